//! `HOST_MAP` through the queue on the sim GPU: a frontend's pool region mapped at the
//! frontend's address, then memsets and device-to-device copies naming that address reach
//! the pool's bytes; and every hostile request (a range past the region, memory without a
//! file, misaligned or wrapping ranges, the vGPU's own device addresses, an address the
//! worker uses, overlaps) refused with the queue still working, and pool addresses refused
//! where nothing was mapped.

use std::os::fd::AsRawFd;

use vm_memory::{FileOffset, GuestMemoryBackend};

use super::*;

/// Guest-physical address of the test's pool region (as the process transport lays out).
const POOL_GPA: u64 = 1 << 32;
const POOL: u64 = 2 * MIB;

/// Guest RAM: `[0, RAM)` anonymous (rings, requests), plus a sealed memfd at `POOL_GPA`.
fn ram_with_pool() -> GuestMem {
    // SAFETY: a valid NUL-terminated name and valid flags.
    let fd = unsafe {
        libc::memfd_create(
            c"host-map-test".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nothing else owns.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_len(POOL).expect("size");
    // SAFETY: F_ADD_SEALS on our own memfd.
    let sealed = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    assert_eq!(sealed, 0);
    GuestMem::from_ranges_with_files([
        (GuestAddress(0), RAM as usize, None),
        (
            GuestAddress(POOL_GPA),
            POOL as usize,
            Some(FileOffset::new(file, 0)),
        ),
    ])
    .expect("guest ram")
}

/// The tenant's pool address in test `n`: far below where the kernel places mappings it
/// picks itself (they grow down from near the top of the user half), and away from sim's
/// device addresses, so nothing of this test process lives there.
fn tenant_address(n: u64) -> u64 {
    0x4a00_0000_0000 + n * (1 << 32)
}

fn host_map(gpa: u64, len: u64, addr: u64) -> Request<'static> {
    Request::HostMap(HostMapArgs { gpa, len, addr })
}

fn memset(dst: u64, value: u32, count: u64) -> Request<'static> {
    Request::Memset(MemsetArgs {
        dst,
        value,
        elem_size: 4,
        count,
    })
}

#[test]
fn pool_memory_mapped_at_the_frontends_address_takes_memsets_and_device_copies() {
    let mem = ram_with_pool();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_ne!(h.vgpu.config_space().features & features::HOST_MAP, 0);
    let addr = tenant_address(0);
    // Before HOST_MAP the address is nobody's: refused.
    assert_ne!(h.status(memset(addr, 1, 2), &[]), Status::Ok);
    assert_eq!(h.ok(host_map(POOL_GPA, POOL, addr), &[])[0], addr);

    // The redzone check's memset: two words at the start of a pinned buffer.
    h.ok(memset(addr + 4096, 0xdead_beef, 2), &[]);
    let mut got = [0u8; 8];
    mem.read_slice(&mut got, GuestAddress(POOL_GPA + 4096))
        .expect("pool read");
    assert_eq!(got, [0xef, 0xbe, 0xad, 0xde, 0xef, 0xbe, 0xad, 0xde]);

    // Device to pool and pool to device.
    let d = h.alloc(MIB);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    h.htod(d, &data);
    h.ok(
        Request::MemcpyDtoD(MemcpyDtoDArgs {
            dst: addr + 8192,
            src: d,
            size: 4096,
        }),
        &[],
    );
    let mut back = vec![0u8; 4096];
    mem.read_slice(&mut back, GuestAddress(POOL_GPA + 8192))
        .expect("pool read");
    assert_eq!(back, data, "the device's bytes reached the pool");
    mem.write_slice(&[7u8; 64], GuestAddress(POOL_GPA + 65536))
        .expect("pool write");
    h.ok(
        Request::MemcpyDtoD(MemcpyDtoDArgs {
            dst: d + 100,
            src: addr + 65536,
            size: 64,
        }),
        &[],
    );
    assert_eq!(h.dtoh(d + 100, 64), vec![7u8; 64]);

    // Past the mapped range's end: refused, nothing written beyond the pool.
    assert_ne!(h.status(memset(addr + POOL - 4, 0, 2), &[]), Status::Ok);
    h.still_works();

    // The vGPU going lets the range go: the address is free again.
    drop(h);
    // SAFETY: a PROT_NONE probe at `addr` that replaces nothing (MAP_FIXED_NOREPLACE).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            POOL as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(p as u64, addr, "unmapped with the vGPU");
    // SAFETY: unmaps the probe just made.
    assert_eq!(unsafe { libc::munmap(p, POOL as usize) }, 0);
}

