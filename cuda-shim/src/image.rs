//! Module images and kernel signatures: what `cuModuleLoadData` was given (PTX text, a
//! fatbin, a cubin, or the vGPU's built-in module), the parameter list of every `.entry`
//! of a PTX module, and how a launch's C parameters become `KernelArg`s.

use std::collections::HashMap;

use vgpu_proto::builtin::{self, Param};
use vgpu_proto::{Access, KernelArg};

use crate::types::{res, CUresult};

/// The image name that loads the vGPU's built-in kernels (`cuModuleLoad` or
/// `cuModuleLoadData`): a vGPU extension, documented in docs/cuda-api.md.
pub const BUILTIN_IMAGE: &str = "vgpu:builtin";

/// `__fatBinC_Wrapper_t` magic (what nvcc embeds and programs pass to the driver).
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;
/// Fat binary header magic.
const FATBIN_MAGIC: u32 = 0xba55_ed50;
/// Fat binary entry kind: PTX text.
const FATBIN_KIND_PTX: u16 = 1;
/// Entry flags: the payload is compressed (LZ4, or zstd as CUDA 13's nvcc writes it).
const FATBIN_FLAG_COMPRESSED: u64 = 0x2000 | 0x8000;
/// Largest image read from memory the library cannot size.
const MAX_IMAGE: usize = vgpu_proto::MAX_MODULE_BYTES as usize;

/// What a module image is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    Builtin,
    Ptx(Vec<u8>),
    /// A cubin, or a fat binary without PTX the library can read: loaded natively where
    /// the device has `features::BINARY_MODULES`.
    Binary(Vec<u8>),
}

/// How one kernel parameter is passed: its size and alignment in the C parameter buffer,
/// and what it becomes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A built-in's pointer with its declared access.
    Ptr(Access),
    /// A 64-bit integer, or a pointer when its value lies in a live allocation (PTX `.u64`).
    Word64,
    /// A 64-bit integer (built-in counts).
    U64,
    /// An integer of up to 32 bits (sent as U32).
    U32,
    F32,
    F64,
    /// Bytes the wire cannot carry (structs, arrays, 16-bit floats) to this device.
    Bytes,
    /// Bytes sent as they are (`ArgKind::Bytes`, 1 to 8 of them) to a device that takes
    /// them (`features::PARAM_LAYOUT`).
    Raw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub kind: ParamKind,
    pub size: usize,
    pub align: usize,
}

/// A kernel's parameters in order.
pub type Signature = Vec<ParamSpec>;

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads an image whose size the caller does not give.
///
/// # Safety
/// `image` must point to a readable image: a fat binary (its header says how long it
/// is), a fatbin wrapper, an ELF, or NUL-terminated text.
///
/// A binary image (cubin, or a fat binary without readable PTX) answers
/// `CUDA_ERROR_NO_BINARY_FOR_GPU`, as on a device that cannot load one;
/// [`read_image_native`] returns it for a device that can.
pub unsafe fn read_image(image: *const u8) -> Result<Image, CUresult> {
    // SAFETY: the caller's contract.
    no_native(unsafe { read_image_with(image, false) })
}

/// [`read_image`] for a device that loads binary images (`features::BINARY_MODULES`).
///
/// # Safety
/// As [`read_image`].
pub unsafe fn read_image_native(image: *const u8) -> Result<Image, CUresult> {
    // SAFETY: the caller's contract.
    unsafe { read_image_with(image, true) }
}

