//! The library through its C ABI against a sim `vgpu-worker`: host functions and stream
//! callbacks (after the stream's earlier work, before its later work), stream value
//! writes, stream capture replayed as a graph, graphs built node by node, each with the
//! bad input a program could pass. One test per file: the library is one per process.
//! The test's parts: this file (set-up, host functions, value writes), then
//! `api_graph/capture.rs` and `api_graph/nodes.rs`, in that order on the same library.

#[path = "api_graph/capture.rs"]
mod capture;
mod common;
#[path = "api_graph/nodes.rs"]
mod nodes;

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

/// What the parts of the test share: the library with its context current, two streams
/// (the second non-blocking), three device buffers of `n` words (`bytes` bytes) and a
/// pinned buffer as long.
struct Setup {
    cu: Cuda,
    ctx: Ptr,
    s: Ptr,
    s2: Ptr,
    n: usize,
    bytes: usize,
    a: u64,
    b: u64,
    c: u64,
    pinned: Ptr,
}

impl Setup {
    /// `cuLaunchHostFunc(s, f, data)`.
    fn host_fn(&self, s: Ptr, f: HostFn, data: Ptr) -> R {
        call!(
            self.cu,
            "cuLaunchHostFunc",
            fn(Ptr, HostFn, Ptr),
            s,
            f,
            data
        )
    }

    /// `cuStreamBeginCapture(s, mode)`.
    fn begin(&self, s: Ptr, mode: c_uint) -> R {
        call!(self.cu, "cuStreamBeginCapture", fn(Ptr, c_uint), s, mode)
    }

    /// `cuGraphInstantiateWithFlags(e, g, flags)`.
    fn inst(&self, e: &mut Ptr, g: Ptr, flags: u64) -> R {
        call!(
            self.cu,
            "cuGraphInstantiateWithFlags",
            fn(*mut Ptr, Ptr, u64),
            e,
            g,
            flags
        )
    }

    /// `cuGraphLaunch(e, s)`.
    fn launch_graph(&self, e: Ptr, s: Ptr) -> R {
        call!(self.cu, "cuGraphLaunch", fn(Ptr, Ptr), e, s)
    }

    /// Word `i` of the pinned buffer, as a float; after the stream that wrote it was
    /// synchronised.
    fn out(&self, i: usize) -> f32 {
        assert!(i < self.n);
        // SAFETY: pinned memory of the library, `bytes` long: `n` words.
        f32::from_bits(unsafe { self.pinned.cast::<u32>().add(i).read_volatile() })
    }
}

#[test]
fn host_functions_value_writes_capture_and_graphs() {
    let (_worker, cu) = common::cuda::start("api-graph");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let ctx = cu.primary_context(0);
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
    let t = Setup {
        cu,
        ctx,
        s,
        s2,
        n,
        bytes,
        a,
        b,
        c,
        pinned,
    };
    let cu = &t.cu;
    let pinned_words = pinned.cast::<u32>();

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
    assert_eq!(t.host_fn(s, Some(record_word), pinned), OK);
    assert_eq!(t.host_fn(s, Some(record_tag), 7 as Ptr), OK);
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
    assert_eq!(cu.sync(s), OK);
    assert_eq!(
        *SEEN.lock().unwrap(),
        vec![5, 7, 1003],
        "in order, after the copy"
    );
    // A thread with no current context (XLA's, a runtime's callback thread) still works
    // on a created stream, in the stream's context; the default stream needs a current one.
    let su = s as usize;
    let host = |h: usize, tag: usize| {
        call!(
            cu,
            "cuLaunchHostFunc",
            fn(Ptr, HostFn, Ptr),
            h as Ptr,
            Some(record_tag),
            tag as Ptr
        )
    };
    let memset = |h: usize| {
        call!(
            cu,
            "cuMemsetD32Async",
            fn(u64, c_uint, usize, Ptr),
            a,
            9,
            n,
            h as Ptr
        )
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            assert_eq!(memset(su), OK);
            assert_eq!(host(su, 8), OK);
            assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), su as Ptr), OK);
            assert_eq!(host(0, 8), INVALID_CONTEXT);
            assert_eq!(memset(0), INVALID_CONTEXT);
        });
    });
    assert_eq!(SEEN.lock().unwrap().pop(), Some(8));
    // ... and before the stream's later work: the copy after it reads what it wrote.
    // SAFETY: pinned memory of the library, `bytes` long.
    unsafe { pinned_words.write_volatile(1) };
    assert_eq!(t.host_fn(s, Some(late_write), pinned), OK);
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
    assert_eq!(cu.sync(s), OK);
    assert_eq!(word, 0x600D);
    // A stream whose host function has not run is not done.
    assert_eq!(t.host_fn(s2, Some(wait_release), null_mut()), OK);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s2), NOT_READY);
    RELEASE.store(1, Ordering::SeqCst);
    assert_eq!(cu.sync(s2), OK);
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s2), OK);
    // Bad host functions.
    assert_eq!(t.host_fn(s, None, null_mut()), INVALID_VALUE);
    assert_eq!(
        t.host_fn(0x7777 as Ptr, Some(count_run), null_mut()),
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
    assert_eq!(cu.sync(s), OK);
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

    let vadd = capture::stream_capture_replayed_as_a_graph(&t);
    nodes::graphs_built_node_by_node_and_bad_input(&t, vadd);
}
