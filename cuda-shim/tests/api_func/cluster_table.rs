//! CLUSTER_PROTOTYPE, the driver's private table of cluster calls cuBLASLt uses before
//! its Hopper GEMMs: every slot, on a function and a device, with the bad input a program
//! could pass. A sim vGPU runs no clusters, so setting a cluster answers NOT_SUPPORTED
//! while the permissions and preferences are kept and read back through
//! `cuFuncGetAttribute` as well.

use super::*;

const CLUSTER_PROTOTYPE: [u8; 16] = [
    0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca,
];

/// Slot `i` of `table` as a function of type `F`.
fn slot<F: Copy>(table: *const usize, i: usize) -> F {
    // SAFETY: the table holds 17 words (its size, checked first).
    let word = unsafe { table.add(i).read() };
    assert_ne!(word, 0, "slot {i} is empty");
    // SAFETY: the caller names the slot's C signature as F (a fn pointer type).
    unsafe { std::mem::transmute_copy(&word) }
}

pub(crate) fn every_slot_of_the_cluster_table(t: &Setup) {
    let cu = &t.cu;
    let func = t.func;
    let foreign = 0x7777 as Ptr;
    let mut table: *const c_void = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuGetExportTable",
            fn(*mut *const c_void, *const [u8; 16]),
            &mut table,
            &CLUSTER_PROTOTYPE
        ),
        OK
    );
    let table: *const usize = table.cast();
    assert!(!table.is_null());
    // SAFETY: slot 0 is the table's size.
    assert_eq!(unsafe { table.read() }, 17 * 8, "the size and 16 calls");

    type SetDim = unsafe extern "C" fn(Ptr, c_int, c_int, c_int) -> R;
    type SetInt = unsafe extern "C" fn(Ptr, c_int) -> R;
    type GetDim = unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int, *mut c_int) -> R;
    type GetInt = unsafe extern "C" fn(Ptr, *mut c_int) -> R;
    type DevInt = unsafe extern "C" fn(c_int, *mut c_int) -> R;
    type MaxSize = unsafe extern "C" fn(Ptr, c_int, usize, *mut c_int) -> R;
    type Active = unsafe extern "C" fn(Ptr, c_int, usize, c_int, *mut c_int) -> R;
    type Override = unsafe extern "C" fn(c_int, c_uint) -> c_uint;
    type Layout = unsafe extern "C" fn(*mut *mut u8, *mut *mut u8) -> R;
    type FreeLayout = unsafe extern "C" fn(*mut u8, *mut u8) -> R;
    type Cnp = unsafe extern "C" fn(*mut c_int) -> R;
    type Singleton = unsafe extern "C" fn(c_int, *mut u8) -> R;

    let get_attr = |a: c_int| {
        let mut v: c_int = -1;
        let r = call!(
            cu,
            "cuFuncGetAttribute",
            fn(*mut c_int, c_int, Ptr),
            &mut v,
            a,
            func
        );
        assert_eq!(r, OK, "attribute {a}");
        v
    };
    let per_sm = cu.blocks_per_sm(func, 128, 0);
    let sms = cu.device_attribute(16);
    assert!(per_sm > 0 && sms > 0);
    let mut dims = [-1 as c_int; 3];
    let get_dim: GetDim = slot(table, 5);
    let set_dim: SetDim = slot(table, 1);
    // SAFETY: each call below uses the slot's C signature as named, with pointers valid or
    // NULL where the library must refuse them.
    unsafe {
        // The function's cluster: none set, none settable on a vGPU without clusters,
        // malformed shapes refused, resetting to none always fine.
        assert_eq!(get_dim(func, &mut dims[0], &mut dims[1], &mut dims[2]), OK);
        assert_eq!(dims, [0, 0, 0]);
        assert_eq!(set_dim(func, 0, 0, 0), OK);
        assert_eq!(set_dim(func, 2, 1, 1), NOT_SUPPORTED, "no clusters on sim");
        assert_eq!(
            set_dim(func, 2, 0, 1),
            INVALID_VALUE,
            "all zero or all positive"
        );
        assert_eq!(set_dim(func, -1, 1, 1), INVALID_VALUE);
        assert_eq!(set_dim(foreign, 0, 0, 0), INVALID_HANDLE);
        assert_eq!(
            get_dim(func, null_mut(), &mut dims[1], &mut dims[2]),
            INVALID_VALUE
        );
        assert_eq!(
            get_dim(foreign, &mut dims[0], &mut dims[1], &mut dims[2]),
            INVALID_HANDLE
        );

        // The scheduling policy and non-portable sizes: kept, and the same as the
        // function attributes.
        let set_policy: SetInt = slot(table, 2);
        let get_policy: GetInt = slot(table, 6);
        let mut v: c_int = -1;
        assert_eq!(set_policy(func, 1), OK);
        assert_eq!(get_policy(func, &mut v), OK);
        assert_eq!(v, 1);
        assert_eq!(get_attr(15), 1, "CLUSTER_SCHEDULING_POLICY_PREFERENCE");
        assert_eq!(set_policy(func, 3), INVALID_VALUE);
        assert_eq!(set_policy(foreign, 0), INVALID_HANDLE);
        assert_eq!(get_policy(func, null_mut()), INVALID_VALUE);
        assert_eq!(set_policy(func, 0), OK);

        let set_np: SetInt = slot(table, 3);
        let get_np: GetInt = slot(table, 7);
        assert_eq!(set_np(func, 1), OK);
        assert_eq!(get_np(func, &mut v), OK);
        assert_eq!(v, 1);
        assert_eq!(get_attr(14), 1, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED");
        assert_eq!(set_np(foreign, 1), INVALID_HANDLE);
        assert_eq!(set_np(func, 0), OK);
        assert_eq!(get_attr(14), 0);

        // The device: no cluster launch on sim, no preferred clusters, no CNP clusters.
        let launch_ok: DevInt = slot(table, 8);
        assert_eq!(launch_ok(0, &mut v), OK);
        assert_eq!(v, 0, "as CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH");
        assert_eq!(launch_ok(5, &mut v), INVALID_DEVICE);
        assert_eq!(launch_ok(0, null_mut()), INVALID_VALUE);
        let preferred: DevInt = slot(table, 16);
        v = -1;
        assert_eq!(preferred(0, &mut v), OK);
        assert_eq!(v, 0);
        assert_eq!(preferred(9, &mut v), INVALID_DEVICE);
        let cnp: Cnp = slot(table, 14);
        v = -1;
        assert_eq!(cnp(&mut v), OK);
        assert_eq!(v, 0);
        assert_eq!(cnp(null_mut()), INVALID_VALUE);

        // Occupancy, as the public calls answer it.
        let max_size: MaxSize = slot(table, 9);
        assert_eq!(max_size(func, 128, 0, &mut v), OK);
        assert_eq!(v, 1, "one block where clusters do not run");
        assert_eq!(max_size(func, 0, 0, &mut v), INVALID_VALUE);
        assert_eq!(max_size(foreign, 128, 0, &mut v), INVALID_HANDLE);
        let active: Active = slot(table, 10);
        assert_eq!(active(func, 128, 0, 1, &mut v), OK);
        assert_eq!(v, per_sm * sms);
        assert_eq!(active(func, 128, 0, 2, &mut v), OK);
        assert_eq!(v, 0, "no cluster of two runs on sim");
        assert_eq!(active(func, 128, 0, 0, &mut v), INVALID_VALUE);
        assert_eq!(active(func, -4, 0, 1, &mut v), INVALID_VALUE);
        assert_eq!(active(foreign, 128, 0, 1, &mut v), INVALID_HANDLE);
        assert_eq!(active(func, 128, 0, 1, null_mut()), INVALID_VALUE);

        // The rest: the override answers the limit the vGPU keeps, the compile-time
        // requirement is absent, and the GPU's layout is not told.
        let override_size: Override = slot(table, 11);
        assert_eq!(override_size(0, 2), 16);
        assert_eq!(override_size(0, 16), 16, "the override is not kept");
        let must: GetInt = slot(table, 12);
        v = -1;
        assert_eq!(must(func, &mut v), OK);
        assert_eq!(v, 0);
        assert_eq!(must(foreign, &mut v), INVALID_HANDLE);
        let layout: Layout = slot(table, 4);
        let (mut a, mut b) = (null_mut(), null_mut());
        assert_eq!(layout(&mut a, &mut b), NOT_SUPPORTED);
        let free_layout: FreeLayout = slot(table, 13);
        assert_eq!(free_layout(null_mut(), null_mut()), OK);
        let mut byte = 0u8;
        assert_eq!(free_layout(&mut byte, null_mut()), INVALID_VALUE);
        let singleton: Singleton = slot(table, 15);
        assert_eq!(singleton(0, &mut byte), NOT_SUPPORTED);
    }
}
