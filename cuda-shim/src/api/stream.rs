//! Streams and events. A stream is one of the vGPU's queues (the default stream is queue
//! 0, created streams take the other queues round robin and share them when there are
//! more streams than queues). An event is a device event id (its handle) recorded on a
//! queue; waiting on an event recorded on another queue waits on the host.

use std::ffi::{c_float, c_int, c_uint, c_void};

use crate::driver::{self, Driver, EventObj, Res, StreamObj};
use crate::types::{res, CUcontext, CUevent, CUresult, CUstream, CU_EVENT_DISABLE_TIMING};
use crate::{guard, out};

fn create_stream(ph: *mut CUstream, flags: c_uint) -> Res<()> {
    if ph.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let h = driver::with(|d| {
        let ctx = d.current_ctx()?;
        let queue = d.pick_queue();
        let h = d.handle();
        d.streams.insert(h, StreamObj { queue, flags, ctx });
        Ok(h)
    })?;
    // SAFETY: checked non-null; a writable CUstream from the caller.
    unsafe { out(ph, h as CUstream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    guard("cuStreamCreate", || create_stream(ph, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CUstream,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    guard("cuStreamCreateWithPriority", || create_stream(ph, flags))
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(h: CUstream) -> CUresult {
    guard("cuStreamDestroy_v2", || {
        driver::with(|d| {
            // Work already enqueued completes on its own, as CUDA specifies.
            d.streams
                .remove(&(h as u64))
                .map(drop)
                .ok_or(res::INVALID_HANDLE)
        })
    })
}

fn queue_of(d: &Driver, h: CUstream) -> Res<usize> {
    d.stream_context(h as usize)?;
    d.stream_queue(h as usize).map(|(q, _)| q)
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(h: CUstream) -> CUresult {
    guard("cuStreamSynchronize", || {
        driver::wait_outside(
            |d| {
                let q = queue_of(d, h)?;
                crate::api::capture::sync_check(d, h as usize)?;
                if q == 0 && matches!(h as usize, 0 | crate::types::CU_STREAM_LEGACY) {
                    // The legacy default stream also waits for every blocking stream.
                    return Ok(d.shared_queues());
                }
                Ok(vec![d.shared_queue(q)?])
            },
            |t, queues| driver::sync_queues(t, &queues),
        )
    })
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(h: CUstream) -> CUresult {
    guard("cuStreamQuery", || {
        driver::with(|d| {
            let q = queue_of(d, h)?;
            crate::api::capture::sync_check(d, h as usize)?;
            let t = d.t.clone();
            let mut queue = d.queue(q)?;
            queue.poll(&t);
            queue.take_error()?;
            if queue.is_idle() && !crate::api::hostfn::busy(q) {
                Ok(())
            } else {
                Err(res::NOT_READY)
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(h: CUstream, flags: *mut c_uint) -> CUresult {
    guard("cuStreamGetFlags", || {
        let f = driver::with(|d| {
            queue_of(d, h)?;
            Ok(d.streams.get(&(h as u64)).map_or(0, |s| s.flags))
        })?;
        // SAFETY: a writable unsigned int from the caller.
        unsafe { out(flags, f) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(h: CUstream, pctx: *mut CUcontext) -> CUresult {
    guard("cuStreamGetCtx", || {
        let c = driver::with(|d| {
            d.stream_queue(h as usize)?;
            d.stream_context(h as usize)
        })?;
        // SAFETY: a writable CUcontext from the caller.
        unsafe { out(pctx, c as CUcontext) }
    })
}

/// A vGPU has no green contexts, so no stream belongs to one: NULL, as the driver answers
/// for a stream of an ordinary context (cuBLASLt asks this of every stream it is given).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetGreenCtx(h: CUstream, pctx: *mut *mut c_void) -> CUresult {
    guard("cuStreamGetGreenCtx", || {
        driver::with(|d| {
            d.stream_context(h as usize)?;
            d.stream_queue(h as usize).map(|_| ())
        })?;
        // SAFETY: a writable CUgreenCtx from the caller (NULL refused).
        unsafe { out(pctx, std::ptr::null_mut()) }
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(h: CUstream, ev: CUevent, _flags: c_uint) -> CUresult {
    guard("cuStreamWaitEvent", || {
        driver::with(|d| {
            let q = queue_of(d, h)?;
            if !d.events.contains_key(&(ev as u64)) {
                return Err(res::INVALID_HANDLE);
            }
            // An event of a capture: the stream joins it (api/capture.rs).
            if crate::api::capture::wait_event(d, h as usize, ev as u64)? {
                return Ok(());
            }
            let e = d.events.get(&(ev as u64)).ok_or(res::INVALID_HANDLE)?;
            if let Some((eq, seq)) = e.recorded {
                if eq != q {
                    let t = d.t.clone();
                    d.queue(eq)?.wait_until(&t, seq);
                }
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    guard("cuEventCreate", || {
        if ph.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let h = driver::with(|d| {
            d.current_ctx()?;
            let h = d.handle();
            d.events.insert(
                h,
                EventObj {
                    flags,
                    recorded: None,
                },
            );
            Ok(h)
        })?;
        // SAFETY: checked non-null; a writable CUevent from the caller.
        unsafe { out(ph, h as CUevent) }
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(ev: CUevent, h: CUstream) -> CUresult {
    guard("cuEventRecord", || {
        driver::with(|d| {
            let q = queue_of(d, h)?;
            let id = ev as u64;
            if !d.events.contains_key(&id) {
                return Err(res::INVALID_HANDLE);
            }
            // On a capturing stream the event marks a point of the capture.
            if crate::api::capture::record_event(d, h as usize, id) {
                return Ok(());
            }
            // On the legacy default stream the event also covers the blocking streams.
            if matches!(h as usize, 0 | crate::types::CU_STREAM_LEGACY) {
                d.order_for(q, true, true);
            }
            // The event completes after the stream's host functions ran.
            crate::api::hostfn::gate(q);
            let t = d.t.clone();
            let mut queue = d.queue(q)?;
            let seq = queue.enqueue(&t, |s| s.enqueue_event_record(id), None)?;
            queue.submit();
            drop(queue);
            if let Some(e) = d.events.get_mut(&id) {
                e.recorded = Some((q, seq));
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags(ev: CUevent, h: CUstream, _flags: c_uint) -> CUresult {
    cuEventRecord(ev, h)
}

/// Whether the event's latest record completed (polling its queue once).
fn complete(d: &mut Driver, ev: CUevent) -> Res<bool> {
    let e = d.events.get(&(ev as u64)).ok_or(res::INVALID_HANDLE)?;
    let Some((q, seq)) = e.recorded else {
        return Ok(true);
    };
    let t = d.t.clone();
    let mut queue = d.queue(q)?;
    if !queue.completed(seq) {
        queue.poll(&t);
    }
    Ok(queue.completed(seq))
}

#[no_mangle]
pub extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    guard("cuEventQuery", || {
        driver::with(|d| {
            match crate::api::capture::event_check(d, ev as u64).and_then(|()| complete(d, ev))? {
                true => Ok(()),
                false => Err(res::NOT_READY),
            }
        })
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    guard("cuEventSynchronize", || {
        driver::wait_outside(
            |d| {
                crate::api::capture::event_check(d, ev as u64)?;
                let e = d.events.get(&(ev as u64)).ok_or(res::INVALID_HANDLE)?;
                match e.recorded {
                    Some((q, seq)) => Ok(Some((d.shared_queue(q)?, seq))),
                    None => Ok(None),
                }
            },
            |t, found| {
                if let Some((q, seq)) = found {
                    driver::lock(&q).wait_until(t, seq);
                }
                Ok(())
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    guard("cuEventElapsedTime", || {
        if ms.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let v = driver::with(|d| {
            for ev in [start, end] {
                let e = d.events.get(&(ev as u64)).ok_or(res::INVALID_HANDLE)?;
                if e.flags & CU_EVENT_DISABLE_TIMING != 0 || e.recorded.is_none() {
                    return Err(res::INVALID_HANDLE);
                }
                if !complete(d, ev)? {
                    return Err(res::NOT_READY);
                }
            }
            let t = d.t.clone();
            let (s, e) = (start as u64, end as u64);
            let mut q0 = d.queue(0)?;
            let ts = q0.call(&t, |st| st.event_query(s))?;
            let te = q0.call(&t, |st| st.event_query(e))?;
            match (ts, te) {
                (Some(a), Some(b)) => Ok((b as f64 - a as f64) / 1e6),
                _ => Err(res::NOT_READY),
            }
        })?;
        // SAFETY: checked non-null; a writable float from the caller.
        unsafe { out(ms, v as c_float) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    guard("cuEventDestroy_v2", || {
        driver::with(|d| {
            let e = d.events.remove(&(ev as u64)).ok_or(res::INVALID_HANDLE)?;
            if let Some((q, _)) = e.recorded {
                // Destroyed after its record, on the same queue; nobody waits for it.
                let t = d.t.clone();
                let id = ev as u64;
                let mut queue = d.queue(q)?;
                let destroy =
                    vgpu_proto::Request::EventDestroy(vgpu_proto::EventArgs { event: id });
                if queue.enqueue(&t, |s| s.enqueue(&destroy), None).is_ok() {
                    queue.submit();
                }
            }
            Ok(())
        })
    })
}

// The unversioned names the real libcuda also exports, with the same signatures.

#[no_mangle]
pub extern "C" fn cuStreamDestroy(h: CUstream) -> CUresult {
    cuStreamDestroy_v2(h)
}

#[no_mangle]
pub extern "C" fn cuEventDestroy(ev: CUevent) -> CUresult {
    cuEventDestroy_v2(ev)
}
