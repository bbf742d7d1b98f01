//! Lazy loading of libraries through the C ABI against a sim `vgpu-worker`, as the CUDA
//! runtime uses it: libraries created with no context current, hundreds of them (more than
//! a program uses at once), none charged to the vGPU until its first use; a kernel's launch,
//! `cuLibraryGetModule` and `cuFuncLoad` load one library each (one module charged), an
//! image the vGPU cannot run fails its first use rather than its creation, a kernel name
//! of 1 000 bytes reaches the device, and unloading gives the memory back.
//! One test per file: the library is one per process.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;

use common::cuda::*;

/// What one built-in module is charged on a sim vGPU (a page).
const MODULE_BYTES: usize = 4096;
/// More libraries than a vGPU could hold loaded at once when each was a module load.
const LIBRARIES: usize = 300;
/// `CU_MODULE_LAZY_LOADING`; `CU_FUNCTION_LOADING_STATE_UNLOADED`, `_LOADED`.
const LAZY: c_int = 2;
const UNLOADED: c_uint = 0;
const LOADED: c_uint = 1;

#[test]
fn libraries_load_on_first_use() {
    let (_worker, cu) = common::cuda::start("library-lazy");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let load = |lib: &mut Ptr, image: &CStr| {
        call!(
            cu,
            "cuLibraryLoadData",
            fn(*mut Ptr, *const c_void, Ptr, Ptr, c_uint, Ptr, Ptr, c_uint),
            lib,
            image.as_ptr().cast(),
            null_mut(),
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0
        )
    };

    // No context is current: the runtime creates its libraries before any call makes one.
    let mut current: Ptr = 0x1 as Ptr;
    assert_eq!(call!(cu, "cuCtxGetCurrent", fn(*mut Ptr), &mut current), OK);
    assert!(current.is_null());
    let mut libs = vec![null_mut(); LIBRARIES];
    for lib in &mut libs {
        assert_eq!(load(lib, c"vgpu:builtin"), OK);
    }
    let mut mode: c_int = 0;
    assert_eq!(
        call!(cu, "cuModuleGetLoadingMode", fn(*mut c_int), &mut mode),
        OK
    );
    assert_eq!(mode, LAZY);

    cu.primary_context(0);
    let free = || {
        let (mut free, mut total) = (0usize, 0usize);
        assert_eq!(
            call!(
                cu,
                "cuMemGetInfo",
                fn(*mut usize, *mut usize),
                &mut free,
                &mut total
            ),
            OK
        );
        free
    };
    let start = free();
    assert_eq!(
        start,
        256 << 20,
        "{LIBRARIES} libraries hold no vGPU memory"
    );

    // Kernels by name before the library loads: a name the image lacks is refused now, a
    // known one is unloaded until its first use.
    let get_kernel = |k: &mut Ptr, lib: Ptr, name: &CStr| {
        call!(
            cu,
            "cuLibraryGetKernel",
            fn(*mut Ptr, Ptr, *const c_char),
            k,
            lib,
            name.as_ptr()
        )
    };
    let (mut vadd, mut again, mut none) = (null_mut(), null_mut(), null_mut());
    assert_eq!(get_kernel(&mut none, libs[0], c"no_such_kernel"), NOT_FOUND);
    assert_eq!(get_kernel(&mut vadd, libs[0], c"vector_add"), OK);
    assert_eq!(get_kernel(&mut again, libs[0], c"vector_add"), OK);
    assert_eq!(vadd, again, "one kernel per name");
    let is_loaded = |f: Ptr| {
        let mut state: c_uint = 9;
        assert_eq!(
            call!(cu, "cuFuncIsLoaded", fn(*mut c_uint, Ptr), &mut state, f),
            OK
        );
        state
    };
    assert_eq!(is_loaded(vadd), UNLOADED);
    let mut owner: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuKernelGetLibrary",
            fn(*mut Ptr, Ptr),
            &mut owner,
            vadd
        ),
        OK
    );
    assert_eq!(owner, libs[0]);
    let mut name: *const c_char = std::ptr::null();
    assert_eq!(
        call!(
            cu,
            "cuKernelGetName",
            fn(*mut *const c_char, Ptr),
            &mut name,
            vadd
        ),
        OK
    );
    // SAFETY: the library answered a NUL-terminated name that lives as long as it.
    assert_eq!(unsafe { CStr::from_ptr(name) }, c"vector_add");
    assert_eq!(free(), start);

    // The launch loads the library: c = a + b, one module charged.
    let n = 4096usize;
    let bytes = n * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    let ha: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n).map(|i| 3.0 * i as f32).collect();
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
    let allocated = free();
    let mut n64 = n as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    assert_eq!(cu.launch_1d(vadd, 16, 256, null_mut(), &mut params), OK);
    let mut back = vec![0u8; bytes];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            bytes
        ),
        OK
    );
    let want: Vec<f32> = (0..n).map(|i| 4.0 * i as f32).collect();
    assert_eq!(floats(&back), want);
    assert_eq!(is_loaded(vadd), LOADED);
    assert_eq!(free(), allocated - MODULE_BYTES, "one library loaded");

    // The library's module and a kernel's cuFuncLoad load theirs; asking again loads
    // nothing more.
    let mut module: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuLibraryGetModule",
            fn(*mut Ptr, Ptr),
            &mut module,
            libs[1]
        ),
        OK
    );
    assert!(!module.is_null());
    assert_eq!(
        call!(
            cu,
            "cuLibraryGetModule",
            fn(*mut Ptr, Ptr),
            &mut module,
            libs[1]
        ),
        OK
    );
    let mut saxpy: Ptr = null_mut();
    assert_eq!(get_kernel(&mut saxpy, libs[2], c"saxpy"), OK);
    assert_eq!(call!(cu, "cuFuncLoad", fn(Ptr), saxpy), OK);
    assert_eq!(is_loaded(saxpy), LOADED);
    assert_eq!(
        free(),
        allocated - 3 * MODULE_BYTES,
        "three libraries loaded"
    );

    // A C++ template's kernel name, 1 000 bytes, is looked up on the device (which has no
    // such kernel) rather than refused for its length.
    let long = std::ffi::CString::new(vec![b'k'; 1000]).expect("name");
    let mut f: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const c_char),
            &mut f,
            module,
            long.as_ptr()
        ),
        NOT_FOUND
    );

    // A PTX library: the sim vGPU cannot run PTX, which its first use reports (and every
    // later one), not its creation; a name its entry list lacks is refused at once.
    let ptx = c".version 7.0\n.target sm_50\n.address_size 64\n\n.visible .entry fill(\n\t.param .u64 p,\n\t.param .u32 v\n)\n{\n\tret;\n}\n";
    let mut text_lib: Ptr = null_mut();
    assert_eq!(load(&mut text_lib, ptx), OK);
    let mut fill: Ptr = null_mut();
    assert_eq!(
        get_kernel(&mut none, text_lib, c"no_such_kernel"),
        NOT_FOUND
    );
    assert_eq!(get_kernel(&mut fill, text_lib, c"fill"), OK);
    for _ in 0..2 {
        let mut f: Ptr = null_mut();
        assert_eq!(
            call!(cu, "cuKernelGetFunction", fn(*mut Ptr, Ptr), &mut f, fill),
            NO_BINARY_FOR_GPU
        );
    }
    assert_eq!(call!(cu, "cuLibraryUnload", fn(Ptr), text_lib), OK);
    assert_eq!(
        free(),
        allocated - 3 * MODULE_BYTES,
        "the refused image holds nothing"
    );

    // Unloading every library gives the modules' memory back; their kernels are gone.
    for lib in &libs {
        assert_eq!(call!(cu, "cuLibraryUnload", fn(Ptr), *lib), OK);
    }
    assert_eq!(free(), allocated);
    assert_eq!(
        call!(cu, "cuLibraryUnload", fn(Ptr), libs[0]),
        INVALID_HANDLE
    );
    assert_eq!(call!(cu, "cuFuncLoad", fn(Ptr), saxpy), INVALID_HANDLE);
    assert_eq!(
        get_kernel(&mut none, libs[3], c"vector_add"),
        INVALID_HANDLE
    );
}
