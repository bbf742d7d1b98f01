//! `LAUNCH`: fixed arguments, then `arg_count` kernel arguments, then `dep_count`
//! dependency task ids, then (since 1.2) the parameter blob holding the bytes of the
//! `BLOB` arguments, all in the header descriptor.

use crate::wire::{wire_struct, WireError, Writer};
use crate::{Opcode, RequestHeader};

/// Most kernel arguments one launch may carry.
pub const MAX_KERNEL_ARGS: u32 = 32;
/// Most task-graph dependencies one launch may name.
pub const MAX_DEPS: u32 = 16;
/// Most threads in one block (x * y * z).
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;
/// Largest dynamic shared memory per block, in bytes.
pub const MAX_SHARED_BYTES: u32 = 227 * 1024;

wire_struct! {
    /// The fixed part of `LAUNCH`'s arguments.
    ///
    /// result[0] of the response = the kernel's device time in nanoseconds.
    pub struct LaunchArgs, size 56 {
        /// Function handle from `GET_FUNCTION`.
        pub function: u64,
        /// Grid size in blocks (each >= 1).
        pub grid: [u32; 3],
        /// Block size in threads (each >= 1, product <= `MAX_THREADS_PER_BLOCK`).
        pub block: [u32; 3],
        /// Dynamic shared memory per block in bytes.
        pub shared_bytes: u32,
        /// Number of [`KernelArg`]s that follow, <= `MAX_KERNEL_ARGS`.
        pub arg_count: u32,
        /// Task-graph node id of this launch, unique among the vGPU's live launches;
        /// 0 = not part of a declared task graph.
        pub task_id: u32,
        /// Priority rank, e.g. the HEFT upward rank of the node (larger = more critical
        /// path behind it); 0 = none. Used to map queues onto hardware slots.
        pub rank: u32,
        /// Number of dependency task ids (u32 each) after the kernel arguments.
        pub dep_count: u32,
        /// 0, or a thread block cluster ([`LaunchArgs::cluster`]). Since 1.4.
        pub flags: u32,
    }
}

/// `LaunchArgs::flags` bit: the launch runs in thread block clusters, whose x, y and z
/// sizes in blocks are bits 8-15, 16-23 and 24-31 of the flags. Needs
/// `features::CLUSTERS`. Since 1.4.
pub const LAUNCH_CLUSTER: u32 = 1;
/// Most blocks in one thread block cluster (the GPU's non-portable limit; 8 is portable).
pub const MAX_CLUSTER_BLOCKS: u32 = 16;

/// Why a launch's cluster is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterError {
    /// Flag bits other than `LAUNCH_CLUSTER` and its sizes.
    Flags(u32),
    /// A cluster size of 0, or more than `MAX_CLUSTER_BLOCKS` blocks.
    Size([u32; 3]),
    /// The grid is not a whole number of clusters.
    Grid {
        /// The launch's grid.
        grid: [u32; 3],
        /// Its cluster.
        cluster: [u32; 3],
    },
}

impl core::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ClusterError::Flags(v) => write!(
                f,
                "launch flags {v:#x}: only LAUNCH_CLUSTER (bit 0) with the cluster's sizes in bits 8-31 is defined"
            ),
            ClusterError::Size(c) => write!(
                f,
                "cluster {c:?}: each size must be at least 1 and the cluster at most {MAX_CLUSTER_BLOCKS} blocks"
            ),
            ClusterError::Grid { grid, cluster } => write!(
                f,
                "grid {grid:?} is not a multiple of the cluster {cluster:?} in every dimension"
            ),
        }
    }
}

impl LaunchArgs {
    /// The launch's thread block cluster in blocks: `[1, 1, 1]` when the flags are 0.
    pub fn cluster(&self) -> Result<[u32; 3], ClusterError> {
        if self.flags == 0 {
            return Ok([1, 1, 1]);
        }
        if self.flags & 0xff != LAUNCH_CLUSTER {
            return Err(ClusterError::Flags(self.flags));
        }
        let c = [
            (self.flags >> 8) & 0xff,
            (self.flags >> 16) & 0xff,
            self.flags >> 24,
        ];
        let blocks = c.iter().map(|&x| u64::from(x)).product::<u64>();
        if c.contains(&0) || blocks > u64::from(MAX_CLUSTER_BLOCKS) {
            return Err(ClusterError::Size(c));
        }
        if self.grid.iter().zip(c).any(|(&g, x)| g % x != 0) {
            return Err(ClusterError::Grid {
                grid: self.grid,
                cluster: c,
            });
        }
        Ok(c)
    }

