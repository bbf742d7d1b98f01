//! Clients that open API connections and never send a request (docs/hostile.md, "API
//! connections"): vgpud at an open-file limit of 1 024 keeps the descriptors its own work
//! needs, closes idle connections, and creates a vGPU after 2 000 such connections.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use vgpu_api::api::VgpuCreate;
use vgpu_api::client::{Client, Endpoint};
use vgpu_tests::daemon::{temp_dir, vgpud_command};

/// Sets this process's open-file limit to at least `n` (root may raise the hard one).
fn raise_nofile(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `lim` only.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    let want = libc::rlimit {
        rlim_cur: lim.rlim_cur.max(n),
        rlim_max: lim.rlim_max.max(n),
    };
    // SAFETY: setrlimit reads `want` only.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) };
    assert_eq!(rc, 0, "cannot raise the test's open-file limit to {n}");
}

/// A non-blocking connect to the unix socket `path`: `None` when the listener's backlog
/// is full (the connection would wait).
fn connect(path: &Path) -> Option<OwnedFd> {
    // SAFETY: socket() with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor this function owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero sockaddr_un is valid; the path is copied in below, bounded.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: `addr` is a valid sockaddr_un of the given size; `fd` is open.
    let rc = unsafe {
        libc::connect(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    (rc == 0).then_some(fd)
}

#[test]
fn idle_connections_cannot_take_the_descriptors_a_vgpu_needs() {
    let dir = temp_dir("connections");
    let sock = dir.join("vgpud.sock");
    let log = dir.join("vgpud.log");
    let mut cmd = vgpud_command(&[
        "--socket",
        &sock.display().to_string(),
        "--sim-gpus",
        "1",
        "--api-idle-timeout-s",
        "2",
    ]);
    // SAFETY: the closure only calls setrlimit, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: 1024,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut vgpud = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("vgpud");
    let client = Client::new(Endpoint::Unix(sock.clone()), None);
    let start = Instant::now();
    while client.gpus().is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "vgpud does not serve"
        );
        assert!(vgpud.try_wait().ok().flatten().is_none(), "vgpud exited");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The attack: 2 000 connections that never send a byte.
    raise_nofile(4096);
    let mut idle = Vec::new();
    for _ in 0..2000 {
        match connect(&sock) {
            Some(fd) => idle.push(fd),
            // The backlog is full: vgpud accepts no more.
            None => break,
        }
    }
    assert!(idle.len() > 1100, "only {} connections got in", idle.len());

    // Idle connections are closed: the first one reads end-of-file.
    let first = std::os::unix::net::UnixStream::from(idle.swap_remove(0));
    first.set_nonblocking(false).expect("blocking");
    first
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let t0 = Instant::now();
    let n = std::io::Read::read(&mut &first, &mut [0u8; 16]);
    assert!(
        matches!(n, Ok(0)),
        "an idle connection stayed open {:?}: {n:?}",
        t0.elapsed()
    );

    // vgpud still has the descriptors a vGPU needs, with the attack's connections held.
    let created = client.create_vgpu(&VgpuCreate {
        gpu: Some(0),
        memory_bytes: 64 << 20,
        compute_share: 0.2,
        copy_share: None,
        priority: 0,
        oversubscribe: false,
        share_group: None,
        queues: 1,
        storage: Vec::new(),
        name: None,
        labels: Default::default(),
        kernel_deadline_ms: None,
        attach: Default::default(),
        owner_uid: None,
        owner_gid: None,
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let v = created.unwrap_or_else(|e| panic!("vGPU create failed: {e}\n{text}"));
    assert!(
        text.contains("API connections at their bound"),
        "no connection was refused at the bound:\n{text}"
    );
    client.delete_vgpu(v.id).expect("delete");
    drop(idle);
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(vgpud.id() as i32, libc::SIGTERM) };
    let _ = vgpud.wait();
    let _ = std::fs::remove_dir_all(dir);
}