/// # Safety
/// As [`read_image`].
unsafe fn read_image_with(image: *const u8, native: bool) -> Result<Image, CUresult> {
    if image.is_null() {
        return Err(res::INVALID_VALUE);
    }
    // The first four bytes, stopping at a NUL: a short text image ends there.
    let mut head = [0u8; 4];
    for (i, b) in head.iter_mut().enumerate() {
        // SAFETY: bytes up to and including the first NUL are readable for every image
        // kind (binary images are longer than four bytes and have no NUL in their magic).
        *b = unsafe { image.add(i).read() };
        if *b == 0 {
            // SAFETY: NUL-terminated text, as just seen.
            let text = unsafe { std::ffi::CStr::from_ptr(image.cast()) };
            return classify_with(text.to_bytes(), native);
        }
    }
    let magic = u32::from_le_bytes(head);
    if magic == FATBIN_WRAPPER_MAGIC {
        // struct { int magic; int version; const unsigned long long *data; void *filename_or_fatbins; }
        // SAFETY: a wrapper is 24 bytes; its data field points to a fat binary.
        let data = unsafe { image.add(8).cast::<*const u8>().read_unaligned() };
        // SAFETY: the wrapper's data pointer is a fat binary (caller's contract).
        return unsafe { read_image_with(data, native) };
    }
    if magic == FATBIN_MAGIC {
        // SAFETY: the fat binary header is 16 bytes: magic, version, header size, size.
        let header = unsafe { std::slice::from_raw_parts(image, 16) };
        let hsize = read_u16(header, 6).unwrap_or(16) as usize;
        let body = read_u64(header, 8).unwrap_or(0) as usize;
        let total = hsize.saturating_add(body).min(MAX_IMAGE);
        // SAFETY: the header says the binary is this long.
        let bytes = unsafe { std::slice::from_raw_parts(image, total) };
        return Ok(from_fatbin(bytes));
    }
    if &head == b"\x7fELF" {
        if !native {
            return Err(res::NO_BINARY_FOR_GPU);
        }
        // A cubin: its ELF header (64 bytes) says how long it is.
        // SAFETY: an ELF image starts with its 64-byte header (caller's contract).
        let header = unsafe { std::slice::from_raw_parts(image, 64) };
        let len = vgpu_proto::binary_image_declared_len(header)
            .filter(|l| (64..=MAX_IMAGE).contains(l))
            .ok_or(res::INVALID_IMAGE)?;
        // SAFETY: the header says the image is this long.
        let bytes = unsafe { std::slice::from_raw_parts(image, len) };
        return Ok(Image::Binary(bytes.to_vec()));
    }
    // SAFETY: otherwise the image is NUL-terminated text (caller's contract).
    let text = unsafe { std::ffi::CStr::from_ptr(image.cast()) };
    classify_with(text.to_bytes(), native)
}

/// A binary image refused as a device without native binaries refuses it.
fn no_native(img: Result<Image, CUresult>) -> Result<Image, CUresult> {
    match img {
        Ok(Image::Binary(_)) => Err(res::NO_BINARY_FOR_GPU),
        other => other,
    }
}

/// Classifies an image whose bytes are known (a file, or text); binary images answer
/// `CUDA_ERROR_NO_BINARY_FOR_GPU` (see [`read_image`]).
pub fn classify(bytes: &[u8]) -> Result<Image, CUresult> {
    no_native(classify_with(bytes, false))
}

/// [`classify`] for a device that loads binary images.
pub fn classify_native(bytes: &[u8]) -> Result<Image, CUresult> {
    classify_with(bytes, true)
}

fn classify_with(bytes: &[u8], native: bool) -> Result<Image, CUresult> {
    let trimmed = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if trimmed == BUILTIN_IMAGE.as_bytes() {
        return Ok(Image::Builtin);
    }
    match read_u32(bytes, 0) {
        Some(FATBIN_MAGIC) => return Ok(from_fatbin(bytes)),
        Some(FATBIN_WRAPPER_MAGIC) => return Err(res::INVALID_IMAGE),
        _ => {}
    }
    if bytes.starts_with(b"\x7fELF") {
        if !native {
            return Err(res::NO_BINARY_FOR_GPU);
        }
        let len = vgpu_proto::binary_image_len(bytes).ok_or(res::INVALID_IMAGE)?;
        return Ok(Image::Binary(bytes.get(..len).unwrap_or(bytes).to_vec()));
    }
    let text = std::str::from_utf8(trimmed).map_err(|_| res::INVALID_IMAGE)?;
    if !text.contains(".version") && !text.contains(".entry") {
        return Err(res::INVALID_IMAGE);
    }
    Ok(Image::Ptx(trimmed.to_vec()))
}

/// A fat binary's first uncompressed PTX entry, else the whole fat binary (for a device
/// that loads binaries natively).
fn from_fatbin(bytes: &[u8]) -> Image {
    match ptx_from_fatbin(bytes) {
        Ok(ptx) => Image::Ptx(ptx),
        Err(_) => Image::Binary(bytes.to_vec()),
    }
}