    /// The flags of a launch in clusters of `cluster` blocks (0 for `[1, 1, 1]`); sizes
    /// above 255 cannot be written and are refused by [`LaunchArgs::cluster`] anyway.
    pub fn cluster_flags(cluster: [u32; 3]) -> u32 {
        if cluster == [1, 1, 1] {
            return 0;
        }
        let [x, y, z] = cluster.map(|v| v.min(255));
        LAUNCH_CLUSTER | x << 8 | y << 16 | z << 24
    }
}

/// `KernelArg::kind` values.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgKind {
    /// 32-bit integer in the low half of `value`.
    U32 = 1,
    /// 64-bit integer.
    U64 = 2,
    /// IEEE f32 bits in the low half of `value`.
    F32 = 3,
    /// IEEE f64 bits.
    F64 = 4,
    /// A device address; `access` says what the kernel may do through it.
    Ptr = 5,
    /// Raw bytes of a by-value parameter of 1 to 8 bytes (a 16-bit value, a small
    /// struct): `access` holds the byte count, `value` the bytes in order (little end
    /// first), the bits above them 0. Since 1.1 (`features::PARAM_LAYOUT`).
    Bytes = 6,
    /// A by-value parameter of any size up to [`MAX_PARAM_BLOB_BYTES`] (a struct, an
    /// array of floats): `access` holds the byte count, `value` the offset of its bytes in
    /// the parameter blob that follows the dependency ids. Since 1.2
    /// (`features::PARAM_BLOBS`).
    Blob = 7,
}

/// Most bytes one [`ArgKind::Bytes`] argument carries.
pub const MAX_ARG_BYTES: u32 = 8;

/// Most bytes of a launch's parameter blob, all [`ArgKind::Blob`] arguments together (the
/// classic CUDA limit of a kernel's parameters).
pub const MAX_PARAM_BLOB_BYTES: u32 = 4096;

impl ArgKind {
    /// The kind with this wire value, if any.
    pub fn from_u32(v: u32) -> Option<ArgKind> {
        [
            ArgKind::U32,
            ArgKind::U64,
            ArgKind::F32,
            ArgKind::F64,
            ArgKind::Ptr,
            ArgKind::Bytes,
            ArgKind::Blob,
        ]
        .into_iter()
        .find(|k| *k as u32 == v)
    }
}

/// How a kernel may use a pointer argument. The host relies on it: memory reachable only
/// through READ pointers is never considered dirtied by the launch (swap, pre-copy
/// migration), and a kernel that writes through a READ pointer is a guest bug whose
/// writes may be lost.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The kernel only reads through the pointer.
    Read = 1,
    /// The kernel only writes through the pointer.
    Write = 2,
    /// The kernel reads and writes through the pointer.
    ReadWrite = 3,
}

impl Access {
    /// The access mode with this wire value, if any.
    pub fn from_u32(v: u32) -> Option<Access> {
        [Access::Read, Access::Write, Access::ReadWrite]
            .into_iter()
            .find(|a| *a as u32 == v)
    }

    /// True if the kernel may read.
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// True if the kernel may write.
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }

    /// True if every use `needed` allows is also allowed by `self`.
    pub fn covers(self, needed: Access) -> bool {
        (!needed.reads() || self.reads()) && (!needed.writes() || self.writes())
    }
}

wire_struct! {
    /// One kernel argument on the wire.
    pub struct KernelArg, size 16 {
        /// An [`ArgKind`] value.
        pub kind: u32,
        /// For `Ptr`: an [`Access`] value. For values: 0.
        pub access: u32,
        /// The value's little-endian bits (u32/f32 in the low 32 bits, high bits 0), or
        /// the device address.
        pub value: u64,
    }
}

