//! Whole-VM live migration between vmm processes on this machine (needs /dev/kvm): a guest
//! that rewrites memory all along moves back and forth and ends with the checksum of an
//! unmigrated run; a destination that dies mid-way leaves the source running.

mod common;

use std::time::Duration;

use serde_json::json;

const ARG: &str = "churn=32 passes=1200 progress=200";

#[test]
fn migrates_back_and_forth_and_keeps_the_checksum() {
    require_kvm!();
    let want = common::reference(ARG, "128M", 2);
    let dir = common::tmpdir("hops");
    let mut api = dir.join("api0.sock");
    let mut current = common::spawn_source(ARG, "128M", 2, &api);
    common::wait_for(&api, Duration::from_secs(10));
    let mut console = String::new();
    // Four hops: pre-copy, stop-and-copy, pre-copy over TCP, pre-copy.
    for hop in 1..=4 {
        let next_api = dir.join(format!("api{hop}.sock"));
        let (addr, next) = if hop == 3 {
            let port = common::free_port();
            let addr = format!("tcp:127.0.0.1:{port}");
            let next = common::spawn_dest_at(&addr, &next_api, &[]);
            common::wait_tcp_listen(port, Duration::from_secs(10));
            (addr, next)
        } else {
            let listen = dir.join(format!("m{hop}.sock"));
            let next = common::spawn_dest(&listen, &next_api);
            common::wait_for(&listen, Duration::from_secs(10));
            (format!("unix:{}", listen.display()), next)
        };
        let reply = common::api(
            &api,
            json!({"command": "migrate", "destination": addr,
                   "downtime_ms": 200, "max_rounds": 8, "precopy": hop != 2}),
        );
        assert_eq!(reply["ok"], true, "{reply}");
        let status = common::wait_migration(&api, Duration::from_secs(60));
        assert_ne!(
            status["migration"]["phase"], "failed",
            "hop {hop}: {status}"
        );
        let out = common::finish(current, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "hop {hop} source: {stderr}");
        assert!(stderr.contains("the VM moved to"), "hop {hop}: {stderr}");
        console.push_str(&String::from_utf8_lossy(&out.stdout));
        assert!(
            common::checksum(&console).is_none(),
            "the guest finished before hop {hop}; give it more passes"
        );
        current = next;
        api = next_api;
        common::wait_for(&api, Duration::from_secs(10));
    }
    let out = common::finish(current, Duration::from_secs(120));
    console.push_str(&String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "last destination: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        common::checksum(&console).as_deref(),
        Some(want.as_str()),
        "{console}"
    );
    // The console went on where it stopped: every progress line once, in order.
    let passes: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("churn: pass"))
        .collect();
    assert_eq!(passes.len(), 6, "{console}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn destination_killed_mid_migration_leaves_the_source_running() {
    require_kvm!();
    let want = common::reference(ARG, "128M", 1);
    let dir = common::tmpdir("kill");
    let api = dir.join("api.sock");
    let listen = dir.join("m.sock");
    let source = common::spawn_source(ARG, "128M", 1, &api);
    common::wait_for(&api, Duration::from_secs(10));
    let mut dest = common::spawn_dest(&listen, &dir.join("api-dest.sock"));
    common::wait_for(&listen, Duration::from_secs(10));
    // A downtime budget no round meets: pre-copy goes on until the destination dies.
    let reply = common::api(
        &api,
        json!({"command": "migrate", "destination": format!("unix:{}", listen.display()),
               "downtime_ms": 0, "max_rounds": 100000}),
    );
    assert_eq!(reply["ok"], true, "{reply}");
    let t = std::time::Instant::now();
    loop {
        let s = common::api(&api, json!({"command": "status"}));
        if s["migration"]["ram_bytes"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no pre-copy progress: {s}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    dest.kill().expect("kill the destination");
    let _ = dest.wait();
    let status = common::wait_migration(&api, Duration::from_secs(60));
    assert_eq!(status["migration"]["phase"], "failed", "{status}");
    assert_eq!(status["vm"], "running", "{status}");
    let out = common::finish(source, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        common::checksum(&stdout).as_deref(),
        Some(want.as_str()),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_destination_that_refuses_leaves_the_source_running() {
    require_kvm!();
    let dir = common::tmpdir("refuse");
    let api = dir.join("api.sock");
    let listen = dir.join("m.sock");
    let arg = "churn=8 passes=1000";
    let want = common::reference(arg, "64M", 1);
    let source = common::spawn_source(arg, "64M", 1, &api);
    common::wait_for(&api, Duration::from_secs(10));
    // The VM has no vGPU; this destination was given one: it refuses at the description.
    let sock = dir.join("no-worker.sock");
    let spec = format!("socket={}", sock.display());
    let dest = common::spawn_dest_at(
        &format!("unix:{}", listen.display()),
        &dir.join("api-dest.sock"),
        &["--vgpu", &spec],
    );
    common::wait_for(&listen, Duration::from_secs(10));
    let r = common::api(
        &api,
        json!({"command": "migrate", "destination": format!("unix:{}", listen.display())}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let s = common::wait_migration(&api, Duration::from_secs(30));
    assert_eq!(s["migration"]["phase"], "failed", "{s}");
    let why = s["migration"]["error"].as_str().unwrap_or("");
    assert!(why.contains("vGPUs"), "{s}");
    let out = common::finish(dest, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    let out = common::finish(source, Duration::from_secs(120));
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        common::checksum(&stdout).as_deref(),
        Some(want.as_str()),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_migrate_while_one_runs_is_refused_and_bad_requests_get_errors() {
    require_kvm!();
    let dir = common::tmpdir("api");
    let api = dir.join("api.sock");
    let source = common::spawn_source("churn=8 passes=100000", "64M", 1, &api);
    common::wait_for(&api, Duration::from_secs(10));
    for bad in [
        json!({"command": "fly"}),
        json!({"command": "migrate", "destination": "nowhere"}),
    ] {
        let r = common::api(&api, bad.clone());
        assert_eq!(r["ok"], false, "{bad}: {r}");
    }
    // Nothing listens there: the migration fails and the VM keeps running.
    let r = common::api(
        &api,
        json!({"command": "migrate", "destination": format!("unix:{}", dir.join("none.sock").display())}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let s = common::wait_migration(&api, Duration::from_secs(10));
    assert_eq!(s["migration"]["phase"], "failed", "{s}");
    assert!(
        s["migration"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("cannot reach"),
        "{s}"
    );
    // Pause and resume.
    let r = common::api(&api, json!({"command": "pause"}));
    assert_eq!(r["vm"], "paused", "{r}");
    let r = common::api(&api, json!({"command": "resume"}));
    assert_eq!(r["vm"], "running", "{r}");
    let mut source = source;
    let _ = source.kill();
    let _ = source.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
