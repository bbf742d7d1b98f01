//! The virtual memory opcodes through the queue, as a hostile guest sends them: the
//! capability bit, a reserve/create/map round trip with copies and a kernel, the memory
//! share (a physical allocation past it: `OUT_OF_MEMORY`), flags, foreign and stale
//! handles, overlapping maps, maps outside a reservation, sizes off the granularity and
//! huge sizes, each refused with the queue still working and nothing leaked.

use super::*;

const G: u64 = VMM_GRANULARITY;

impl Harness<'_> {
    fn reserve(&mut self, size: u64) -> u64 {
        let args = VaReserveArgs {
            size,
            align: 0,
            hint: 0,
            flags: 0,
        };
        self.ok(Request::VaReserve(args), &[])[0]
    }

    fn create(&mut self, size: u64) -> u64 {
        let r = self.ok(Request::MemCreate(MemCreateArgs { size, flags: 0 }), &[]);
        assert_eq!(r[1], size, "charged as asked");
        r[0]
    }

    fn map(&mut self, addr: u64, size: u64, handle: u64) -> Status {
        let args = MemMapArgs {
            addr,
            size,
            offset: 0,
            handle,
        };
        self.status(Request::MemMap(args), &[])
    }

    fn used(&mut self) -> u64 {
        let info = self.space(DeviceInfo::SIZE);
        self.ok(Request::GetInfo, &[w(info, DeviceInfo::SIZE)]);
        DeviceInfo::decode(&self.read(info, DeviceInfo::SIZE))
            .expect("info")
            .memory_used
    }
}

#[test]
fn the_sim_device_announces_virtual_memory_and_maps_memory_guests_use() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_ne!(h.vgpu.config_space().features & features::VIRTUAL_MEMORY, 0);
    // Loaded first: the module's memory is charged too.
    let m = h.builtin();
    let base = h.used();
    let va = h.reserve(8 * MIB);
    let handle = h.create(4 * MIB);
    assert_eq!(h.used(), base + 4 * MIB, "the share is charged");
    assert_eq!(h.map(va + 2 * MIB, 4 * MIB, handle), Status::Ok);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    h.htod(va + 2 * MIB + 100, &data);
    assert_eq!(h.dtoh(va + 2 * MIB + 100, data.len()), data);
    // A kernel writes through a pointer into the mapping.
    let fill = h.get_function(m, "fill")[0];
    let resp = h.launch(
        fill,
        &[
            KernelArg::ptr(va + 2 * MIB, Access::Write),
            KernelArg::u32(0xdead_beef),
            KernelArg::u32(2),
        ],
    );
    assert_eq!(resp.status(), Some(Status::Ok));
    assert_eq!(
        h.dtoh(va + 2 * MIB, 8),
        0xdead_beefu32.to_le_bytes().repeat(2)
    );
    // FREE refuses the mapping; MEM_RETAIN finds its handle.
    assert_eq!(
        h.status(Request::Free(FreeArgs { addr: va + 2 * MIB }), &[]),
        Status::BadDevicePointer
    );
    let r = h.ok(
        Request::MemRetain(MemRetainArgs { addr: va + 3 * MIB }),
        &[],
    );
    assert_eq!(r, [handle, 4 * MIB, va + 2 * MIB, 4 * MIB]);
    for _ in 0..2 {
        h.ok(Request::MemRelease(MemReleaseArgs { handle }), &[]);
    }
    assert_eq!(
        h.used(),
        base + 4 * MIB,
        "the mapping still holds the memory"
    );
    h.ok(
        Request::MemUnmap(MemUnmapArgs {
            addr: va,
            size: 8 * MIB,
        }),
        &[],
    );
    h.vgpu.backend().synchronize();
    assert_eq!(h.used(), base, "unmapped and released: the charge is back");
    h.ok(
        Request::VaFree(VaFreeArgs {
            addr: va,
            size: 8 * MIB,
        }),
        &[],
    );
    h.still_works();
}

#[test]
fn physical_allocations_are_held_to_the_share() {
    let mem = ram();
    let mut h = Harness::new(&mem, 8 * MIB);
    let a = h.create(4 * MIB);
    let create = |size| Request::MemCreate(MemCreateArgs { size, flags: 0 });
    assert_eq!(h.status(create(6 * MIB), &[]), Status::OutOfMemory);
    assert_eq!(h.status(create(u64::MAX - G + 1), &[]), Status::OutOfMemory);
    // ALLOC sees the physical allocation's charge too.
    assert_eq!(
        h.status(
            Request::Alloc(AllocArgs {
                size: 6 * MIB,
                flags: 0
            }),
            &[]
        ),
        Status::OutOfMemory
    );
    h.ok(Request::MemRelease(MemReleaseArgs { handle: a }), &[]);
    assert_eq!(h.used(), 0);
    let b = h.create(8 * MIB);
    assert_ne!(b, a, "handles are never reused");
    h.still_works();
}

