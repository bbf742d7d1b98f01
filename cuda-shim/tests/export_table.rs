//! `cuGetExportTable` through the C ABI (the library loaded with `dlopen`, against a sim
//! worker), as NVIDIA's CUDA runtime uses it: the tables' sizes, the integrity check's
//! digest (recomputed here from the process, the calling thread, the tables' addresses and
//! the device's identity), context-local storage and its destructors when a context goes,
//! the primary context slot, and the answers to bad input. Needs no CUDA runtime.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::cuda::*;
use vgpu_cuda::integrity::{self, DeviceIdentity};

type GetTable = unsafe extern "C" fn(*mut *const c_void, *const [u8; 16]) -> R;
type Integrity = unsafe extern "C" fn(c_uint, u64, *mut [u64; 2]) -> R;
type Dtor = unsafe extern "C" fn(Ptr, Ptr, Ptr);
type Put = unsafe extern "C" fn(Ptr, Ptr, Ptr, Option<Dtor>) -> R;
type Get = unsafe extern "C" fn(*mut Ptr, Ptr, Ptr) -> R;
type Delete = unsafe extern "C" fn(Ptr, Ptr) -> R;
type Primary = unsafe extern "C" fn(*mut Ptr, c_int) -> R;

const CUDART: [u8; 16] = [
    0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9,
];
const STORAGE: [u8; 16] = [
    0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93,
];
const INTEGRITY: [u8; 16] = [
    0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2,
];

/// (context, key, value) of every destructor call.
static DESTROYED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn on_destroy(_ctx: Ptr, key: Ptr, value: Ptr) {
    assert_eq!(key as usize, 0x6b);
    DESTROYED.store(value as usize, Ordering::SeqCst);
}

fn table(get: GetTable, id: &[u8; 16]) -> *const usize {
    let mut t: *const c_void = null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { get(&mut t, id) }, OK);
    assert!(!t.is_null());
    t.cast()
}

/// Slot `i` of a table as a function of type `F`.
fn slot<F: Copy>(t: *const usize, i: usize) -> F {
    // SAFETY: the library's tables hold at least `i + 1` words (checked by the caller).
    let word = unsafe { t.add(i).read() };
    assert_ne!(word, 0, "slot {i} is empty");
    // SAFETY: the caller names the slot's C signature as F (a fn pointer type).
    unsafe { std::mem::transmute_copy(&word) }
}

