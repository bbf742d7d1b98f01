//! `ENCODE_TENSOR_MAP`'s arguments: the wire form and every refused field.

extern crate std;

use std::string::ToString;

use crate::*;

const ADDR: u64 = 0x2000_0020_0000;

/// A 1024 x 512 f16 matrix (rows of 2 KiB), 64 x 64 boxes swizzled 128B: what a Hopper
/// GEMM's tile loader encodes.
fn tiled() -> TensorMapArgs {
    TensorMapArgs {
        kind: tensor_map_kind::TILED,
        data_type: 6,
        rank: 2,
        swizzle: 3,
        l2_promotion: 2,
        global_address: ADDR,
        global_dim: [1024, 512, 0, 0, 0],
        global_strides: [2048, 0, 0, 0],
        box_dim: [64, 64, 0, 0, 0],
        element_strides: [1, 1, 0, 0, 0],
        ..TensorMapArgs::default()
    }
}

/// An NHWC f16 activation (N 2, H 8, W 8, C 64) read as im2col columns of a 3 x 3 filter
/// with padding 1.
fn im2col() -> TensorMapArgs {
    TensorMapArgs {
        kind: tensor_map_kind::IM2COL,
        data_type: 6,
        rank: 4,
        swizzle: 3,
        global_address: ADDR,
        global_dim: [64, 8, 8, 2, 0],
        global_strides: [128, 1024, 8192, 0],
        element_strides: [1, 1, 1, 1, 0],
        pixel_box_lower: [-1, -1, 0],
        pixel_box_upper: [-1, -1, 0],
        channels_per_pixel: 64,
        pixels_per_column: 128,
        ..TensorMapArgs::default()
    }
}

#[test]
fn the_request_round_trips_and_answers_into_one_writable_descriptor() {
    assert_eq!(TensorMapArgs::SIZE, 184);
    assert_eq!(TENSOR_MAP_BYTES, 128);
    let args = im2col();
    let req = Request::EncodeTensorMap(args);
    let mut buf = [0u8; 256];
    let n = req.encode(42, &mut buf).expect("encodes");
    assert_eq!(n, RequestHeader::SIZE + TensorMapArgs::SIZE);
    let (h, parsed) = parse_request(&buf[..n]).expect("parses");
    assert_eq!(h.opcode, 0x0900);
    assert_eq!(h.id, 42);
    match parsed {
        Request::EncodeTensorMap(a) => assert_eq!(a, args),
        other => panic!("parsed as {other:?}"),
    }
    assert_eq!(parsed.data_len(), 128);
    assert_eq!(
        Opcode::EncodeTensorMap.data_shape(),
        DataShape::WritableInfo
    );
    // The corners travel as signed words.
    assert_eq!(&buf[16 + 152..16 + 156], &(-1i32).to_le_bytes());
    // Short arguments: BAD_LENGTH.
    let short = parse_request(&buf[..n - 1])
        .map(|_| ())
        .map_err(|(_, e)| e.status());
    assert_eq!(short, Err(Status::BadLength));
    const { assert!(VERSION_MINOR >= 4) };
    assert_eq!(features::TENSOR_MAPS, 1 << 14);
}

#[test]
fn documented_maps_pass_and_their_extent_covers_the_tensor() {
    assert_eq!(tiled().check(), Ok(()));
    assert_eq!(im2col().check(), Ok(()));
    // The last row starts 511 strides in and is 1024 halves long.
    assert_eq!(tiled().extent(), Some(511 * 2048 + 2048));
    assert_eq!(im2col().extent(), Some(8192 + 7 * 1024 + 7 * 128 + 128));
    // Rank 1, packed 4-bit values, the largest dimensions.
    let one = TensorMapArgs {
        rank: 1,
        data_type: 13,
        swizzle: 0,
        global_dim: [4096, 0, 0, 0, 0],
        global_strides: [0; 4],
        box_dim: [256, 0, 0, 0, 0],
        element_strides: [1, 0, 0, 0, 0],
        ..tiled()
    };
    assert_eq!(one.check(), Ok(()));
    assert_eq!(one.extent(), Some(2048));
    let huge = TensorMapArgs {
        rank: 5,
        global_dim: [1 << 32; 5],
        global_strides: [(1 << 40) - 16; 4],
        box_dim: [64, 1, 1, 1, 1],
        element_strides: [1; 5],
        ..tiled()
    };
    assert_eq!(huge.check(), Ok(()));
    assert_eq!(huge.extent(), None, "past 64 bits: no allocation holds it");
}

