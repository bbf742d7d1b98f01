//! Graphs. A graph's nodes run in the order they were added or captured (api/capture.rs;
//! a node's dependencies are always added before it, so that order respects them);
//! launching an executable graph replays them on the launch's stream, each checked as
//! the call it stands for. Nodes can also be added explicitly: kernels, copies, memsets.

use std::ffi::{c_uint, c_void};

use crate::driver::{self, Driver, Res};
use crate::extra::{Graph, Op};
use crate::types::{res, CUcontext, CUresult, CUstream};

use super::capture::implicit_check;
pub(crate) use super::capture::record;
use crate::{guard, out};

pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;

/// `CUgraphInstantiate_flags` this library honours: auto-free on launch (nothing is
/// allocated by a graph), upload (nothing to upload), node priority (one queue per
/// stream).
const INSTANTIATE_AUTO_FREE: u64 = 1;
const INSTANTIATE_UPLOAD: u64 = 2;
const INSTANTIATE_DEVICE_LAUNCH: u64 = 4;
const INSTANTIATE_USE_NODE_PRIORITY: u64 = 8;

/// A new graph holding `ops`, one node each.
pub(crate) fn new_graph(d: &mut Driver, ops: Vec<Op>) -> u64 {
    let mut g = Graph::default();
    for op in ops {
        let node = d.handle();
        g.nodes.push((node, op));
    }
    let h = d.handle();
    d.extra.graphs.insert(h, g);
    h
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(pgraph: *mut CUgraph, flags: c_uint) -> CUresult {
    guard("cuGraphCreate", || {
        if pgraph.is_null() || flags != 0 {
            return Err(res::INVALID_VALUE);
        }
        let g = driver::with(|d| {
            d.current_ctx()?;
            Ok(new_graph(d, Vec::new()))
        })?;
        // SAFETY: checked non-null; a writable CUgraph from the caller.
        unsafe { out(pgraph, g as CUgraph) }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    guard("cuGraphDestroy", || {
        driver::with(|d| {
            d.extra
                .graphs
                .remove(&(g as u64))
                .map(drop)
                .ok_or(res::INVALID_VALUE)
        })
    })
}

/// Adds nodes to a graph after checking their dependencies are nodes of it; writes the
/// last node's handle.
///
/// # Safety
/// `deps` must hold `num_deps` node handles (or be NULL with 0).
pub(crate) unsafe fn add_nodes(
    d: &mut Driver,
    pnode: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    ops: Vec<Op>,
) -> Res<()> {
    if pnode.is_null() || (deps.is_null() && num_deps != 0) {
        return Err(res::INVALID_VALUE);
    }
    let graph = d.extra.graphs.get(&(g as u64)).ok_or(res::INVALID_VALUE)?;
    for i in 0..num_deps {
        // SAFETY: `deps` holds `num_deps` handles (caller's contract).
        let dep = unsafe { *deps.add(i) } as u64;
        if !graph.nodes.iter().any(|(n, _)| *n == dep) {
            return Err(res::INVALID_VALUE);
        }
    }
    // One node for the whole operation: its rows share the handle.
    let node = d.handle();
    if let Some(graph) = d.extra.graphs.get_mut(&(g as u64)) {
        graph.nodes.extend(ops.into_iter().map(|op| (node, op)));
    }
    // SAFETY: checked non-null; a writable CUgraphNode from the caller.
    unsafe { out(pnode, node as CUgraphNode) }
}

/// `CUDA_KERNEL_NODE_PARAMS` (v1).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParamsV1 {
    pub func: *mut c_void,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`: v1, then the kernel (used when `func` is NULL) and a
/// context.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub v1: KernelNodeParamsV1,
    pub kern: *mut c_void,
    pub ctx: CUcontext,
}

/// # Safety
/// `params` must be NULL or point to a readable `CUDA_KERNEL_NODE_PARAMS_v2` when `v2`,
/// else to a v1 one; `deps` as [`add_nodes`] takes it.
unsafe fn add_kernel_node(
    pnode: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *const KernelNodeParams,
    v2: bool,
) -> Res<()> {
    if params.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let (p, f) = if v2 {
        // SAFETY: a readable v2 struct (caller's contract).
        let p2 = unsafe { params.read_unaligned() };
        let f = if p2.v1.func.is_null() {
            p2.kern
        } else {
            p2.v1.func
        };
        (p2.v1, f)
    } else {
        // SAFETY: a readable v1 struct (caller's contract): only its fields are read.
        let p1 = unsafe { params.cast::<KernelNodeParamsV1>().read_unaligned() };
        (p1, p1.func)
    };
    driver::with(|d| {
        let launch =
            super::launch::prepare(d, f, p.grid, p.block, p.shared, p.kernel_params, p.extra)?;
        // SAFETY: the caller's dependency array.
        unsafe { add_nodes(d, pnode, g, deps, num_deps, vec![Op::Launch(launch)]) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    pnode: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    guard("cuGraphAddKernelNode_v2", || {
        // SAFETY: the caller's pointers, checked inside.
        unsafe { add_kernel_node(pnode, g, deps, num_deps, params, true) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    pnode: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    guard("cuGraphAddKernelNode", || {
        // SAFETY: the caller's pointers, checked inside.
        unsafe { add_kernel_node(pnode, g, deps, num_deps, params, false) }
    })
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
pub struct MemsetNodeParams {
    pub dst: u64,
    pub pitch: usize,
    pub value: c_uint,
    pub element_size: c_uint,
    pub width: usize,
    pub height: usize,
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    pnode: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *const MemsetNodeParams,
    _ctx: CUcontext,
) -> CUresult {
    guard("cuGraphAddMemsetNode", || {
        if params.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a readable CUDA_MEMSET_NODE_PARAMS from the caller.
        let p = unsafe { &*params };
        driver::with(|d| {
            d.current_ctx()?;
            let op = super::memcpy2d::memset2d_op(
                d,
                p.dst,
                p.pitch,
                p.value,
                p.width,
                p.height,
                p.element_size,
            )?;
            // SAFETY: the caller's dependency array.
            unsafe { add_nodes(d, pnode, g, deps, num_deps, vec![op]) }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    pnode: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    num_deps: usize,
    params: *const super::memcpy2d::Memcpy3d,
    _ctx: CUcontext,
) -> CUresult {
    guard("cuGraphAddMemcpyNode", || {
        if params.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a readable CUDA_MEMCPY3D from the caller.
        let p = unsafe { &*params };
        driver::with(|d| {
            d.current_ctx()?;
            let ops = super::memcpy2d::copy3d_ops(d, p)?;
            // SAFETY: the caller's dependency array.
            unsafe { add_nodes(d, pnode, g, deps, num_deps, ops) }
        })
    })
}

fn instantiate(pexec: *mut CUgraphExec, g: CUgraph, flags: u64) -> Res<()> {
    if pexec.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let known = INSTANTIATE_AUTO_FREE
        | INSTANTIATE_UPLOAD
        | INSTANTIATE_DEVICE_LAUNCH
        | INSTANTIATE_USE_NODE_PRIORITY;
    if flags & !known != 0 {
        return Err(res::INVALID_VALUE);
    }
    if flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
        crate::api::stubs::log_once("graphs launched from the device");
        return Err(res::NOT_SUPPORTED);
    }
    let e = driver::with(|d| {
        d.current_ctx()?;
        let graph = d.extra.graphs.get(&(g as u64)).ok_or(res::INVALID_VALUE)?;
        let ops: Vec<Op> = graph.nodes.iter().map(|(_, op)| op.clone()).collect();
        let h = d.handle();
        d.extra.execs.insert(h, ops);
        Ok(h)
    })?;
    // SAFETY: checked non-null; a writable CUgraphExec from the caller.
    unsafe { out(pexec, e as CUgraphExec) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    flags: u64,
) -> CUresult {
    guard("cuGraphInstantiateWithFlags", || {
        instantiate(pexec, g, flags)
    })
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub err_node_out: CUgraphNode,
    pub result_out: c_uint,
}

/// `cuGraphInstantiateWithParams`: the flags, and the outcome in the parameters
/// (`CUDA_GRAPH_INSTANTIATE_SUCCESS`, or `CUDA_GRAPH_INSTANTIATE_ERROR` for a graph this
/// library cannot instantiate). An upload stream has nothing to upload.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    params: *mut InstantiateParams,
) -> CUresult {
    guard("cuGraphInstantiateWithParams", || {
        if params.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a readable and writable CUDA_GRAPH_INSTANTIATE_PARAMS from the caller.
        let p = unsafe { &mut *params };
        let r = instantiate(pexec, g, p.flags);
        p.err_node_out = std::ptr::null_mut();
        p.result_out = if r.is_ok() { 0 } else { 1 };
        r
    })
}

/// The CUDA 11 form: error node and log buffer (nothing to report: instantiation fails
/// only on bad handles).
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut std::ffi::c_char,
    _log_size: usize,
) -> CUresult {
    guard("cuGraphInstantiate_v2", || instantiate(pexec, g, 0))
}

/// The CUDA 11 name: the same arguments as `cuGraphInstantiate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut std::ffi::c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: the same contract as cuGraphInstantiate_v2.
    unsafe { cuGraphInstantiate_v2(pexec, g, error_node, log, log_size) }
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(e: CUgraphExec) -> CUresult {
    guard("cuGraphExecDestroy", || {
        driver::with(|d| {
            d.extra
                .execs
                .remove(&(e as u64))
                .map(drop)
                .ok_or(res::INVALID_VALUE)
        })
    })
}

/// Runs one operation on stream handle `h`, as the call it was recorded from.
pub(crate) fn run(d: &mut Driver, h: usize, op: &Op) -> Res<()> {
    let s = Some(h as CUstream);
    match *op {
        Op::Htod { dst, src, len } => super::copy::htod_in(d, dst, src as *const c_void, len, s),
        Op::Dtoh { dst, src, len } => super::copy::dtoh_in(d, dst as *mut c_void, src, len, s),
        Op::Dtod { dst, src, len } => super::copy::dtod_in(d, dst, src, len, s),
        Op::Memset {
            dst,
            value,
            count,
            elem,
        } => super::copy::memset_in(d, dst, value, count, elem, s),
        Op::Memset2d {
            dst,
            pitch,
            value,
            width,
            height,
            elem,
        } => {
            for row in 0..height {
                let at = dst + (row * pitch) as u64;
                super::copy::memset_in(d, at, value, width, elem, s)?;
            }
            Ok(())
        }
        Op::Strided(ref c) => super::memcpy2d::run_strided(d, c, s),
        Op::Launch(ref p) => super::launch::submit(d, h, p),
        Op::HostFn { f, data } => super::hostfn::launch_in(d, h, f, data),
        Op::WriteValue { addr, value, wide } => {
            super::hostfn::write_value_in(d, h, addr, value, wide)
        }
    }
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(e: CUgraphExec, h: CUstream) -> CUresult {
    guard("cuGraphLaunch", || {
        driver::with(|d| {
            d.current_ctx()?;
            let hs = h as usize;
            d.stream_queue(hs)?;
            let ops = d
                .extra
                .execs
                .get(&(e as u64))
                .ok_or(res::INVALID_VALUE)?
                .clone();
            if let Some(c) = super::capture::of_stream(d, hs) {
                // A graph launched into a capture becomes part of it.
                c.ops.extend(ops);
                return Ok(());
            }
            implicit_check(d, hs)?;
            for op in &ops {
                run(d, hs, op)?;
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuGraphUpload(e: CUgraphExec, h: CUstream) -> CUresult {
    guard("cuGraphUpload", || {
        driver::with(|d| {
            d.current_ctx()?;
            d.stream_queue(h as usize)?;
            // Nothing to upload: a graph's operations are sent when it is launched.
            d.extra
                .execs
                .get(&(e as u64))
                .map(drop)
                .ok_or(res::INVALID_VALUE)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    g: CUgraph,
    nodes: *mut CUgraphNode,
    num: *mut usize,
) -> CUresult {
    guard("cuGraphGetNodes", || {
        if num.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let list = driver::with(|d| {
            let graph = d.extra.graphs.get(&(g as u64)).ok_or(res::INVALID_VALUE)?;
            let mut list: Vec<u64> = Vec::new();
            for (n, _) in &graph.nodes {
                if list.last() != Some(n) {
                    list.push(*n);
                }
            }
            Ok(list)
        })?;
        if !nodes.is_null() {
            // SAFETY: `num` is readable and writable (checked non-null).
            let room = unsafe { num.read_unaligned() };
            for (i, n) in list.iter().take(room).enumerate() {
                // SAFETY: `nodes` holds `*num` handles (API contract).
                unsafe { nodes.add(i).write_unaligned(*n as CUgraphNode) };
            }
        }
        // SAFETY: checked non-null.
        unsafe { out(num, list.len()) }
    })
}