/// The first uncompressed PTX entry of a fat binary.
fn ptx_from_fatbin(bytes: &[u8]) -> Result<Vec<u8>, CUresult> {
    let hsize = read_u16(bytes, 6).ok_or(res::INVALID_IMAGE)? as usize;
    let body = read_u64(bytes, 8).ok_or(res::INVALID_IMAGE)? as usize;
    let end = hsize.saturating_add(body).min(bytes.len());
    let mut at = hsize;
    let mut saw_compressed_ptx = false;
    // Entry header: kind u16, version u16, header size u32, payload size u64, compressed
    // size u32, u32, minor u16, major u16, arch u32, name offset u32, name length u32,
    // flags u64 (at 40), u64, decompressed size u64.
    while at + 48 <= end {
        let kind = read_u16(bytes, at).ok_or(res::INVALID_IMAGE)?;
        let ehsize = read_u32(bytes, at + 4).ok_or(res::INVALID_IMAGE)? as usize;
        let psize = read_u64(bytes, at + 8).ok_or(res::INVALID_IMAGE)? as usize;
        let flags = read_u64(bytes, at + 40).ok_or(res::INVALID_IMAGE)?;
        let start = at.checked_add(ehsize).ok_or(res::INVALID_IMAGE)?;
        let stop = start.checked_add(psize).ok_or(res::INVALID_IMAGE)?;
        if ehsize == 0 || stop > end {
            return Err(res::INVALID_IMAGE);
        }
        if kind == FATBIN_KIND_PTX {
            if flags & FATBIN_FLAG_COMPRESSED != 0 {
                saw_compressed_ptx = true;
            } else {
                let text = &bytes[start..stop];
                let n = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                return Ok(text[..n].to_vec());
            }
        }
        at = stop;
    }
    if saw_compressed_ptx {
        tracing::warn!("the fat binary's PTX is compressed, which this library does not read");
    }
    Err(res::NO_BINARY_FOR_GPU)
}

/// The parameter list of every `.entry` of a PTX module.
pub fn ptx_entries(ptx: &str) -> HashMap<String, Signature> {
    let mut out = HashMap::new();
    let mut rest = ptx;
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + ".entry".len()..];
        let Some(open) = rest.find('(') else { break };
        let name = rest[..open].trim().to_string();
        let Some(close) = rest[open..].find(')') else {
            break;
        };
        let list = &rest[open + 1..open + close];
        let params = list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(ptx_param)
            .collect();
        if !name.is_empty() && !name.contains(char::is_whitespace) {
            out.insert(name, params);
        }
        rest = &rest[open + close..];
    }
    out
}

/// One `.param` declaration: `.param .u64 .ptr .global .align 8 name` or
/// `.param .align 8 .b8 name[16]`.
fn ptx_param(decl: &str) -> ParamSpec {
    let mut ty = None;
    let mut align = None;
    let mut tokens = decl.split_whitespace().peekable();
    let mut last = "";
    while let Some(t) = tokens.next() {
        if t == ".align" {
            align = tokens.next().and_then(|a| a.parse::<usize>().ok());
            continue;
        }
        if let Some(s) = t.strip_prefix('.') {
            if scalar_size(s).is_some() {
                ty = Some(s);
            }
        }
        last = t;
    }
    let count = last
        .split_once('[')
        .and_then(|(_, n)| n.trim_end_matches(']').parse::<usize>().ok());
    let Some(ty) = ty else {
        return ParamSpec {
            kind: ParamKind::Bytes,
            size: 0,
            align: align.unwrap_or(1),
        };
    };
    let elem = scalar_size(ty).unwrap_or(1);
    if let Some(n) = count {
        return ParamSpec {
            kind: ParamKind::Bytes,
            size: elem * n,
            align: align.unwrap_or(elem),
        };
    }
    let kind = match ty {
        "f32" => ParamKind::F32,
        "f64" => ParamKind::F64,
        "f16" | "bf16" | "f16x2" | "bf16x2" => ParamKind::Bytes,
        _ if elem == 8 => ParamKind::Word64,
        _ => ParamKind::U32,
    };
    ParamSpec {
        kind,
        size: elem,
        align: align.unwrap_or(elem),
    }
}

fn scalar_size(ty: &str) -> Option<usize> {
    Some(match ty {
        "u8" | "s8" | "b8" | "pred" => 1,
        "u16" | "s16" | "b16" | "f16" | "bf16" => 2,
        "u32" | "s32" | "b32" | "f32" | "f16x2" | "bf16x2" => 4,
        "u64" | "s64" | "b64" | "f64" => 8,
        _ => return None,
    })
}

