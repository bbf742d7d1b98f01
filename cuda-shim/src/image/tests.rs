use super::*;

const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.visible .entry scale(
	.param .u64 .ptr .global .align 8 scale_param_0,
	.param .f32 scale_param_1,
	.param .u32 scale_param_2
)
{
	ret;
}

.visible .entry pack(
	.param .align 8 .b8 pack_param_0[16],
	.param .f64 pack_param_1,
	.param .u16 pack_param_2
)
{
	ret;
}
.entry empty()
{
	ret;
}
"#;

#[test]
fn ptx_entries_and_their_parameters() {
    let e = ptx_entries(PTX);
    assert_eq!(e.len(), 3);
    let scale = &e["scale"];
    assert_eq!(
        scale
            .iter()
            .map(|p| (p.kind, p.size, p.align))
            .collect::<Vec<_>>(),
        [
            (ParamKind::Word64, 8, 8),
            (ParamKind::F32, 4, 4),
            (ParamKind::U32, 4, 4)
        ]
    );
    let pack = &e["pack"];
    assert_eq!(pack[0].kind, ParamKind::Bytes);
    assert_eq!((pack[0].size, pack[0].align), (16, 8));
    assert_eq!(pack[1].kind, ParamKind::F64);
    assert_eq!((pack[2].kind, pack[2].size), (ParamKind::U32, 2));
    assert!(e["empty"].is_empty());
}

#[test]
fn buffer_layout_aligns_every_parameter() {
    let e = ptx_entries(PTX);
    // u64 at 0, f32 at 8, u32 at 12.
    assert_eq!(buffer_layout(&e["scale"]), (16, vec![0, 8, 12]));
    // 16 bytes at 0, f64 at 16, u16 at 24.
    assert_eq!(buffer_layout(&e["pack"]), (26, vec![0, 16, 24]));
}

#[test]
fn kernel_args_from_bytes() {
    let e = ptx_entries(PTX);
    let s = &e["scale"];
    let live = |v: u64| v == 0x2000_0000;
    let p = kernel_arg(&s[0], &0x2000_0000u64.to_le_bytes(), live).unwrap();
    assert_eq!(p.kind, vgpu_proto::ArgKind::Ptr as u32);
    let v = kernel_arg(&s[0], &7u64.to_le_bytes(), live).unwrap();
    assert_eq!(v.kind, vgpu_proto::ArgKind::U64 as u32);
    let f = kernel_arg(&s[1], &1.5f32.to_le_bytes(), live).unwrap();
    assert_eq!(f.value, u64::from(1.5f32.to_bits()));
    assert_eq!(
        kernel_arg(&e["pack"][0], &[0; 16], live),
        Err(res::NOT_SUPPORTED)
    );
}

#[test]
fn builtin_signatures_use_eight_byte_counts() {
    let s = builtin_signature("vector_add").unwrap();
    assert_eq!(s.len(), 4);
    assert_eq!(s[0].kind, ParamKind::Ptr(Access::Read));
    assert_eq!(s[2].kind, ParamKind::Ptr(Access::Write));
    assert_eq!((s[3].kind, s[3].size), (ParamKind::U64, 8));
    assert!(builtin_signature("nope").is_none());
}

