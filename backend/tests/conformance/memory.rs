//! Allocation, accounting, out of memory, copies and memsets.

use super::*;

#[test]
fn alloc_free_accounting_and_zeroed_reuse() {
    each(256 * MIB, |name, b| {
        // The context reserve (cuda; 0 on sim) is charged from the start.
        let base = b.memory_usage().used;
        let info = b.info().clone();
        let g = info.alloc_granularity;
        assert!(g >= 4096 && g.is_power_of_two(), "{name}: granularity {g}");
        let a = b.alloc(1).expect("alloc");
        assert_eq!(a.charged, g, "{name}");
        assert_eq!(a.addr % (2 * MIB), 0, "{name}: 2 MiB aligned");
        assert!(
            a.addr >= info.va_base && a.addr < info.va_base + info.va_size,
            "{name}: inside the address space"
        );
        let big = b.alloc(3 * MIB + 5).expect("alloc");
        assert_ne!(a.addr, big.addr);
        let charged = (3 * MIB + 5).div_ceil(g) * g;
        assert_eq!(big.charged, charged, "{name}");
        let u = b.memory_usage();
        assert_eq!((u.used, u.allocations), (base + g + charged, 2), "{name}");
        assert!(
            get(b, big.addr, (3 * MIB + 5) as usize)
                .expect("read")
                .iter()
                .all(|x| *x == 0),
            "{name}: fresh memory is zero"
        );
        put(b, big.addr, &vec![0xa5; (3 * MIB) as usize]).expect("dirty it");
        assert_eq!(
            status(b.free(big.addr + 8)),
            Status::BadDevicePointer,
            "{name}"
        );
        b.free(big.addr).expect("free");
        assert_eq!(
            status(b.free(big.addr)),
            Status::BadDevicePointer,
            "{name}: double free"
        );
        assert_eq!(status(b.free(0)), Status::BadDevicePointer, "{name}");
        assert_eq!(b.memory_usage().used, base + g, "{name}");
        let again = b.alloc(3 * MIB + 5).expect("alloc");
        assert!(
            get(b, again.addr, (3 * MIB) as usize)
                .expect("read")
                .iter()
                .all(|x| *x == 0),
            "{name}: reused memory comes back zeroed"
        );
        assert_eq!(status(b.alloc(0)), Status::InvalidArgument, "{name}");
    });
}

#[test]
fn out_of_memory_and_recovery() {
    each(8 * MIB, |name, b| {
        let g = b.info().alloc_granularity;
        let half = 4 * MIB;
        let a = b.alloc(half).expect("alloc");
        let _b2 = b.alloc(half).expect("alloc");
        let e = b.alloc(1).expect_err("full");
        assert!(
            matches!(e, BackendError::OutOfMemory { available: 0, .. }),
            "{name}: {e}"
        );
        assert_eq!(e.status(), Status::OutOfMemory);
        assert_eq!(status(b.alloc(u64::MAX)), Status::OutOfMemory, "{name}");
        assert_eq!(
            status(b.alloc(u64::MAX - g + 2)),
            Status::OutOfMemory,
            "{name}"
        );
        b.free(a.addr).expect("free");
        b.alloc(half).expect("room again");
    });
}

#[test]
fn copies_at_allocation_boundaries() {
    each(64 * MIB, |name, b| {
        let a = b.alloc(2 * MIB).expect("alloc");
        let n = b.alloc(2 * MIB).expect("alloc");
        let full = pattern((2 * MIB) as usize, 1);
        assert_eq!(put(b, a.addr, &full).expect("whole allocation"), 2 * MIB);
        assert_eq!(
            get(b, a.addr, full.len()).expect("read back"),
            full,
            "{name}"
        );
        assert_eq!(
            get(b, a.addr + 2 * MIB - 1, 1).expect("last byte"),
            vec![full[full.len() - 1]],
            "{name}"
        );
        assert_eq!(status(put(b, a.addr + 1, &full)), Status::BadDevicePointer);
        assert_eq!(
            status(get(b, a.addr + 2 * MIB - 1, 2)),
            Status::BadDevicePointer
        );
        assert_eq!(status(get(b, a.addr - 1, 1)), Status::BadDevicePointer);
        assert_eq!(status(get(b, 0, 1)), Status::BadDevicePointer);
        assert_eq!(status(get(b, u64::MAX, 1)), Status::BadDevicePointer);
        assert_eq!(
            status(b.check_range(a.addr, u64::MAX)),
            Status::BadDevicePointer
        );
        assert_eq!(
            status(b.check_range(a.addr + 5, u64::MAX - 4)),
            Status::BadDevicePointer
        );
        b.check_range(a.addr, 2 * MIB).expect("whole allocation");
        assert!(
            get(b, n.addr, 4096)
                .expect("neighbour")
                .iter()
                .all(|x| *x == 0),
            "{name}: failed copies touched nothing"
        );
        // Unaligned offsets and odd lengths.
        let odd = pattern(12_345, 2);
        put(b, a.addr + 3, &odd).expect("odd htod");
        assert_eq!(
            get(b, a.addr + 3, odd.len()).expect("odd dtoh"),
            odd,
            "{name}"
        );
        b.free(a.addr).expect("free");
        assert_eq!(
            status(get(b, a.addr, 1)),
            Status::BadDevicePointer,
            "{name}: freed"
        );
    });
}

