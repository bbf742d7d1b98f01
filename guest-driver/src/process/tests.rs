use std::os::fd::AsRawFd;

use super::*;

#[test]
fn memfds_are_sealed_against_resizing() {
    let fd = sealed_memfd(4 << 20).expect("memfd");
    // SAFETY: F_GET_SEALS on our own descriptor.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    assert_eq!(seals & want, want);
    // SAFETY: ftruncate on our own descriptor; the seals must refuse it.
    assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 8 << 20) }, 0);
    // SAFETY: as above.
    assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 20) }, 0);
    // SAFETY: adding a seal to a sealed seal set must fail.
    let more = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
    assert_ne!(more, 0);
}

#[test]
fn regions_are_laid_out_apart_and_translate() {
    let mut m = Memory::default();
    m.grow(3 << 20).expect("first");
    m.grow(1 << 20).expect("second");
    assert_eq!(m.regions[0].gpa, GPA_BASE);
    assert_eq!(m.regions[0].len, 4 << 20, "rounded up to 2 MiB");
    // One 2 MiB gap after the first region.
    assert_eq!(m.regions[1].gpa, GPA_BASE + (6 << 20));
    let t = m.snapshot();
    assert_eq!(t.hva(GPA_BASE + 100), Some(m.regions[0].hva + 100));
    assert_eq!(t.hva(GPA_BASE + (6 << 20)), Some(m.regions[1].hva));
    assert_eq!(t.hva(GPA_BASE + (5 << 20)), None, "the gap");
    assert_eq!(t.hva(0), None);
    // DMA allocations translate back to the region's guest-physical addresses.
    let (ptr, phys) = m.pool.alloc(4096, 4096).expect("alloc");
    assert_eq!(t.hva(phys), Some(ptr.as_ptr() as u64));
}

#[test]
fn the_table_has_a_limit() {
    let mut m = Memory::default();
    for _ in 0..MAX_REGIONS {
        m.grow(2 << 20).expect("region");
    }
    assert!(m.grow(2 << 20).is_err());
}

#[test]
fn a_missing_socket_is_a_connect_error() {
    let err = ProcessTransport::connect(Path::new("/nonexistent/vgpu.sock")).unwrap_err();
    assert!(matches!(err, ProcessError::Connect { .. }), "{err}");
}

#[test]
fn a_worker_that_never_answers_ends_the_connect_at_the_handshake_timeout() {
    // A socket whose listener never accepts, as a worker serving another frontend does:
    // the connection waits in the backlog and nothing answers.
    let dir = std::env::temp_dir().join(format!("vgpu-noanswer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vgpu.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let opts = Options {
        handshake_timeout: std::time::Duration::from_millis(300),
        ..Options::default()
    };
    let started = std::time::Instant::now();
    let err = ProcessTransport::connect_with(&path, opts).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, ProcessError::NoAnswer { .. }), "{err}");
    assert!(
        took >= std::time::Duration::from_millis(300) && took < std::time::Duration::from_secs(5),
        "{took:?}"
    );
    assert!(err.to_string().contains("did not answer"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn regions_go_where_a_worker_has_nothing_mapped() {
    let mut m = Memory::default();
    m.grow(2 << 20).expect("first");
    m.grow(2 << 20).expect("second");
    // The hint window holds nothing in a fresh process (two test pools of a few MiB meet
    // in its 2 TiB with negligible odds), so the kernel takes the hints.
    let first = m.regions[0].hva;
    assert!(
        (POOL_HINT_BASE..POOL_HINT_BASE + POOL_HINT_SPAN).contains(&first),
        "{first:#x}"
    );
    assert_eq!(first % GPA_ALIGN, 0, "{first:#x}");
    assert_eq!(
        m.regions[1].hva,
        first + (4 << 20),
        "the next region follows after a 2 MiB gap"
    );
    let hints: std::collections::BTreeSet<u64> = (0..8).map(|_| pool_hint()).collect();
    assert!(hints.len() > 1, "hints are random");
    assert!(hints.iter().all(|h| {
        (POOL_HINT_BASE..POOL_HINT_BASE + POOL_HINT_SPAN).contains(h) && h % GPA_ALIGN == 0
    }));
}
