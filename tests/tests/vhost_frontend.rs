//! A tenant's hostile vhost-user frontend against a real worker (sim backend), speaking
//! the wire protocol by hand (docs/hostile.md, "A tenant's vhost-user frontend"):
//! protocol features that were never offered, memory slots (`ADD_MEM_REG`) by the
//! thousand, a dirty log that could shrink, out-of-range ring values. Each is refused, the
//! worker keeps its descriptors bounded, and it serves the next connection. A memory
//! table above the worker's `--max-guest-memory` is refused the same way.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_OWNER: u32 = 3;
const SET_MEM_TABLE: u32 = 5;
const SET_LOG_BASE: u32 = 6;
const SET_VRING_NUM: u32 = 8;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_PROTOCOL_FEATURES: u32 = 16;
const GET_QUEUE_NUM: u32 = 17;
const ADD_MEM_REG: u32 = 37;
const NEED_REPLY: u32 = 0x8;
const PROTOCOL_FEATURES: u64 = 1 << 30;
const REPLY_ACK: u64 = 1 << 3;
const CONFIGURE_MEM_SLOTS: u64 = 1 << 15;
const GIB: u64 = 1 << 30;

struct Raw(UnixStream);

impl Raw {
    fn connect(path: &Path) -> Self {
        let s = UnixStream::connect(path).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Raw(s)
    }

    fn send(&mut self, req: u32, flags: u32, body: &[u8], fds: &[RawFd]) {
        let mut m = Vec::new();
        m.extend_from_slice(&req.to_le_bytes());
        m.extend_from_slice(&(0x1 | flags).to_le_bytes());
        m.extend_from_slice(&(body.len() as u32).to_le_bytes());
        m.extend_from_slice(body);
        let n = self.0.send_with_fds(&[m.as_slice()], fds).expect("send");
        self.0.write_all(&m[n..]).expect("send the rest");
    }

    /// A reply's first u64 (a REPLY_ACK: 0 accepted, else refused); `None` when the
    /// connection closed.
    fn reply(&mut self) -> Option<u64> {
        let mut h = [0u8; 12];
        self.0.read_exact(&mut h).ok()?;
        let size = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let mut b = vec![0u8; size.max(8)];
        self.0.read_exact(&mut b[..size]).ok()?;
        Some(u64::from_le_bytes(b[..8].try_into().ok()?))
    }

    fn ask(&mut self, req: u32, flags: u32, body: &[u8], fds: &[RawFd]) -> Option<u64> {
        self.send(req, flags, body, fds);
        self.reply()
    }

    /// SET_OWNER, then features with REPLY_ACK: the daemon answers every NEED_REPLY.
    fn handshake(&mut self) -> u64 {
        self.send(SET_OWNER, 0, &[], &[]);
        let features = self.ask(GET_FEATURES, 0, &[], &[]).expect("features");
        assert_ne!(features & PROTOCOL_FEATURES, 0);
        self.send(SET_FEATURES, 0, &features.to_le_bytes(), &[]);
        let offered = self
            .ask(GET_PROTOCOL_FEATURES, 0, &[], &[])
            .expect("protocol");
        assert_ne!(offered & REPLY_ACK, 0);
        assert_eq!(
            offered & CONFIGURE_MEM_SLOTS,
            0,
            "memory slots are not offered"
        );
        let ack = self.ask(
            SET_PROTOCOL_FEATURES,
            NEED_REPLY,
            &offered.to_le_bytes(),
            &[],
        );
        assert_eq!(ack, Some(0), "the offered features are refused");
        offered
    }
}