#[test]
fn hostile_virtual_memory_requests_are_refused_and_change_nothing() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let reserve = |size, align, hint, flags| {
        Request::VaReserve(VaReserveArgs {
            size,
            align,
            hint,
            flags,
        })
    };
    for (size, align, flags) in [
        (0, 0, 0),
        (G + 1, 0, 0),
        (G, 3 * G, 0),
        (G, 0, 1),
        (u64::MAX - G + 1, 0, 0),
    ] {
        let s = h.status(reserve(size, align, 0, flags), &[]);
        assert!(
            matches!(s, Status::InvalidArgument | Status::OutOfMemory),
            "reserve {size:#x} {align:#x} {flags:#x}: {s:?}"
        );
    }
    let create = |size, flags| Request::MemCreate(MemCreateArgs { size, flags });
    assert_eq!(h.status(create(G, 1), &[]), Status::InvalidArgument);
    assert_eq!(h.status(create(G + 1, 0), &[]), Status::InvalidArgument);
    assert_eq!(h.status(create(0, 0), &[]), Status::InvalidArgument);
    let va = h.reserve(8 * MIB);
    let handle = h.create(4 * MIB);
    // Foreign, stale and zero handles; maps outside the reservation, off the granularity,
    // past the allocation, wrapping, with an offset.
    for (addr, size, hd) in [
        (va, G, 0),
        (va, G, handle + 1),
        (va, G, u64::MAX),
        (va - G, G, handle),
        (va + 8 * MIB, G, handle),
        (va + 6 * MIB, 4 * MIB, handle),
        (va + 1, G, handle),
        (va, G - 1, handle),
        (va, 8 * MIB, handle),
        (u64::MAX - G + 1, 4 * MIB, handle),
    ] {
        assert_eq!(
            h.map(addr, size, hd),
            Status::InvalidArgument,
            "map {addr:#x} {size:#x} {hd:#x}"
        );
    }
    let offset = MemMapArgs {
        addr: va,
        size: G,
        offset: G,
        handle,
    };
    assert_eq!(
        h.status(Request::MemMap(offset), &[]),
        Status::InvalidArgument
    );
    // An allocation of the vGPU's own is not a reservation: nothing maps over it.
    let plain = h.alloc(2 * MIB);
    assert_eq!(h.map(plain, G, handle), Status::InvalidArgument);
    assert_eq!(h.map(va, 2 * G, handle), Status::Ok);
    assert_eq!(h.map(va + G, G, handle), Status::InvalidArgument, "overlap");
    // Unmaps that cut a mapping or hold none, frees of a mapped range, retains of
    // unmapped addresses, releases of unknown handles.
    let unmap = |addr, size| Request::MemUnmap(MemUnmapArgs { addr, size });
    assert_eq!(h.status(unmap(va + G, G), &[]), Status::InvalidArgument);
    assert_eq!(h.status(unmap(va + 4 * G, G), &[]), Status::InvalidArgument);
    assert_eq!(h.status(unmap(va, 0), &[]), Status::InvalidArgument);
    assert_eq!(h.status(unmap(va, u64::MAX), &[]), Status::InvalidArgument);
    let free = |addr, size| Request::VaFree(VaFreeArgs { addr, size });
    assert_eq!(h.status(free(va, 8 * MIB), &[]), Status::InvalidArgument);
    assert_eq!(h.status(free(plain, 2 * MIB), &[]), Status::InvalidArgument);
    assert_eq!(
        h.status(Request::MemRetain(MemRetainArgs { addr: plain }), &[]),
        Status::InvalidArgument
    );
    assert_eq!(
        h.status(Request::MemRelease(MemReleaseArgs { handle: 0 }), &[]),
        Status::InvalidArgument
    );
    // The mapping and the plain allocation still work.
    h.htod(va, b"still here");
    assert_eq!(h.dtoh(va, 10), b"still here");
    h.htod(plain, b"neighbour");
    assert_eq!(h.dtoh(plain, 9), b"neighbour");
    h.still_works();
}