#[test]
fn the_runtimes_private_tables() {
    let (_worker, cu) = common::cuda::start("export-table");
    let get: GetTable = cu.f("cuGetExportTable");
    let mut t: *const c_void = std::ptr::dangling();
    let unknown = [0xeeu8; 16];
    // SAFETY: valid pointers (and NULLs the library must refuse).
    unsafe {
        assert_eq!(get(null_mut(), &CUDART), INVALID_VALUE);
        assert_eq!(get(&mut t, std::ptr::null()), INVALID_VALUE);
        assert_eq!(get(&mut t, &unknown), INVALID_VALUE);
    }
    assert!(t.is_null(), "an unknown table answers NULL");

    // Before cuInit the tables exist, their device slots answer NOT_INITIALIZED.
    let check = table(get, &INTEGRITY);
    // SAFETY: slot 0 of a table is its size.
    assert_eq!(unsafe { check.read() }, 3 * 8);
    let digest_of: Integrity = slot(check, 1);
    let mut out = [0u64; 2];
    // SAFETY: valid pointers.
    assert_eq!(unsafe { digest_of(12082, 1, &mut out) }, NOT_INITIALIZED);
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);

    // The integrity digest covers this process, this thread and the device.
    let cudart = table(get, &CUDART);
    // SAFETY: slot 0 of a table is its size.
    assert_eq!(unsafe { cudart.read() }, 13 * 8);
    let mut uuid = [0u8; 16];
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetUuid",
            fn(*mut [u8; 16], c_int),
            &mut uuid,
            0
        ),
        OK
    );
    let attr = |a: c_int| {
        let mut v: c_int = -1;
        assert_eq!(
            call!(
                cu,
                "cuDeviceGetAttribute",
                fn(*mut c_int, c_int, c_int),
                &mut v,
                a,
                0
            ),
            OK
        );
        v
    };
    let device = DeviceIdentity {
        uuid,
        pci_domain: attr(50),
        pci_bus: attr(33),
        pci_device: attr(34),
    };
    let mut version: c_int = 0;
    assert_eq!(
        call!(cu, "cuDriverGetVersion", fn(*mut c_int), &mut version),
        OK
    );
    let seconds = 0x682b_9cee;
    // SAFETY: valid pointers.
    assert_eq!(unsafe { digest_of(12082, seconds, &mut out) }, OK);
    let inputs = integrity::Inputs {
        version: 12082,
        unix_seconds: seconds,
        driver_version: version as u32,
        process: std::process::id(),
        // SAFETY: no preconditions.
        thread: unsafe { libc::pthread_self() } as u32,
        cudart_table: cudart as usize,
        integrity_table: check as usize,
        // SAFETY: slot 1 exists (size checked above).
        function: unsafe { check.add(1).read() },
    };
    assert_eq!(out, integrity::digest(&inputs, &[device]));
    // Another thread is another digest.
    let other = std::thread::spawn(move || {
        let mut o = [0u64; 2];
        // SAFETY: valid pointers.
        assert_eq!(unsafe { digest_of(12082, seconds, &mut o) }, OK);
        o
    })
    .join()
    .unwrap();
    assert_ne!(other, out);
    // SAFETY: a NULL output, which the library refuses.
    let refused = unsafe { digest_of(12082, seconds, null_mut()) };
    assert_eq!(refused, INVALID_VALUE);

    // The primary context slot: the handle cuDevicePrimaryCtxRetain answers.
    let primary: Primary = slot(cudart, 2);
    let mut ctx: Ptr = null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { primary(&mut ctx, 0) }, OK);
    let mut retained: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuDevicePrimaryCtxRetain",
            fn(*mut Ptr, c_int),
            &mut retained,
            0
        ),
        OK
    );
    assert_eq!(ctx, retained);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { primary(&mut ctx, 1) }, INVALID_DEVICE);

    // Context-local storage, on a context the program creates and destroys.
    let storage = table(get, &STORAGE);
    let (put, delete, get_value): (Put, Delete, Get) =
        (slot(storage, 0), slot(storage, 1), slot(storage, 2));
    let mut own: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuCtxCreate",
            fn(*mut Ptr, Ptr, c_uint, c_int),
            &mut own,
            null_mut(),
            0,
            0
        ),
        OK
    );
    let key = 0x6b as Ptr;
    let mut v: Ptr = null_mut();
    // SAFETY: valid pointers, handles from the library (and foreign ones it must refuse).
    unsafe {
        assert_eq!(get_value(&mut v, own, key), INVALID_HANDLE);
        assert_eq!(put(own, key, 0x1234 as Ptr, Some(on_destroy)), OK);
        assert_eq!(get_value(&mut v, own, key), OK);
        assert_eq!(v as usize, 0x1234);
        // NULL means the current context: the one just created.
        assert_eq!(get_value(&mut v, null_mut(), key), OK);
        assert_eq!(get_value(&mut v, retained, key), INVALID_HANDLE);
        assert_eq!(get_value(&mut v, 0xdead_0000 as Ptr, key), INVALID_CONTEXT);
        assert_eq!(put(0xdead_0000 as Ptr, key, v, None), INVALID_CONTEXT);
        assert_eq!(get_value(null_mut(), own, key), INVALID_VALUE);
        assert_eq!(put(own, key, 0x5678 as Ptr, Some(on_destroy)), OK);
        assert_eq!(delete(retained, key), OK);
        assert_eq!(get_value(&mut v, own, key), OK);
        assert_eq!(v as usize, 0x5678);
    }
    assert_eq!(DESTROYED.load(Ordering::SeqCst), 0);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), own), OK);
    assert_eq!(
        DESTROYED.load(Ordering::SeqCst),
        0x5678,
        "destructor at destroy"
    );
    // SAFETY: valid pointers; the destroyed context is no longer live.
    assert_eq!(unsafe { get_value(&mut v, own, key) }, INVALID_CONTEXT);
}
