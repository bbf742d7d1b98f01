//! The library through its C ABI against a sim `vgpu-worker`: host functions and stream
//! callbacks (after the stream's earlier work, before its later work), stream value
//! writes, stream capture replayed as a graph, graphs built node by node, each with the
//! bad input a program could pass. One test per file: the library is one per process.

mod common;

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::cuda::*;

const ILLEGAL_STATE: R = 401;
const STREAM_CAPTURE_UNSUPPORTED: R = 900;
const STREAM_CAPTURE_IMPLICIT: R = 906;

/// What the host functions saw, in the order they ran.
static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static RUNS: AtomicUsize = AtomicUsize::new(0);
static RELEASE: AtomicU32 = AtomicU32::new(0);

/// Records the first word of the pinned buffer `data` points to.
unsafe extern "C" fn record_word(data: *mut c_void) {
    // SAFETY: the test passes a pinned buffer of at least 4 bytes.
    let v = unsafe { data.cast::<u32>().read_volatile() };
    SEEN.lock().unwrap().push(v);
}

/// Records `data` itself as a number.
unsafe extern "C" fn record_tag(data: *mut c_void) {
    SEEN.lock().unwrap().push(data as usize as u32);
}

unsafe extern "C" fn count_run(_: *mut c_void) {
    RUNS.fetch_add(1, Ordering::SeqCst);
}

/// Sleeps, then writes 0x600D into the pinned word `data` points to.
unsafe extern "C" fn late_write(data: *mut c_void) {
    std::thread::sleep(Duration::from_millis(150));
    // SAFETY: a pinned word of the test.
    unsafe { data.cast::<u32>().write_volatile(0x600D) };
}

/// Waits until the test releases it.
unsafe extern "C" fn wait_release(_: *mut c_void) {
    while RELEASE.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
}

unsafe extern "C" fn callback(_s: Ptr, status: R, data: *mut c_void) {
    SEEN.lock()
        .unwrap()
        .push(1000 + status + data as usize as u32);
}

