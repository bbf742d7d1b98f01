//! The virtual memory management round the library runs against a worker (sim in
//! `api_vmm.rs`, cuda in `gpu_vmm.rs`): the device attribute, the granularity, a reserve /
//! create / map / set-access round trip with copies, a memset and a kernel over the
//! mapping, the share (a physical allocation past it: OUT_OF_MEMORY; unmap and release
//! give it back), and what a program gets wrong (sizes off the granularity, maps outside a
//! reservation or over another, stale handles, cuMemFree of a mapping, unmaps that cut
//! one).

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use crate::call;
use crate::common::cuda::*;

const MIB: usize = 1 << 20;
const OUT_OF_MEMORY: R = 2;
const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;

#[repr(C)]
#[derive(Clone, Copy)]
struct Location {
    type_: c_int,
    id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Prop {
    type_: c_int,
    handle_types: c_int,
    location: Location,
    win32: *mut c_void,
    flags: [u8; 8],
}

#[repr(C)]
struct Access {
    location: Location,
    flags: c_int,
}

const DEVICE0: Location = Location { type_: 1, id: 0 };

fn prop() -> Prop {
    Prop {
        type_: 1,
        handle_types: 0,
        location: DEVICE0,
        win32: null_mut(),
        flags: [0; 8],
    }
}

/// The whole round: `cu` is the library connected to a fresh worker, not yet initialised.
pub fn exercise(cu: &Cuda) {
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let _ctx = cu.primary_context(0);
    let attr = |a: c_int| {
        let mut v: c_int = -1;
        let r = call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut v,
            a,
            0
        );
        assert_eq!(r, OK);
        v
    };
    assert_eq!(attr(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), 1);
    assert_eq!(attr(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED), 0);
    let free_mem = || {
        let (mut free, mut total) = (0usize, 0usize);
        let r = call!(
            cu,
            "cuMemGetInfo",
            fn(*mut usize, *mut usize),
            &mut free,
            &mut total
        );
        assert_eq!(r, OK);
        free
    };

    // The granularity: 2 MiB, minimum and recommended.
    let gran = |p: &Prop, option: c_int| {
        let mut g = 0usize;
        let r = call!(
            cu,
            "cuMemGetAllocationGranularity",
            fn(*mut usize, *const Prop, c_int),
            &mut g,
            p,
            option
        );
        (r, g)
    };
    assert_eq!(gran(&prop(), 0), (OK, 2 * MIB));
    assert_eq!(gran(&prop(), 1), (OK, 2 * MIB));
    assert_eq!(gran(&prop(), 2).0, INVALID_VALUE);
    let other_device = Prop {
        location: Location { type_: 1, id: 1 },
        ..prop()
    };
    assert_eq!(gran(&other_device, 0).0, INVALID_DEVICE);
    assert_eq!(
        call!(
            cu,
            "cuMemGetAllocationGranularity",
            fn(*mut usize, *const Prop, c_int),
            &mut 0,
            std::ptr::null(),
            0
        ),
        INVALID_VALUE
    );

    let reserve = |size: usize, align: usize, hint: u64| {
        let mut va = 0u64;
        let r = call!(
            cu,
            "cuMemAddressReserve",
            fn(*mut u64, usize, usize, u64, u64),
            &mut va,
            size,
            align,
            hint,
            0
        );
        (r, va)
    };
    let create = |size: usize, p: &Prop| {
        let mut h = 0u64;
        let r = call!(
            cu,
            "cuMemCreate",
            fn(*mut u64, usize, *const Prop, u64),
            &mut h,
            size,
            p,
            0
        );
        (r, h)
    };
    let map = |va: u64, size: usize, offset: usize, h: u64| {
        call!(
            cu,
            "cuMemMap",
            fn(u64, usize, usize, u64, u64),
            va,
            size,
            offset,
            h,
            0
        )
    };
    let unmap = |va: u64, size: usize| call!(cu, "cuMemUnmap", fn(u64, usize), va, size);
    let release = |h: u64| call!(cu, "cuMemRelease", fn(u64), h);
    let set_access = |va: u64, size: usize, flags: c_int| {
        let a = Access {
            location: DEVICE0,
            flags,
        };
        call!(
            cu,
            "cuMemSetAccess",
            fn(u64, usize, *const Access, usize),
            va,
            size,
            &a,
            1
        )
    };
    let get_access = |va: u64| {
        let mut f = 99u64;
        let r = call!(
            cu,
            "cuMemGetAccess",
            fn(*mut u64, *const Location, u64),
            &mut f,
            &DEVICE0,
            va
        );
        (r, f)
    };

    // Loaded first: the module's memory is charged too.
    let module = cu.builtin_module();
    let vadd = cu.function(module, c"vector_add");

