//! `ENCODE_TENSOR_MAP` (since 1.4, `features::TENSOR_MAPS`): the parameters of
//! `cuTensorMapEncodeTiled` and `cuTensorMapEncodeIm2col` in one wire struct, and the
//! checks the CUDA driver documents for them, run on both sides (the CUDA library before
//! it sends, the device before its GPU driver sees anything). The answer is the 128-byte
//! descriptor (`CUtensorMap`) the GPU's driver encodes.

use core::fmt;

use crate::wire::wire_struct;

/// Bytes of an encoded tensor map (`CUtensorMap`): the answer's size.
pub const TENSOR_MAP_BYTES: usize = 128;
/// Most dimensions a tensor map describes.
pub const MAX_TENSOR_RANK: u32 = 5;

/// [`TensorMapArgs::kind`] values.
pub mod tensor_map_kind {
    /// `cuTensorMapEncodeTiled`: `box_dim` names the box.
    pub const TILED: u32 = 0;
    /// `cuTensorMapEncodeIm2col`: the pixel box corners, channels per pixel and pixels
    /// per column name it.
    pub const IM2COL: u32 = 1;
}

wire_struct! {
    /// `ENCODE_TENSOR_MAP`'s arguments: what `cuTensorMapEncodeTiled` or
    /// `cuTensorMapEncodeIm2col` takes, the enums as their CUDA values. Entries past the
    /// rank, and the other kind's fields, are 0. One writable data descriptor of at least
    /// [`TENSOR_MAP_BYTES`] receives the descriptor; result[0] = its size.
    pub struct TensorMapArgs, size 184 {
        /// A [`tensor_map_kind`] value.
        pub kind: u32,
        /// `CUtensorMapDataType` (0..=15).
        pub data_type: u32,
        /// Dimensions: 1..=5 (tiled), 3..=5 (im2col).
        pub rank: u32,
        /// `CUtensorMapInterleave` (0..=2).
        pub interleave: u32,
        /// `CUtensorMapSwizzle` (0..=6).
        pub swizzle: u32,
        /// `CUtensorMapL2promotion` (0..=3).
        pub l2_promotion: u32,
        /// `CUtensorMapFloatOOBfill` (0..=1).
        pub oob_fill: u32,
        /// Must be 0.
        pub flags: u32,
        /// The tensor's first byte: a device address of this vGPU; the whole tensor
        /// ([`TensorMapArgs::extent`] bytes) lies inside one of its allocations.
        pub global_address: u64,
        /// Elements along each dimension, innermost first: 1..=2^32.
        pub global_dim: [u64; 5],
        /// Bytes between consecutive entries of dimensions 1..rank: multiples of 16
        /// below 2^40.
        pub global_strides: [u64; 4],
        /// Tiled: elements of the box along each dimension, 1..=256.
        pub box_dim: [u32; 5],
        /// Traversal step along each dimension, 1..=8.
        pub element_strides: [u32; 5],
        /// Im2col: the lower corner of the pixel box (D, H, W offsets; rank - 2 of them).
        pub pixel_box_lower: [i32; 3],
        /// Im2col: the upper corner of the pixel box.
        pub pixel_box_upper: [i32; 3],
        /// Im2col: elements along C per pixel, 1..=256.
        pub channels_per_pixel: u32,
        /// Im2col: pixels per column, 1..=1024.
        pub pixels_per_column: u32,
    }
}

/// Why tensor map parameters were refused (the device answers `INVALID_ARGUMENT`, the
/// CUDA library `CUDA_ERROR_INVALID_VALUE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorMapError {
    /// `flags` is not 0.
    Flags(u32),
    /// `kind` is neither tiled nor im2col.
    Kind(u32),
    /// An enum field out of its range.
    Enum {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u32,
        /// The largest value CUDA defines.
        max: u32,
    },
    /// `rank` out of range for the kind and interleave.
    Rank {
        /// The rank given.
        rank: u32,
        /// The least rank allowed.
        min: u32,
    },
    /// `global_address` is 0 or not aligned.
    Address {
        /// The address.
        addr: u64,
        /// The alignment it needs.
        align: u64,
    },
    /// An entry of an array field out of range.
    Entry {
        /// The field.
        field: &'static str,
        /// The entry.
        index: usize,
        /// Its value.
        value: i64,
        /// What it must be.
        rule: &'static str,
    },
    /// A field that must be 0 here (past the rank, or the other kind's) is not.
    Unused {
        /// The field.
        field: &'static str,
        /// The entry (0 for a single field).
        index: usize,
    },
    /// Fields that are each in range but not together.
    Combination(&'static str),
}

