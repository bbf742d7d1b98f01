//! The library through its C ABI against a sim `vgpu-worker`: the library API
//! (`cuLibrary*`, `cuKernel*`), function attributes, occupancy, `cuLaunchKernelEx`, the
//! module loading mode and context limits, each with the bad input a program could pass.
//! One test per file: the library is one per process. The test's parts: this file
//! (set-up, libraries, kernels, enumeration), then `api_func/cluster_table.rs` (the
//! driver's private cluster table) and `api_func/attributes.rs` on the same library.

#[path = "api_func/attributes.rs"]
mod attributes;
#[path = "api_func/cluster_table.rs"]
mod cluster_table;
mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;

use common::cuda::*;

const UNSUPPORTED_LIMIT: R = 215;

/// `CUlaunchAttribute`.
#[repr(C)]
struct LaunchAttribute {
    id: c_uint,
    pad: [u8; 4],
    value: [u32; 16],
}

/// `CUlaunchConfig`.
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: Ptr,
    attrs: *const LaunchAttribute,
    num_attrs: c_uint,
}

fn attr(id: c_uint, words: &[u32]) -> LaunchAttribute {
    let mut value = [0u32; 16];
    value[..words.len()].copy_from_slice(words);
    LaunchAttribute {
        id,
        pad: [0; 4],
        value,
    }
}

/// What the parts of the test share: the library with its primary context current, the
/// built-in library `lib` (loaded eagerly) and `lib2`, its `vector_add` kernel `vadd` and
/// that kernel's function `func`, and the library's module.
struct Setup {
    cu: Cuda,
    lib: Ptr,
    lib2: Ptr,
    vadd: Ptr,
    func: Ptr,
    module: Ptr,
}