fn fatbin(entries: &[(u16, u64, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, flags, payload) in entries {
        let mut h = vec![0u8; 64];
        h[0..2].copy_from_slice(&kind.to_le_bytes());
        h[4..8].copy_from_slice(&64u32.to_le_bytes());
        h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        h[40..48].copy_from_slice(&flags.to_le_bytes());
        body.extend_from_slice(&h);
        body.extend_from_slice(payload);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

#[test]
fn images_are_classified() {
    assert_eq!(classify(b"vgpu:builtin\0"), Ok(Image::Builtin));
    assert_eq!(
        classify(PTX.as_bytes()),
        Ok(Image::Ptx(PTX.as_bytes().to_vec()))
    );
    assert_eq!(classify(b"\x7fELF\x02\x01"), Err(res::NO_BINARY_FOR_GPU));
    assert_eq!(classify(b"hello"), Err(res::INVALID_IMAGE));
    let with_ptx = fatbin(&[(2, 0, b"sass"), (1, 0, b".version 8.0\0\0\0")]);
    assert_eq!(
        classify(&with_ptx),
        Ok(Image::Ptx(b".version 8.0".to_vec()))
    );
    let only_sass = fatbin(&[(2, 0, b"sass")]);
    assert_eq!(classify(&only_sass), Err(res::NO_BINARY_FOR_GPU));
    let compressed = fatbin(&[(1, FATBIN_FLAG_COMPRESSED, b"zz")]);
    assert_eq!(classify(&compressed), Err(res::NO_BINARY_FOR_GPU));
    // CUDA 13's nvcc compresses with zstd (flag 0x8000): not text either.
    for flag in [0x2000u64, 0x8000] {
        let compressed = fatbin(&[(2, 0, b"sass"), (1, flag | 0x11, b"\x28\xb5\x2f\xfd")]);
        assert_eq!(classify(&compressed), Err(res::NO_BINARY_FOR_GPU));
        assert_eq!(
            classify_native(&compressed),
            Ok(Image::Binary(compressed.clone()))
        );
    }
    // SAFETY: a complete fat binary in memory.
    let read = unsafe { read_image(with_ptx.as_ptr()) };
    assert_eq!(read, Ok(Image::Ptx(b".version 8.0".to_vec())));
}

#[test]
fn short_text_images_are_read_up_to_their_nul() {
    for text in [c"", c"ab", c"vgpu:builtin"] {
        // SAFETY: NUL-terminated text.
        let got = unsafe { read_image(text.as_ptr().cast()) };
        let want = if text.is_empty() || text == c"ab" {
            Err(res::INVALID_IMAGE)
        } else {
            Ok(Image::Builtin)
        };
        assert_eq!(got, want, "{text:?}");
    }
    // SAFETY: NULL is refused before any read.
    let null = unsafe { read_image(std::ptr::null()) };
    assert_eq!(null, Err(res::INVALID_VALUE));
}

#[test]
fn binary_images_go_to_a_device_that_loads_them() {
    // A minimal ELF64 header whose section table ends at byte 0x80 + 2 * 0x40.
    let mut elf = vec![0u8; 0x100];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    elf[0x28..0x30].copy_from_slice(&0x80u64.to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&0x40u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
    assert_eq!(classify(&elf), Err(res::NO_BINARY_FOR_GPU));
    assert_eq!(classify_native(&elf), Ok(Image::Binary(elf.clone())));
    // SAFETY: a complete ELF image in memory.
    let read = unsafe { read_image_native(elf.as_ptr()) };
    assert_eq!(read, Ok(Image::Binary(elf.clone())));
    // A header whose tables lie past the image it came with.
    assert_eq!(
        classify_native(&elf[..0x90]),
        Err(res::INVALID_IMAGE),
        "truncated"
    );
    let only_sass = fatbin(&[(2, 0, b"sass")]);
    assert_eq!(
        classify_native(&only_sass),
        Ok(Image::Binary(only_sass.clone()))
    );
}

#[test]
fn signatures_from_a_device_layout_and_raw_bytes() {
    let mut l = vgpu_proto::ParamLayout::default();
    for (i, (o, s)) in [(0, 8), (8, 4), (12, 2), (16, 16)].into_iter().enumerate() {
        l.set(i, o, s);
    }
    let sig = signature_from_layout(&l, 4);
    let kinds: Vec<_> = sig.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        [
            ParamKind::Word64,
            ParamKind::U32,
            ParamKind::Bytes,
            ParamKind::Bytes
        ]
    );
    assert_eq!(
        buffer_layout(&sig),
        (32, vec![0, 8, 12, 16]),
        "the device's offsets"
    );
    let raw = with_raw_bytes(sig);
    assert_eq!(raw[2].kind, ParamKind::Raw);
    assert_eq!(
        raw[3].kind,
        ParamKind::Bytes,
        "over 8 bytes stays unsupported"
    );
    let live = |_: u64| false;
    let a = kernel_arg(&raw[2], &[0xef, 0xbe], live).expect("raw");
    assert_eq!(
        (a.kind, a.access, a.value),
        (vgpu_proto::ArgKind::Bytes as u32, 2, 0xbeef)
    );
    assert_eq!(kernel_arg(&raw[3], &[0; 16], live), Err(res::NOT_SUPPORTED));
    // A PTX 16-bit parameter becomes raw bytes too; 4 and 8-byte ones keep their kinds.
    let e = ptx_entries(PTX);
    let pack = with_raw_bytes(e["pack"].clone());
    assert_eq!(pack[2].kind, ParamKind::Raw);
    assert_eq!(pack[1].kind, ParamKind::F64);
    assert_eq!(pack[0].kind, ParamKind::Bytes, "16 bytes");
}
