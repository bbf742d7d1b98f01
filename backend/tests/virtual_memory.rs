//! CUDA's virtual memory management on a backend ([`VirtualMemory`]): a reserved range, a
//! physical allocation charged like `alloc`, a mapping that copies, memsets, kernels and
//! pointer checks treat as an allocation, bytes that survive an unmap, and every malformed
//! request refused with nothing changed. On sim always, on cuda where a GPU is present.

mod common;

use common::{builtin, each, status, w, CFG, MIB};
use vgpu_backend::{Backend, BackendError, LaunchOne, VirtualMemory, VMM_GRANULARITY};
use vgpu_proto::{ArgValue, Status};
use vm_memory::VolatileSlice;

fn vmm(b: &dyn Backend) -> &dyn VirtualMemory {
    b.virtual_memory()
        .expect("the backend offers virtual memory")
}

fn put(b: &dyn Backend, addr: u64, bytes: &mut [u8]) {
    b.copy_htod(addr, &VolatileSlice::from(bytes))
        .expect("htod");
}

fn get(b: &dyn Backend, addr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut out[..]))
        .expect("dtoh");
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn mapped_memory_is_an_allocation_at_its_address() {
    each(64 * MIB, |name, b| {
        let v = vmm(b);
        // Loaded first: the module's memory is charged too.
        let fill = builtin(b, "fill");
        let before = b.memory_usage();
        let va = v.reserve(8 * MIB, 0, 0).expect("reserve");
        assert_eq!(va % VMM_GRANULARITY, 0, "{name}");
        let info = b.info();
        assert!(va >= info.va_base && va + 8 * MIB <= info.va_base + info.va_size);
        assert_eq!(
            b.memory_usage().used,
            before.used,
            "{name}: a reservation is not charged"
        );
        let c = v.create(4 * MIB).expect("create");
        assert_ne!(c.handle, 0);
        assert_eq!(c.charged, 4 * MIB);
        assert_eq!(
            b.memory_usage().used,
            before.used + 4 * MIB,
            "{name}: charged like alloc"
        );
        assert_eq!(v.charged(), 4 * MIB);
        assert_eq!(
            status(b.check_range(va, 1)),
            Status::BadDevicePointer,
            "{name}: not mapped yet"
        );
        v.map(va, 4 * MIB, 0, c.handle).expect("map");
        b.check_range(va, 4 * MIB)
            .expect("the mapping is a valid range");
        assert_eq!(
            status(b.check_range(va, 4 * MIB + 1)),
            Status::BadDevicePointer
        );
        assert_eq!(
            status(b.check_range(va + 4 * MIB, 1)),
            Status::BadDevicePointer
        );
        // Zero-filled, then copies and a memset.
        assert!(
            get(b, va, 4096).iter().all(|x| *x == 0),
            "{name}: fresh memory is zeroed"
        );
        let mut data = pattern(3 * MIB as usize, 7);
        put(b, va + MIB, &mut data);
        b.memset(va + MIB, 0xab, 1, 100).expect("memset");
        data[..100].fill(0xab);
        assert_eq!(get(b, va + MIB, data.len()), data, "{name}");
        // A kernel writes through a pointer into it.
        b.launch_one(
            fill,
            &CFG,
            &[w(va), ArgValue::U32(0x1234_5678), ArgValue::U32(4)],
        )
        .expect("fill");
        assert_eq!(
            get(b, va, 16),
            0x1234_5678u32.to_le_bytes().repeat(4),
            "{name}"
        );
        b.copy_dtod(va + 16, va + MIB, 64)
            .expect("dtod inside the mapping");
        assert_eq!(get(b, va + 16, 64), data[..64].to_vec());
        // FREE refuses a mapping; the mapping stays.
        assert_eq!(status(b.free(va)), Status::BadDevicePointer, "{name}");
        b.check_range(va, 1).expect("still mapped");
        // Retain from any address inside; release both references: the mapping still
        // holds the memory and its charge.
        let [h, size, start, len] = v.retain(va + 4096).expect("retain");
        assert_eq!([h, size, start, len], [c.handle, 4 * MIB, va, 4 * MIB]);
        v.release(h).expect("release the retained reference");
        v.release(c.handle).expect("release the created reference");
        assert_eq!(
            status(v.release(c.handle)),
            Status::InvalidArgument,
            "{name}: stale"
        );
        assert_eq!(get(b, va + MIB, data.len()), data, "{name}: still mapped");
        assert_eq!(b.memory_usage().used, before.used + 4 * MIB);
        // A retain after the last release gives the same handle back.
        let [again, ..] = v.retain(va).expect("retain again");
        assert_eq!(again, c.handle);
        v.release(again).expect("release");
        // Unmapping the last mapping returns the charge; the range can be mapped again.
        v.unmap(va, 4 * MIB).expect("unmap");
        assert_eq!(status(b.check_range(va, 1)), Status::BadDevicePointer);
        b.synchronize();
        assert_eq!(
            b.memory_usage().used,
            before.used,
            "{name}: charge returned"
        );
        assert_eq!(v.charged(), 0);
        v.free_range(va, 8 * MIB).expect("free the range");
        assert_eq!(v.objects(), 0, "{name}: nothing left");
    });
}