/// Applies `change` to `base` and expects the check to refuse it with an error `ok` accepts.
fn refused(
    base: TensorMapArgs,
    what: &str,
    change: impl FnOnce(&mut TensorMapArgs),
    ok: impl FnOnce(&TensorMapError) -> bool,
) {
    let mut a = base;
    change(&mut a);
    match a.check() {
        Err(e) => {
            assert!(ok(&e), "{what}: refused for the wrong reason: {e}");
            assert_eq!(e.status(), Status::InvalidArgument);
            assert!(!e.to_string().is_empty());
        }
        Ok(()) => panic!("{what}: accepted {a:?}"),
    }
}

fn entry_of(field: &'static str, index: usize) -> impl FnOnce(&TensorMapError) -> bool {
    move |e| matches!(e, TensorMapError::Entry { field: f, index: i, .. } if *f == field && *i == index)
}

fn unused_of(field: &'static str, index: usize) -> impl FnOnce(&TensorMapError) -> bool {
    move |e| matches!(e, TensorMapError::Unused { field: f, index: i } if *f == field && *i == index)
}

fn enum_of(field: &'static str) -> impl FnOnce(&TensorMapError) -> bool {
    move |e| matches!(e, TensorMapError::Enum { field: f, .. } if *f == field)
}

fn combination(e: &TensorMapError) -> bool {
    matches!(e, TensorMapError::Combination(_))
}

#[test]
fn every_header_field_out_of_range_is_refused() {
    let t = tiled();
    refused(
        t,
        "flags",
        |a| a.flags = 1,
        |e| *e == TensorMapError::Flags(1),
    );
    refused(t, "kind", |a| a.kind = 2, |e| *e == TensorMapError::Kind(2));
    refused(t, "data type", |a| a.data_type = 16, enum_of("data type"));
    refused(t, "interleave", |a| a.interleave = 3, enum_of("interleave"));
    refused(t, "swizzle", |a| a.swizzle = 7, enum_of("swizzle"));
    refused(
        t,
        "L2 promotion",
        |a| a.l2_promotion = 4,
        enum_of("L2 promotion"),
    );
    refused(t, "OOB fill", |a| a.oob_fill = 2, enum_of("OOB fill"));
    let rank =
        |r: u32, min: u32| move |e: &TensorMapError| *e == TensorMapError::Rank { rank: r, min };
    refused(t, "rank 0", |a| a.rank = 0, rank(0, 1));
    refused(t, "rank 6", |a| a.rank = 6, rank(6, 1));
    refused(
        t,
        "interleaved rank 2",
        |a| {
            a.interleave = 1;
            a.swizzle = 0;
        },
        rank(2, 3),
    );
    refused(im2col(), "im2col rank 2", |a| a.rank = 2, rank(2, 3));
    let addr = |addr: u64, align: u64| {
        move |e: &TensorMapError| *e == TensorMapError::Address { addr, align }
    };
    refused(t, "null address", |a| a.global_address = 0, addr(0, 16));
    refused(
        t,
        "address off 16",
        |a| a.global_address = ADDR + 8,
        addr(ADDR + 8, 16),
    );
    let t3 = TensorMapArgs {
        rank: 3,
        interleave: 2,
        swizzle: 1,
        global_dim: [16, 64, 64, 0, 0],
        global_strides: [64, 4096, 0, 0],
        box_dim: [16, 8, 8, 0, 0],
        element_strides: [1, 1, 1, 0, 0],
        ..tiled()
    };
    assert_eq!(t3.check(), Ok(()), "interleave 32B with swizzle 32B");
    refused(
        t3,
        "interleave 32B address off 32",
        |a| a.global_address = ADDR + 16,
        addr(ADDR + 16, 32),
    );
    refused(
        t3,
        "interleave 32B stride off 32",
        |a| a.global_strides[0] = 48,
        entry_of("global strides", 0),
    );
    refused(
        t3,
        "interleave 32B without swizzle 32B",
        |a| a.swizzle = 3,
        combination,
    );
}