impl KernelArg {
    /// A u32 value.
    pub fn u32(v: u32) -> Self {
        Self {
            kind: ArgKind::U32 as u32,
            access: 0,
            value: u64::from(v),
        }
    }
    /// A u64 value.
    pub fn u64(v: u64) -> Self {
        Self {
            kind: ArgKind::U64 as u32,
            access: 0,
            value: v,
        }
    }
    /// An f32 value.
    pub fn f32(v: f32) -> Self {
        Self {
            kind: ArgKind::F32 as u32,
            access: 0,
            value: u64::from(v.to_bits()),
        }
    }
    /// An f64 value.
    pub fn f64(v: f64) -> Self {
        Self {
            kind: ArgKind::F64 as u32,
            access: 0,
            value: v.to_bits(),
        }
    }
    /// A device pointer with its access mode.
    pub fn ptr(addr: u64, access: Access) -> Self {
        Self {
            kind: ArgKind::Ptr as u32,
            access: access as u32,
            value: addr,
        }
    }

    /// Raw bytes of a by-value parameter (1..=`MAX_ARG_BYTES` of them), or None.
    pub fn bytes(b: &[u8]) -> Option<Self> {
        if b.is_empty() || b.len() > MAX_ARG_BYTES as usize {
            return None;
        }
        let mut w = [0u8; 8];
        w.get_mut(..b.len())?.copy_from_slice(b);
        Some(Self {
            kind: ArgKind::Bytes as u32,
            access: b.len() as u32,
            value: u64::from_le_bytes(w),
        })
    }

    /// A by-value parameter of `len` bytes (1..=`MAX_PARAM_BLOB_BYTES`) at `offset` of
    /// the launch's parameter blob, or None.
    pub fn blob(offset: u32, len: u32) -> Option<Self> {
        (1..=MAX_PARAM_BLOB_BYTES).contains(&len).then_some(Self {
            kind: ArgKind::Blob as u32,
            access: len,
            value: u64::from(offset),
        })
    }

    /// The checked, typed form of this argument. A `Blob` argument is checked against
    /// the request's parameter blob by [`LaunchRequest::check_blobs`](crate::LaunchRequest::check_blobs).
    pub fn typed(&self) -> Result<ArgValue, ArgError> {
        let kind = ArgKind::from_u32(self.kind).ok_or(ArgError::UnknownKind(self.kind))?;
        // `access` is the access mode of a pointer and the byte count of raw bytes.
        if !matches!(kind, ArgKind::Ptr | ArgKind::Bytes | ArgKind::Blob) && self.access != 0 {
            return Err(ArgError::AccessOnValue);
        }
        let low = u32::try_from(self.value);
        Ok(match kind {
            ArgKind::U32 => ArgValue::U32(low.map_err(|_| ArgError::HighBitsSet)?),
            ArgKind::U64 => ArgValue::U64(self.value),
            ArgKind::F32 => ArgValue::F32(f32::from_bits(low.map_err(|_| ArgError::HighBitsSet)?)),
            ArgKind::F64 => ArgValue::F64(f64::from_bits(self.value)),
            ArgKind::Ptr => ArgValue::Ptr {
                addr: self.value,
                access: Access::from_u32(self.access)
                    .ok_or(ArgError::UnknownAccess(self.access))?,
            },
            ArgKind::Bytes => {
                let len = u8::try_from(self.access)
                    .ok()
                    .filter(|n| (1..=MAX_ARG_BYTES as u8).contains(n))
                    .ok_or(ArgError::BadByteCount(self.access))?;
                if len < 8 && self.value >> (u32::from(len) * 8) != 0 {
                    return Err(ArgError::HighBitsSet);
                }
                ArgValue::Bytes {
                    len,
                    bits: self.value,
                }
            }
            ArgKind::Blob => {
                if !(1..=MAX_PARAM_BLOB_BYTES).contains(&self.access) {
                    return Err(ArgError::BadBlobLength(self.access));
                }
                let offset = u32::try_from(self.value)
                    .ok()
                    .filter(|o| *o < MAX_PARAM_BLOB_BYTES)
                    .ok_or(ArgError::BlobOutside {
                        offset: self.value,
                        len: self.access,
                    })?;
                ArgValue::Blob {
                    offset,
                    len: self.access,
                }
            }
        })
    }
}

