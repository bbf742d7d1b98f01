//! The built-in kernels of module `"builtin"`: names and parameter lists, shared by the
//! guest (to build launches) and every backend (to check them).
//!
//! All element types are 32-bit little endian (f32 or u32) except `checksum`, which reads
//! bytes and writes one u64. Pointers must be aligned to their element size.

use crate::launch::{Access, ArgKind};

/// What a built-in kernel parameter accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// A device pointer whose declared access must cover this access.
    Ptr(Access),
    /// An element count or size: a `U32` or `U64` argument.
    Int,
    /// An `F32` argument.
    F32,
    /// A 32-bit pattern: a `U32` or `F32` argument (its bits are used).
    Word32,
}

impl Param {
    /// True if an argument of `kind` may be passed for this parameter (pointer access is
    /// checked separately with [`Access::covers`]).
    pub fn accepts(self, kind: ArgKind) -> bool {
        match self {
            Param::Ptr(_) => kind == ArgKind::Ptr,
            Param::Int => matches!(kind, ArgKind::U32 | ArgKind::U64),
            Param::F32 => kind == ArgKind::F32,
            Param::Word32 => matches!(kind, ArgKind::U32 | ArgKind::F32),
        }
    }
}

/// One built-in kernel.
#[derive(Clone, Copy, Debug)]
pub struct KernelSig {
    /// The name `GET_FUNCTION` takes.
    pub name: &'static str,
    /// Parameters in order: (name, kind).
    pub params: &'static [(&'static str, Param)],
    /// What it computes.
    pub doc: &'static str,
}

const R: Param = Param::Ptr(Access::Read);
const W: Param = Param::Ptr(Access::Write);
const RW: Param = Param::Ptr(Access::ReadWrite);

/// `c[i] = a[i] + b[i]` for `i < n` (f32).
pub const VECTOR_ADD: KernelSig = KernelSig {
    name: "vector_add",
    params: &[("a", R), ("b", R), ("c", W), ("n", Param::Int)],
    doc: "c[i] = a[i] + b[i] for i < n (f32)",
};
/// `y[i] = alpha * x[i] + y[i]` for `i < n` (f32).
pub const SAXPY: KernelSig = KernelSig {
    name: "saxpy",
    params: &[
        ("alpha", Param::F32),
        ("x", R),
        ("y", RW),
        ("n", Param::Int),
    ],
    doc: "y[i] = alpha * x[i] + y[i] for i < n (f32, one rounding per multiply and add)",
};
/// `dst[i] = value` for `i < n` (32-bit words).
pub const FILL: KernelSig = KernelSig {
    name: "fill",
    params: &[("dst", W), ("value", Param::Word32), ("n", Param::Int)],
    doc: "dst[i] = value for i < n (32-bit words)",
};
/// `out[0] = sum(x[0..n])` (f32 in, f64 accumulation, f32 out).
pub const REDUCE_SUM: KernelSig = KernelSig {
    name: "reduce_sum",
    params: &[("x", R), ("out", W), ("n", Param::Int)],
    doc: "out[0] = sum of x[i] for i < n: each block of 65536 elements is summed in order \
          in f64, the block sums are added in order in f64, the total is rounded to f32",
};
/// `c = a * b`, row-major f32, `a` is m x k, `b` is k x n, `c` is m x n.
pub const MATMUL: KernelSig = KernelSig {
    name: "matmul",
    params: &[
        ("a", R),
        ("b", R),
        ("c", W),
        ("m", Param::Int),
        ("n", Param::Int),
        ("k", Param::Int),
    ],
    doc: "c[i][j] = sum over l < k of a[i][l] * b[l][j] (row-major f32, accumulated in f32 \
          in order of l); a is m x k, b is k x n, c is m x n",
};
/// `dst[i] = src[idx[i]]` for `i < n` (32-bit words); an index >= `src_len` faults.
pub const GATHER: KernelSig = KernelSig {
    name: "gather",
    params: &[
        ("src", R),
        ("idx", R),
        ("dst", W),
        ("n", Param::Int),
        ("src_len", Param::Int),
    ],
    doc: "dst[i] = src[idx[i]] for i < n (32-bit words, u32 indices); an index >= src_len \
          stops the kernel with KERNEL_FAULT (dst may be partly written)",
};
/// Busy for `duration_us` microseconds of device time.
pub const SPIN: KernelSig = KernelSig {
    name: "spin",
    params: &[("duration_us", Param::Int)],
    doc: "keeps one compute engine busy for duration_us microseconds at speed 1.0 \
          (duration_us / speed on a device of another speed), at most MAX_SPIN_US; \
          touches no memory",
};
/// `out[0] = FNV-1a 64 of data[0..n_bytes]`.
pub const CHECKSUM: KernelSig = KernelSig {
    name: "checksum",
    params: &[("data", R), ("n_bytes", Param::Int), ("out", W)],
    doc: "out[0] (u64) = 64-bit FNV-1a of the n_bytes bytes at data: h = 0xcbf29ce484222325; \
          for each byte: h ^= byte; h = h * 0x100000001b3 (wrapping)",
};

