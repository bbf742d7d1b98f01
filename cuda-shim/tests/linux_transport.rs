//! The library over guest-driver's Linux transport, as a program in a VM reaches its vGPU:
//! registers and DMA memory through a physical-memory file (here a regular file laid out
//! like `/dev/mem`, offset = physical address, with the DMA memory a reserved region of
//! it), and behind it the real vgpu-device request handling on a sim GPU, serving the
//! rings from the same file (`common/physmem.rs`). One test per file: the library is one
//! per process.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::cuda::*;
use common::physmem::*;
use vgpu_backend::{SimConfig, SimGpu};

#[test]
fn the_library_runs_over_the_linux_transport() {
    let mem = physical_memory("linux");
    let stop = Arc::new(AtomicBool::new(false));
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let device = serve(mem.0.clone(), stop.clone(), Arc::new(sim));
    use_linux_transport(&mem.0);
    let cu = Cuda::load();

    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let mut name = [0 as c_char; 64];
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetName",
            fn(*mut c_char, c_int, c_int),
            name.as_mut_ptr(),
            64,
            0
        ),
        OK
    );
    // SAFETY: the library wrote a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) };
    assert!(name.to_str().expect("utf-8").contains("vGPU"), "{name:?}");
    cu.primary_context(0);

    // Pageable copies (through the library's bounce buffers) and a built-in kernel.
    let n = 1usize << 16;
    let bytes = n * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    let ha: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    for (d, h) in [(a, &ha), (b, &hb)] {
        assert_eq!(
            call!(
                cu,
                "cuMemcpyHtoD",
                fn(u64, *const c_void, usize),
                d,
                h.as_ptr().cast(),
                bytes
            ),
            OK
        );
    }
    let module = cu.builtin_module();
    let vadd = cu.function(module, c"vector_add");
    let mut count = n as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut count as *mut u64).cast(),
    ];
    assert_eq!(
        cu.launch_1d(vadd, (n / 256) as c_uint, 256, null_mut(), &mut params),
        OK
    );
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), OK);

    // The result into pinned memory (DMA memory of the reserved region: no bounce).
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
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            pinned,
            c,
            bytes
        ),
        OK
    );
    // SAFETY: `pinned` holds `bytes` bytes the library allocated for us.
    let out = unsafe { std::slice::from_raw_parts(pinned.cast::<f32>(), n) };
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, 1.5 * i as f32, "element {i}");
    }
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), OK);
    for p in [a, b, c] {
        assert_eq!(call!(cu, "cuMemFree", fn(u64), p), OK);
    }
    assert_eq!(call!(cu, "cuModuleUnload", fn(Ptr), module), OK);

    stop.store(true, Ordering::SeqCst);
    let served = device.join().expect("device thread");
    assert!(
        served >= 10,
        "the device served the library's requests ({served})"
    );
}
