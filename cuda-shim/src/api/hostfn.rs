//! Host functions and stream callbacks (`cuLaunchHostFunc`, `cuStreamAddCallback`) and
//! stream value writes (`cuStreamWriteValue32/64`).
//!
//! A host function runs on a library thread, one per queue ("lane"), after the stream's
//! earlier work completed (the library sends a `STREAM_SYNC` on the queue and the lane
//! waits for it), in the order they were launched. Later work on the stream waits for it:
//! a call that sends work to a queue whose lane still has host functions to run waits
//! for them first, as do the synchronising calls (`cuStreamSynchronize`,
//! `cuCtxSynchronize`, `cuEventRecord`, `cuStreamQuery` answers `NOT_READY`). A host
//! function must not call the CUDA API (the driver's rule): such a call can deadlock.
//!
//! A value write is a 4-byte memset (32-bit) or an 8-byte copy (64-bit) on the stream.
//! `cuStreamWaitValue*` is not offered: the protocol has no device-side wait, and a wait
//! in the library would hold later calls on the host, deadlocking a program whose writer
//! comes after it (`CUDA_ERROR_NOT_SUPPORTED`; the device attributes for stream memory
//! operations answer 0).

use std::ffi::{c_uint, c_void};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};

use crate::driver::{self, Driver, Res, SharedQueue};
use crate::extra::{HostFn, Op};
use crate::guard;
use crate::transport::AnyTransport;
use crate::types::{res, CUdeviceptr, CUresult, CUstream};

/// `void (*)(CUstream, CUresult, void *)`: a stream callback.
pub type StreamCallback = unsafe extern "C" fn(CUstream, CUresult, *mut c_void);

enum Call {
    Host(HostFn, usize),
    Callback(StreamCallback, usize, usize),
}

struct Item {
    seq: u64,
    call: Call,
}

/// Host functions of one queue not yet run.
type Pending = Arc<(Mutex<u64>, Condvar)>;

struct Lane {
    tx: Sender<Item>,
    pending: Pending,
}

static LANES: Mutex<Vec<Option<Lane>>> = Mutex::new(Vec::new());

fn lanes() -> std::sync::MutexGuard<'static, Vec<Option<Lane>>> {
    LANES.lock().unwrap_or_else(|e| e.into_inner())
}

fn spawn(q: usize, queue: SharedQueue, t: AnyTransport) -> Res<Lane> {
    let (tx, rx) = channel::<Item>();
    let pending: Pending = Arc::new((Mutex::new(0), Condvar::new()));
    let done = pending.clone();
    std::thread::Builder::new()
        .name(format!("vgpu-hostfn-{q}"))
        .spawn(move || {
            for item in rx {
                // The stream's earlier work completes first.
                driver::lock(&queue).wait_until(&t, item.seq);
                // SAFETY: the program's function and argument, called as the API
                // documents, once.
                unsafe {
                    match item.call {
                        Call::Host(f, data) => f(data as *mut c_void),
                        Call::Callback(f, stream, data) => {
                            f(stream as CUstream, res::SUCCESS, data as *mut c_void)
                        }
                    }
                }
                let (count, cv) = &*done;
                let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
                *n = n.saturating_sub(1);
                cv.notify_all();
            }
        })
        .map_err(|_| res::OUT_OF_MEMORY)?;
    Ok(Lane { tx, pending })
}

/// Waits until queue `q`'s lane ran every host function sent to it.
pub fn gate(q: usize) {
    let pending = match lanes().get(q) {
        Some(Some(l)) => l.pending.clone(),
        _ => return,
    };
    let (count, cv) = &*pending;
    let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
    while *n > 0 {
        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
    }
}

/// Waits until every lane ran every host function sent to it.
pub fn gate_all() {
    let n = lanes().len();
    for q in 0..n {
        gate(q);
    }
}

/// Whether queue `q`'s lane has host functions still to run.
pub fn busy(q: usize) -> bool {
    match lanes().get(q) {
        Some(Some(l)) => *l.pending.0.lock().unwrap_or_else(|e| e.into_inner()) > 0,
        _ => false,
    }
}