/// A memfd of `size` bytes (sparse), sealed against shrinking when `sealed`.
fn memfd(size: u64, sealed: bool) -> OwnedFd {
    // SAFETY: a fresh memfd with a constant name; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"attack".as_ptr(),
            libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC,
        )
    };
    assert!(fd >= 0);
    // SAFETY: `fd` is fresh and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate and fcntl on our own descriptor.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), size as libc::off_t), 0);
        if sealed {
            assert_eq!(
                libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK),
                0
            );
        }
    }
    fd
}

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The worker, killed if the test fails before it exits.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(sock: &Path, log: &Path, extra: &[&str]) -> Worker {
    let w = Command::new(vgpu_tests::bins::binary("vgpu-worker"))
        .args(["--socket", &sock.display().to_string(), "--vgpu-id", "7"])
        .args(["--memory", "64M", "--queues", "2", "--seccomp", "kill"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("worker");
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the worker did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Worker(w)
}

#[test]
fn a_hostile_frontend_is_refused_and_the_worker_serves_the_next_one() {
    let dir = vgpu_tests::daemon::temp_dir("vhost-frontend");
    let sock = dir.join("vgpu.sock");
    let log = dir.join("worker.log");
    let mut w = worker(&sock, &log, &[]);
    let pid = w.0.id();
    let mut fe = Raw::connect(&sock);
    let offered = fe.handshake();
    let text = || std::fs::read_to_string(&log).unwrap_or_default();

    // Acking a protocol feature that was never offered.
    let more = offered | CONFIGURE_MEM_SLOTS;
    let ack = fe.ask(SET_PROTOCOL_FEATURES, NEED_REPLY, &more.to_le_bytes(), &[]);
    assert_eq!(
        ack,
        Some(1),
        "unoffered protocol features accepted\n{}",
        text()
    );

    // Memory slots by the hundred: 1 GiB memfds, never touched.
    let before = fds_of(pid);
    for i in 0..200u64 {
        let fd = memfd(GIB, true);
        let mut body = vec![0u8; 8];
        for v in [i * GIB, GIB, 0x7f00_0000_0000 + i * GIB, 0] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        let ack = fe.ask(ADD_MEM_REG, NEED_REPLY, &body, &[fd.as_raw_fd()]);
        assert_eq!(ack, Some(1), "ADD_MEM_REG {i} accepted\n{}", text());
    }
    assert!(
        fds_of(pid) < before + 8,
        "the worker holds {} descriptors (from {before})",
        fds_of(pid)
    );

    // A real memory table (64 MiB, sealed), then dirty logs that could crash the worker:
    // each is refused with its connection (SET_LOG_BASE is answered with the log area,
    // so a refusal cannot be a REPLY_ACK), and the next connection is served.
    let ram = memfd(64 << 20, true);
    let mut table = Vec::new();
    table.extend_from_slice(&1u32.to_le_bytes());
    table.extend_from_slice(&0u32.to_le_bytes());
    for v in [0u64, 64 << 20, 0x7f00_0000_0000, 0] {
        table.extend_from_slice(&v.to_le_bytes());
    }
    let log_area = (64u64 << 20) / (8 * 4096);
    let mut log_msg = Vec::new();
    log_msg.extend_from_slice(&log_area.to_le_bytes());
    log_msg.extend_from_slice(&0u64.to_le_bytes());
    for (what, fd) in [
        ("a 0-byte memfd", memfd(0, true)),
        ("an unsealed memfd", memfd(log_area, false)),
        ("a sealed memfd too small", memfd(log_area / 2, true)),
        ("a sealed memfd of the right size", memfd(log_area, true)),
    ] {
        let ack = fe.ask(SET_MEM_TABLE, NEED_REPLY, &table, &[ram.as_raw_fd()]);
        assert_eq!(ack, Some(0), "the memory table\n{}", text());
        let answer = fe.ask(SET_LOG_BASE, NEED_REPLY, &log_msg, &[fd.as_raw_fd()]);
        if what.ends_with("right size") {
            assert_eq!(answer, Some(log_area), "{what} refused\n{}", text());
        } else {
            assert_eq!(answer, None, "{what} accepted as the dirty log\n{}", text());
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                w.0.try_wait().expect("wait").is_none(),
                "the worker exited\n{}",
                text()
            );
            fe = Raw::connect(&sock);
            fe.handshake();
        }
    }

    // A ring size of 0: the daemon refuses it and this connection ends.
    let mut num = Vec::new();
    num.extend_from_slice(&0u32.to_le_bytes());
    num.extend_from_slice(&0u32.to_le_bytes());
    let ack = fe.ask(SET_VRING_NUM, NEED_REPLY, &num, &[]);
    assert_ne!(ack, Some(0), "a ring of 0 entries accepted");
    drop(fe);

    // The worker lives on and serves the next frontend.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        w.0.try_wait().expect("wait").is_none(),
        "the worker exited after a refused request\n{}",
        text()
    );
    let mut next = Raw::connect(&sock);
    next.handshake();
    let queues = next.ask(GET_QUEUE_NUM, 0, &[], &[]);
    assert_eq!(
        queues,
        Some(2),
        "the next frontend is not served\n{}",
        text()
    );
    drop(next);
    // Its clean disconnect ends the worker, as a VM's does.
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = w.0.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the worker did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}\n{}", text());
    assert!(!text().contains("panicked"), "{}", text());
    let _ = std::fs::remove_dir_all(dir);
}

