//! Helpers for the migration tests: the vmm binary, the hello payload, the control API.

#![allow(dead_code)]

pub mod vhost;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn have_kvm() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// Returns from the calling test when KVM is missing.
#[macro_export]
macro_rules! require_kvm {
    () => {
        if !common::have_kvm() {
            eprintln!("SKIPPED: /dev/kvm is not available on this machine");
            return;
        }
    };
}

pub fn vmm() -> &'static str {
    env!("CARGO_BIN_EXE_vmm")
}

/// The hello payload: from `VGPU_PAYLOAD_DIR`, or built by payload-build once.
pub fn hello() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        if let Some(dir) = std::env::var_os("VGPU_PAYLOAD_DIR").filter(|v| !v.is_empty()) {
            return Path::new(&dir).join("hello");
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
        let out = Command::new(cargo)
            .args([
                "run",
                "--quiet",
                "--manifest-path",
                manifest,
                "-p",
                "payload-build",
            ])
            .output()
            .expect("run payload-build");
        assert!(
            out.status.success(),
            "payload-build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("hello ").map(PathBuf::from))
            .expect("payload-build lists hello")
    })
    .clone()
}

/// A fresh directory for sockets.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmm-mig-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmpdir");
    d
}

/// A source VM running hello in churn mode.
pub fn spawn_source(arg: &str, memory: &str, vcpus: u8, api: &Path) -> Child {
    Command::new(vmm())
        .arg("--payload")
        .arg(hello())
        .args([
            "--memory",
            memory,
            "--vcpus",
            &vcpus.to_string(),
            "--payload-arg",
            arg,
        ])
        .arg("--api-socket")
        .arg(api)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn source vmm")
}

/// A destination waiting on `listen`, with its own control socket.
pub fn spawn_dest(listen: &Path, api: &Path) -> Child {
    spawn_dest_at(&format!("unix:{}", listen.display()), api, &[])
}

/// A destination waiting on `addr` (`unix:` or `tcp:`), with extra arguments.
pub fn spawn_dest_at(addr: &str, api: &Path, extra: &[&str]) -> Child {
    Command::new(vmm())
        .arg("--migrate-from")
        .arg(addr)
        .args(extra)
        .arg("--api-socket")
        .arg(api)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn destination vmm")
}

/// Waits until `path` exists.
pub fn wait_for(path: &Path, within: Duration) {
    let t = Instant::now();
    while !path.exists() {
        assert!(t.elapsed() < within, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A free loopback TCP port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits until something listens on loopback TCP `port` (from /proc/net/tcp, without
/// connecting: the destination accepts exactly one connection).
pub fn wait_tcp_listen(port: u16, within: Duration) {
    let want = format!("0100007F:{port:04X}");
    let t = Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        }) {
            return;
        }
        assert!(t.elapsed() < within, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Connects to a socket that may exist a moment before it listens.
pub fn connect(path: &Path) -> UnixStream {
    let t = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return s,
            Err(e) if t.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("cannot connect to {}: {e}", path.display()),
        }
    }
}

/// One control request; the reply as JSON.
pub fn api(sock: &Path, req: serde_json::Value) -> serde_json::Value {
    let mut s = connect(sock);
    s.write_all(format!("{req}\n").as_bytes()).expect("send");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("reply");
    serde_json::from_str(&line).expect("reply is JSON")
}

/// Polls `status` until the migration leaves pre-copy and stop; returns the last status.
pub fn wait_migration(sock: &Path, within: Duration) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let Ok(mut s) = UnixStream::connect(sock) else {
            // The source ended (it does once the VM moved): its last word is on stderr.
            return serde_json::json!({"migration": {"phase": "gone"}});
        };
        let _ = s.write_all(b"{\"command\":\"status\"}\n");
        let mut line = String::new();
        let _ = BufReader::new(s).read_line(&mut line);
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            let phase = v["migration"]["phase"].as_str().unwrap_or("").to_owned();
            if phase == "completed" || phase == "failed" {
                return v;
            }
        }
        assert!(t.elapsed() < within, "migration did not finish: {line}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a process with a deadline; kills it past the deadline.
pub fn finish(mut child: Child, within: Duration) -> Output {
    let t = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t.elapsed() > within {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "process did not end within {within:?}: stdout {} stderr {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// The churn checksum line of a guest's console output.
pub fn checksum(stdout: &str) -> Option<String> {
    stdout
        .lines()
        .find(|l| l.starts_with("churn: mib="))
        .map(str::to_owned)
}

/// An unmigrated run's checksum line.
pub fn reference(arg: &str, memory: &str, vcpus: u8) -> String {
    let out = Command::new(vmm())
        .arg("--payload")
        .arg(hello())
        .args([
            "--memory",
            memory,
            "--vcpus",
            &vcpus.to_string(),
            "--payload-arg",
            arg,
        ])
        .output()
        .expect("reference run");
    assert!(out.status.success(), "reference run failed: {out:?}");
    checksum(&String::from_utf8_lossy(&out.stdout)).expect("reference checksum")
}
