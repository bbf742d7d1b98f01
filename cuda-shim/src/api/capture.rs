//! Stream capture. A captured stream records its copies, memsets, launches, host
//! functions and value writes in the library instead of running them (launch parameters
//! are copied when captured, as the driver does); `cuStreamEndCapture` makes them a graph
//! (api/graph.rs). Other streams join a capture as the driver's do: an event recorded on
//! a capturing stream marks a point of the capture, and a stream that waits for it
//! records into the same capture from then on, until the capture ends. The operations of
//! every joined stream go into one sequence in the order they were issued, which
//! respects every dependency the events expressed (stricter than the driver's graph,
//! never looser).

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{self, Driver, Res};
use crate::extra::{Capture, Op};
use crate::types::{res, CUresult, CUstream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::{guard, out};

use super::graph::{CUgraph, CUgraphNode};

/// `CUstreamCaptureMode`.
const MODE_GLOBAL: c_uint = 0;
const MODE_RELAXED: c_uint = 2;
/// `CUstreamCaptureStatus`.
const STATUS_NONE: c_int = 0;
const STATUS_ACTIVE: c_int = 1;

/// Ends the captures of destroyed streams: a joined stream leaves its capture, an origin
/// stream takes its capture with it.
fn prune(d: &mut Driver) {
    let streams = &d.streams;
    let live = |s: usize| s == CU_STREAM_PER_THREAD || streams.contains_key(&(s as u64));
    d.extra.capturing.retain(|&s, _| live(s));
    d.extra.captures.retain(|_, c| live(c.origin));
    let captures = &d.extra.captures;
    d.extra.capturing.retain(|_, id| captures.contains_key(id));
    d.extra
        .captured_events
        .retain(|_, id| captures.contains_key(id));
}

/// The capture stream handle `h` records into, if any.
pub(crate) fn of_stream(d: &mut Driver, h: usize) -> Option<&mut Capture> {
    let id = *d.extra.capturing.get(&h)?;
    d.extra.captures.get_mut(&id)
}

/// Records `op` when stream handle `h` is being captured: `Ok(true)`, the operation must
/// not run. Work on the legacy default stream while a stream is captured in global mode
/// answers `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, as with the driver.
pub(crate) fn record(d: &mut Driver, h: usize, op: impl FnOnce() -> Op) -> Res<bool> {
    if d.extra.captures.is_empty() {
        return Ok(false);
    }
    prune(d);
    if let Some(c) = of_stream(d, h) {
        c.ops.push(op());
        return Ok(true);
    }
    implicit_check(d, h)?;
    Ok(false)
}

/// `cuEventRecord` on stream `h`: on a capturing stream the event marks a point of the
/// capture instead of being recorded on the device (`true`).
pub(crate) fn record_event(d: &mut Driver, h: usize, event: u64) -> bool {
    if d.extra.captures.is_empty() {
        return false;
    }
    prune(d);
    match d.extra.capturing.get(&h) {
        Some(&id) => {
            d.extra.captured_events.insert(event, id);
            true
        }
        None => {
            // Recorded outside any capture again: no longer a point of one.
            d.extra.captured_events.remove(&event);
            false
        }
    }
}

/// `cuStreamWaitEvent` of stream `h` on an event that marks a point of a capture: the
/// stream joins the capture (`Ok(true)`: nothing to wait for now). A stream of another
/// capture answers `CUDA_ERROR_STREAM_CAPTURE_MERGE`.
pub(crate) fn wait_event(d: &mut Driver, h: usize, event: u64) -> Res<bool> {
    if d.extra.captures.is_empty() {
        return Ok(false);
    }
    prune(d);
    let Some(&id) = d.extra.captured_events.get(&event) else {
        return Ok(false);
    };
    if matches!(h, 0 | CU_STREAM_LEGACY) {
        return Err(res::STREAM_CAPTURE_IMPLICIT);
    }
    match d.extra.capturing.get(&h) {
        Some(&other) if other != id => Err(res::STREAM_CAPTURE_MERGE),
        Some(_) => Ok(true),
        None => {
            d.extra.capturing.insert(h, id);
            Ok(true)
        }
    }
}

/// Synchronising with stream `h` (0: the device) while it is captured, or with the
/// legacy stream during a global-mode capture, answers
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, as with the driver: captured work has not run.
pub(crate) fn sync_check(d: &mut Driver, h: usize) -> Res<()> {
    if d.extra.captures.is_empty() {
        return Ok(());
    }
    prune(d);
    if d.extra.capturing.contains_key(&h) || implicit_check(d, h).is_err() {
        return Err(res::STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// Querying or waiting for an event that marks a point of a capture answers
/// `CUDA_ERROR_CAPTURED_EVENT`: it stands for work that has not run.
pub(crate) fn event_check(d: &mut Driver, event: u64) -> Res<()> {
    if d.extra.captures.is_empty() {
        return Ok(());
    }
    prune(d);
    if d.extra.captured_events.contains_key(&event) {
        return Err(res::CAPTURED_EVENT);
    }
    Ok(())
}

thread_local! {
    /// This thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static THREAD_MODE: std::cell::Cell<c_uint> = const { std::cell::Cell::new(MODE_GLOBAL) };
}

/// Refuses work on the legacy default stream while a stream is captured in global mode,
/// unless this thread relaxed its mode.
pub(crate) fn implicit_check(d: &Driver, h: usize) -> Res<()> {
    let legacy = matches!(h, 0 | CU_STREAM_LEGACY);
    let relaxed = THREAD_MODE.with(|m| m.get()) == MODE_RELAXED;
    if legacy && !relaxed && d.extra.captures.values().any(|c| c.mode == MODE_GLOBAL) {
        return Err(res::STREAM_CAPTURE_IMPLICIT);
    }
    Ok(())
}

/// A stream that can be captured: a created stream or the per-thread default stream.
fn capturable(d: &mut Driver, h: CUstream) -> Res<usize> {
    d.current_ctx()?;
    let h = h as usize;
    d.stream_queue(h)?;
    if matches!(h, 0 | CU_STREAM_LEGACY) {
        return Err(res::STREAM_CAPTURE_UNSUPPORTED);
    }
    prune(d);
    Ok(h)
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(h: CUstream, mode: c_uint) -> CUresult {
    guard("cuStreamBeginCapture_v2", || {
        driver::with(|d| {
            let h = capturable(d, h)?;
            if mode > MODE_RELAXED {
                return Err(res::INVALID_VALUE);
            }
            if d.extra.capturing.contains_key(&h) {
                return Err(res::ILLEGAL_STATE);
            }
            d.extra.next_capture_id += 1;
            let id = d.extra.next_capture_id;
            d.extra.captures.insert(
                id,
                Capture {
                    id,
                    mode,
                    origin: h,
                    ops: Vec::new(),
                },
            );
            d.extra.capturing.insert(h, id);
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture(h: CUstream) -> CUresult {
    cuStreamBeginCapture_v2(h, MODE_GLOBAL)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(h: CUstream, pgraph: *mut CUgraph) -> CUresult {
    guard("cuStreamEndCapture", || {
        if pgraph.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let g = driver::with(|d| {
            let h = capturable(d, h)?;
            let id = *d.extra.capturing.get(&h).ok_or(res::ILLEGAL_STATE)?;
            if d.extra.captures.get(&id).is_some_and(|c| c.origin != h) {
                // Only the stream that began a capture ends it.
                return Err(res::STREAM_CAPTURE_UNMATCHED);
            }
            let c = d.extra.captures.remove(&id).ok_or(res::ILLEGAL_STATE)?;
            d.extra.capturing.retain(|_, c| *c != id);
            d.extra.captured_events.retain(|_, c| *c != id);
            Ok(super::graph::new_graph(d, c.ops))
        })?;
        // SAFETY: checked non-null; a writable CUgraph from the caller.
        unsafe { out(pgraph, g as CUgraph) }
    })
}

/// (status, capture id) of a stream.
fn capture_state(h: CUstream) -> Res<(c_int, u64)> {
    driver::with(|d| {
        d.current_ctx()?;
        let h = h as usize;
        d.stream_queue(h)?;
        prune(d);
        Ok(match d.extra.capturing.get(&h) {
            Some(&id) => (STATUS_ACTIVE, id),
            None => (STATUS_NONE, 0),
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(h: CUstream, status: *mut c_int) -> CUresult {
    guard("cuStreamIsCapturing", || {
        let (s, _) = capture_state(h)?;
        // SAFETY: a writable status from the caller (NULL refused).
        unsafe { out(status, s) }
    })
}

/// `cuStreamGetCaptureInfo`'s outputs; each but the status may be NULL. The graph being
/// built is not an object until the capture ends (NULL), and a capture is a chain with
/// no dependency set to report (none).
unsafe fn capture_info(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> Res<()> {
    if status.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let (s, cid) = capture_state(h)?;
    // SAFETY: each pointer is NULL or writable for its type (API contract).
    unsafe {
        out(status, s)?;
        if !id.is_null() {
            out(id, cid)?;
        }
        if !graph.is_null() {
            out(graph, std::ptr::null_mut())?;
        }
        if !deps.is_null() {
            out(deps, std::ptr::null())?;
        }
        if !edges.is_null() {
            out(edges, std::ptr::null())?;
        }
        if !num_deps.is_null() {
            out(num_deps, 0)?;
        }
    }
    Ok(())
}

/// The CUDA 10.1 form: the status and the capture's id.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
) -> CUresult {
    guard("cuStreamGetCaptureInfo", || {
        let none = std::ptr::null_mut();
        // SAFETY: the caller's pointers, checked inside; the others are NULL.
        unsafe { capture_info(h, status, id, none, none.cast(), none.cast(), none.cast()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    guard("cuStreamGetCaptureInfo_v2", || {
        // SAFETY: the caller's pointers, checked inside.
        unsafe { capture_info(h, status, id, graph, deps, std::ptr::null_mut(), num_deps) }
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    guard("cuStreamGetCaptureInfo_v3", || {
        // SAFETY: the caller's pointers, checked inside.
        unsafe { capture_info(h, status, id, graph, deps, edges, num_deps) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult {
    guard("cuThreadExchangeStreamCaptureMode", || {
        if mode.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: non-null; a readable and writable mode from the caller.
        let new = unsafe { mode.read_unaligned() };
        if new > MODE_RELAXED {
            return Err(res::INVALID_VALUE);
        }
        let old = THREAD_MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { mode.write_unaligned(old) };
        Ok(())
    })
}
