//! Clients that open API connections and never send a request (docs/hostile.md, "API
//! connections"): vgpud at an open-file limit of 1 024 keeps the descriptors its own work
//! needs while 2 000 such connections are open (a vGPU is created meanwhile) and closes
//! them when idle.

use std::io::{Read, Write};
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

/// vgpud, killed with its workers if the test fails before it stops it.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            for pid in vgpu_tests::daemon::children(self.0.id()) {
                // SAFETY: kill takes integers; the pid is our vgpud's child.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn idle_connections_cannot_take_the_descriptors_a_vgpu_needs() {
    let dir = temp_dir("connections");
    let sock = dir.join("vgpud.sock");
    let log = dir.join("vgpud.log");
    let mut cmd = vgpud_command(&["--socket", &sock.display().to_string(), "--sim-gpus", "1"]);
    // `--api-idle-timeout-s`, through its variable.
    cmd.env("VGPUD_API_IDLE_TIMEOUT_S", "2");
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
    let mut vgpud = Stopped(
        cmd.stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("vgpud"),
    );
    let client = Client::new(Endpoint::Unix(sock.clone()), None);
    let start = Instant::now();
    while client.gpus().is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "vgpud does not serve"
        );
        assert!(vgpud.0.try_wait().ok().flatten().is_none(), "vgpud exited");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A user's connection, open before the attack; its request comes during it.
    let user = std::os::unix::net::UnixStream::connect(&sock).expect("user connection");
    user.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");

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

    // vgpud still has the descriptors a vGPU needs while the attack's connections are held.
    let spec = serde_json::to_vec(&VgpuCreate {
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
    })
    .expect("encode");
    let mut request = format!(
        "POST /v1/vgpus HTTP/1.1\r\nhost: vgpud\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        spec.len()
    )
    .into_bytes();
    request.extend_from_slice(&spec);
    (&user).write_all(&request).expect("send the request");
    let mut answer = String::new();
    let _ = (&user).read_to_string(&mut answer);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        answer.starts_with("HTTP/1.1 201"),
        "vGPU create during the attack: {answer}\n{text}"
    );
    assert!(
        text.contains("API connections at their bound"),
        "no connection was refused at the bound:\n{text}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let id = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["id"].as_u64())
        .and_then(|v| u32::try_from(v).ok())
        .expect("the new vGPU's id");

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
    // With the attack's connections closed, the API serves again.
    let t0 = Instant::now();
    while client.delete_vgpu(id).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the API does not serve again"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(idle);
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(vgpud.0.id() as i32, libc::SIGTERM) };
    let _ = vgpud.0.wait();
    let _ = std::fs::remove_dir_all(dir);
}
