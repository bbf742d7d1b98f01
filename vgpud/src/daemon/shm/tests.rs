//! The shared memory registry's tests.

use super::*;
use std::os::fd::FromRawFd;

/// A shared object for a sim GPU: a memfd of `size` bytes (page-rounded) with its memory
/// committed, so running out of host memory is an error here and never a SIGBUS in a
/// mapper later. The sim backend maps it as device memory (`SharedMemory::import`).
fn sim_object(size: u64) -> Result<OwnedFd, String> {
    const PAGE: u64 = 4096;
    let len = size
        .checked_add(PAGE - 1)
        .map(|l| l & !(PAGE - 1))
        .filter(|l| *l > 0)
        .and_then(|l| libc::off_t::try_from(l).ok())
        .ok_or_else(|| format!("a shared object of {size} bytes cannot be created"))?;
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"vgpu-shm".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor we own and nothing else refers to.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on our own descriptor.
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), len) } != 0 {
        return Err(format!(
            "sizing the object: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above.
    if unsafe { libc::fallocate(memfd.as_raw_fd(), 0, 0, len) } != 0 {
        return Err(format!(
            "committing {len} bytes of host memory for the object: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: plain fcntl on our own descriptor.
    if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
        return Err(format!("sealing: {}", std::io::Error::last_os_error()));
    }
    Ok(memfd)
}

fn memfd(size: u64) -> Result<OwnedFd, String> {
    sim_object(size)
}

fn who(vgpu: u32, group: Option<&str>) -> Asker<'_> {
    Asker {
        vgpu,
        gpu: 0,
        group,
    }
}

#[test]
fn create_lookup_attach_and_free_on_last_detach() {
    let mut r = Registry::default();
    let a = who(1, Some("g"));
    let b = who(2, Some("g"));
    let c = CREATE_FLAGS;
    let id = r.get(&a, 7, 4096, c, 1 << 20, memfd).expect("create");
    assert_eq!(r.get(&b, 7, 0, 0, 1 << 20, memfd), Ok(id), "lookup by key");
    assert_eq!(
        r.get(&b, 7, 4096, c | shm_flags::EXCLUSIVE, 1 << 20, memfd)
            .map_err(|e| e.0),
        Err(ShmFailure::Exists)
    );
    let (_fd, size) = r.attach(&a, id).expect("attach a");
    assert_eq!(size, 4096);
    r.attach(&b, id).expect("attach b");
    assert_eq!(r.ctl(&a, id, shm_cmd::STAT), Ok([4096, 2, 7, 0]));
    r.ctl(&a, id, shm_cmd::RMID).expect("rmid while attached");
    assert!(r.objects().any(|o| o.id == id), "kept while attached");
    assert!(r.attach(&a, id).is_err(), "no new attachments after RMID");
    assert_eq!(r.mapped_by(1), vec![id]);
    assert_eq!(r.mapped_by(3), Vec::<u64>::new());
    r.detach(1, id).expect("detach a");
    assert!(r.mapped_by(1).is_empty(), "a detached vGPU maps nothing");
    assert!(r.objects().any(|o| o.id == id));
    r.detach(2, id).expect("detach b");
    assert!(r.objects().next().is_none(), "freed on the last detach");
}

const CREATE_FLAGS: u64 = shm_flags::CREATE;

#[test]
fn other_groups_and_groupless_vgpus_are_denied() {
    let mut r = Registry::default();
    let id = r
        .get(&who(1, Some("g")), 7, 4096, CREATE_FLAGS, 1 << 20, memfd)
        .expect("create");
    let other = who(2, Some("h"));
    assert_eq!(
        r.attach(&other, id).map(|_| ()).map_err(|e| e.0),
        Err(ShmFailure::Denied)
    );
    assert_eq!(
        r.ctl(&other, id, shm_cmd::RMID).map_err(|e| e.0),
        Err(ShmFailure::Denied)
    );
    assert_eq!(
        r.get(&other, 7, 0, 0, 1 << 20, memfd).map_err(|e| e.0),
        Err(ShmFailure::NotFound),
        "keys are scoped by share group"
    );
    assert_eq!(
        r.get(&who(3, None), 7, 0, 0, 1 << 20, memfd)
            .map_err(|e| e.0),
        Err(ShmFailure::Denied)
    );
    let mut other_gpu = who(4, Some("g"));
    other_gpu.gpu = 1;
    assert_eq!(
        r.attach(&other_gpu, id).map(|_| ()).map_err(|e| e.0),
        Err(ShmFailure::Denied)
    );
}

#[test]
fn bad_sizes_and_commands_fail() {
    let mut r = Registry::default();
    let a = who(1, Some("g"));
    for size in [0, MAX_SIZE + 1] {
        assert_eq!(
            r.get(&a, 1, size, CREATE_FLAGS, u64::MAX, memfd)
                .map_err(|e| e.0),
            Err(ShmFailure::Invalid)
        );
    }
    assert_eq!(
        r.get(&a, 1, 1 << 30, CREATE_FLAGS, 1 << 20, memfd)
            .map_err(|e| e.0),
        Err(ShmFailure::NoMemory)
    );
    let id = r
        .get(&a, 1, 4096, CREATE_FLAGS, 1 << 20, memfd)
        .expect("create");
    assert_eq!(
        r.get(&a, 1, 8192, 0, 1 << 20, memfd).map_err(|e| e.0),
        Err(ShmFailure::Invalid)
    );
    assert_eq!(r.ctl(&a, id, 9).map_err(|e| e.0), Err(ShmFailure::Invalid));
    assert_eq!(r.detach(1, id).map_err(|e| e.0), Err(ShmFailure::NotFound));
    assert_eq!(r.detach(1, 999).map_err(|e| e.0), Err(ShmFailure::NotFound));
}

#[test]
fn objects_and_attachments_are_bounded_per_vgpu_and_per_group() {
    let limits = Limits {
        objects_per_vgpu: 3,
        objects_per_group: 5,
        attachments_per_vgpu: 4,
        fd_reserve: 0,
    };
    let mut r = Registry::new(limits);
    let a = who(1, Some("g"));
    let b = who(2, Some("g"));
    let other = who(3, Some("h"));
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(
            r.get(&a, 0, 1, CREATE_FLAGS, 1 << 30, memfd)
                .expect("create"),
        );
    }
    let past = r.get(&a, 0, 1, CREATE_FLAGS, 1 << 30, memfd);
    match past {
        Err((ShmFailure::NoMemory, why)) => {
            assert!(why.contains("the most one vGPU may hold"), "{why}")
        }
        other => panic!("the 4th object of a vGPU: {other:?}"),
    }
    // An existing key still answers: lookups create nothing.
    let keyed = r.get(&b, 9, 1, CREATE_FLAGS, 1 << 30, memfd).expect("b");
    r.get(&b, 0, 1, CREATE_FLAGS, 1 << 30, memfd).expect("b");
    match r.get(&b, 0, 1, CREATE_FLAGS, 1 << 30, memfd) {
        Err((ShmFailure::NoMemory, why)) => {
            assert!(why.contains("the most a group may hold"), "{why}")
        }
        other => panic!("the 6th object of a group: {other:?}"),
    }
    assert_eq!(r.get(&a, 9, 0, 0, 1 << 30, memfd), Ok(keyed));
    r.get(&other, 0, 1, CREATE_FLAGS, 1 << 30, memfd)
        .expect("another group has its own bound");
    // Removing one makes room again.
    let first = mine[0];
    r.ctl(&a, first, shm_cmd::RMID).expect("rmid");
    r.get(&a, 0, 1, CREATE_FLAGS, 1 << 30, memfd)
        .expect("room after RMID");
    // Attachments per vGPU.
    let mut fds = Vec::new();
    for _ in 0..4 {
        fds.push(r.attach(&b, keyed).expect("attach"));
    }
    assert_eq!(
        r.attach(&b, keyed).map(|_| ()).map_err(|e| e.0),
        Err(ShmFailure::NoMemory)
    );
    r.detach(2, keyed).expect("detach");
    r.attach(&b, keyed).expect("room after a detach");
    // Whole pages: a 1-byte object takes a page.
    assert_eq!(charged_bytes(1), 4096);
    assert_eq!(charged_bytes(4096), 4096);
    assert_eq!(charged_bytes(4097), 8192);
    assert_eq!(r.bytes_on(0), 6 * 4096, "six live objects on GPU 0");
}

#[test]
fn objects_are_refused_when_descriptors_run_short() {
    let mut r = Registry::new(Limits {
        fd_reserve: 100,
        ..Limits::default()
    });
    let a = who(1, Some("g"));
    let id = r
        .get(&a, 7, 1, CREATE_FLAGS, 1 << 30, memfd)
        .expect("create");
    r.headroom = || Some(100);
    match r.get(&a, 0, 1, CREATE_FLAGS, 1 << 30, memfd) {
        Err((ShmFailure::NoMemory, why)) => {
            assert!(why.contains("file descriptors left"), "{why}")
        }
        other => panic!("short of descriptors: {other:?}"),
    }
    assert_eq!(
        r.attach(&a, id).map(|_| ()).map_err(|e| e.0),
        Err(ShmFailure::NoMemory)
    );
    assert_eq!(
        r.get(&a, 7, 0, 0, 1 << 30, memfd),
        Ok(id),
        "lookups still work"
    );
    r.headroom = || Some(101);
    r.attach(&a, id).expect("attach with headroom");
}

#[test]
fn the_fd_limit_is_raised_to_the_hard_limit() {
    let soft = raise_fd_limit();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes into `lim`.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert_eq!(soft, lim.rlim_cur);
    assert_eq!(lim.rlim_cur, lim.rlim_max);
    assert!(fd_headroom().is_some_and(|h| h > 0));
}

#[test]
fn a_dying_vgpu_leaves_the_object_to_the_others() {
    let mut r = Registry::default();
    let a = who(1, Some("g"));
    let b = who(2, Some("g"));
    let id = r
        .get(&a, 7, 4096, CREATE_FLAGS, 1 << 20, memfd)
        .expect("create");
    r.attach(&a, id).expect("a");
    r.attach(&b, id).expect("b");
    r.vgpu_gone(1, |_, _| true);
    assert_eq!(r.ctl(&b, id, shm_cmd::STAT), Ok([4096, 1, 7, 0]));
    r.vgpu_gone(2, |_, _| false);
    assert!(
        r.objects().next().is_none(),
        "no vGPU of the group left: freed"
    );
}

#[test]
fn a_workers_object_is_checked_before_it_is_kept() {
    // A sealed memfd of the object's whole pages: what the sim backend exports.
    let fd = sim_object(5000).expect("memfd");
    assert_eq!(check_object(&fd, 5000, true), Ok(()));
    assert_eq!(check_object(&fd, 8192, true), Ok(()));
    let short = check_object(&fd, 8193, true).expect_err("too small");
    assert!(short.contains("sealed against shrinking"), "{short}");
    // Unsealed: a holder could shrink it under a mapper.
    // SAFETY: memfd_create with a valid name; checked below.
    let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    let plain = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscall on our own descriptor.
    assert_eq!(unsafe { libc::ftruncate(plain.as_raw_fd(), 4096) }, 0);
    assert!(check_object(&plain, 4096, true).is_err(), "unsealed");
    assert_eq!(
        check_object(&plain, 4096, false),
        Ok(()),
        "cuda: the driver's to judge"
    );
    // A socket is no object on any GPU.
    let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
    let sock = OwnedFd::from(a);
    assert!(check_object(&sock, 4096, true).is_err());
    assert!(check_object(&sock, 4096, false).is_err());
}

#[test]
fn prepare_says_when_to_create_and_insert_registers() {
    let mut r = Registry::default();
    let a = who(1, Some("g"));
    let b = who(2, Some("g"));
    assert_eq!(
        r.prepare(&a, 7, 4096, CREATE_FLAGS, 1 << 20),
        Ok(None),
        "make it"
    );
    assert_eq!(
        r.prepare(&a, 7, 4096, 0, 1 << 20).map_err(|e| e.0),
        Err(ShmFailure::NotFound)
    );
    assert_eq!(
        r.prepare(&a, 7, 1 << 30, CREATE_FLAGS, 1 << 20)
            .map_err(|e| e.0),
        Err(ShmFailure::NoMemory),
        "no room on the GPU"
    );
    assert_eq!(
        r.prepare(&who(3, None), 7, 4096, CREATE_FLAGS, 1 << 20)
            .map_err(|e| e.0),
        Err(ShmFailure::Denied)
    );
    let id = r
        .insert(&a, 7, 4096, sim_object(4096).expect("memfd"))
        .expect("insert");
    // Another mapper that was told to create it too finds it now.
    assert_eq!(r.prepare(&b, 7, 4096, CREATE_FLAGS, 1 << 20), Ok(Some(id)));
    assert_eq!(
        r.prepare(&b, 7, 4096, CREATE_FLAGS | shm_flags::EXCLUSIVE, 1 << 20)
            .map_err(|e| e.0),
        Err(ShmFailure::Exists)
    );
    assert_eq!(r.bytes_on(0), 4096);
}
