//! Payload guests really boot under KVM: serial output, exit codes, reset, signals, and a
//! one-line error (never a panic or a leftover process) for every bad input.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::time::Duration;

use vgpu_tests::bins::payload;
use vgpu_tests::require_kvm;
use vgpu_tests::run::{finish, run_payload, spawn_vmm};

const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn hello_prints_and_exits_with_its_code() {
    require_kvm!();
    let out = run_payload(
        &payload("hello"),
        &["--vcpus", "2", "--payload-arg", "exit=7"],
        DEADLINE,
    );
    assert_eq!(out.code, Some(7), "{out:?}");
    assert!(
        out.stdout
            .contains("hello from vgpu payload: vcpus=2 mem=256"),
        "{out:?}"
    );
    assert!(out.stdout.contains("exit=7"), "{out:?}");
}

#[test]
fn hello_exits_zero_and_sees_all_memory() {
    require_kvm!();
    // 4 GiB crosses the MMIO hole: the guest sees both RAM regions.
    let out = run_payload(
        &payload("hello"),
        &["--memory", "4G", "--vcpus", "4"],
        DEADLINE,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("vcpus=4 mem=4096"), "{out:?}");
}

#[test]
fn i8042_reset_ends_the_vm_cleanly() {
    require_kvm!();
    let out = run_payload(&payload("hello"), &["--payload-arg", "reset"], DEADLINE);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("hello from vgpu payload"), "{out:?}");
}

#[test]
fn sigterm_stops_a_running_guest_in_order() {
    require_kvm!();
    let p = payload("kvm-exits");
    let child = spawn_vmm(&[
        "--payload",
        p.to_str().unwrap(),
        "--vcpus",
        "2",
        "--payload-arg",
        "n=100000000000",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on the pid of a child we own; no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = finish(child, Duration::from_secs(10));
    assert_eq!(out.code, Some(128 + libc::SIGTERM), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
}

/// Runs the vmm with arguments that must fail; returns its single error line.
fn must_fail(args: &[&str]) -> String {
    let out = finish(spawn_vmm(args), DEADLINE);
    assert_eq!(out.code, Some(1), "{args:?}: {out:?}");
    let lines: Vec<_> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "{args:?}: one error line expected: {out:?}");
    assert!(lines[0].starts_with("vmm: "), "{out:?}");
    assert!(!out.stderr.contains("panicked"), "{out:?}");
    lines[0].to_string()
}

#[test]
fn bad_inputs_give_one_line_errors() {
    let hello = payload("hello");
    let hello = hello.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("vgpu-boot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.elf");
    std::fs::write(&garbage, b"\x7fELF but not really an ELF image at all").unwrap();
    let empty = dir.join("empty.elf");
    std::fs::write(&empty, b"").unwrap();

    assert!(must_fail(&["--payload", "/nonexistent/payload.elf"]).contains("cannot open payload"));
    assert!(must_fail(&["--payload", garbage.to_str().unwrap()]).contains("not a 64-bit x86 ELF"));
    assert!(must_fail(&["--payload", empty.to_str().unwrap()]).contains("not a 64-bit x86 ELF"));
    assert!(must_fail(&["--payload", hello, "--memory", "0"]).contains("too small"));
    assert!(must_fail(&["--payload", hello, "--memory", "100T"]).contains("exceeds this host"));
    assert!(must_fail(&["--payload", hello, "--vcpus", "0"]).contains("out of range"));
    let missing = dir.join("missing.sock");
    let arg = format!("socket={}", missing.display());
    assert!(must_fail(&["--payload", hello, "--vgpu", &arg]).contains("cannot connect"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_socket_that_speaks_garbage_is_refused() {
    let dir = std::env::temp_dir().join(format!("vgpu-garbage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("garbage.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        // Answer anything with noise, then hang up.
        if let Ok((mut s, _)) = listener.accept() {
            let _ = s.write_all(&[0xab; 64]);
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let hello = payload("hello");
    let arg = format!("socket={}", sock.display());
    let line = must_fail(&["--payload", hello.to_str().unwrap(), "--vgpu", &arg]);
    assert!(line.contains("failed the handshake"), "{line}");
    server.join().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_socket_that_never_answers_times_out() {
    let dir = std::env::temp_dir().join(format!("vgpu-silent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("silent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let conn = listener.accept();
        std::thread::sleep(Duration::from_secs(7));
        drop(conn);
    });
    let hello = payload("hello");
    let arg = format!("socket={}", sock.display());
    let line = must_fail(&["--payload", hello.to_str().unwrap(), "--vgpu", &arg]);
    assert!(line.contains("failed the handshake"), "{line}");
    server.join().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