    // A round trip with data checked.
    let before = free_mem();
    let (r, va) = reserve(16 * MIB, 0, 0);
    assert_eq!(r, OK);
    assert_eq!(va % (2 * MIB) as u64, 0);
    assert_eq!(
        free_mem(),
        before,
        "a reservation holds addresses, not memory"
    );
    let (r, h) = create(8 * MIB, &prop());
    assert_eq!(r, OK);
    assert_eq!(free_mem(), before - 8 * MIB, "charged like cuMemAlloc");
    assert_eq!(map(va, 8 * MIB, 0, h), OK);
    assert_eq!(get_access(va), (OK, 0), "no access set yet");
    assert_eq!(set_access(va, 8 * MIB, 3), OK);
    assert_eq!(get_access(va + 4096), (OK, 3));
    assert_eq!(
        set_access(va, 8 * MIB, 1),
        NOT_SUPPORTED,
        "read-only cannot be enforced"
    );
    assert_eq!(
        set_access(va, 10 * MIB, 3),
        INVALID_VALUE,
        "past the mapping"
    );
    let data: Vec<u8> = (0..6 * MIB).map(|i| (i * 13 % 251) as u8).collect();
    let htod = |d: u64, h: &[u8]| {
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            d,
            h.as_ptr().cast(),
            h.len()
        )
    };
    let dtoh = |s: u64, len: usize| {
        let mut out = vec![0u8; len];
        let r = call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            out.as_mut_ptr().cast(),
            s,
            len
        );
        assert_eq!(r, OK);
        out
    };
    assert_eq!(htod(va + 2 * MIB as u64, &data), OK);
    assert!(dtoh(va + 2 * MIB as u64, data.len()) == data, "copied back");
    // A memset, then a kernel: c = a + b over three arrays in the mapping.
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), va, 0x7f, 100),
        OK
    );
    assert_eq!(
        dtoh(va, 101)[..],
        [[0x7f; 100].as_slice(), &[0]].concat()[..]
    );
    let n: usize = 1024;
    let (mut a, mut b, mut c) = (
        va + MIB as u64,
        va + (MIB + 4 * n) as u64,
        va + (MIB + 8 * n) as u64,
    );
    let fa: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let fb: Vec<u8> = (0..n)
        .flat_map(|i| (3.0 * i as f32).to_le_bytes())
        .collect();
    assert_eq!(htod(a, &fa), OK);
    assert_eq!(htod(b, &fb), OK);
    let mut n64 = n as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    let r = call!(
        cu,
        "cuLaunchKernel",
        fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Ptr, *mut Ptr, *mut Ptr),
        vadd,
        4,
        1,
        1,
        256,
        1,
        1,
        0,
        null_mut(),
        params.as_mut_ptr(),
        null_mut()
    );
    assert_eq!(r, OK);
    assert_eq!(cu.sync(null_mut()), OK);
    let sum = floats(&dtoh(c, 4 * n));
    assert!(
        sum.iter().enumerate().all(|(i, v)| *v == 4.0 * i as f32),
        "kernel wrote the mapping"
    );

    // The pointer is an allocation to pointer queries; cuMemFree refuses it.
    let (mut base, mut size) = (0u64, 0usize);
    let r = call!(
        cu,
        "cuMemGetAddressRange",
        fn(*mut u64, *mut usize, u64),
        &mut base,
        &mut size,
        va + 5
    );
    assert_eq!((r, base, size), (OK, va, 8 * MIB));
    assert_eq!(call!(cu, "cuMemFree", fn(u64), va), INVALID_VALUE);
    assert_eq!(
        dtoh(va + 2 * MIB as u64, 16),
        data[..16].to_vec(),
        "still mapped"
    );

    // Retain from an address inside; the properties come back from the handle.
    let mut again = 0u64;
    let r = call!(
        cu,
        "cuMemRetainAllocationHandle",
        fn(*mut u64, *mut c_void),
        &mut again,
        (va + 3 * MIB as u64) as *mut c_void
    );
    assert_eq!((r, again), (OK, h));
    let mut p = Prop {
        type_: 0,
        handle_types: 7,
        location: Location { type_: 0, id: 9 },
        ..prop()
    };
    let r = call!(
        cu,
        "cuMemGetAllocationPropertiesFromHandle",
        fn(*mut Prop, u64),
        &mut p,
        h
    );
    assert_eq!(
        (r, p.type_, p.handle_types, p.location.type_, p.location.id),
        (OK, 1, 0, 1, 0)
    );
    assert_eq!(release(h), OK);
    assert_eq!(release(h), OK);
    assert_eq!(release(h), INVALID_VALUE, "stale handle");
    assert_eq!(
        call!(
            cu,
            "cuMemGetAllocationPropertiesFromHandle",
            fn(*mut Prop, u64),
            &mut p,
            h
        ),
        INVALID_VALUE
    );
    assert_eq!(free_mem(), before - 8 * MIB, "the mapping holds the memory");
    assert!(dtoh(va + 2 * MIB as u64, data.len()) == data, "data intact");

    // What a program gets wrong.
    assert_eq!(
        map(va, 2 * MIB, 0, h),
        INVALID_VALUE,
        "stale handle, range taken"
    );
    let (r, h2) = create(2 * MIB, &prop());
    assert_eq!(r, OK);
    assert_eq!(
        map(va + 4 * MIB as u64, 2 * MIB, 0, h2),
        INVALID_VALUE,
        "over a mapping"
    );
    assert_eq!(
        map(va + 8 * MIB as u64, 2 * MIB, 2 * MIB, h2),
        INVALID_VALUE,
        "offset"
    );
    assert_eq!(
        map(va + 8 * MIB as u64, 3 * MIB, 0, h2),
        INVALID_VALUE,
        "past the allocation"
    );
    assert_eq!(
        map(va + 8 * MIB as u64 + 4096, 2 * MIB, 0, h2),
        INVALID_VALUE,
        "unaligned"
    );
    assert_eq!(
        map(va + 16 * MIB as u64, 2 * MIB, 0, h2),
        INVALID_VALUE,
        "outside the range"
    );
    assert_eq!(
        map(va + 8 * MIB as u64, 2 * MIB, 0, 0xbad),
        INVALID_VALUE,
        "foreign handle"
    );
    assert_eq!(create(MIB, &prop()).0, INVALID_VALUE, "off the granularity");
    assert_eq!(
        create(2 * MIB, &Prop { type_: 2, ..prop() }).0,
        INVALID_VALUE
    );
    assert_eq!(reserve(MIB + 1, 0, 0).0, INVALID_VALUE);
    assert_eq!(reserve(2 * MIB, 3 * MIB, 0).0, INVALID_VALUE);
    assert_eq!(
        unmap(va + 2 * MIB as u64, 2 * MIB),
        INVALID_VALUE,
        "cuts the mapping"
    );
    assert_eq!(
        call!(cu, "cuMemAddressFree", fn(u64, usize), va, 16 * MIB),
        INVALID_VALUE,
        "mappings left"
    );
    assert_eq!(map(va + 8 * MIB as u64, 2 * MIB, 0, h2), OK);

    // Two neighbouring mappings are one range to the program: copies and memsets across
    // the seam (sent as one piece per mapping), synchronous and on a stream.
    let seam = va + 8 * MIB as u64;
    let across: Vec<u8> = (0..3000).map(|i| (i % 239) as u8 + 1).collect();
    assert_eq!(htod(seam - 1000, &across), OK);
    assert!(
        dtoh(seam - 1000, across.len()) == across,
        "HtoD and DtoH across the seam"
    );
    let r = call!(
        cu,
        "cuMemcpyHtoDAsync",
        fn(u64, *const c_void, usize, Ptr),
        seam - 2000,
        across.as_ptr().cast(),
        across.len(),
        null_mut()
    );
    assert_eq!(r, OK);
    assert_eq!(cu.sync(null_mut()), OK);
    assert!(
        dtoh(seam - 2000, across.len()) == across,
        "asynchronous HtoD across the seam"
    );
    let dtod = |d: u64, s: u64, n: usize| call!(cu, "cuMemcpyDtoD", fn(u64, u64, usize), d, s, n);
    assert_eq!(dtod(va + 7 * MIB as u64, seam - 2000, 3000), OK);
    assert!(
        dtoh(va + 7 * MIB as u64, 3000) == across,
        "DtoD from across the seam"
    );
    assert_eq!(dtod(seam - 1500, va + 7 * MIB as u64, 3000), OK);
    assert!(dtoh(seam - 1500, 3000) == across, "DtoD onto the seam");
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32",
            fn(u64, c_uint, usize),
            seam - 8,
            0xabcd_ef01,
            4
        ),
        OK
    );
    assert_eq!(dtoh(seam - 8, 16), 0xabcd_ef01u32.to_le_bytes().repeat(4));
    // Past the last mapping there is nothing: refused whole, nothing written.
    let tail = va + 10 * MIB as u64;
    assert_eq!(htod(tail - 4, &[7u8; 8]), INVALID_VALUE);
    assert_eq!(dtoh(tail - 4, 4), vec![0u8; 4]);

    // Past the share: OUT_OF_MEMORY, nothing charged.
    let left = free_mem();
    assert_eq!(
        create(left.next_multiple_of(2 * MIB) + 2 * MIB, &prop()).0,
        OUT_OF_MEMORY
    );
    assert_eq!(free_mem(), left);

    // Unmapping both mappings at once and releasing gives everything back.
    assert_eq!(unmap(va, 16 * MIB), OK);
    assert_eq!(release(h2), OK);
    assert_eq!(free_mem(), before, "the charge is back");
    assert_eq!(dtoh_err(cu, va), INVALID_VALUE, "unmapped");
    assert_eq!(
        call!(cu, "cuMemAddressFree", fn(u64, usize), va, 16 * MIB),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemAddressFree", fn(u64, usize), va, 16 * MIB),
        INVALID_VALUE
    );
    // The addresses are free again: a reservation at the hint gets them.
    assert_eq!(reserve(16 * MIB, 0, va), (OK, va));
}

fn dtoh_err(cu: &Cuda, src: u64) -> R {
    let mut b = [0u8; 4];
    call!(
        cu,
        "cuMemcpyDtoH",
        fn(*mut c_void, u64, usize),
        b.as_mut_ptr().cast(),
        src,
        4
    )
}