impl TensorMapError {
    /// The status the device answers with.
    pub fn status(&self) -> crate::Status {
        crate::Status::InvalidArgument
    }
}

impl fmt::Display for TensorMapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorMapError::Flags(v) => write!(f, "tensor map flags {v:#x} must be 0"),
            TensorMapError::Kind(k) => {
                write!(f, "tensor map kind {k} is unknown; use 0 (tiled) or 1 (im2col)")
            }
            TensorMapError::Enum { field, value, max } => {
                write!(f, "tensor map {field} {value} is not a CUDA value (0..={max})")
            }
            TensorMapError::Rank { rank, min } => write!(
                f,
                "tensor map rank {rank} must be {min}..={MAX_TENSOR_RANK} for this kind and interleave"
            ),
            TensorMapError::Address { addr, align } => write!(
                f,
                "tensor map global address {addr:#x} must be a non-zero multiple of {align}"
            ),
            TensorMapError::Entry {
                field,
                index,
                value,
                rule,
            } => write!(f, "tensor map {field}[{index}] = {value}: {rule}"),
            TensorMapError::Unused { field, index } => write!(
                f,
                "tensor map {field}[{index}] must be 0 (past the rank, or not used by this kind)"
            ),
            TensorMapError::Combination(why) => write!(f, "tensor map: {why}"),
        }
    }
}

/// `CUtensorMapDataType` values the checks name.
mod data_type {
    pub const FLOAT16: u32 = 6;
    pub const TFLOAT32_FTZ: u32 = 12;
    pub const U4_ALIGN8B: u32 = 13;
    pub const U4_ALIGN16B: u32 = 14;
    pub const U6_ALIGN16B: u32 = 15;
}
const MAX_DATA_TYPE: u32 = data_type::U6_ALIGN16B;
const INTERLEAVE_NONE: u32 = 0;
const INTERLEAVE_32B: u32 = 2;
const SWIZZLE_NONE: u32 = 0;
const SWIZZLE_32B: u32 = 1;
const SWIZZLE_128B: u32 = 3;
const SWIZZLE_128B_ATOM_32B: u32 = 4;
const SWIZZLE_128B_ATOM_64B: u32 = 6;
/// The largest global dimension (CUDA 12 documents 2^32; CUDA 13 2^31, which its driver
/// checks itself).
const MAX_GLOBAL_DIM: u64 = 1 << 32;
const MAX_STRIDE: u64 = 1 << 40;

/// Bits one element of `data_type` takes in memory (the packed types: their share of a
/// 16-value chunk, gaps included).
fn element_bits(data_type: u32) -> u64 {
    match data_type {
        0 => 8,
        1 | 6 | 9 => 16,
        4 | 5 | 8 => 64,
        data_type::U4_ALIGN8B => 4,
        data_type::U4_ALIGN16B | data_type::U6_ALIGN16B => 8,
        _ => 32,
    }
}

fn packed(data_type: u32) -> bool {
    data_type >= data_type::U4_ALIGN8B
}

fn aligned16(data_type: u32) -> bool {
    matches!(data_type, data_type::U4_ALIGN16B | data_type::U6_ALIGN16B)
}

/// Bytes of the swizzle span, when swizzled.
fn swizzle_span(swizzle: u32) -> Option<u64> {
    match swizzle {
        SWIZZLE_NONE => None,
        1 => Some(32),
        2 => Some(64),
        _ => Some(128),
    }
}

fn entry(field: &'static str, index: usize, value: i64, rule: &'static str) -> TensorMapError {
    TensorMapError::Entry {
        field,
        index,
        value,
        rule,
    }
}

/// Checks that every entry of `values` from `from` on is 0.
fn zero_from<T: Copy + Into<i64>>(
    field: &'static str,
    values: &[T],
    from: usize,
) -> Result<(), TensorMapError> {
    match values
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, v)| (**v).into() != 0)
    {
        Some((index, _)) => Err(TensorMapError::Unused { field, index }),
        None => Ok(()),
    }
}