#[test]
fn hostile_host_map_requests_are_refused_and_the_queue_still_works() {
    let mem = ram_with_pool();
    let mut h = Harness::new(&mem, 32 * MIB);
    let addr = tenant_address(1);
    let bad = [
        // Past the pool region's end.
        host_map(POOL_GPA, POOL + 4096, addr),
        host_map(POOL_GPA + POOL - 4096, 8192, addr),
        // Past every region.
        host_map(POOL_GPA + POOL, 4096, addr),
        // Anonymous guest RAM (no file to map).
        host_map(0, 4096, addr),
        // Empty and misaligned.
        host_map(POOL_GPA, 0, addr),
        host_map(POOL_GPA + 1, 4096, addr),
        host_map(POOL_GPA, 4095, addr),
        host_map(POOL_GPA, 4096, addr + 1),
        // Wrapping ranges.
        host_map(u64::MAX - 4095, 8192, addr),
        host_map(POOL_GPA, 8192, u64::MAX - 4095),
        // Not a user-space address.
        host_map(POOL_GPA, 4096, 0),
        host_map(POOL_GPA, 4096, 1 << 47),
    ];
    for req in bad {
        assert_eq!(h.status(req, &[]), Status::InvalidArgument, "{req:?}");
        h.still_works();
    }
    // The vGPU's own device addresses.
    let va = h.alloc(MIB);
    assert_eq!(
        h.status(host_map(POOL_GPA, 4096, va), &[]),
        Status::InvalidArgument
    );
    // An address the worker uses (here: this test's own mapping of guest RAM) is never
    // replaced: the feature is off for that range.
    let taken = mem
        .get_slice(GuestAddress(POOL_GPA), 1)
        .expect("host address")
        .ptr_guard()
        .as_ptr() as u64;
    assert_eq!(
        h.status(host_map(POOL_GPA, POOL, taken), &[]),
        Status::NotSupported
    );
    let mut probe = [0u8; 4];
    mem.write_slice(&[9, 9, 9, 9], GuestAddress(POOL_GPA))
        .expect("pool write");
    mem.read_slice(&mut probe, GuestAddress(POOL_GPA))
        .expect("pool read");
    assert_eq!(probe, [9; 4], "the worker's own mapping is intact");
    // Refused addresses reach nothing.
    assert_ne!(h.status(memset(taken, 0, 1), &[]), Status::Ok);
    assert_ne!(h.status(memset(addr, 0, 1), &[]), Status::Ok);

    // One good map, then overlapping ones.
    h.ok(host_map(POOL_GPA, POOL, addr), &[]);
    assert_eq!(
        h.status(host_map(POOL_GPA, 4096, addr + POOL - 4096), &[]),
        Status::InvalidArgument
    );
    // A second view of the same pool bytes elsewhere is allowed (its own range).
    h.ok(host_map(POOL_GPA, 4096, addr + POOL), &[]);
    h.ok(memset(addr + POOL, 0x0102_0304, 1), &[]);
    mem.read_slice(&mut probe, GuestAddress(POOL_GPA))
        .expect("pool read");
    assert_eq!(probe, [4, 3, 2, 1]);
    // A range that starts inside a mapped range and runs past it.
    assert_ne!(h.status(memset(addr + POOL + 4092, 0, 2), &[]), Status::Ok);
    h.still_works();
}
