//! Pinned host memory the GPU reaches at its host address, through the library's C ABI,
//! as XLA's redzone check uses it: `cuMemHostAlloc(DEVICEMAP)`, its device pointer (the
//! pointer itself), `cuMemsetD32Async` on the host pointer, device-to-device copies with
//! either side in it, its pointer attributes; on a GPU also a PTX kernel that writes
//! through the host pointer, read back on the host after the stream's sync. Memory
//! registered with `cuMemHostRegister` stays host-only. Shared by `api_host_map.rs` (sim
//! worker) and `gpu_host_map.rs` (cuda worker).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;

use crate::call;
use crate::common::cuda::*;

const CAN_MAP_HOST_MEMORY: c_int = 19;
const DEVICEMAP: c_uint = 2;
const MEMORY_TYPE: c_int = 2;
const DEVICE_POINTER: c_int = 3;
const IS_MANAGED: c_int = 8;

/// Writes `v` and `v + 1` to the two words at `p` (through the generic address space).
const WRITE_HOST: &std::ffi::CStr = c".version 7.0
.target sm_70
.address_size 64
.visible .entry write_host(.param .u64 p, .param .u32 v)
{
 .reg .u64 %rd<3>;
 .reg .u32 %r<3>;
 ld.param.u64 %rd1, [p];
 ld.param.u32 %r1, [v];
 st.u32 [%rd1], %r1;
 add.u32 %r2, %r1, 1;
 st.u32 [%rd1+4], %r2;
 ret;
}
";

fn words(p: Ptr) -> [u32; 2] {
    // SAFETY: `p` is an 8-byte pinned allocation of this process, no copy running on it.
    unsafe { std::ptr::read_volatile(p.cast::<[u32; 2]>()) }
}

fn attr_u32(cu: &Cuda, attribute: c_int, p: u64) -> (R, u32) {
    let mut v: c_uint = 0xffff;
    let r = call!(
        cu,
        "cuPointerGetAttribute",
        fn(*mut c_void, c_int, u64),
        (&mut v as *mut c_uint).cast(),
        attribute,
        p
    );
    (r, v)
}

/// The round; `gpu`: also launch a PTX kernel (the sim worker runs none).
pub fn exercise(cu: &Cuda, gpu: bool) {
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    cu.primary_context(0);
    let mut can: c_int = -1;
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut can,
            CAN_MAP_HOST_MEMORY,
            0
        ),
        OK
    );
    assert_eq!(
        can, 1,
        "the vGPU maps pinned host memory (where not, the worker's log says why: HOST_MAP)"
    );

    // XLA's redzone check: 8 pinned bytes, device-mapped.
    let mut host: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuMemHostAlloc",
            fn(*mut Ptr, usize, c_uint),
            &mut host,
            8,
            DEVICEMAP
        ),
        OK
    );
    let mut dptr = 0u64;
    assert_eq!(
        call!(
            cu,
            "cuMemHostGetDevicePointer",
            fn(*mut u64, Ptr, c_uint),
            &mut dptr,
            host,
            0
        ),
        OK
    );
    assert_eq!(dptr, host as u64, "the device pointer is the host pointer");
    assert_eq!(
        call!(
            cu,
            "cuMemHostGetDevicePointer",
            fn(*mut u64, Ptr, c_uint),
            &mut dptr,
            host,
            1
        ),
        INVALID_VALUE,
        "flags must be 0"
    );
    assert_eq!(
        attr_u32(cu, MEMORY_TYPE, host as u64),
        (OK, 1),
        "host memory"
    );
    assert_eq!(attr_u32(cu, IS_MANAGED, host as u64), (OK, 0));
    let mut dp = 0u64;
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut dp as *mut u64).cast(),
            DEVICE_POINTER,
            host as u64
        ),
        OK
    );
    assert_eq!(dp, host as u64);

    let mut s: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s, 1),
        OK
    );
    // SAFETY: 8 writable bytes of ours.
    unsafe { std::ptr::write_volatile(host.cast::<[u32; 2]>(), [7, 7]) };
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32Async",
            fn(u64, c_uint, usize, Ptr),
            host as u64,
            0,
            2,
            s
        ),
        OK
    );
    assert_eq!(cu.sync(s), OK);
    assert_eq!(words(host), [0, 0], "the memset reached the host's bytes");

    // Device to pinned host memory and back, as device-to-device copies.
    let mut dev = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut dev, 4096),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32",
            fn(u64, c_uint, usize),
            dev,
            0x5151_5151,
            2
        ),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemcpyDtoD", fn(u64, u64, usize), host as u64, dev, 8),
        OK
    );
    assert_eq!(words(host), [0x5151_5151; 2]);
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile(host.cast::<[u32; 2]>(), [1, 2]) };
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoD",
            fn(u64, u64, usize),
            dev + 64,
            host as u64,
            8
        ),
        OK
    );
    let mut back = [0u32; 2];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            dev + 64,
            8
        ),
        OK
    );
    assert_eq!(back, [1, 2]);

    if gpu {
        let mut module: Ptr = null_mut();
        assert_eq!(
            call!(
                cu,
                "cuModuleLoadData",
                fn(*mut Ptr, *const c_void),
                &mut module,
                WRITE_HOST.as_ptr().cast()
            ),
            OK
        );
        let mut f: Ptr = null_mut();
        assert_eq!(
            call!(
                cu,
                "cuModuleGetFunction",
                fn(*mut Ptr, Ptr, *const c_char),
                &mut f,
                module,
                c"write_host".as_ptr()
            ),
            OK
        );
        let mut p = host as u64;
        let mut v: u32 = 0x1234;
        let mut params: [Ptr; 2] = [(&mut p as *mut u64).cast(), (&mut v as *mut u32).cast()];
        assert_eq!(cu.launch_1d(f, 1, 1, s, &mut params), OK);
        assert_eq!(cu.sync(s), OK);
        assert_eq!(
            words(host),
            [0x1234, 0x1235],
            "the kernel wrote through the host pointer"
        );
    }

    // Registered (pageable) memory is not device-mapped: no device pointer, no memset.
    let mut reg = vec![0u32; 1024];
    let regp: Ptr = reg.as_mut_ptr().cast();
    assert_eq!(
        call!(
            cu,
            "cuMemHostRegister",
            fn(Ptr, usize, c_uint),
            regp,
            4096,
            DEVICEMAP
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemHostGetDevicePointer",
            fn(*mut u64, Ptr, c_uint),
            &mut dptr,
            regp,
            0
        ),
        NOT_SUPPORTED
    );
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, c_uint, usize), regp as u64, 9, 4),
        INVALID_VALUE
    );
    assert_eq!(reg[0], 0);
    assert_eq!(call!(cu, "cuMemHostUnregister", fn(Ptr), regp), OK);

    assert_eq!(call!(cu, "cuStreamDestroy", fn(Ptr), s), OK);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), dev), OK);
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), host), OK);
}
