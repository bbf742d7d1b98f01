//! The library's objects beyond modules and streams: libraries (`cuLibrary*`), memory
//! pools and their stream-ordered allocations, stream captures, graphs and their
//! executable forms. They live in the driver (behind its one lock) as one field, so each
//! area's file under `api/` keeps its own state here.

use std::collections::HashMap;

use vgpu_proto::KernelArg;

/// A library: its image kept host-side until its first use loads it on the vGPU (lazy
/// loading; `CUDA_MODULE_LOADING=EAGER` loads it when it is created), its kernels by name.
pub struct Library {
    /// The module once loaded on the vGPU.
    pub module: Option<u64>,
    /// The image, until it is loaded.
    pub image: Option<crate::image::Image>,
    /// Why the image cannot load on this vGPU (`CUDA_ERROR_NO_BINARY_FOR_GPU`, a bad
    /// image): every use answers it.
    pub refused: Option<crate::types::CUresult>,
    /// Kernel name -> kernel handle. A `CUkernel` is the handle its function gets when
    /// the library loads, so a kernel passes to `cuLaunchKernel` as a `CUfunction`, as
    /// with the driver.
    pub kernels: HashMap<String, u64>,
}

/// A memory pool: stream-ordered allocations charged to the vGPU's share as they are
/// made. Freed memory goes back to the share at once (the pool keeps none in reserve), so
/// reserved and used memory are the same.
#[derive(Default)]
pub struct Pool {
    pub release_threshold: u64,
    /// The most the pool may hold (`maxSize`; 0: the share).
    pub max_size: u64,
    /// Bytes its allocations hold (recounted by [`crate::api::pool`] when allocations
    /// were freed another way).
    pub used: u64,
    pub used_high: u64,
    /// `CU_MEMPOOL_ATTR_REUSE_*` flags (1, 2, 3), as set; the pool reuses nothing.
    pub reuse: [i32; 3],
}

/// A launch, its parameters packed (copied from the caller's at capture time).
#[derive(Clone)]
pub struct PreparedLaunch {
    pub device_function: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    /// Thread block cluster in blocks; `[1, 1, 1]` for none.
    pub cluster: [u32; 3],
    pub args: Vec<KernelArg>,
    pub blob: Vec<u8>,
}

/// One side of a strided copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Host(usize),
    Device(u64),
}

/// A 3D copy as rows: `depth` slices of `height` rows of `width` bytes; rows `pitch`
/// bytes apart, slices `slice` bytes apart (the first row's address is the side's).
#[derive(Clone, Copy, Debug)]
pub struct Strided {
    pub src: Side,
    pub dst: Side,
    pub src_pitch: u64,
    pub dst_pitch: u64,
    pub src_slice: u64,
    pub dst_slice: u64,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `void (*)(void *)`: a host function (`cuLaunchHostFunc`).
pub type HostFn = unsafe extern "C" fn(*mut std::ffi::c_void);

/// One recorded stream operation, replayed by a graph launch on the launch's stream.
#[derive(Clone)]
pub enum Op {
    Htod {
        dst: u64,
        src: usize,
        len: usize,
    },
    Dtoh {
        dst: usize,
        src: u64,
        len: usize,
    },
    Dtod {
        dst: u64,
        src: u64,
        len: usize,
    },
    Memset {
        dst: u64,
        value: u32,
        count: usize,
        elem: u32,
    },
    /// A pitched memset: `height` rows of `width` elements, `pitch` bytes apart.
    Memset2d {
        dst: u64,
        pitch: usize,
        value: u32,
        width: usize,
        height: usize,
        elem: u32,
    },
    /// A 2D/3D copy (`cuMemcpy2D`, `cuMemcpy3D`): rows copied one by one.
    Strided(Strided),
    Launch(PreparedLaunch),
    HostFn {
        f: HostFn,
        data: usize,
    },
    WriteValue {
        addr: u64,
        value: u64,
        wide: bool,
    },
}

/// A stream capture: the stream that began it and what it and the streams that joined it
/// recorded, in the order they issued it.
pub struct Capture {
    pub id: u64,
    pub mode: u32,
    pub origin: usize,
    pub ops: Vec<Op>,
}

/// A graph: its nodes in the order they were added (each node's dependencies were added
/// before it, so this order is a topological one) or captured.
#[derive(Default)]
pub struct Graph {
    pub nodes: Vec<(u64, Op)>,
}

#[derive(Default)]
pub struct Extra {
    pub libraries: HashMap<u64, Library>,
    /// Kernels whose library is not loaded yet (or whose function was not looked up):
    /// kernel handle -> (library, name).
    pub lazy_kernels: HashMap<u64, (u64, String)>,
    pub pools: HashMap<u64, Pool>,
    /// The device's default pool, created on first use.
    pub default_pool: u64,
    /// The pool `cuMemAllocAsync` uses (0: the default pool).
    pub current_pool: u64,
    /// Stream-ordered allocations: address -> (pool, size, the allocation's id).
    pub async_allocs: HashMap<u64, (u64, u64, u64)>,
    /// Captures in progress, by id.
    pub captures: HashMap<u64, Capture>,
    /// The capture each capturing stream records into (its own or one it joined).
    pub capturing: HashMap<usize, u64>,
    /// Events recorded on a capturing stream: the capture they mark a point of.
    pub captured_events: HashMap<u64, u64>,
    pub next_capture_id: u64,
    pub graphs: HashMap<u64, Graph>,
    pub execs: HashMap<u64, Vec<Op>>,
    /// Stack, printf FIFO and heap limits as a program lowered them (`cuCtxSetLimit`).
    pub limits: [Option<u64>; 3],
    /// The built-in `fill` kernel's handle, once a small memset loaded it (`api/fill.rs`).
    pub fill_kernel: Option<u64>,
}