type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// `CUDA_KERNEL_NODE_PARAMS_v2`.
#[repr(C)]
struct KernelNodeParams {
    func: Ptr,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    kernel_params: *mut Ptr,
    extra: *mut Ptr,
    kern: Ptr,
    ctx: Ptr,
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
struct MemsetNodeParams {
    dst: u64,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
}

/// `CUDA_MEMCPY3D`, as 25 words (the layout the pitched test spells out field by field).
#[repr(C)]
struct Memcpy3d {
    w: [u64; 25],
}

#[test]
fn host_functions_value_writes_capture_and_graphs() {
    let (_worker, cu) = common::cuda::start("api-graph");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let mut ctx: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuDevicePrimaryCtxRetain",
            fn(*mut Ptr, c_int),
            &mut ctx,
            0
        ),
        OK
    );
    assert_eq!(call!(cu, "cuCtxSetCurrent", fn(Ptr), ctx), OK);
    let (mut s, mut s2): (Ptr, Ptr) = (null_mut(), null_mut());
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s2, 1),
        OK
    );
    let n = 2048usize;
    let bytes = n * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    let mut pinned: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuMemAllocHost",
            fn(*mut Ptr, usize),
            &mut pinned,
            bytes
        ),
        OK
    );
    let pinned_words = pinned.cast::<u32>();
    let host_fn = |s: Ptr, f: HostFn, data: Ptr| {
        call!(cu, "cuLaunchHostFunc", fn(Ptr, HostFn, Ptr), s, f, data)
    };
    let sync = |s: Ptr| call!(cu, "cuStreamSynchronize", fn(Ptr), s);

    // A host function runs after the stream's earlier work: it sees the copied value.
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32Async",
            fn(u64, c_uint, usize, Ptr),
            a,
            5,
            n,
            s
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            pinned,
            a,
            bytes,
            s
        ),
        OK
    );
    assert_eq!(host_fn(s, Some(record_word), pinned), OK);
    assert_eq!(host_fn(s, Some(record_tag), 7 as Ptr), OK);
    assert_eq!(
        call!(
            cu,
            "cuStreamAddCallback",
            fn(Ptr, Option<unsafe extern "C" fn(Ptr, R, *mut c_void)>, Ptr, c_uint),
            s,
            Some(callback),
            3 as Ptr,
            0
        ),
        OK
    );
    assert_eq!(sync(s), OK);
    assert_eq!(
        *SEEN.lock().unwrap(),
        vec![5, 7, 1003],
        "in order, after the copy"
    );
    // ... and before the stream's later work: the copy after it reads what it wrote.
    // SAFETY: pinned memory of the library, `bytes` long.
    unsafe { pinned_words.write_volatile(1) };
    assert_eq!(host_fn(s, Some(late_write), pinned), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoDAsync",
            fn(u64, *const c_void, usize, Ptr),
            b,
            pinned,
            4,
            s
        ),
        OK
    );
    let mut word = 0u32;
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            (&mut word as *mut u32).cast(),
            b,
            4,
            s
        ),
        OK
    );
    assert_eq!(sync(s), OK);
    assert_eq!(word, 0x600D);
    // A stream whose host function has not run is not done.
    assert_eq!(host_fn(s2, Some(wait_release), null_mut()), OK);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s2), NOT_READY);
    RELEASE.store(1, Ordering::SeqCst);
    assert_eq!(sync(s2), OK);
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s2), OK);
    // Bad host functions.
    assert_eq!(host_fn(s, None, null_mut()), INVALID_VALUE);
    assert_eq!(
        host_fn(0x7777 as Ptr, Some(count_run), null_mut()),
        INVALID_HANDLE
    );
    assert_eq!(
        call!(
            cu,
            "cuStreamAddCallback",
            fn(Ptr, Option<unsafe extern "C" fn(Ptr, R, *mut c_void)>, Ptr, c_uint),
            s,
            Some(callback),
            null_mut(),
            1
        ),
        INVALID_VALUE
    );

    // Value writes, in stream order.
    assert_eq!(call!(cu, "cuMemsetD8", fn(u64, u8, usize), c, 0, 64), OK);
    assert_eq!(
        call!(
            cu,
            "cuStreamWriteValue32",
            fn(Ptr, u64, u32, c_uint),
            s,
            c + 4,
            0xdead_beef,
            0
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuStreamWriteValue64",
            fn(Ptr, u64, u64, c_uint),
            s,
            c + 8,
            0x0123_4567_89ab_cdef,
            1
        ),
        OK
    );
    let mut words = [0u32; 4];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            words.as_mut_ptr().cast(),
            c,
            16,
            s
        ),
        OK
    );
    assert_eq!(sync(s), OK);
    assert_eq!(words, [0, 0xdead_beef, 0x89ab_cdef, 0x0123_4567]);
    let wv32 = |addr: u64, flags: c_uint| {
        call!(
            cu,
            "cuStreamWriteValue32",
            fn(Ptr, u64, u32, c_uint),
            s,
            addr,
            1,
            flags
        )
    };
    assert_eq!(wv32(c + 2, 0), INVALID_VALUE, "misaligned");
    assert_eq!(
        wv32(c + bytes as u64, 0),
        INVALID_VALUE,
        "past the allocation"
    );
    assert_eq!(wv32(0xdead_0000, 0), INVALID_VALUE, "not an allocation");
    assert_eq!(wv32(c, 2), INVALID_VALUE, "an unknown flag");
    assert_eq!(
        call!(
            cu,
            "cuStreamWriteValue64",
            fn(Ptr, u64, u64, c_uint),
            s,
            c + 4,
            1,
            0
        ),
        INVALID_VALUE,
        "a 64-bit write 4-byte aligned"
    );
    assert_eq!(
        call!(
            cu,
            "cuStreamWaitValue32",
            fn(Ptr, u64, u32, c_uint),
            s,
            c,
            1,
            0
        ),
        NOT_SUPPORTED
    );

    // Stream capture: nothing runs while captured; the graph replays it.
    let mut module: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut module,
            c"vgpu:builtin".as_ptr().cast()
        ),
        OK
    );
    let mut vadd: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const std::ffi::c_char),
            &mut vadd,
            module,
            c"vector_add".as_ptr()
        ),
        OK
    );
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
    let begin = |s: Ptr, mode: c_uint| call!(cu, "cuStreamBeginCapture", fn(Ptr, c_uint), s, mode);
    assert_eq!(
        begin(null_mut(), 0),
        STREAM_CAPTURE_UNSUPPORTED,
        "the legacy stream"
    );
    assert_eq!(begin(s, 7), INVALID_VALUE);
    assert_eq!(begin(s, 0), OK);
    assert_eq!(begin(s, 0), ILLEGAL_STATE, "already capturing");
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
            fn(Ptr, *mut c_int, *mut u64, *mut Ptr, *mut Ptr, *mut usize),
            s,
            &mut status,
            &mut id,
            &mut graph_out,
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
    assert_eq!(host_fn(s, Some(count_run), null_mut()), OK);
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
    assert_eq!(sync(s2), OK);
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
    let inst = |e: &mut Ptr, g: Ptr, flags: u64| {
        call!(
            cu,
            "cuGraphInstantiateWithFlags",
            fn(*mut Ptr, Ptr, u64),
            e,
            g,
            flags
        )
    };
    assert_eq!(inst(&mut exec, graph, 0), OK);
    let mut bad: Ptr = null_mut();
    assert_eq!(inst(&mut bad, graph, 4), NOT_SUPPORTED, "device launch");
    assert_eq!(inst(&mut bad, graph, 0x100), INVALID_VALUE);
    assert_eq!(inst(&mut bad, 0x7777 as Ptr, 0), INVALID_VALUE);
    let launch_graph = |e: Ptr, s: Ptr| call!(cu, "cuGraphLaunch", fn(Ptr, Ptr), e, s);
    let out = |i: usize| {
        // SAFETY: pinned memory, `bytes` long; the stream was synchronised.
        f32::from_bits(unsafe { pinned_words.add(i).read_volatile() })
    };
    for round in 0..2u32 {
        // The graph's host-to-device copy reads the host memory when it runs.
        for (i, x) in hx.iter_mut().enumerate() {
            *x = (i as u32 * (round + 1)) as f32;
        }
        assert_eq!(launch_graph(exec, s), OK);
        assert_eq!(sync(s), OK);
        assert!(
            (0..n).all(|i| out(i) == (i as u32 * (round + 1)) as f32 + 2.0),
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
    assert_eq!(launch_graph(0x7777 as Ptr, s), INVALID_VALUE);
    assert_eq!(launch_graph(exec, 0x7777 as Ptr), INVALID_HANDLE);
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
    assert_eq!(begin(s, 0), OK);
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
    assert_eq!(sync(s), STREAM_CAPTURE_UNSUPPORTED);
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
    assert_eq!(inst(&mut exec, graph, 0), OK);
    assert_eq!(launch_graph(exec, s), OK);
    assert_eq!(sync(s), OK);
    assert!(read_c().iter().all(|&x| x == 5.0));
    assert_eq!(call!(cu, "cuGraphExecDestroy", fn(Ptr), exec), OK);
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), graph), OK);
    // A stream of one capture cannot wait on a point of another.
    let mut s5: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s5, 0),
        OK
    );
    assert_eq!(begin(s, 0), OK);
    assert_eq!(record(ev1, s), OK);
    assert_eq!(begin(s5, 0), OK);
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

    // A graph built node by node: memset a, copy a to b, c = a + b.
    let mut g: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuGraphCreate", fn(*mut Ptr, c_uint), &mut g, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuGraphCreate", fn(*mut Ptr, c_uint), &mut bad, 1),
        INVALID_VALUE
    );
    let ms = MemsetNodeParams {
        dst: a,
        pitch: bytes,
        value: 3.0f32.to_bits(),
        element_size: 4,
        width: n,
        height: 1,
    };
    let mut n1: Ptr = null_mut();
    let add_memset = |node: &mut Ptr, deps: &[Ptr], p: &MemsetNodeParams| {
        call!(
            cu,
            "cuGraphAddMemsetNode",
            fn(*mut Ptr, Ptr, *const Ptr, usize, *const MemsetNodeParams, Ptr),
            node,
            g,
            deps.as_ptr(),
            deps.len(),
            p,
            ctx
        )
    };
    assert_eq!(add_memset(&mut n1, &[], &ms), OK);
    let oob = MemsetNodeParams { width: n + 1, ..ms };
    assert_eq!(
        add_memset(&mut bad, &[], &oob),
        INVALID_VALUE,
        "past the allocation"
    );
    assert_eq!(
        add_memset(&mut bad, &[0x7777 as Ptr], &ms),
        INVALID_VALUE,
        "a foreign dependency"
    );
    // CUDA_MEMCPY3D: device a to device b, one row of `bytes`.
    let mut cp = Memcpy3d { w: [0; 25] };
    cp.w[4] = 2; // srcMemoryType
    cp.w[6] = a; // srcDevice
    cp.w[15] = 2; // dstMemoryType
    cp.w[17] = b; // dstDevice
    cp.w[22] = bytes as u64; // WidthInBytes
    cp.w[23] = 1; // Height
    cp.w[24] = 1; // Depth
    let mut n2: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuGraphAddMemcpyNode",
            fn(*mut Ptr, Ptr, *const Ptr, usize, *const Memcpy3d, Ptr),
            &mut n2,
            g,
            &n1,
            1,
            &cp,
            ctx
        ),
        OK
    );
    cp.w[22] = bytes as u64 + 4;
    assert_eq!(
        call!(
            cu,
            "cuGraphAddMemcpyNode",
            fn(*mut Ptr, Ptr, *const Ptr, usize, *const Memcpy3d, Ptr),
            &mut bad,
            g,
            &n1,
            1,
            &cp,
            ctx
        ),
        INVALID_VALUE
    );
    let kp = KernelNodeParams {
        func: vadd,
        grid: [(n / 128) as c_uint, 1, 1],
        block: [128, 1, 1],
        shared: 0,
        kernel_params: pp,
        extra: null_mut(),
        kern: null_mut(),
        ctx,
    };
    let mut n3: Ptr = null_mut();
    let deps = [n1, n2];
    assert_eq!(
        call!(
            cu,
            "cuGraphAddKernelNode",
            fn(*mut Ptr, Ptr, *const Ptr, usize, *const KernelNodeParams),
            &mut n3,
            g,
            deps.as_ptr(),
            2,
            &kp
        ),
        OK
    );
    let bad_kp = KernelNodeParams {
        block: [2048, 1, 1],
        ..kp
    };
    assert_eq!(
        call!(
            cu,
            "cuGraphAddKernelNode",
            fn(*mut Ptr, Ptr, *const Ptr, usize, *const KernelNodeParams),
            &mut bad,
            g,
            deps.as_ptr(),
            2,
            &bad_kp
        ),
        INVALID_VALUE
    );
    // CUDA_GRAPH_INSTANTIATE_PARAMS: flags, upload stream, error node, result.
    #[repr(C)]
    struct InstParams {
        flags: u64,
        upload: Ptr,
        err_node: Ptr,
        result: c_uint,
    }
    let mut ip = InstParams {
        flags: 4,
        upload: null_mut(),
        err_node: 7 as Ptr,
        result: 9,
    };
    assert_eq!(
        call!(
            cu,
            "cuGraphInstantiateWithParams",
            fn(*mut Ptr, Ptr, *mut InstParams),
            &mut exec,
            g,
            &mut ip
        ),
        NOT_SUPPORTED
    );
    assert_eq!(
        (ip.result, ip.err_node),
        (1, null_mut()),
        "an instantiation error"
    );
    ip.flags = 0;
    assert_eq!(
        call!(
            cu,
            "cuGraphInstantiateWithParams",
            fn(*mut Ptr, Ptr, *mut InstParams),
            &mut exec,
            g,
            &mut ip
        ),
        OK
    );
    assert_eq!(ip.result, 0);
    assert_eq!(call!(cu, "cuGraphExecDestroy", fn(Ptr), exec), OK);
    assert_eq!(inst(&mut exec, g, 0), OK);
    assert_eq!(call!(cu, "cuGraphUpload", fn(Ptr, Ptr), exec, s2), OK);
    assert_eq!(launch_graph(exec, s2), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            pinned,
            c,
            bytes,
            s2
        ),
        OK
    );
    assert_eq!(sync(s2), OK);
    assert!((0..n).all(|i| out(i) == 6.0));
    assert_eq!(call!(cu, "cuGraphExecDestroy", fn(Ptr), exec), OK);
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), g), OK);

    // A replay is checked as the calls it stands for: memory freed since fails it.
    let mut tmp = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut tmp, 4096),
        OK
    );
    let mut g2: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuGraphCreate", fn(*mut Ptr, c_uint), &mut g2, 0),
        OK
    );
    let ms_tmp = MemsetNodeParams {
        dst: tmp,
        pitch: 4096,
        value: 1,
        element_size: 4,
        width: 1024,
        height: 1,
    };
    assert_eq!(
        call!(
            cu,
            "cuGraphAddMemsetNode",
            fn(*mut Ptr, Ptr, *const Ptr, usize, *const MemsetNodeParams, Ptr),
            &mut n1,
            g2,
            std::ptr::null(),
            0,
            &ms_tmp,
            ctx
        ),
        OK
    );
    assert_eq!(inst(&mut exec, g2, 0), OK);
    assert_eq!(launch_graph(exec, s), OK);
    assert_eq!(sync(s), OK);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), tmp), OK);
    assert_eq!(launch_graph(exec, s), INVALID_VALUE);
    assert_eq!(call!(cu, "cuGraphExecDestroy", fn(Ptr), exec), OK);
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), g2), OK);

    // Bad input to the capture and graph calls.
    assert_eq!(
        call!(
            cu,
            "cuStreamGetCaptureInfo",
            fn(Ptr, *mut c_int, *mut u64, *mut Ptr, *mut Ptr, *mut usize),
            s,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut()
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuStreamIsCapturing",
            fn(Ptr, *mut c_int),
            0x7777 as Ptr,
            &mut status
        ),
        INVALID_HANDLE
    );
    assert_eq!(
        call!(cu, "cuStreamEndCapture", fn(Ptr, *mut Ptr), s, null_mut()),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuGraphGetNodes",
            fn(Ptr, *mut Ptr, *mut usize),
            0x7777 as Ptr,
            null_mut(),
            &mut count
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuGraphUpload", fn(Ptr, Ptr), 0x7777 as Ptr, s),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuGraphCreate", fn(*mut Ptr, c_uint), null_mut(), 0),
        INVALID_VALUE
    );
    let mut mode: c_uint = 2;
    assert_eq!(
        call!(
            cu,
            "cuThreadExchangeStreamCaptureMode",
            fn(*mut c_uint),
            &mut mode
        ),
        OK
    );
    assert_eq!(mode, 0, "the previous mode: global");
    let mut back: c_uint = mode;
    assert_eq!(
        call!(
            cu,
            "cuThreadExchangeStreamCaptureMode",
            fn(*mut c_uint),
            &mut back
        ),
        OK
    );
    assert_eq!(back, 2);
    let mut bad_mode: c_uint = 9;
    assert_eq!(
        call!(
            cu,
            "cuThreadExchangeStreamCaptureMode",
            fn(*mut c_uint),
            &mut bad_mode
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuLaunchHostFunc",
            fn(Ptr, HostFn, Ptr),
            s,
            None,
            null_mut()
        ),
        INVALID_VALUE
    );
    // A relaxed thread may use the legacy stream during a global capture.
    let mut s4: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s4, 0),
        OK
    );
    assert_eq!(begin(s4, 0), OK);
    let mut relaxed: c_uint = 2;
    assert_eq!(
        call!(
            cu,
            "cuThreadExchangeStreamCaptureMode",
            fn(*mut c_uint),
            &mut relaxed
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            peek.as_mut_ptr().cast(),
            c,
            16
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuThreadExchangeStreamCaptureMode",
            fn(*mut c_uint),
            &mut relaxed
        ),
        OK
    );
    let mut g4: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamEndCapture", fn(Ptr, *mut Ptr), s4, &mut g4),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuGraphGetNodes",
            fn(Ptr, *mut Ptr, *mut usize),
            g4,
            null_mut(),
            &mut count
        ),
        OK
    );
    assert_eq!(count, 0, "an empty capture");
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), g4), OK);

    // A capturing stream destroyed ends its capture: the legacy stream works again.
    let mut s3: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s3, 0),
        OK
    );
    assert_eq!(begin(s3, 0), OK);
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
    assert_eq!(call!(cu, "cuStreamDestroy", fn(Ptr), s3), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            peek.as_mut_ptr().cast(),
            c,
            16
        ),
        OK
    );

    let mut name: *const std::ffi::c_char = std::ptr::null();
    assert_eq!(
        call!(
            cu,
            "cuGetErrorName",
            fn(R, *mut *const std::ffi::c_char),
            STREAM_CAPTURE_IMPLICIT,
            &mut name
        ),
        OK
    );
    // SAFETY: a static C string of the library.
    let text = unsafe { CStr::from_ptr(name) };
    assert_eq!(text, c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT");
}
