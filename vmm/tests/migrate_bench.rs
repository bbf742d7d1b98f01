//! Whole-VM migration figures (ignored by default; needs /dev/kvm). For each VM size a
//! guest fills its RAM, then keeps rewriting a 32 MiB working set while the VM migrates,
//! once with pre-copy and once stop-and-copy; the anchor is the plain transfer of the same
//! bytes over the same kind of connection (a unix socket) in this process.
//!
//! `cargo test --release -p vmm --test migrate_bench -- --ignored --nocapture`
//! (`VMM_MIG_BENCH_SIZES=256,1024,2048` picks the sizes in MiB).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

/// The figures the source prints when the VM has moved.
#[derive(Debug, Default)]
struct Moved {
    downtime_ms: f64,
    total_ms: f64,
    bytes: u64,
    stop_ram_bytes: u64,
    rounds: u64,
}

fn parse_moved(stderr: &str) -> Option<Moved> {
    let line = stderr.lines().find(|l| l.contains("the VM moved to"))?;
    let mut m = Moved::default();
    for kv in line.split_whitespace() {
        match kv.split_once('=') {
            Some(("downtime_ms", v)) => m.downtime_ms = v.parse().ok()?,
            Some(("total_ms", v)) => m.total_ms = v.parse().ok()?,
            Some(("bytes", v)) => m.bytes = v.parse().ok()?,
            Some(("stop_ram_bytes", v)) => m.stop_ram_bytes = v.parse().ok()?,
            Some(("rounds", v)) => m.rounds = v.parse().ok()?,
            _ => {}
        }
    }
    Some(m)
}

/// Waits for the guest's `churn: filled`, echoing nothing.
fn wait_filled(child: &mut Child) {
    let out = child.stdout.take().expect("stdout");
    let filled = Arc::new(AtomicBool::new(false));
    let f = filled.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line == "churn: filled" {
                f.store(true, Ordering::SeqCst);
            }
        }
    });
    let t = Instant::now();
    while !filled.load(Ordering::SeqCst) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the guest never filled its RAM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn one(mib: u64, precopy: bool) -> Moved {
    let dir = common::tmpdir(&format!("bench{mib}{precopy}"));
    let api = dir.join("api.sock");
    let listen = dir.join("m.sock");
    let arg = format!("churn={} hot=32 passes=1000000000", mib - 64);
    let mut src = common::spawn_source(&arg, &format!("{mib}M"), 1, &api);
    wait_filled(&mut src);
    let mut dest = common::spawn_dest(&listen, &dir.join("api-dest.sock"));
    common::wait_for(&listen, Duration::from_secs(10));
    let r = common::api(
        &api,
        json!({"command": "migrate", "destination": format!("unix:{}", listen.display()),
               "downtime_ms": 300, "max_rounds": 30, "precopy": precopy}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let out = common::finish(src, Duration::from_secs(300));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let moved = parse_moved(&stderr).unwrap_or_else(|| panic!("no handover: {stderr}"));
    let _ = dest.kill();
    let _ = dest.wait();
    let _ = std::fs::remove_dir_all(&dir);
    moved
}

/// Milliseconds to move `bytes` through a unix socket between two threads, 4 MiB writes.
fn plain_transfer_ms(bytes: u64) -> f64 {
    let (mut a, mut b) = UnixStream::pair().expect("socketpair");
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4 << 20];
        let mut got = 0u64;
        while got < bytes {
            match b.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
        got
    });
    let buf = vec![0x5au8; 4 << 20];
    let t = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        let n = (bytes - sent).min(buf.len() as u64) as usize;
        a.write_all(&buf[..n]).expect("write");
        sent += n as u64;
    }
    let got = reader.join().expect("reader");
    assert_eq!(got, bytes);
    t.elapsed().as_secs_f64() * 1e3
}

fn line(name: &str, v: f64, unit: &str, anchor: f64, aunit: &str) {
    let ratio = if anchor > 0.0 { v / anchor } else { 0.0 };
    println!("{name}: {v:.1} {unit} | anchor: {anchor:.1} {aunit} | ratio: {ratio:.2}");
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn migration_figures() {
    require_kvm!();
    let sizes = std::env::var("VMM_MIG_BENCH_SIZES").unwrap_or_else(|_| "256,1024,2048".into());
    for mib in sizes
        .split(',')
        .filter_map(|s| s.trim().parse::<u64>().ok())
    {
        let pre = one(mib, true);
        let stop = one(mib, false);
        let pre_anchor = plain_transfer_ms(pre.bytes);
        let stop_anchor = plain_transfer_ms(stop.bytes);
        line(
            &format!("vm_migration_{mib}M_precopy_downtime"),
            pre.downtime_ms,
            "ms",
            stop.downtime_ms,
            "ms (stop-and-copy downtime)",
        );
        line(
            &format!("vm_migration_{mib}M_precopy_total"),
            pre.total_ms,
            "ms",
            pre_anchor,
            "ms (plain transfer of the same bytes)",
        );
        line(
            &format!("vm_migration_{mib}M_stop_copy_total"),
            stop.total_ms,
            "ms",
            stop_anchor,
            "ms (plain transfer of the same bytes)",
        );
        line(
            &format!("vm_migration_{mib}M_precopy_sent"),
            pre.bytes as f64 / 1048576.0,
            "MiB",
            stop.bytes as f64 / 1048576.0,
            "MiB (stop-and-copy)",
        );
        println!(
            "vm_migration_{mib}M_precopy_detail: rounds {} stop_ram {:.1} MiB",
            pre.rounds,
            pre.stop_ram_bytes as f64 / 1048576.0
        );
    }
}
