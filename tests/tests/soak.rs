//! A bounded soak (docs/hostile.md): 8 VMs with mixed workloads on 2 sim GPUs
//! (4 gpu-load, 2 memcheck, a shm-pipe producer/consumer pair), a migration every few
//! seconds, every finished job's checksums verified and the job started again, vgpud's and
//! its children's RSS and open fds sampled each second.
//!
//! CI runs the short version (`VGPU_SOAK_SECS`, default 20, a migration every 5 s). The
//! full soak is its own command: `ci/soak.sh` (10 minutes, a migration every 3 s;
//! `VGPU_SOAK_OUT=<file>` writes the figures as JSON, `VGPU_SOAK_KEEP=<dir>` keeps the
//! logs and consoles of a failed run, `VGPU_SOAK_MIGRATE_MS` sets the migration interval).

use std::time::{Duration, Instant};

use vgpu_api::api::{MigrateRequest, VmCreate, VmState};
use vgpu_tests::daemon::{children, gpu_load, TestDaemon};
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    GpuLoad,
    Memcheck,
    Producer,
    Consumer,
}

struct Slot {
    kind: Kind,
    gpu: u32,
    vm: Option<u32>,
    generation: u32,
}

fn spec(kind: Kind, gpu: u32, generation: u32, index: usize) -> VmCreate {
    let key = format!("key={:#x}", 0x50a0_0000u32 + generation);
    let (payload, arg, compute, memory, group) = match kind {
        Kind::GpuLoad => (
            "gpu-load",
            format!(
                "rounds={} n=65536 spin_us=500 check=5",
                40 + 20 * (index % 3)
            ),
            0.15,
            64 * MIB,
            None,
        ),
        Kind::Memcheck => (
            "memcheck",
            format!("buffers=4 size_mib=4 rounds=4 seed={}", generation + 1),
            0.1,
            32 * MIB,
            None,
        ),
        Kind::Producer => (
            "shm-pipe",
            format!("role=producer {key} size_mib=2 items=20"),
            0.05,
            32 * MIB,
            Some("soak".to_string()),
        ),
        Kind::Consumer => (
            "shm-pipe",
            format!("role=consumer {key} size_mib=2 items=20"),
            0.05,
            32 * MIB,
            Some("soak".to_string()),
        ),
    };
    let mut vm = gpu_load(&arg, gpu, compute, memory);
    vm.payload = Some(vgpu_tests::bins::payload(payload).display().to_string());
    if let Some(v) = vm.vgpu.as_mut() {
        v.share_group = group;
    }
    vm
}

fn ok_marker(kind: Kind) -> &'static str {
    match kind {
        Kind::GpuLoad => "GPU-LOAD OK",
        Kind::Memcheck => "MEMCHECK OK",
        Kind::Producer => "SHM-PIPE OK role=producer",
        Kind::Consumer => "SHM-PIPE OK role=consumer",
    }
}

/// (RSS bytes, open fds) of `pid`.
fn sample(pid: u32) -> (u64, u64) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    (rss, fds)
}

/// Creates a VM. A 500 "cannot schedule" was a known issue (docs/hostile.md, "Issues the
/// soak found", item 1: a migrated vGPU kept its shares on its old GPU for a 2 s grace);
/// fixed since, it is still counted (`create_refused_during_grace`, expected 0) and
/// retried, so a regression shows in the figures.
fn create(c: &vgpu_api::client::Client, vm: &VmCreate, grace_500s: &mut u64) -> u32 {
    for _ in 0..3 {
        match c.create_vm(vm) {
            Ok(v) => return v.id,
            Err(e) if e.to_string().contains("cannot schedule") => {
                *grace_500s += 1;
                std::thread::sleep(Duration::from_millis(2500));
            }
            Err(e) => panic!("create VM: {e}"),
        }
    }
    panic!("create VM: refused three times")
}

/// Whether VM `id` is still live a moment after its migration failed or was refused. The
/// guest may just have finished: its worker exits when the vmm disconnects, and vgpud may
/// reap it (vGPU released, migration refused) a moment before the vmm (VM exited).
fn still_live(c: &vgpu_api::client::Client, id: u32) -> bool {
    c.wait_vm(id, Duration::from_secs(5))
        .map(|v| v.state.is_live())
        .unwrap_or(false)
}

/// Copies vgpud's state directory (its log, the workers' logs, the consoles) to `to`.
fn keep_logs(d: &TestDaemon, to: &std::path::Path) {
    let _ = std::fs::create_dir_all(to);
    for e in std::fs::read_dir(&d.dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::copy(e.path(), to.join(e.file_name()));
        }
    }
    eprintln!("soak: logs kept in {}", to.display());
}

fn avg(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
}