/// `dst[i] = A[idx[i]]` where `A` is the array of `elem_bytes`-byte elements starting at
/// byte `base` of namespace `ns`.
pub const STORAGE_GATHER: KernelSig = KernelSig {
    name: "storage_gather",
    params: &[
        ("ns", Param::Int),
        ("base", Param::Int),
        ("idx", R),
        ("dst", W),
        ("n", Param::Int),
        ("elem_bytes", Param::Int),
    ],
    doc: "dst[i] = A[idx[i]] for i < n, where A is the array of elem_bytes-byte (4 or 8) \
          little-endian elements from byte base (a multiple of elem_bytes) to the end of \
          namespace ns; idx holds u64 indices, dst elem_bytes-byte elements; an index past \
          the namespace stops the kernel with KERNEL_FAULT before any read",
};
/// `out[0] = sum of n elements` read sequentially from byte `base` of namespace `ns`.
pub const STORAGE_SCAN_SUM: KernelSig = KernelSig {
    name: "storage_scan_sum",
    params: &[
        ("ns", Param::Int),
        ("base", Param::Int),
        ("n", Param::Int),
        ("elem_bytes", Param::Int),
        ("out", W),
    ],
    doc: "out[0] (u64) = wrapping sum of the n elem_bytes-byte (4 or 8) little-endian \
          unsigned elements at byte base of namespace ns, each widened to u64; a range \
          past the namespace is INVALID_ARGUMENT",
};
/// Level-synchronous BFS over a CSR graph stored in namespace `ns`.
pub const STORAGE_BFS: KernelSig = KernelSig {
    name: "storage_bfs",
    params: &[
        ("ns", Param::Int),
        ("offsets_base", Param::Int),
        ("edges_base", Param::Int),
        ("vertices", Param::Int),
        ("edges", Param::Int),
        ("source", Param::Int),
        ("levels", W),
    ],
    doc: "BFS from source over the CSR graph in namespace ns: vertices + 1 u64 offsets at \
          byte offsets_base, edges u32 neighbour ids at byte edges_base; the neighbours of v \
          are edges[offsets[v]..offsets[v + 1]]; levels[v] (u32) = hops from source, \
          0xffffffff if unreachable; a malformed graph (offsets decreasing or past edges, a \
          neighbour >= vertices) is INVALID_ARGUMENT",
};

/// Longest `spin` a launch may ask for (10 s of device time, on the device it runs on);
/// longer is `INVALID_ARGUMENT`. Well below the guest driver's 30 s request timeout and the
/// worker's 20 s hard kernel limit, so a built-in kernel always ends and is answered; the
/// scheduler's kernel deadline (2 s by default) lets a vGPU's neighbours run meanwhile.
pub const MAX_SPIN_US: u64 = 10_000_000;

/// Every built-in kernel.
pub const KERNELS: [KernelSig; 8] = [
    VECTOR_ADD, SAXPY, FILL, REDUCE_SUM, MATMUL, GATHER, SPIN, CHECKSUM,
];

/// The storage kernels, after [`KERNELS`] in the built-in module.
pub const STORAGE_KERNELS: [KernelSig; 3] = [STORAGE_GATHER, STORAGE_SCAN_SUM, STORAGE_BFS];

/// Every kernel of the built-in module in order: [`KERNELS`], then [`STORAGE_KERNELS`].
pub fn all() -> impl Iterator<Item = &'static KernelSig> {
    KERNELS.iter().chain(STORAGE_KERNELS.iter())
}

/// The built-in kernel called `name`, if any (storage kernels included).
pub fn find(name: &[u8]) -> Option<&'static KernelSig> {
    all().find(|k| k.name.as_bytes() == name)
}

/// Whether `sig` is one of the [`STORAGE_KERNELS`].
pub fn is_storage(sig: &KernelSig) -> bool {
    STORAGE_KERNELS.iter().any(|k| k.name == sig.name)
}

/// 64-bit FNV-1a offset basis.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// 64-bit FNV-1a prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Continues a 64-bit FNV-1a hash over `bytes` (start with [`FNV_OFFSET`]); the
/// reference for the `checksum` kernel.
pub fn fnv1a64(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// A built-in kernel's parameter layout as the CUDA library passes it (docs/cuda-api.md):
/// pointers and counts 8 bytes, `f32` and 32-bit words 4, each at its natural alignment.
pub fn layout(sig: &KernelSig) -> crate::ParamLayout {
    let mut out = crate::ParamLayout::default();
    let mut at = 0u32;
    for (i, (_, p)) in sig.params.iter().enumerate() {
        let size = match p {
            Param::Ptr(_) | Param::Int => 8,
            Param::F32 | Param::Word32 => 4,
        };
        at = at.next_multiple_of(size);
        out.set(i, at, size);
        at += size;
    }
    out
}