/// The C signature of a built-in kernel: pointers and counts are 8 bytes, f32 and 32-bit
/// words 4.
pub fn builtin_signature(name: &str) -> Option<Signature> {
    let sig = builtin::find(name.as_bytes())?;
    Some(
        sig.params
            .iter()
            .map(|(_, p)| match p {
                Param::Ptr(a) => ParamSpec {
                    kind: ParamKind::Ptr(*a),
                    size: 8,
                    align: 8,
                },
                Param::Int => ParamSpec {
                    kind: ParamKind::U64,
                    size: 8,
                    align: 8,
                },
                Param::F32 => ParamSpec {
                    kind: ParamKind::F32,
                    size: 4,
                    align: 4,
                },
                Param::Word32 => ParamSpec {
                    kind: ParamKind::U32,
                    size: 4,
                    align: 4,
                },
            })
            .collect(),
    )
}

/// For a device that takes raw bytes: by-value parameters of up to 8 bytes the protocol
/// has no kind for (8 and 16-bit values, small structs) go as raw bytes.
pub fn with_raw_bytes(sig: Signature) -> Signature {
    sig.into_iter()
        .map(|p| match p.kind {
            // Aggregates and 16-bit floats, and 8 and 16-bit integers (a U32 argument would
            // not match their size).
            ParamKind::Bytes | ParamKind::U32
                if (1..=vgpu_proto::MAX_ARG_BYTES as usize).contains(&p.size) && p.size != 4 =>
            {
                ParamSpec {
                    kind: ParamKind::Raw,
                    ..p
                }
            }
            _ => p,
        })
        .collect()
}

/// The signature of a kernel the library has no PTX for (a cubin's), from the device's
/// parameter layout: 8-byte parameters as 64-bit words (pointers when they point into a
/// live allocation), 4-byte ones as 32-bit words, other sizes as bytes.
pub fn signature_from_layout(layout: &vgpu_proto::ParamLayout, count: u64) -> Signature {
    let count = count.min(u64::from(vgpu_proto::MAX_KERNEL_ARGS)) as usize;
    (0..count)
        .filter_map(|i| layout.get(i))
        .map(|(off, size)| {
            let size = size as usize;
            let kind = match size {
                8 => ParamKind::Word64,
                4 => ParamKind::U32,
                _ => ParamKind::Bytes,
            };
            // The alignment that puts the parameter where the device says it lies.
            let align = if off == 0 {
                size.next_power_of_two().clamp(1, 8)
            } else {
                1usize << off.trailing_zeros().min(4)
            };
            ParamSpec { kind, size, align }
        })
        .collect()
}

/// Bytes a parameter buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER`) must hold, and each
/// parameter's offset in it.
pub fn buffer_layout(sig: &Signature) -> (usize, Vec<usize>) {
    let mut offs = Vec::with_capacity(sig.len());
    let mut at = 0usize;
    for p in sig {
        at = at.next_multiple_of(p.align.max(1));
        offs.push(at);
        at += p.size;
    }
    (at, offs)
}

/// The wire argument for parameter `p` whose bytes are `bytes` (exactly `p.size` long).
/// `is_device_ptr` says whether a 64-bit value is a live device address.
pub fn kernel_arg(
    p: &ParamSpec,
    bytes: &[u8],
    is_device_ptr: impl Fn(u64) -> bool,
) -> Result<KernelArg, CUresult> {
    let mut w = [0u8; 8];
    let n = bytes.len().min(8);
    w[..n].copy_from_slice(&bytes[..n]);
    let v = u64::from_le_bytes(w);
    Ok(match p.kind {
        ParamKind::Ptr(a) => KernelArg::ptr(v, a),
        ParamKind::Word64 if v != 0 && is_device_ptr(v) => KernelArg::ptr(v, Access::ReadWrite),
        ParamKind::Word64 | ParamKind::U64 => KernelArg::u64(v),
        ParamKind::U32 => KernelArg::u32(v as u32),
        ParamKind::F32 => KernelArg::f32(f32::from_bits(v as u32)),
        ParamKind::F64 => KernelArg::f64(f64::from_bits(v)),
        ParamKind::Raw => KernelArg::bytes(bytes).ok_or(res::NOT_SUPPORTED)?,
        ParamKind::Bytes => {
            crate::api::stubs::log_once(
                "kernel parameters that are aggregates over 8 bytes (or, on a protocol 1.0 device, any aggregate or 16-bit float)",
            );
            return Err(res::NOT_SUPPORTED);
        }
    })
}

#[cfg(test)]
mod tests;