/// Sends a host call to stream `h`'s lane, after the stream's earlier work.
fn send(d: &mut Driver, h: usize, call: Call) -> Res<()> {
    let q = d.ordered_queue(h)?;
    let t = d.t.clone();
    let seq = {
        let mut queue = d.queue(q)?;
        let seq = queue.enqueue(&t, |s| s.enqueue_stream_sync(), None)?;
        queue.submit();
        seq
    };
    let shared = d.shared_queue(q)?;
    let mut lanes = lanes();
    if lanes.len() <= q {
        lanes.resize_with(q + 1, || None);
    }
    if lanes[q].is_none() {
        lanes[q] = Some(spawn(q, shared, t)?);
    }
    let lane = lanes[q].as_ref().ok_or(res::UNKNOWN)?;
    *lane.pending.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    if lane.tx.send(Item { seq, call }).is_err() {
        *lane.pending.0.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        return Err(res::UNKNOWN);
    }
    Ok(())
}

/// `cuLaunchHostFunc` on stream handle `h` (the stream checked; capture handled).
pub(crate) fn launch_in(d: &mut Driver, h: usize, f: HostFn, data: usize) -> Res<()> {
    d.stream_context(h)?;
    d.stream_queue(h)?;
    if super::graph::record(d, h, || Op::HostFn { f, data })? {
        return Ok(());
    }
    send(d, h, Call::Host(f, data))
}

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(s: CUstream, f: Option<HostFn>, data: *mut c_void) -> CUresult {
    guard("cuLaunchHostFunc", || {
        let f = f.ok_or(res::INVALID_VALUE)?;
        driver::with(|d| launch_in(d, s as usize, f, data as usize))
    })
}

#[no_mangle]
pub extern "C" fn cuStreamAddCallback(
    s: CUstream,
    f: Option<StreamCallback>,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    guard("cuStreamAddCallback", || {
        let f = f.ok_or(res::INVALID_VALUE)?;
        if flags != 0 {
            return Err(res::INVALID_VALUE);
        }
        driver::with(|d| {
            let h = s as usize;
            d.stream_context(h)?;
            d.stream_queue(h)?;
            if d.extra.capturing.contains_key(&h) {
                // The driver refuses callbacks in a capture (host functions are allowed).
                return Err(res::STREAM_CAPTURE_UNSUPPORTED);
            }
            send(d, h, Call::Callback(f, h, data as usize))
        })
    })
}

/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`: the only flag.
const WRITE_VALUE_NO_MEMORY_BARRIER: c_uint = 1;

/// Writes `value` (8 bytes when `wide`, else 4) at device address `addr` in stream order.
pub(crate) fn write_value_in(
    d: &mut Driver,
    h: usize,
    addr: u64,
    value: u64,
    wide: bool,
) -> Res<()> {
    d.current_ctx()?;
    d.stream_queue(h)?;
    let len: u64 = if wide { 8 } else { 4 };
    if addr % len != 0 {
        return Err(res::INVALID_VALUE);
    }
    d.check_device(addr, len)?;
    if super::graph::record(d, h, || Op::WriteValue { addr, value, wide })? {
        return Ok(());
    }
    let s = Some(h as CUstream);
    if wide {
        let bytes = value.to_le_bytes();
        // The bytes are copied into DMA memory before the call returns.
        super::copy::htod_in(d, addr, bytes.as_ptr().cast(), 8, s)
    } else {
        super::copy::memset_in(d, addr, value as u32, 1, 4, s)
    }
}

fn write_value(s: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint, wide: bool) -> Res<()> {
    if flags & !WRITE_VALUE_NO_MEMORY_BARRIER != 0 {
        return Err(res::INVALID_VALUE);
    }
    driver::with(|d| write_value_in(d, s as usize, addr, value, wide))
}

#[no_mangle]
pub extern "C" fn cuStreamWriteValue32_v2(
    s: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    guard("cuStreamWriteValue32_v2", || {
        write_value(s, addr, u64::from(value), flags, false)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWriteValue64_v2(
    s: CUstream,
    addr: CUdeviceptr,
    value: u64,
    flags: c_uint,
) -> CUresult {
    guard("cuStreamWriteValue64_v2", || {
        write_value(s, addr, value, flags, true)
    })
}

// The CUDA 11 names, with the same signatures.

#[no_mangle]
pub extern "C" fn cuStreamWriteValue32(
    s: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    cuStreamWriteValue32_v2(s, addr, value, flags)
}

#[no_mangle]
pub extern "C" fn cuStreamWriteValue64(
    s: CUstream,
    addr: CUdeviceptr,
    value: u64,
    flags: c_uint,
) -> CUresult {
    cuStreamWriteValue64_v2(s, addr, value, flags)
}
