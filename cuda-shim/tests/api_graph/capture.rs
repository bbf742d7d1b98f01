//! Stream capture: nothing runs while captured, the graph replays it; two streams in one
//! capture through events; the capture errors.

use super::*;

/// Answers the built-in module's `vector_add`, which it loads.
pub(crate) fn stream_capture_replayed_as_a_graph(t: &Setup) -> Ptr {
    let Setup {
        ref cu,
        s,
        s2,
        n,
        bytes,
        mut a,
        mut b,
        mut c,
        pinned,
        ..
    } = *t;
    // Stream capture: nothing runs while captured; the graph replays it.
    let module = cu.builtin_module();
    let vadd = cu.function(module, c"vector_add");
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, c_uint, usize), c, 0, n),
        OK
    );
    let mut n64 = n as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    let pp = params.as_mut_ptr();
    assert_eq!(
        t.begin(null_mut(), 0),
        STREAM_CAPTURE_UNSUPPORTED,
        "the legacy stream"
    );
    assert_eq!(t.begin(s, 7), INVALID_VALUE);
    assert_eq!(t.begin(s, 0), OK);
    assert_eq!(t.begin(s, 0), ILLEGAL_STATE, "already capturing");
    let mut status: c_int = -1;
    assert_eq!(
        call!(
            cu,
            "cuStreamIsCapturing",
            fn(Ptr, *mut c_int),
            s,
            &mut status
        ),
        OK
    );
    assert_eq!(status, 1);
    let (mut id, mut graph_out, mut ndeps): (u64, Ptr, usize) = (0, 7 as Ptr, 9);
    assert_eq!(
        call!(
            cu,
            "cuStreamGetCaptureInfo",
            fn(Ptr, *mut c_int, *mut u64, *mut Ptr, *mut Ptr, *mut Ptr, *mut usize),
            s,
            &mut status,
            &mut id,
            &mut graph_out,
            null_mut(),
            null_mut(),
            &mut ndeps
        ),
        OK
    );
    assert!(status == 1 && id > 0 && ndeps == 0);
    let mut hx: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let two = 2.0f32.to_bits();
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoDAsync",
            fn(u64, *const c_void, usize, Ptr),
            a,
            hx.as_ptr().cast(),
            bytes,
            s
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32Async",
            fn(u64, c_uint, usize, Ptr),
            b,
            two,
            n,
            s
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuLaunchKernel",
            fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
                *mut Ptr,
            ),
            vadd,
            (n / 256) as c_uint,
            1,
            1,
            256,
            1,
            1,
            0,
            s,
            pp,
            null_mut()
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            pinned,
            c,
            bytes,
            s
        ),
        OK
    );
    assert_eq!(t.host_fn(s, Some(count_run), null_mut()), OK);
    assert_eq!(
        call!(
            cu,
            "cuStreamWriteValue32",
            fn(Ptr, u64, u32, c_uint),
            s,
            a,
            0x7f,
            0
        ),
        OK
    );
    // The legacy stream while a global-mode capture is active; a callback in a capture.
    let mut peek = vec![0u8; 16];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            peek.as_mut_ptr().cast(),
            c,
            16
        ),
        STREAM_CAPTURE_IMPLICIT
    );
    assert_eq!(
        call!(
            cu,
            "cuStreamAddCallback",
            fn(Ptr, Option<unsafe extern "C" fn(Ptr, R, *mut c_void)>, Ptr, c_uint),
            s,
            Some(callback),
            null_mut(),
            0
        ),
        STREAM_CAPTURE_UNSUPPORTED
    );
    // Nothing ran: c is still zero (read on another stream).
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            peek.as_mut_ptr().cast(),
            c,
            16,
            s2
        ),
        OK
    );
    assert_eq!(cu.sync(s2), OK);
    assert!(peek.iter().all(|&x| x == 0));
    assert_eq!(RUNS.load(Ordering::SeqCst), 0);
    let mut graph: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamEndCapture", fn(Ptr, *mut Ptr), s, &mut graph),
        OK
    );
    assert_eq!(
        call!(cu, "cuStreamEndCapture", fn(Ptr, *mut Ptr), s, &mut graph),
        ILLEGAL_STATE
    );
    assert_eq!(
        call!(
            cu,
            "cuStreamIsCapturing",
            fn(Ptr, *mut c_int),
            s,
            &mut status
        ),
        OK
    );
    assert_eq!(status, 0);
    let mut count = 0usize;
    assert_eq!(
        call!(
            cu,
            "cuGraphGetNodes",
            fn(Ptr, *mut Ptr, *mut usize),
            graph,
            null_mut(),
            &mut count
        ),
        OK
    );
    assert_eq!(count, 6);
    let mut exec: Ptr = null_mut();
    assert_eq!(t.inst(&mut exec, graph, 0), OK);
    let mut bad: Ptr = null_mut();
    assert_eq!(t.inst(&mut bad, graph, 4), NOT_SUPPORTED, "device launch");
    assert_eq!(t.inst(&mut bad, graph, 0x100), INVALID_VALUE);
    assert_eq!(t.inst(&mut bad, 0x7777 as Ptr, 0), INVALID_VALUE);
    for round in 0..2u32 {
        // The graph's host-to-device copy reads the host memory when it runs.
        for (i, x) in hx.iter_mut().enumerate() {
            *x = (i as u32 * (round + 1)) as f32;
        }
        assert_eq!(t.launch_graph(exec, s), OK);
        assert_eq!(cu.sync(s), OK);
        assert!(
            (0..n).all(|i| t.out(i) == (i as u32 * (round + 1)) as f32 + 2.0),
            "round {round}"
        );
        assert_eq!(RUNS.load(Ordering::SeqCst), round as usize + 1);
        let mut first = 0u32;
        assert_eq!(
            call!(
                cu,
                "cuMemcpyDtoH",
                fn(*mut c_void, u64, usize),
                (&mut first as *mut u32).cast(),
                a,
                4
            ),
            OK
        );
        assert_eq!(first, 0x7f, "the captured value write ran last");
    }
    assert_eq!(t.launch_graph(0x7777 as Ptr, s), INVALID_VALUE);
    assert_eq!(t.launch_graph(exec, 0x7777 as Ptr), INVALID_HANDLE);
    assert_eq!(call!(cu, "cuGraphExecDestroy", fn(Ptr), exec), OK);
    assert_eq!(
        call!(cu, "cuGraphExecDestroy", fn(Ptr), exec),
        INVALID_VALUE
    );
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), graph), OK);
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), graph), INVALID_VALUE);

    // Two streams in one capture: s forks to s2 through an event, s2 joins back.
    let (mut ev1, mut ev2): (Ptr, Ptr) = (null_mut(), null_mut());
    for e in [&mut ev1, &mut ev2] {
        assert_eq!(call!(cu, "cuEventCreate", fn(*mut Ptr, c_uint), e, 0), OK);
    }
    let record = |e: Ptr, s: Ptr| call!(cu, "cuEventRecord", fn(Ptr, Ptr), e, s);
    let wait = |s: Ptr, e: Ptr| call!(cu, "cuStreamWaitEvent", fn(Ptr, Ptr, c_uint), s, e, 0);
    let memset32 = |d: u64, v: f32, s: Ptr| {
        call!(
            cu,
            "cuMemsetD32Async",
            fn(u64, c_uint, usize, Ptr),
            d,
            v.to_bits(),
            n,
            s
        )
    };
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, c_uint, usize), c, 0, n),
        OK
    );
    assert_eq!(t.begin(s, 0), OK);
    assert_eq!(memset32(a, 1.0, s), OK);
    assert_eq!(record(ev1, s), OK);
    assert_eq!(wait(s2, ev1), OK);
    assert_eq!(
        call!(
            cu,
            "cuStreamIsCapturing",
            fn(Ptr, *mut c_int),
            s2,
            &mut status
        ),
        OK
    );
    assert_eq!(status, 1, "s2 joined the capture");
    assert_eq!(memset32(b, 4.0, s2), OK);
    assert_eq!(
        call!(cu, "cuStreamEndCapture", fn(Ptr, *mut Ptr), s2, &mut graph),
        903,
        "only the stream that began a capture ends it"
    );
    // Captured work has not run: no synchronising with it.
    assert_eq!(cu.sync(s), STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(
        call!(cu, "cuStreamQuery", fn(Ptr), s2),
        STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(call!(cu, "cuEventQuery", fn(Ptr), ev1), 907);
    assert_eq!(call!(cu, "cuEventSynchronize", fn(Ptr), ev1), 907);
    assert_eq!(
        call!(cu, "cuCtxSynchronize", fn()),
        STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(record(ev2, s2), OK);
    assert_eq!(wait(s, ev2), OK);
    assert_eq!(
        call!(
            cu,
            "cuLaunchKernel",
            fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
                *mut Ptr,
            ),
            vadd,
            (n / 256) as c_uint,
            1,
            1,
            256,
            1,
            1,
            0,
            s,
            pp,
            null_mut()
        ),
        OK
    );
    assert_eq!(
        call!(cu, "cuStreamEndCapture", fn(Ptr, *mut Ptr), s, &mut graph),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuStreamIsCapturing",
            fn(Ptr, *mut c_int),
            s2,
            &mut status
        ),
        OK
    );
    assert_eq!(status, 0, "the capture ended for s2 too");
    let read_c = || {
        let mut v = vec![0u8; bytes];
        assert_eq!(
            call!(
                cu,
                "cuMemcpyDtoH",
                fn(*mut c_void, u64, usize),
                v.as_mut_ptr().cast(),
                c,
                bytes
            ),
            OK
        );
        floats(&v)
    };
    assert!(
        read_c().iter().all(|&x| x == 0.0),
        "nothing ran while captured"
    );
    assert_eq!(
        call!(
            cu,
            "cuGraphGetNodes",
            fn(Ptr, *mut Ptr, *mut usize),
            graph,
            null_mut(),
            &mut count
        ),
        OK
    );
    assert_eq!(count, 3, "both streams' memsets and the launch");
    assert_eq!(t.inst(&mut exec, graph, 0), OK);
    assert_eq!(t.launch_graph(exec, s), OK);
    assert_eq!(cu.sync(s), OK);
    assert!(read_c().iter().all(|&x| x == 5.0));
    assert_eq!(call!(cu, "cuGraphExecDestroy", fn(Ptr), exec), OK);
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), graph), OK);
    // A stream of one capture cannot wait on a point of another.
    let mut s5: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s5, 0),
        OK
    );
    assert_eq!(t.begin(s, 0), OK);
    assert_eq!(record(ev1, s), OK);
    assert_eq!(t.begin(s5, 0), OK);
    assert_eq!(wait(s5, ev1), 902, "separate captures would merge");
    for st in [s, s5] {
        assert_eq!(
            call!(cu, "cuStreamEndCapture", fn(Ptr, *mut Ptr), st, &mut graph),
            OK
        );
        assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), graph), OK);
    }
    // Recorded outside a capture again, the event is an ordinary one.
    assert_eq!(record(ev1, s), OK);
    assert_eq!(wait(s5, ev1), OK);
    assert_eq!(call!(cu, "cuEventSynchronize", fn(Ptr), ev1), OK);

    vadd
}