#[test]
fn libraries_function_attributes_occupancy_and_extended_launches() {
    let (_worker, cu) = common::cuda::start("api-func");
    // Before cuInit, as every call.
    let mut lib: Ptr = null_mut();
    let no_opts = |lib: &mut Ptr, name: &CStr| {
        call!(
            cu,
            "cuLibraryLoadFromFile",
            fn(*mut Ptr, *const c_char, Ptr, Ptr, c_uint, Ptr, Ptr, c_uint),
            lib,
            name.as_ptr(),
            null_mut(),
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0
        )
    };
    assert_eq!(no_opts(&mut lib, c"vgpu:builtin"), NOT_INITIALIZED);
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    cu.primary_context(0);

    // Libraries: load (eager), kernels, module, globals, unload.
    assert_eq!(no_opts(&mut lib, c"/no/such/file.cubin"), FILE_NOT_FOUND);
    assert_eq!(no_opts(&mut lib, c"vgpu:builtin"), OK);
    let mut lib2: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuLibraryLoadData",
            fn(*mut Ptr, *const c_void, Ptr, Ptr, c_uint, Ptr, Ptr, c_uint),
            &mut lib2,
            c"vgpu:builtin".as_ptr().cast(),
            null_mut(),
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuLibraryLoadData",
            fn(*mut Ptr, *const c_void, Ptr, Ptr, c_uint, Ptr, Ptr, c_uint),
            null_mut(),
            c"vgpu:builtin".as_ptr().cast(),
            null_mut(),
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0
        ),
        INVALID_VALUE
    );
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
    assert_eq!(get_kernel(&mut vadd, lib, c"vector_add"), OK);
    assert_eq!(get_kernel(&mut again, lib, c"vector_add"), OK);
    assert_eq!(vadd, again, "one kernel per name");
    assert_eq!(get_kernel(&mut none, lib, c"no_such_kernel"), NOT_FOUND);
    assert_eq!(
        get_kernel(&mut none, 0x7777 as Ptr, c"vector_add"),
        INVALID_HANDLE
    );
    let mut func: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuKernelGetFunction",
            fn(*mut Ptr, Ptr),
            &mut func,
            vadd
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuKernelGetFunction",
            fn(*mut Ptr, Ptr),
            &mut func,
            0x7777 as Ptr
        ),
        INVALID_HANDLE
    );
    assert_eq!(
        call!(
            cu,
            "cuKernelGetFunction",
            fn(*mut Ptr, Ptr),
            &mut func,
            vadd
        ),
        OK
    );
    let mut module: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuLibraryGetModule",
            fn(*mut Ptr, Ptr),
            &mut module,
            lib
        ),
        OK
    );
    assert!(!module.is_null());
    let mut fmod: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuFuncGetModule", fn(*mut Ptr, Ptr), &mut fmod, func),
        OK
    );
    assert_eq!(fmod, module);
    let mut klib: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuKernelGetLibrary", fn(*mut Ptr, Ptr), &mut klib, vadd),
        OK
    );
    assert_eq!(klib, lib);
    let (mut gptr, mut gsize) = (0u64, 0usize);
    assert_eq!(
        call!(
            cu,
            "cuLibraryGetGlobal",
            fn(*mut u64, *mut usize, Ptr, *const c_char),
            &mut gptr,
            &mut gsize,
            lib,
            c"scale".as_ptr()
        ),
        NOT_FOUND
    );
    let mut name: *const c_char = std::ptr::null();
    assert_eq!(
        call!(
            cu,
            "cuFuncGetName",
            fn(*mut *const c_char, Ptr),
            &mut name,
            func
        ),
        OK
    );
    // SAFETY: the library returned a C string that lives as long as the program.
    assert_eq!(unsafe { CStr::from_ptr(name) }, c"vector_add");
    assert_eq!(
        call!(
            cu,
            "cuKernelGetName",
            fn(*mut *const c_char, Ptr),
            null_mut(),
            vadd
        ),
        INVALID_VALUE
    );

    assert_eq!(
        call!(
            cu,
            "cuFuncGetModule",
            fn(*mut Ptr, Ptr),
            &mut fmod,
            0x7777 as Ptr
        ),
        INVALID_HANDLE
    );
    assert_eq!(
        call!(
            cu,
            "cuKernelGetLibrary",
            fn(*mut Ptr, Ptr),
            &mut klib,
            0x7777 as Ptr
        ),
        INVALID_HANDLE
    );
    assert_eq!(
        call!(
            cu,
            "cuLibraryLoadFromFile",
            fn(*mut Ptr, *const c_char, Ptr, Ptr, c_uint, Ptr, Ptr, c_uint),
            &mut lib2,
            std::ptr::null(),
            null_mut(),
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0
        ),
        INVALID_VALUE
    );

    // Enumeration: the built-in module's kernels, each a function; parameter layouts.
    let mut count: c_uint = 0;
    assert_eq!(
        call!(
            cu,
            "cuModuleGetFunctionCount",
            fn(*mut c_uint, Ptr),
            &mut count,
            module
        ),
        OK
    );
    assert_eq!(count, 8);
    let mut all: Vec<Ptr> = vec![null_mut(); count as usize];
    assert_eq!(
        call!(
            cu,
            "cuModuleEnumerateFunctions",
            fn(*mut Ptr, c_uint, Ptr),
            all.as_mut_ptr(),
            count,
            module
        ),
        OK
    );
    assert!(all.iter().all(|f| !f.is_null()));
    let names: Vec<String> = all
        .iter()
        .map(|&f| {
            let mut n: *const c_char = std::ptr::null();
            assert_eq!(
                call!(cu, "cuFuncGetName", fn(*mut *const c_char, Ptr), &mut n, f),
                OK
            );
            // SAFETY: a C string of the library that lives as long as the program.
            unsafe { CStr::from_ptr(n) }.to_str().unwrap().to_string()
        })
        .collect();
    assert!(names.iter().any(|n| n == "vector_add") && names.iter().any(|n| n == "saxpy"));
    assert_eq!(
        call!(
            cu,
            "cuModuleEnumerateFunctions",
            fn(*mut Ptr, c_uint, Ptr),
            null_mut(),
            8,
            module
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleGetFunctionCount",
            fn(*mut c_uint, Ptr),
            &mut count,
            0x7777 as Ptr
        ),
        INVALID_HANDLE
    );
    let mut kcount: c_uint = 0;
    assert_eq!(
        call!(
            cu,
            "cuLibraryGetKernelCount",
            fn(*mut c_uint, Ptr),
            &mut kcount,
            lib
        ),
        OK
    );
    assert_eq!(kcount, 8);
    let mut kernels: Vec<Ptr> = vec![null_mut(); 8];
    assert_eq!(
        call!(
            cu,
            "cuLibraryEnumerateKernels",
            fn(*mut Ptr, c_uint, Ptr),
            kernels.as_mut_ptr(),
            8,
            lib
        ),
        OK
    );
    assert!(
        kernels.contains(&vadd),
        "the kernel already looked up, the same handle"
    );
    assert_eq!(
        call!(
            cu,
            "cuLibraryEnumerateKernels",
            fn(*mut Ptr, c_uint, Ptr),
            kernels.as_mut_ptr(),
            8,
            0x7777 as Ptr
        ),
        INVALID_HANDLE
    );
    let param = |i: usize| {
        let (mut off, mut size) = (usize::MAX, usize::MAX);
        let r = call!(
            cu,
            "cuKernelGetParamInfo",
            fn(Ptr, usize, *mut usize, *mut usize),
            vadd,
            i,
            &mut off,
            &mut size
        );
        (r, off, size)
    };
    assert_eq!(param(0), (OK, 0, 8));
    assert_eq!(
        param(3),
        (OK, 24, 8),
        "n: an 8-byte count after three pointers"
    );
    assert_eq!(param(4).0, INVALID_VALUE, "past the last parameter");
    assert_eq!(
        call!(
            cu,
            "cuFuncGetParamInfo",
            fn(Ptr, usize, *mut usize, *mut usize),
            0x7777 as Ptr,
            0,
            null_mut(),
            null_mut()
        ),
        INVALID_HANDLE
    );
    let mut state: c_uint = 0;
    assert_eq!(
        call!(cu, "cuFuncIsLoaded", fn(*mut c_uint, Ptr), &mut state, func),
        OK
    );
    assert_eq!(state, 1, "loaded");
    assert_eq!(call!(cu, "cuFuncLoad", fn(Ptr), func), OK);
    assert_eq!(
        call!(cu, "cuFuncLoad", fn(Ptr), 0x7777 as Ptr),
        INVALID_HANDLE
    );
    assert_eq!(
        call!(cu, "cuFuncSetSharedMemConfig", fn(Ptr, c_int), func, 7),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuKernelSetCacheConfig",
            fn(Ptr, c_int, c_int),
            vadd,
            1,
            3
        ),
        INVALID_DEVICE
    );
    assert_eq!(
        call!(
            cu,
            "cuLibraryGetGlobal",
            fn(*mut u64, *mut usize, Ptr, *const c_char),
            null_mut(),
            null_mut(),
            0x7777 as Ptr,
            c"x".as_ptr()
        ),
        INVALID_HANDLE
    );
    let t = Setup {
        cu,
        lib,
        lib2,
        vadd,
        func,
        module,
    };
    cluster_table::every_slot_of_the_cluster_table(&t);
    attributes::launches_attributes_occupancy_and_limits(&t);
}