impl TensorMapArgs {
    /// Checks every field as the CUDA driver documents its parameters (ranges, alignments,
    /// the combinations it names), and that entries past the rank and the other kind's
    /// fields are 0. The GPU's driver may refuse more (its own checks of the strides
    /// against the dimensions, the box's area).
    pub fn check(&self) -> Result<(), TensorMapError> {
        if self.flags != 0 {
            return Err(TensorMapError::Flags(self.flags));
        }
        let im2col = match self.kind {
            tensor_map_kind::TILED => false,
            tensor_map_kind::IM2COL => true,
            k => return Err(TensorMapError::Kind(k)),
        };
        for (field, value, max) in [
            ("data type", self.data_type, MAX_DATA_TYPE),
            ("interleave", self.interleave, INTERLEAVE_32B),
            ("swizzle", self.swizzle, SWIZZLE_128B_ATOM_64B),
            ("L2 promotion", self.l2_promotion, 3),
            ("OOB fill", self.oob_fill, 1),
        ] {
            if value > max {
                return Err(TensorMapError::Enum { field, value, max });
            }
        }
        let min = if im2col || self.interleave != INTERLEAVE_NONE {
            3
        } else {
            1
        };
        if self.rank < min || self.rank > MAX_TENSOR_RANK {
            return Err(TensorMapError::Rank {
                rank: self.rank,
                min,
            });
        }
        let rank = self.rank as usize;
        self.check_combinations()?;
        let align = if self.interleave == INTERLEAVE_32B || aligned16(self.data_type) {
            32
        } else {
            16
        };
        if self.global_address == 0 || self.global_address % align != 0 {
            return Err(TensorMapError::Address {
                addr: self.global_address,
                align,
            });
        }
        self.check_global(rank, align)?;
        for (i, &s) in self.element_strides.iter().enumerate().take(rank) {
            if !(1..=8).contains(&s) {
                return Err(entry("element strides", i, s.into(), "must be 1..=8"));
            }
        }
        zero_from("element strides", &self.element_strides, rank)?;
        if im2col {
            self.check_im2col(rank)
        } else {
            self.check_tiled(rank)
        }
    }

    /// The pairings the driver's documentation requires.
    fn check_combinations(&self) -> Result<(), TensorMapError> {
        if self.interleave == INTERLEAVE_32B && self.swizzle != SWIZZLE_32B {
            return Err(TensorMapError::Combination(
                "interleave 32B needs swizzle 32B",
            ));
        }
        if self.data_type == data_type::U6_ALIGN16B && self.interleave != INTERLEAVE_NONE {
            return Err(TensorMapError::Combination(
                "data type 16U6_ALIGN16B needs interleave NONE",
            ));
        }
        let swizzles_of_packed = [SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_128B_ATOM_32B];
        let swizzle_ok = match self.data_type {
            data_type::U6_ALIGN16B => {
                swizzles_of_packed.contains(&self.swizzle) || self.swizzle == SWIZZLE_128B_ATOM_64B
            }
            data_type::U4_ALIGN16B => swizzles_of_packed.contains(&self.swizzle),
            _ => true,
        };
        if !swizzle_ok {
            return Err(TensorMapError::Combination(
                "this packed data type takes swizzle NONE, 128B or 128B_ATOM_32B (16U6 also 128B_ATOM_64B)",
            ));
        }
        let float = (data_type::FLOAT16..=data_type::TFLOAT32_FTZ).contains(&self.data_type);
        if self.oob_fill != 0 && !float {
            return Err(TensorMapError::Combination(
                "OOB fill NAN_REQUEST_ZERO_FMA needs a floating-point data type",
            ));
        }
        Ok(())
    }

    /// Global dimensions and strides.
    fn check_global(&self, rank: usize, align: u64) -> Result<(), TensorMapError> {
        for (i, &d) in self.global_dim.iter().enumerate().take(rank) {
            if d == 0 || d > MAX_GLOBAL_DIM {
                return Err(entry("global dims", i, d as i64, "must be 1..=2^32"));
            }
        }
        zero_from("global dims", &self.global_dim.map(|d| d as i64), rank)?;
        let d0 = self.global_dim[0];
        if aligned16(self.data_type) && d0 % 128 != 0 {
            return Err(entry(
                "global dims",
                0,
                d0 as i64,
                "must be a multiple of 128 for this packed data type",
            ));
        }
        if self.data_type == data_type::U4_ALIGN8B && d0 % 2 != 0 {
            return Err(entry(
                "global dims",
                0,
                d0 as i64,
                "must be even for 16U4_ALIGN8B",
            ));
        }
        let strides = rank - 1;
        for (i, &s) in self.global_strides.iter().enumerate().take(strides) {
            if s % 16 != 0 || s >= MAX_STRIDE {
                return Err(entry(
                    "global strides",
                    i,
                    s as i64,
                    "must be a multiple of 16 below 2^40",
                ));
            }
            if s % align != 0 {
                return Err(entry(
                    "global strides",
                    i,
                    s as i64,
                    "must be a multiple of 32 with interleave 32B or a 16-byte-aligned packed type",
                ));
            }
        }
        zero_from(
            "global strides",
            &self.global_strides.map(|s| s as i64),
            strides,
        )
    }