/// CI's short version: 8 VMs, mixed workloads, a migration every 5 s, so `cargo test`
/// covers migration under load (the full soak below runs longer and migrates more often).
#[test]
fn soak_short_eight_vms_mixed_workloads() {
    require_kvm!();
    soak(
        env_or("VGPU_SOAK_SECS", 20),
        Some(Duration::from_millis(env_or("VGPU_SOAK_MIGRATE_MS", 5000))),
    );
}

/// The full soak with a migration every 3 s (`ci/soak.sh`, 10 minutes). Ignored in
/// `cargo test` only because it is long.
#[test]
#[ignore = "long (10 minutes in ci/soak.sh); CI runs soak_short_eight_vms_mixed_workloads"]
fn soak_eight_vms_mixed_workloads_and_migrations() {
    require_kvm!();
    soak(
        env_or("VGPU_SOAK_SECS", 30),
        Some(Duration::from_millis(env_or("VGPU_SOAK_MIGRATE_MS", 3000))),
    );
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn soak(secs: u64, migrate_every: Option<Duration>) {
    let d = TestDaemon::start("soak", &["--sim-gpus", "2", "--sim-memory", "2G"]);
    let c = &d.client;
    let daemon_pid = d.pid();
    let kinds = [
        Kind::GpuLoad,
        Kind::GpuLoad,
        Kind::GpuLoad,
        Kind::GpuLoad,
        Kind::Memcheck,
        Kind::Memcheck,
        Kind::Producer,
        Kind::Consumer,
    ];
    let mut slots: Vec<Slot> = kinds
        .iter()
        .enumerate()
        .map(|(i, &kind)| Slot {
            kind,
            // The shm pair shares GPU 0 (shared objects live on one GPU).
            gpu: if matches!(kind, Kind::Producer | Kind::Consumer) {
                0
            } else {
                (i % 2) as u32
            },
            vm: None,
            generation: 0,
        })
        .collect();
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let (mut jobs_ok, mut jobs_failed, mut failures) = (0u64, 0u64, Vec::<String>::new());
    let (mut mig_ok, mut mig_failed, mut mig_tried) = (0u64, 0u64, 0u64);
    let mut next_migration = start + migrate_every.unwrap_or(Duration::from_secs(secs + 1));
    let mut next_sample = start;
    let mut mig_cursor = 0usize;
    let mut grace_500s = 0u64;
    let (mut d_rss, mut d_fds, mut k_rss, mut k_fds, mut k_n) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    loop {
        let now = Instant::now();
        let running = now < end;
        // Finished jobs: verify, then start the next generation.
        let mut pair_done = 0;
        for (i, s) in slots.iter_mut().enumerate() {
            if let Some(id) = s.vm {
                let vm = c.vm(id).expect("vm");
                if vm.state.is_live() {
                    continue;
                }
                let out =
                    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned();
                if vm.state == (VmState::Exited { code: 0 }) && out.contains(ok_marker(s.kind)) {
                    jobs_ok += 1;
                    // As an operator would: a finished VM's records go, so what vgpud
                    // keeps per VM does not read as a leak in the RSS drift. A failed
                    // one stays, with its logs, for VGPU_SOAK_KEEP.
                    if let Err(e) = c.delete_vm(id) {
                        panic!("delete finished VM {id}: {e}");
                    }
                } else {
                    jobs_failed += 1;
                    failures.push(format!(
                        "slot {i} VM {id}: {:?}\n{}",
                        vm.state,
                        out.lines().rev().take(5).collect::<Vec<_>>().join("\n")
                    ));
                }
                s.vm = None;
            }
            if matches!(s.kind, Kind::Producer | Kind::Consumer) {
                if s.vm.is_none() {
                    pair_done += 1;
                }
                continue;
            }
            if running {
                s.generation += 1;
                s.vm = Some(create(
                    c,
                    &spec(s.kind, s.gpu, s.generation, i),
                    &mut grace_500s,
                ));
            }
        }
        // The shm pair restarts together, with a fresh key.
        if running && pair_done == 2 {
            for (i, s) in slots.iter_mut().enumerate() {
                if matches!(s.kind, Kind::Producer | Kind::Consumer) {
                    s.generation = s.generation.max(1) + 1;
                    let g = s.generation;
                    s.vm = Some(create(c, &spec(s.kind, 0, g, i), &mut grace_500s));
                }
            }
        }
        if !running && slots.iter().all(|s| s.vm.is_none()) {
            break;
        }
        assert!(
            now < end + Duration::from_secs(240),
            "jobs still running 4 minutes after the end"
        );
        // A migration every few seconds: the next running gpu-load or memcheck VM moves to
        // the other GPU.
        if let (true, Some(every)) = (running && now >= next_migration, migrate_every) {
            next_migration = now + every;
            for _ in 0..slots.len() {
                mig_cursor = (mig_cursor + 1) % slots.len();
                let s = &slots[mig_cursor];
                if matches!(s.kind, Kind::Producer | Kind::Consumer) {
                    continue;
                }
                let Some(id) = s.vm else { continue };
                let Ok(vm) = c.vm(id) else { continue };
                if vm.state != VmState::Running {
                    continue;
                }
                let Some(vg) = vm.vgpu else { continue };
                let Ok(v) = c.vgpu(vg) else { continue };
                mig_tried += 1;
                let req = MigrateRequest {
                    target_gpu: Some(v.gpu ^ 1),
                    mode: Some(
                        if mig_tried % 3 == 0 {
                            "stop_copy"
                        } else {
                            "precopy"
                        }
                        .into(),
                    ),
                    max_downtime_ms: Some(20),
                };
                match c.migrate_vgpu(vg, &req) {
                    Ok(m) => {
                        let m = c
                            .wait_migration(m.id, Duration::from_secs(60), |_| {})
                            .expect("migration");
                        if m.state == "completed" {
                            mig_ok += 1;
                        } else {
                            // Only acceptable when the guest finished meanwhile.
                            mig_failed += 1;
                            assert!(!still_live(c, id), "migration of a live vGPU failed: {m:?}");
                        }
                    }
                    Err(e) => {
                        assert!(!still_live(c, id), "migration refused for a live vGPU: {e}");
                    }
                }
                break;
            }
        }
        if now >= next_sample {
            next_sample = now + Duration::from_secs(1);
            let (r, f) = sample(daemon_pid);
            d_rss.push(r);
            d_fds.push(f);
            let kids = children(daemon_pid);
            let (mut rr, mut ff) = (0, 0);
            for k in &kids {
                let (r, f) = sample(*k);
                rr += r;
                ff += f;
            }
            k_rss.push(rr);
            k_fds.push(ff);
            k_n.push(kids.len() as u64);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Drift: the last quarter of the samples against the second quarter (after warm-up).
    let q = d_rss.len() / 4;
    let early = |v: &Vec<u64>| avg(&v[q..2 * q.max(1)]);
    let late = |v: &Vec<u64>| avg(&v[v.len() - q.max(1)..]);
    let rss_drift = late(&d_rss) - early(&d_rss);
    let fd_drift = late(&d_fds) - early(&d_fds);
    let per_child = |v: &Vec<u64>| {
        v.iter()
            .zip(&k_n)
            .filter(|(_, n)| **n > 0)
            .map(|(x, n)| *x as f64 / *n as f64)
            .collect::<Vec<_>>()
    };
    let kr = per_child(&k_rss);
    let kf = per_child(&k_fds);
    let favg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let summary = serde_json::json!({
        "seconds": elapsed,
        "vms": slots.len(),
        "jobs_ok": jobs_ok,
        "jobs_failed": jobs_failed,
        "bytes_lost": if jobs_failed == 0 { 0 } else { -1 },
        "migrations_completed": mig_ok,
        "migrations_failed_guest_gone": mig_failed,
        "vgpud_rss_mib": { "start": early(&d_rss) / MIB as f64, "end": late(&d_rss) / MIB as f64, "drift": rss_drift / MIB as f64, "max": d_rss.iter().max().copied().unwrap_or(0) as f64 / MIB as f64 },
        "vgpud_fds": { "start": early(&d_fds), "end": late(&d_fds), "drift": fd_drift, "max": d_fds.iter().max().copied().unwrap_or(0) },
        "children_per_process": { "rss_mib_first_half": favg(&kr[..kr.len() / 2]) / MIB as f64, "rss_mib_second_half": favg(&kr[kr.len() / 2..]) / MIB as f64, "fds_first_half": favg(&kf[..kf.len() / 2]), "fds_second_half": favg(&kf[kf.len() / 2..]) },
        "samples": d_rss.len(),
        "create_refused_during_grace": grace_500s,
    });
    eprintln!("soak: {summary}");
    if let (false, Ok(keep)) = (failures.is_empty(), std::env::var("VGPU_SOAK_KEEP")) {
        // vgpud removes its workers' logs and the consoles when it stops: copy them first.
        keep_logs(&d, std::path::Path::new(&keep));
    }
    if let Ok(path) = std::env::var("VGPU_SOAK_OUT") {
        std::fs::write(&path, format!("{summary:#}\n")).expect("soak output");
    }
    assert!(failures.is_empty(), "failed jobs:\n{}", failures.join("\n"));
    assert!(jobs_ok >= 8, "too few jobs finished: {jobs_ok}");
    assert!(
        migrate_every.is_none() || mig_ok >= 1,
        "no migration completed"
    );
    // Every job ended: nothing may stay committed.
    for g in c.gpus().expect("gpus") {
        assert!(
            g.compute_committed.abs() < 1e-9 && g.memory_committed_bytes == 0,
            "{g:?}"
        );
    }
    assert!(fd_drift <= 8.0, "vgpud leaks descriptors: {summary}");
    assert!(
        rss_drift <= 64.0 * MIB as f64,
        "vgpud's RSS grows: {summary}"
    );
}