#[test]
fn bytes_survive_unmap_and_two_mappings_share_them() {
    each(64 * MIB, |name, b| {
        let v = vmm(b);
        let va = v.reserve(16 * MIB, 4 * MIB, 0).expect("reserve");
        assert_eq!(va % (4 * MIB), 0, "{name}: aligned as asked");
        let c = v.create(2 * MIB).expect("create");
        v.map(va, 2 * MIB, 0, c.handle).expect("map");
        let mut data = pattern(2 * MIB as usize, 3);
        put(b, va, &mut data);
        v.unmap(va, 2 * MIB).expect("unmap");
        b.synchronize();
        // Mapped elsewhere, the bytes are still there (the handle kept them).
        v.map(va + 6 * MIB, 2 * MIB, 0, c.handle)
            .expect("map again");
        assert_eq!(get(b, va + 6 * MIB, data.len()), data, "{name}");
        // A second mapping of the same allocation at once sees the same bytes.
        v.map(va, 2 * MIB, 0, c.handle).expect("second mapping");
        let mut one = [0x5au8; 8];
        put(b, va, &mut one);
        assert_eq!(get(b, va + 6 * MIB, 8), one.to_vec(), "{name}: aliases");
        // One unmap over both mappings (and the hole between them).
        v.unmap(va, 8 * MIB).expect("unmap both");
        v.release(c.handle).expect("release");
        v.free_range(va, 16 * MIB).expect("free");
        b.synchronize();
        assert_eq!(v.objects(), 0);
        assert_eq!(v.charged(), 0);
    });
}