#[test]
fn large_copies_round_trip_from_plain_and_registered_memory() {
    const LEN: usize = 40 << 20; // several copy chunks, not a multiple of any
    each(128 * MIB, |name, b| {
        let a = b.alloc(LEN as u64 + 4096).expect("alloc");
        let src = pattern(LEN - 7, 3);
        put(b, a.addr + 7, &src).expect("htod");
        assert!(
            get(b, a.addr + 7, src.len()).expect("dtoh") == src,
            "{name}: plain memory"
        );

        // Page-aligned memory registered once, like guest RAM.
        let len = LEN + 4096;
        // SAFETY: a fresh private anonymous mapping of our own; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let region = HostRegion {
            addr: p as usize,
            len,
        };
        // Where the backend prepares guest RAM (cuda pins it); sim copies with the CPU.
        if let Some(h) = b.host_memory() {
            h.register(&[region]).expect("register");
        }
        // SAFETY: [p, p + len) is our live mapping until munmap below; nothing else uses it.
        let host = unsafe { VolatileSlice::new(p.cast::<u8>(), len) };
        let want = pattern(LEN, 4);
        host.subslice(100, LEN).expect("slice").copy_from(&want);
        b.copy_htod(a.addr, &host.subslice(100, LEN).expect("slice"))
            .expect("registered htod");
        host.subslice(0, len)
            .expect("slice")
            .copy_from(&vec![0u8; len]);
        b.copy_dtoh(a.addr, &host.subslice(50, LEN).expect("slice"))
            .expect("registered dtoh");
        let mut back = vec![0u8; LEN];
        host.subslice(50, LEN)
            .expect("slice")
            .copy_to(&mut back[..]);
        assert!(back == want, "{name}: registered memory");
        if let Some(h) = b.host_memory() {
            h.unregister(&[region]);
        }
        // Still works unregistered.
        b.copy_dtoh(a.addr, &host.subslice(0, 4096).expect("slice"))
            .expect("dtoh after unregister");
        let mut first = vec![0u8; 4096];
        host.subslice(0, 4096)
            .expect("slice")
            .copy_to(&mut first[..]);
        assert_eq!(first, want[..4096], "{name}");
        // SAFETY: unmaps our own mapping; `host` is not used after this.
        assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    });
}

#[test]
fn dtod_is_memmove_and_memset_fills() {
    each(128 * MIB, |name, b| {
        let a = b.alloc(4096).expect("alloc");
        let src: Vec<u8> = (0..100u8).collect();
        put(b, a.addr, &src).expect("htod");
        b.copy_dtod(a.addr + 10, a.addr, 100)
            .expect("overlapping dtod");
        assert_eq!(
            &get(b, a.addr + 10, 100).expect("dtoh")[..],
            &src[..],
            "{name}"
        );
        assert_eq!(
            status(b.copy_dtod(a.addr, a.addr + 4000, 100)),
            Status::BadDevicePointer
        );
        // Large overlapping moves in both directions (several staging pieces).
        let big = b.alloc(40 * MIB).expect("alloc");
        let len = 30 << 20;
        let p = pattern(40 << 20, 5);
        for (dst_off, src_off) in [(4096 + 3, 0), (0, 1 << 20)] {
            put(b, big.addr, &p).expect("htod");
            b.copy_dtod(big.addr + dst_off, big.addr + src_off, len as u64)
                .expect("memmove");
            let mut want = p.clone();
            want.copy_within(src_off as usize..src_off as usize + len, dst_off as usize);
            assert!(
                get(b, big.addr, p.len()).expect("dtoh") == want,
                "{name}: memmove {src_off} -> {dst_off}"
            );
        }

        put(b, a.addr, &pattern(4096, 6)).expect("htod");
        let before = get(b, a.addr, 8).expect("dtoh");
        b.memset(a.addr + 1, 0xab, 1, 6).expect("memset8");
        let got = get(b, a.addr, 8).expect("dtoh");
        assert_eq!(&got[1..7], &[0xab; 6], "{name}");
        assert_eq!(
            (got[0], got[7]),
            (before[0], before[7]),
            "{name}: edges untouched"
        );
        b.memset(a.addr + 2, 0x1234, 2, 3).expect("memset16");
        assert_eq!(
            get(b, a.addr + 2, 6).expect("dtoh"),
            vec![0x34, 0x12, 0x34, 0x12, 0x34, 0x12],
            "{name}"
        );
        b.memset(a.addr + 8, 0xdead_beef, 4, 1000)
            .expect("memset32");
        assert!(
            get_u32(b, a.addr + 8, 1000)
                .iter()
                .all(|v| *v == 0xdead_beef),
            "{name}"
        );
        assert_eq!(
            status(b.memset(a.addr + 2, 1, 4, 1)),
            Status::BadDevicePointer
        );
        assert_eq!(status(b.memset(a.addr, 1, 3, 1)), Status::InvalidArgument);
        assert_eq!(
            status(b.memset(a.addr, 1, 4, 1025)),
            Status::BadDevicePointer
        );
        assert_eq!(
            status(b.memset(a.addr, 1, 4, u64::MAX / 2)),
            Status::BadDevicePointer
        );
    });
}