/// A decoded kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    /// 32-bit integer.
    U32(u32),
    /// 64-bit integer.
    U64(u64),
    /// f32.
    F32(f32),
    /// f64.
    F64(f64),
    /// Device pointer.
    Ptr {
        /// Device address.
        addr: u64,
        /// Declared access.
        access: Access,
    },
    /// Raw bytes of a by-value parameter.
    Bytes {
        /// Byte count, 1..=`MAX_ARG_BYTES`.
        len: u8,
        /// The bytes, little end first; the bits above them are 0.
        bits: u64,
    },
    /// A by-value parameter whose bytes lie in the launch's parameter blob.
    Blob {
        /// Offset of the bytes in the parameter blob.
        offset: u32,
        /// Byte count, 1..=`MAX_PARAM_BLOB_BYTES`.
        len: u32,
    },
}

impl ArgValue {
    /// The kind of this value.
    pub fn kind(&self) -> ArgKind {
        match self {
            ArgValue::U32(_) => ArgKind::U32,
            ArgValue::U64(_) => ArgKind::U64,
            ArgValue::F32(_) => ArgKind::F32,
            ArgValue::F64(_) => ArgKind::F64,
            ArgValue::Ptr { .. } => ArgKind::Ptr,
            ArgValue::Bytes { .. } => ArgKind::Bytes,
            ArgValue::Blob { .. } => ArgKind::Blob,
        }
    }
}

/// Why a [`KernelArg`] is malformed (the device answers `BadArgType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// `kind` is not an [`ArgKind`].
    UnknownKind(u32),
    /// `access` on a pointer is not an [`Access`].
    UnknownAccess(u32),
    /// A value argument has a non-zero `access`.
    AccessOnValue,
    /// A 32-bit value (or a `Bytes` argument) has bits set above its size.
    HighBitsSet,
    /// A `Bytes` argument's byte count is not 1..=`MAX_ARG_BYTES`.
    BadByteCount(u32),
    /// A `Blob` argument's byte count is not 1..=`MAX_PARAM_BLOB_BYTES`.
    BadBlobLength(u32),
    /// A `Blob` argument's bytes do not lie inside the request's parameter blob.
    BlobOutside {
        /// The offset it names.
        offset: u64,
        /// Its byte count.
        len: u32,
    },
    /// The `Blob` arguments of one launch add up to more than `MAX_PARAM_BLOB_BYTES`.
    BlobsTooLarge(u64),
    /// A `Blob` argument's byte count differs from its parameter's size.
    BlobSizeMismatch {
        /// The argument's byte count.
        len: u32,
        /// The parameter's size in the function's layout.
        param: u32,
    },
}

impl core::fmt::Display for ArgError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ArgError::UnknownKind(k) => write!(
                f,
                "argument kind {k} is unknown; use 1..=7 (U32, U64, F32, F64, PTR, BYTES, BLOB)"
            ),
            ArgError::UnknownAccess(a) => write!(
                f,
                "pointer access {a} is unknown; use 1 READ, 2 WRITE or 3 READ_WRITE"
            ),
            ArgError::AccessOnValue => {
                f.write_str("a value argument carries an access mode; set access to 0")
            }
            ArgError::HighBitsSet => f.write_str(
                "an argument has bits set above its size (32 bits, or a BYTES argument's count); zero them",
            ),
            ArgError::BadByteCount(n) => write!(
                f,
                "a BYTES argument carries {n} bytes; use 1..={MAX_ARG_BYTES}"
            ),
            ArgError::BadBlobLength(n) => write!(
                f,
                "a BLOB argument carries {n} bytes; use 1..={MAX_PARAM_BLOB_BYTES}"
            ),
            ArgError::BlobOutside { offset, len } => write!(
                f,
                "a BLOB argument's {len} bytes at offset {offset} lie outside the parameter blob after the dependency ids"
            ),
            ArgError::BlobsTooLarge(n) => write!(
                f,
                "the BLOB arguments add up to {n} bytes; at most {MAX_PARAM_BLOB_BYTES}"
            ),
            ArgError::BlobSizeMismatch { len, param } => write!(
                f,
                "a BLOB argument carries {len} bytes for a parameter of {param} bytes; pass exactly the parameter's bytes"
            ),
        }
    }
}