#[test]
fn every_array_entry_out_of_range_is_refused() {
    let t = tiled();
    refused(
        t,
        "dim 0",
        |a| a.global_dim[1] = 0,
        entry_of("global dims", 1),
    );
    refused(
        t,
        "dim past 2^32",
        |a| a.global_dim[0] = (1 << 32) + 1,
        entry_of("global dims", 0),
    );
    refused(
        t,
        "dim past the rank",
        |a| a.global_dim[2] = 4,
        unused_of("global dims", 2),
    );
    refused(
        t,
        "stride off 16",
        |a| a.global_strides[0] = 2056,
        entry_of("global strides", 0),
    );
    refused(
        t,
        "stride 2^40",
        |a| a.global_strides[0] = 1 << 40,
        entry_of("global strides", 0),
    );
    refused(
        t,
        "stride past the rank",
        |a| a.global_strides[1] = 16,
        unused_of("global strides", 1),
    );
    refused(t, "box 0", |a| a.box_dim[1] = 0, entry_of("box dims", 1));
    refused(
        t,
        "box 257",
        |a| a.box_dim[1] = 257,
        entry_of("box dims", 1),
    );
    refused(
        t,
        "box past the rank",
        |a| a.box_dim[4] = 1,
        unused_of("box dims", 4),
    );
    refused(
        t,
        "inner box of 8 bytes",
        |a| {
            a.box_dim[0] = 4;
            a.swizzle = 0;
        },
        entry_of("box dims", 0),
    );
    refused(
        t,
        "inner box wider than the swizzle",
        |a| a.swizzle = 2,
        combination,
    );
    refused(
        t,
        "element stride 0",
        |a| a.element_strides[1] = 0,
        entry_of("element strides", 1),
    );
    refused(
        t,
        "element stride 9",
        |a| a.element_strides[0] = 9,
        entry_of("element strides", 0),
    );
    refused(
        t,
        "element stride past the rank",
        |a| a.element_strides[3] = 1,
        unused_of("element strides", 3),
    );
    refused(
        t,
        "corner on a tiled map",
        |a| a.pixel_box_lower[0] = -1,
        unused_of("pixel box lower corner", 0),
    );
    refused(
        t,
        "channels on a tiled map",
        |a| a.channels_per_pixel = 8,
        unused_of("channels/pixels per column", 0),
    );
    refused(
        t,
        "pixels on a tiled map",
        |a| a.pixels_per_column = 8,
        unused_of("channels/pixels per column", 1),
    );
}

#[test]
fn im2col_fields_out_of_range_are_refused() {
    let m = im2col();
    refused(
        m,
        "box dims on im2col",
        |a| a.box_dim[0] = 64,
        unused_of("box dims", 0),
    );
    refused(
        m,
        "rank 4 lower corner -129",
        |a| a.pixel_box_lower[1] = -129,
        entry_of("pixel box lower corner", 1),
    );
    refused(
        m,
        "rank 4 upper corner 128",
        |a| a.pixel_box_upper[0] = 128,
        entry_of("pixel box upper corner", 0),
    );
    refused(
        m,
        "corner past the spatial dims",
        |a| a.pixel_box_upper[2] = 1,
        unused_of("pixel box upper corner", 2),
    );
    let five = TensorMapArgs {
        rank: 5,
        global_dim: [64, 8, 8, 8, 2],
        global_strides: [128, 1024, 8192, 65536],
        element_strides: [1; 5],
        pixel_box_lower: [-1, -1, -1],
        pixel_box_upper: [-1, -1, -1],
        ..m
    };
    assert_eq!(five.check(), Ok(()));
    refused(
        five,
        "rank 5 corner -17",
        |a| a.pixel_box_lower[2] = -17,
        entry_of("pixel box lower corner", 2),
    );
    let three = TensorMapArgs {
        rank: 3,
        global_dim: [64, 8, 2, 0, 0],
        global_strides: [128, 1024, 0, 0],
        element_strides: [1, 1, 1, 0, 0],
        pixel_box_lower: [-32768, 0, 0],
        pixel_box_upper: [32767, 0, 0],
        ..m
    };
    assert_eq!(three.check(), Ok(()));
    refused(
        three,
        "rank 3 second corner",
        |a| a.pixel_box_lower[1] = 1,
        unused_of("pixel box lower corner", 1),
    );
    refused(
        m,
        "channels 0",
        |a| a.channels_per_pixel = 0,
        entry_of("channels per pixel", 0),
    );
    refused(
        m,
        "channels 257",
        |a| a.channels_per_pixel = 257,
        entry_of("channels per pixel", 0),
    );
    refused(
        m,
        "channels wider than the swizzle",
        |a| a.channels_per_pixel = 128,
        combination,
    );
    refused(
        m,
        "pixels 0",
        |a| a.pixels_per_column = 0,
        entry_of("pixels per column", 0),
    );
    refused(
        m,
        "pixels 1025",
        |a| a.pixels_per_column = 1025,
        entry_of("pixels per column", 0),
    );
}