/// A `SET_MEM_TABLE` body for `regions` (guest address, size), one descriptor each.
fn mem_table(regions: &[(u64, u64)]) -> Vec<u8> {
    let mut table = Vec::new();
    table.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    table.extend_from_slice(&0u32.to_le_bytes());
    for (i, (gpa, size)) in regions.iter().enumerate() {
        let uaddr = 0x7f00_0000_0000 + (i as u64) * GIB;
        for v in [*gpa, *size, uaddr, 0] {
            table.extend_from_slice(&v.to_le_bytes());
        }
    }
    table
}

#[test]
fn a_memory_table_above_the_workers_bound_is_refused_and_the_worker_serves_on() {
    let dir = vgpu_tests::daemon::temp_dir("vhost-frontend-bound");
    let sock = dir.join("vgpu.sock");
    let log = dir.join("worker.log");
    let mut w = worker(&sock, &log, &["--max-guest-memory", "128M"]);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut fe = Raw::connect(&sock);
    fe.handshake();

    // One region past the bound, then two that only together are past it: sealed
    // memfds of the sizes they claim, so only the bound refuses them.
    let big = memfd(256 << 20, true);
    let ack = fe.ask(
        SET_MEM_TABLE,
        NEED_REPLY,
        &mem_table(&[(0, 256 << 20)]),
        &[big.as_raw_fd()],
    );
    assert_eq!(ack, Some(1), "a 256 MiB table accepted\n{}", text());
    let (a, b) = (memfd(96 << 20, true), memfd(64 << 20, true));
    let ack = fe.ask(
        SET_MEM_TABLE,
        NEED_REPLY,
        &mem_table(&[(0, 96 << 20), (GIB, 64 << 20)]),
        &[a.as_raw_fd(), b.as_raw_fd()],
    );
    assert_eq!(ack, Some(1), "a 160 MiB table accepted\n{}", text());
    assert!(
        text().contains("this vGPU's worker maps and pins at most 134217728"),
        "the refusal is not logged\n{}",
        text()
    );

    // The same connection goes on: a table within the bound is taken and the device
    // answers.
    let ram = memfd(128 << 20, true);
    let ack = fe.ask(
        SET_MEM_TABLE,
        NEED_REPLY,
        &mem_table(&[(0, 128 << 20)]),
        &[ram.as_raw_fd()],
    );
    assert_eq!(ack, Some(0), "a 128 MiB table refused\n{}", text());
    assert_eq!(fe.ask(GET_QUEUE_NUM, 0, &[], &[]), Some(2), "{}", text());
    assert!(
        w.0.try_wait().expect("wait").is_none(),
        "the worker exited\n{}",
        text()
    );
    drop(fe);
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = w.0.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the worker did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}\n{}", text());
    assert!(!text().contains("panicked"), "{}", text());
    let _ = std::fs::remove_dir_all(dir);
}
