//! The destination against hostile or broken migration streams (needs /dev/kvm): each gets
//! a clear error on stderr and back on the stream. A connection that is not the VM's source
//! (garbage, a wrong token) is closed and the destination waits on for its source; a source
//! whose stream breaks ends the destination with exit 1 instead of a crash or a hang.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vmm::migration::snapshot::{VmDescription, VmSnapshot, SNAPSHOT_VERSION};
use vmm::migration::wire::{self, Kind, Message};

fn description(memory: u64, vcpus: u8) -> VmDescription {
    VmDescription {
        snapshot_version: SNAPSHOT_VERSION,
        memory,
        vcpus,
        vgpus: 0,
        linux: false,
        cpu_profile: "host".into(),
        token: None,
    }
}

/// Starts a destination, lets `feed` write to it, and returns (exit code, stderr, the
/// error the destination sent back, if any).
fn against(name: &str, feed: impl FnOnce(&mut UnixStream)) -> (i32, String, Option<String>) {
    let dir = common::tmpdir(name);
    let listen = dir.join("m.sock");
    let dest = common::spawn_dest(&listen, &dir.join("api.sock"));
    common::wait_for(&listen, Duration::from_secs(10));
    let mut s = common::connect(&listen);
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    feed(&mut s);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut buf = Vec::new();
    let back = match wire::read_message(&mut s, &mut buf) {
        Ok(Message::Error(e)) => Some(e),
        _ => None,
    };
    let out = common::finish(dest, Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        back,
    )
}

/// Starts a destination (with `args`), lets `feed` write to one connection, and returns the
/// error the destination sent back, once it has checked that the destination is still
/// waiting for its source (a connection that is not the VM's source never ends the move),
/// and its stderr after it is stopped.
fn not_the_source(
    name: &str,
    args: &[&str],
    feed: impl FnOnce(&mut UnixStream),
) -> (Option<String>, String) {
    let dir = common::tmpdir(name);
    let listen = dir.join("m.sock");
    let mut dest = common::spawn_dest_at(
        &format!("unix:{}", listen.display()),
        &dir.join("api.sock"),
        args,
    );
    common::wait_for(&listen, Duration::from_secs(10));
    let mut s = common::connect(&listen);
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    feed(&mut s);
    let mut buf = Vec::new();
    let back = match wire::read_message(&mut s, &mut buf) {
        Ok(Message::Error(e)) => Some(e),
        _ => None,
    };
    std::thread::sleep(Duration::from_millis(300));
    let waiting = dest.try_wait().expect("wait").is_none();
    let _ = dest.kill();
    let out = dest.wait_with_output().expect("output");
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        waiting,
        "the destination ended on a connection that is not its source: {err}"
    );
    (back, err)
}

fn ram(s: &mut UnixStream, gpa: u64, data: &[u8]) {
    wire::write_message(s, Kind::Ram, &[&gpa.to_le_bytes(), data]).unwrap();
}

#[test]
fn garbage_is_not_a_migration_stream() {
    require_kvm!();
    let (back, err) = not_the_source("garbage", &[], |s| {
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    });
    assert!(err.contains("not a vmm migration stream"), "{err}");
    assert!(back.is_some_and(|b| b.contains("bad magic")));
}

#[test]
fn a_truncated_stream_is_refused() {
    require_kvm!();
    let (code, err, _) = against("trunc", |s| {
        wire::write_json(s, Kind::Describe, &description(64 << 20, 1)).unwrap();
        ram(s, 0x10000, &[1; 4096]);
        // Half a message: a header promising 4 KiB, then 100 bytes and the end.
        s.write_all(&wire::encode_header(Kind::Ram, 8 + 4096))
            .unwrap();
        s.write_all(&[0; 100]).unwrap();
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("ended in the middle of a message"), "{err}");
}

#[test]
fn ram_outside_guest_memory_is_refused() {
    require_kvm!();
    let (code, err, back) = against("outside", |s| {
        wire::write_json(s, Kind::Describe, &description(64 << 20, 1)).unwrap();
        ram(s, 64 << 20, &[1; 4096]);
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("lies outside this VM's guest memory"), "{err}");
    assert!(back.is_some_and(|b| b.contains("outside")));
}

#[test]
fn oversized_messages_and_impossible_vms_are_refused() {
    require_kvm!();
    let (code, err, _) = against("huge", |s| {
        wire::write_json(s, Kind::Describe, &description(64 << 20, 1)).unwrap();
        s.write_all(&wire::encode_header(Kind::State, u32::MAX as usize))
            .unwrap();
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("exceeds its limit"), "{err}");

    let (code, err, _) = against("bigvm", |s| {
        wire::write_json(s, Kind::Describe, &description(1 << 50, 1)).unwrap();
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("exceeds this host"), "{err}");

    let (code, err, _) = against("vcpus", |s| {
        wire::write_json(s, Kind::Describe, &description(64 << 20, 200)).unwrap();
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--vcpus 200"), "{err}");
}

#[test]
fn a_state_that_does_not_fit_is_refused() {
    require_kvm!();
    let (code, err, _) = against("state", |s| {
        wire::write_json(s, Kind::Describe, &description(64 << 20, 1)).unwrap();
        let snap = VmSnapshot {
            version: SNAPSHOT_VERSION,
            vcpus: vec![Default::default()],
            ..Default::default()
        };
        wire::write_json(s, Kind::State, &snap).unwrap();
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("wrong size"), "{err}");

    let (code, err, _) = against("state2", |s| {
        wire::write_json(s, Kind::Describe, &description(64 << 20, 1)).unwrap();
        let snap = VmSnapshot {
            version: SNAPSHOT_VERSION,
            vcpus: vec![Default::default(), Default::default()],
            ..Default::default()
        };
        wire::write_json(s, Kind::State, &snap).unwrap();
    });
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("2 vCPU states for a VM of 1"), "{err}");
}

#[test]
fn a_destination_with_a_token_refuses_a_source_without_it() {
    require_kvm!();
    let dir = common::tmpdir("token-file");
    let token = dir.join("token");
    std::fs::write(&token, "one-time-secret\n").unwrap();
    let token_arg = token.display().to_string();
    let (back, err) = not_the_source("token", &["--migrate-token-file", &token_arg], |s| {
        let mut d = description(64 << 20, 1);
        d.token = Some("another-secret".into());
        wire::write_json(s, Kind::Describe, &d).unwrap();
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(err.contains("wrong token"), "{err}");
    assert!(back.is_some_and(|b| b.contains("wrong token")));
}