#[test]
fn packed_types_and_fills_keep_their_documented_pairings() {
    let t = tiled();
    refused(
        t,
        "NaN fill on integers",
        |a| {
            a.data_type = 3;
            a.oob_fill = 1;
            a.box_dim[0] = 32;
        },
        combination,
    );
    let mut f = t;
    f.oob_fill = 1;
    assert_eq!(f.check(), Ok(()), "NaN fill on f16");
    let u6 = TensorMapArgs {
        data_type: 15,
        global_dim: [1024, 512, 0, 0, 0],
        global_strides: [1024, 0, 0, 0],
        box_dim: [128, 64, 0, 0, 0],
        ..t
    };
    assert_eq!(u6.check(), Ok(()));
    refused(
        u6,
        "16U6 dims not a multiple of 128",
        |a| a.global_dim[0] = 1000,
        entry_of("global dims", 0),
    );
    refused(
        u6,
        "16U6 box not 128",
        |a| a.box_dim[0] = 64,
        entry_of("box dims", 0),
    );
    refused(
        u6,
        "16U6 stride off 32",
        |a| a.global_strides[0] = 1040,
        entry_of("global strides", 0),
    );
    refused(
        u6,
        "16U6 address off 32",
        |a| a.global_address = ADDR + 16,
        |e| matches!(e, TensorMapError::Address { align: 32, .. }),
    );
    refused(u6, "16U6 swizzle 64B", |a| a.swizzle = 2, combination);
    refused(
        u6,
        "16U6 interleaved",
        |a| {
            a.rank = 3;
            a.interleave = 1;
            a.global_dim[2] = 2;
            a.global_strides[1] = 1 << 20;
            a.box_dim[2] = 1;
            a.element_strides[2] = 1;
        },
        combination,
    );
    let u4 = TensorMapArgs {
        data_type: 14,
        ..u6
    };
    assert_eq!(u4.check(), Ok(()));
    refused(
        u4,
        "16U4_ALIGN16B swizzle 128B_ATOM_64B",
        |a| a.swizzle = 6,
        combination,
    );
    refused(u4, "16U4 NaN fill", |a| a.oob_fill = 1, combination);
    let u4_8 = TensorMapArgs {
        data_type: 13,
        box_dim: [64, 64, 0, 0, 0],
        ..t
    };
    refused(
        u4_8,
        "16U4_ALIGN8B odd dim",
        |a| a.global_dim[0] = 1023,
        entry_of("global dims", 0),
    );
}

#[test]
fn the_extent_of_any_bytes_is_an_answer_not_a_panic() {
    let worst = TensorMapArgs {
        rank: u32::MAX,
        data_type: u32::MAX,
        interleave: u32::MAX,
        global_dim: [u64::MAX; 5],
        global_strides: [u64::MAX; 4],
        ..TensorMapArgs::default()
    };
    assert_eq!(
        worst.check().map_err(|e| e.status()),
        Err(Status::InvalidArgument)
    );
    assert_eq!(worst.extent(), None);
    let empty = TensorMapArgs::default();
    assert!(empty.check().is_err());
    assert_eq!(empty.extent(), Some(0));
}