    /// The box of a tiled map.
    fn check_tiled(&self, rank: usize) -> Result<(), TensorMapError> {
        for (i, &b) in self.box_dim.iter().enumerate().take(rank) {
            if !(1..=256).contains(&b) {
                return Err(entry("box dims", i, b.into(), "must be 1..=256"));
            }
        }
        zero_from("box dims", &self.box_dim, rank)?;
        zero_from("pixel box lower corner", &self.pixel_box_lower, 0)?;
        zero_from("pixel box upper corner", &self.pixel_box_upper, 0)?;
        zero_from(
            "channels/pixels per column",
            &[self.channels_per_pixel, self.pixels_per_column],
            0,
        )?;
        let b0 = self.box_dim[0];
        if aligned16(self.data_type) && b0 != 128 {
            return Err(entry(
                "box dims",
                0,
                b0.into(),
                "must be 128 for this packed data type",
            ));
        }
        if self.interleave == INTERLEAVE_NONE && !packed(self.data_type) {
            let inner = u64::from(b0) * element_bits(self.data_type) / 8;
            if inner % 16 != 0 {
                return Err(entry(
                    "box dims",
                    0,
                    b0.into(),
                    "times the element size must be a multiple of 16 bytes",
                ));
            }
            self.check_span(inner)?;
        }
        Ok(())
    }

    /// The pixel box of an im2col map.
    fn check_im2col(&self, rank: usize) -> Result<(), TensorMapError> {
        zero_from("box dims", &self.box_dim, 0)?;
        let spatial = rank - 2;
        let (lo, hi, rule) = match rank {
            3 => (-32768, 32767, "must be -32768..=32767 for rank 3"),
            4 => (-128, 127, "must be -128..=127 for rank 4"),
            _ => (-16, 15, "must be -16..=15 for rank 5"),
        };
        for (field, corner) in [
            ("pixel box lower corner", &self.pixel_box_lower),
            ("pixel box upper corner", &self.pixel_box_upper),
        ] {
            for (i, &c) in corner.iter().enumerate().take(spatial) {
                if c < lo || c > hi {
                    return Err(entry(field, i, c.into(), rule));
                }
            }
            zero_from(field, corner, spatial)?;
        }
        let c = self.channels_per_pixel;
        if !(1..=256).contains(&c) {
            return Err(entry("channels per pixel", 0, c.into(), "must be 1..=256"));
        }
        if aligned16(self.data_type) && c != 128 {
            return Err(entry(
                "channels per pixel",
                0,
                c.into(),
                "must be 128 for this packed data type",
            ));
        }
        let p = self.pixels_per_column;
        if !(1..=1024).contains(&p) {
            return Err(entry("pixels per column", 0, p.into(), "must be 1..=1024"));
        }
        if self.interleave == INTERLEAVE_NONE && !packed(self.data_type) {
            self.check_span(u64::from(c) * element_bits(self.data_type) / 8)?;
        }
        Ok(())
    }

    /// A swizzled box's inner dimension fits the swizzle span.
    fn check_span(&self, inner: u64) -> Result<(), TensorMapError> {
        match swizzle_span(self.swizzle) {
            Some(span) if inner > span => Err(TensorMapError::Combination(
                "the box's inner dimension in bytes exceeds the swizzle span (32, 64 or 128 bytes)",
            )),
            _ => Ok(()),
        }
    }

    /// Bytes from `global_address` to the end of the tensor's last element (the range
    /// that must lie inside one allocation); `None` when it does not fit in 64 bits. Any
    /// parameters give an answer; only checked ones give a meaningful one.
    pub fn extent(&self) -> Option<u64> {
        let rank = (self.rank as usize).clamp(1, MAX_TENSOR_RANK as usize);
        let row_bits = u128::from(self.global_dim[0]) * u128::from(element_bits(self.data_type));
        // An interleaved layout's innermost run is a whole 16 or 32-byte chunk.
        let row = row_bits.div_ceil(8).max(match self.interleave {
            INTERLEAVE_NONE => 0,
            INTERLEAVE_32B => 32,
            _ => 16,
        });
        let mut end = row;
        for (dim, stride) in self.global_dim[1..rank]
            .iter()
            .zip(&self.global_strides[..rank - 1])
        {
            // Each term is below 2^128; the sum is checked.
            let span = u128::from(dim.saturating_sub(1)) * u128::from(*stride);
            end = end.checked_add(span)?;
        }
        u64::try_from(end).ok()
    }
}
