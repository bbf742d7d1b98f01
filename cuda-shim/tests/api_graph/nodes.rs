//! Graphs built node by node (memset, copy and kernel nodes), a replay after a free, and
//! bad input to the capture and graph calls.

use super::*;

/// `vadd`: the built-in module's `vector_add`.
pub(crate) fn graphs_built_node_by_node_and_bad_input(t: &Setup, vadd: Ptr) {
    let Setup {
        ref cu,
        ctx,
        s,
        s2,
        n,
        bytes,
        mut a,
        mut b,
        mut c,
        pinned,
    } = *t;
    let mut n64 = n as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    let pp = params.as_mut_ptr();
    let (mut status, mut count): (c_int, usize) = (-1, 0);
    let (mut exec, mut bad): (Ptr, Ptr) = (null_mut(), null_mut());
    let mut peek = vec![0u8; 16];
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
    assert_eq!(t.inst(&mut exec, g, 0), OK);
    assert_eq!(call!(cu, "cuGraphUpload", fn(Ptr, Ptr), exec, s2), OK);
    assert_eq!(t.launch_graph(exec, s2), OK);
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
    assert_eq!(cu.sync(s2), OK);
    assert!((0..n).all(|i| t.out(i) == 6.0));
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
    assert_eq!(t.inst(&mut exec, g2, 0), OK);
    assert_eq!(t.launch_graph(exec, s), OK);
    assert_eq!(cu.sync(s), OK);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), tmp), OK);
    assert_eq!(t.launch_graph(exec, s), INVALID_VALUE);
    assert_eq!(call!(cu, "cuGraphExecDestroy", fn(Ptr), exec), OK);
    assert_eq!(call!(cu, "cuGraphDestroy", fn(Ptr), g2), OK);

    // Bad input to the capture and graph calls.
    assert_eq!(
        call!(
            cu,
            "cuStreamGetCaptureInfo",
            fn(Ptr, *mut c_int, *mut u64, *mut Ptr, *mut Ptr, *mut Ptr, *mut usize),
            s,
            null_mut(),
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
    assert_eq!(t.begin(s4, 0), OK);
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
    assert_eq!(t.begin(s3, 0), OK);
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