#[test]
fn malformed_requests_change_nothing() {
    each(16 * MIB, |name, b| {
        let v = vmm(b);
        let g = VMM_GRANULARITY;
        let used = b.memory_usage().used;
        // Sizes and alignments off the granularity, zero, or wrapping.
        for (size, align) in [
            (0, 0),
            (g + 1, 0),
            (g, 3 * g),
            (g, g / 2),
            (u64::MAX - g + 1, 0),
        ] {
            let e = v.reserve(size, align, 0).expect_err("bad reserve");
            assert!(
                matches!(
                    e,
                    BackendError::InvalidArgument(_) | BackendError::AddressSpaceFull { .. }
                ),
                "{name}: reserve({size:#x}, {align:#x}): {e}"
            );
        }
        assert_eq!(status(v.create(0)), Status::InvalidArgument);
        assert_eq!(status(v.create(g - 1)), Status::InvalidArgument);
        // Past the vGPU's memory: OUT_OF_MEMORY, nothing charged.
        assert_eq!(status(v.create(64 * MIB)), Status::OutOfMemory, "{name}");
        assert_eq!(
            status(v.create(u64::MAX - g + 1)),
            Status::OutOfMemory,
            "{name}"
        );
        assert_eq!(
            b.memory_usage().used,
            used,
            "{name}: refused creates charge nothing"
        );
        let va = v.reserve(8 * MIB, 0, 0).expect("reserve");
        let c = v.create(4 * MIB).expect("create");
        let other = v.create(2 * MIB).expect("create");
        // Maps: unknown handles, offsets, sizes, outside the range, past the allocation.
        let bad_maps = [
            (va, 2 * MIB, 0, 0),
            (va, 2 * MIB, 0, 0xdead_beef),
            (va, 2 * MIB, 2 * MIB, c.handle),
            (va + 1, 2 * MIB, 0, c.handle),
            (va, 2 * MIB + 1, 0, c.handle),
            (va, 6 * MIB, 0, c.handle),
            (va + 6 * MIB, 4 * MIB, 0, c.handle),
            (va - 2 * MIB, 2 * MIB, 0, c.handle),
            (u64::MAX - g + 1, 4 * MIB, 0, c.handle),
            (va, u64::MAX - g + 1, 0, c.handle),
        ];
        for (addr, size, off, h) in bad_maps {
            assert_eq!(
                status(v.map(addr, size, off, h)),
                Status::InvalidArgument,
                "{name}: map({addr:#x}, {size:#x}, {off:#x}, {h:#x})"
            );
        }
        assert_eq!(
            status(b.check_range(va, 1)),
            Status::BadDevicePointer,
            "{name}"
        );
        // Overlapping maps.
        v.map(va + 2 * MIB, 4 * MIB, 0, c.handle).expect("map");
        assert_eq!(
            status(v.map(va, 4 * MIB, 0, other.handle)),
            Status::InvalidArgument
        );
        assert_eq!(
            status(v.map(va + 4 * MIB, 2 * MIB, 0, other.handle)),
            Status::InvalidArgument
        );
        v.map(va, 2 * MIB, 0, other.handle)
            .expect("the free part maps");
        // Unmaps that cut a mapping or hold none; frees of a range with mappings or of
        // the wrong size.
        assert_eq!(
            status(v.unmap(va + 2 * MIB, 2 * MIB)),
            Status::InvalidArgument
        );
        assert_eq!(
            status(v.unmap(va + 6 * MIB, 2 * MIB)),
            Status::InvalidArgument
        );
        assert_eq!(status(v.unmap(va, u64::MAX)), Status::InvalidArgument);
        assert_eq!(status(v.free_range(va, 8 * MIB)), Status::InvalidArgument);
        assert_eq!(status(v.free_range(va, 4 * MIB)), Status::InvalidArgument);
        assert_eq!(
            status(v.free_range(va + 2 * MIB, 2 * MIB)),
            Status::InvalidArgument
        );
        assert_eq!(status(v.retain(va + 6 * MIB)), Status::InvalidArgument);
        // Neither the refused requests nor FREE broke the mappings.
        let mut data = pattern(6 * MIB as usize, 9);
        put(b, va, &mut data[..2 * MIB as usize]);
        put(b, va + 2 * MIB, &mut data[2 * MIB as usize..]);
        assert_eq!(
            get(b, va, 2 * MIB as usize),
            data[..2 * MIB as usize].to_vec()
        );
        assert_eq!(
            get(b, va + 2 * MIB, 4 * MIB as usize),
            data[2 * MIB as usize..].to_vec()
        );
        // A copy across two neighbouring mappings is refused (a range lies in one).
        let mut across = [0u8; 8];
        let e = b.copy_htod(va + 2 * MIB - 4, &VolatileSlice::from(&mut across[..]));
        assert_eq!(status(e), Status::BadDevicePointer, "{name}");
        // Everything goes when the backend goes, with live objects left (no leak, no
        // panic: the process's memory is checked by the drop itself).
        assert!(v.objects() >= 4, "{name}");
    });
}

#[test]
fn a_flood_of_reservations_is_bounded() {
    let b = vgpu_backend::SimGpu::new(vgpu_backend::SimConfig {
        memory: 64 * MIB,
        va_size: 256 << 30,
        threads: 1,
        ..Default::default()
    })
    .expect("sim");
    let v = vmm(&b);
    let mut ranges = Vec::new();
    let refused = loop {
        match v.reserve(VMM_GRANULARITY, 0, 0) {
            Ok(va) => ranges.push(va),
            Err(e) => break e,
        }
    };
    assert_eq!(ranges.len(), vgpu_backend::MAX_VMM_OBJECTS);
    assert_eq!(refused.status(), Status::OutOfResources, "{refused}");
    // The vGPU's own allocations still work, and freeing one range makes room for one.
    let a = b.alloc(MIB).expect("alloc beside the flood");
    b.check_range(a.addr, MIB).expect("allocated");
    v.free_range(ranges[0], VMM_GRANULARITY).expect("free");
    v.reserve(VMM_GRANULARITY, 0, 0)
        .expect("room for one again");
}