/// The kernel arguments of a decoded `LAUNCH`, read lazily from the request bytes.
#[derive(Clone, Copy, Debug)]
pub struct KernelArgs<'a> {
    bytes: &'a [u8],
}

impl<'a> KernelArgs<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.bytes.len() / KernelArg::SIZE
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Argument `i`, if present.
    pub fn get(&self, i: usize) -> Option<KernelArg> {
        let start = i.checked_mul(KernelArg::SIZE)?;
        let end = start.checked_add(KernelArg::SIZE)?;
        KernelArg::decode(self.bytes.get(start..end)?).ok()
    }

    /// All arguments in order.
    pub fn iter(&self) -> impl Iterator<Item = KernelArg> + 'a {
        self.bytes
            .chunks_exact(KernelArg::SIZE)
            .filter_map(|c| KernelArg::decode(c).ok())
    }
}

/// The dependency task ids of a decoded `LAUNCH`.
#[derive(Clone, Copy, Debug)]
pub struct Deps<'a> {
    bytes: &'a [u8],
}

impl<'a> Deps<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// Number of dependencies.
    pub fn len(&self) -> usize {
        self.bytes.len() / 4
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The task ids in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.bytes.chunks_exact(4).map(|c| {
            let mut a = [0u8; 4];
            a.copy_from_slice(c);
            u32::from_le_bytes(a)
        })
    }
}

/// Bytes a `LAUNCH` header descriptor needs for `args` kernel arguments and `deps`
/// dependencies (header included).
pub const fn launch_request_len(args: usize, deps: usize) -> usize {
    RequestHeader::SIZE + LaunchArgs::SIZE + args * KernelArg::SIZE + deps * 4
}

/// Writes a complete `LAUNCH` header descriptor (header, fixed args, kernel args, deps)
/// into `out`, setting `arg_count`/`dep_count` from the slices. Returns the bytes written.
pub fn encode_launch(
    out: &mut [u8],
    id: u64,
    launch: &LaunchArgs,
    args: &[KernelArg],
    deps: &[u32],
) -> Result<usize, WireError> {
    encode_launch_with_blob(out, id, launch, args, deps, &[])
}

/// [`encode_launch`] followed by the parameter blob the `Blob` arguments point into (at
/// most `MAX_PARAM_BLOB_BYTES`; empty when there are none). Since 1.2.
pub fn encode_launch_with_blob(
    out: &mut [u8],
    id: u64,
    launch: &LaunchArgs,
    args: &[KernelArg],
    deps: &[u32],
    blob: &[u8],
) -> Result<usize, WireError> {
    let needed = RequestHeader::SIZE
        .saturating_add(LaunchArgs::SIZE)
        .saturating_add(args.len().saturating_mul(KernelArg::SIZE))
        .saturating_add(deps.len().saturating_mul(4))
        .saturating_add(blob.len());
    if out.len() < needed {
        return Err(WireError::Short {
            needed,
            available: out.len(),
        });
    }
    let mut w = Writer::new(out);
    let header = RequestHeader {
        opcode: Opcode::Launch as u32,
        flags: 0,
        id,
    };
    w.bytes(&header.to_bytes())?;
    let fixed = LaunchArgs {
        arg_count: u32::try_from(args.len()).unwrap_or(u32::MAX),
        dep_count: u32::try_from(deps.len()).unwrap_or(u32::MAX),
        ..*launch
    };
    w.bytes(&fixed.to_bytes())?;
    for a in args {
        w.bytes(&a.to_bytes())?;
    }
    for d in deps {
        w.bytes(&d.to_le_bytes())?;
    }
    w.bytes(blob)?;
    Ok(w.pos())
}
