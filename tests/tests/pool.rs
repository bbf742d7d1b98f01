//! The worker pool (`vgpud --worker-pool N`, docs/api.md): a new vGPU takes a worker
//! started before it was asked for, the pool refills, an idle pool worker that dies is
//! replaced, concurrent VM launches all compute right, pool workers have their own uid
//! and private directory, a vgpud restart adopts VM workers and replaces pool workers,
//! and a pool worker that never answers its assignment costs the vGPU only a fallback to
//! a fresh worker.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use vgpu_api::api::{VgpuCreate, VgpuState, VmState};
use vgpu_tests::daemon::{alive, gpu_load, wait_running, TestDaemon};

const MIB: u64 = 1 << 20;
/// vgpud's default `--worker-uid-base`: vGPU N's worker runs as BASE + N, pool slot S as
/// BASE - 1 - S.
const UID_BASE: u32 = 2_000_000_000;

fn spec(memory: u64, compute: f64) -> VgpuCreate {
    VgpuCreate {
        gpu: Some(0),
        ..VgpuCreate::new(memory, compute)
    }
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The idle pool workers of the vgpud in `dir`: processes working in
/// `dir/workers/pool-N/`.
fn pool_workers(dir: &Path) -> BTreeSet<u32> {
    let pools = dir.join("workers");
    std::fs::read_dir("/proc")
        .map(|procs| {
            procs
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| {
                        cwd.parent() == Some(pools.as_path())
                            && cwd
                                .file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with("pool-"))
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until GPU 0's pool holds `n` idle workers (reported and running); returns them.
fn full_pool(d: &TestDaemon, n: usize) -> BTreeSet<u32> {
    let mut seen = BTreeSet::new();
    wait_until(
        &format!("{n} idle pool workers"),
        Duration::from_secs(60),
        || {
            seen = pool_workers(&d.dir);
            seen.len() == n && vgpu_tests::daemon::pool_idle(&d.client, Some(0)) == Some(n as u64)
        },
    );
    seen
}

fn uid_of(pid: u32) -> u32 {
    std::fs::metadata(format!("/proc/{pid}"))
        .expect("the worker runs")
        .uid()
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_vgpu_takes_a_pool_worker_and_the_pool_refills_with_its_own_identities() {
    let d = TestDaemon::start(
        "pool-take",
        &[
            "--sim-gpus",
            "1",
            "--sim-memory",
            "1G",
            "--worker-pool",
            "2",
        ],
    );
    let c = &d.client;
    let before = full_pool(&d, 2);
    // Pool workers' identity and directory are fixed when they start.
    use std::os::unix::fs::PermissionsExt;
    for pid in &before {
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd");
        let meta = std::fs::metadata(&cwd).expect("pool dir");
        assert_eq!(
            meta.permissions().mode() & 0o777,
            0o700,
            "{}",
            cwd.display()
        );
        if root() {
            let slot: u32 = cwd
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("pool-"))
                .and_then(|n| n.parse().ok())
                .expect("pool-N");
            assert_eq!(uid_of(*pid), UID_BASE - 1 - slot);
            assert_eq!(meta.uid(), uid_of(*pid), "its directory is its own");
        }
    }
    let v = c.create_vgpu(&spec(64 * MIB, 0.3)).expect("vGPU");
    assert_eq!(v.state, VgpuState::Ready);
    let pid = v.worker_pid.expect("worker");
    assert!(
        before.contains(&pid),
        "the vGPU's worker {pid} is not one of the pool's {before:?}"
    );
    // Its directory is the vGPU's now, still its own and private.
    let dir = d.dir.join("workers").join(v.id.to_string());
    let meta = std::fs::metadata(&dir).expect("vGPU dir");
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert!(dir.join("vgpu.sock").exists(), "{}", dir.display());
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd"),
        dir
    );
    if root() {
        assert_eq!(meta.uid(), uid_of(pid));
        assert!(uid_of(pid) < UID_BASE, "a pool slot's uid");
    }
    assert!(d.dir.join(format!("vgpu-{}.log", v.id)).exists());
    // The pool refills: two idle workers again, one of them new, no uid shared.
    let after = full_pool(&d, 2);
    assert!(!after.contains(&pid));
    assert_eq!(
        after.intersection(&before).count(),
        1,
        "{before:?} {after:?}"
    );
    if root() {
        let mut uids: BTreeSet<u32> = after.iter().map(|p| uid_of(*p)).collect();
        uids.insert(uid_of(pid));
        assert_eq!(uids.len(), 3, "a uid is shared: {uids:?}");
    }
    // The vGPU works like any other: a VM runs on it.
    if vgpu_tests::bins::have_kvm() {
        let vm = c
            .create_vm(&vgpu_tests::daemon::gpu_load(
                "rounds=5 spin_us=200 check=5",
                0,
                0.1,
                32 * MIB,
            ))
            .expect("vm");
        let done = c.wait_vm(vm.id, Duration::from_secs(120)).expect("wait");
        let out = String::from_utf8_lossy(&c.console(vm.id, 0).unwrap_or_default()).into_owned();
        assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
        assert!(out.contains("GPU-LOAD OK rounds=5"), "{out}");
    }
    c.delete_vgpu(v.id).expect("delete");
    wait_until("the worker exits", Duration::from_secs(10), || !alive(pid));
}

#[test]
fn a_killed_pool_worker_is_replaced() {
    let d = TestDaemon::start(
        "pool-kill",
        &[
            "--sim-gpus",
            "1",
            "--sim-memory",
            "1G",
            "--worker-pool",
            "2",
        ],
    );
    let before = full_pool(&d, 2);
    let victim = *before.iter().next().expect("one");
    let p = libc::pid_t::try_from(victim).expect("pid");
    // SAFETY: kill(2) on a pool worker this test's vgpud started.
    unsafe { libc::kill(p, libc::SIGKILL) };
    wait_until("the pool worker is gone", Duration::from_secs(10), || {
        !alive(victim)
    });
    let after = full_pool(&d, 2);
    assert!(!after.contains(&victim), "{after:?}");
    assert!(
        d.log_text()
            .contains("an idle pool worker exited; replacing it"),
        "{}",
        d.log_text()
    );
    // The pool still serves.
    let v = d.client.create_vgpu(&spec(64 * MIB, 0.2)).expect("vGPU");
    assert!(after.contains(&v.worker_pid.expect("worker")));
}

#[test]
fn sixteen_concurrent_vm_launches_with_the_pool_all_compute_right() {
    vgpu_tests::require_kvm!();
    let d = TestDaemon::start(
        "pool-burst",
        &[
            "--sim-gpus",
            "1",
            "--sim-memory",
            "2G",
            "--worker-pool",
            "4",
        ],
    );
    full_pool(&d, 4);
    let c = &d.client;
    let launches: Vec<_> = (0..16)
        .map(|_| {
            let c = c.clone();
            std::thread::spawn(move || {
                let vm = c
                    .create_vm(&gpu_load("rounds=5 spin_us=200 check=5", 0, 0.05, 32 * MIB))
                    .expect("launch");
                let done = c.wait_vm(vm.id, Duration::from_secs(240)).expect("wait");
                let out =
                    String::from_utf8_lossy(&c.console(vm.id, 0).unwrap_or_default()).into_owned();
                (done.state, out)
            })
        })
        .collect();
    for l in launches {
        let (state, out) = l.join().expect("launch thread");
        assert_eq!(state, VmState::Exited { code: 0 }, "{out}");
        assert!(out.contains("GPU-LOAD OK rounds=5"), "{out}");
        assert!(!out.contains("FAIL"), "{out}");
    }
    let log = d.log_text();
    assert!(log.contains("worker ready (from the pool)"), "{log}");
    // Everything released: the GPU is free again and the pool full.
    wait_until("GPU 0 is free", Duration::from_secs(20), || {
        c.gpus().is_ok_and(|g| g[0].compute_committed == 0.0)
    });
    full_pool(&d, 4);
}

#[test]
fn a_restart_adopts_vm_workers_and_replaces_pool_workers() {
    vgpu_tests::require_kvm!();
    let mut d = TestDaemon::start(
        "pool-restart",
        &[
            "--sim-gpus",
            "1",
            "--sim-memory",
            "1G",
            "--worker-pool",
            "2",
        ],
    );
    let pool = full_pool(&d, 2);
    let vm = d
        .client
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=2000 check=20",
            0,
            0.5,
            64 * MIB,
        ))
        .expect("vm");
    wait_running(&d.client, vm.id);
    let g = vm.vgpu.expect("inline vGPU");
    let worker = d.client.vgpu(g).expect("vgpu").worker_pid.expect("worker");
    assert!(pool.contains(&worker), "{worker} not from {pool:?}");
    let pool = full_pool(&d, 2);
    d.kill9();
    // Idle pool workers hold no tenant: they go with vgpud; the VM's worker stays.
    wait_until("the pool workers exit", Duration::from_secs(10), || {
        pool.iter().all(|p| !alive(*p))
    });
    assert!(alive(worker), "kill -9 of vgpud took the VM's worker down");
    d.restart(None);
    let c = &d.client;
    let v = c.vgpu(g).expect("vgpu");
    assert_eq!(
        (v.state.clone(), v.worker_pid),
        (VgpuState::Attached, Some(worker))
    );
    let fresh = full_pool(&d, 2);
    assert!(fresh.is_disjoint(&pool), "{fresh:?} {pool:?}");
    assert!(!fresh.contains(&worker));
    if root() {
        // The adopted worker keeps its uid; no new pool worker shares it.
        assert!(fresh.iter().all(|p| uid_of(*p) != uid_of(worker)));
    }
    wait_until("live stats", Duration::from_secs(20), || {
        c.vgpu_stats(g).is_ok_and(|s| s.live && s.requests > 0)
    });
    c.delete_vm(vm.id).expect("stop the adopted VM");
    assert!(!alive(worker));
    // A graceful stop kills the pool workers too.
    let fresh = full_pool(&d, 2);
    assert!(d.stop(), "vgpud did not stop");
    wait_until("the pool workers exit", Duration::from_secs(10), || {
        fresh.iter().all(|p| !alive(*p))
    });
}

#[test]
fn a_pool_worker_that_never_answers_its_assignment_gives_way_to_a_fresh_worker() {
    let d = TestDaemon::start_with_env(
        "pool-stall",
        &[
            "--sim-gpus",
            "1",
            "--sim-memory",
            "1G",
            "--worker-pool",
            "1",
        ],
        &[("VGPU_WORKER_POOL_STALL", "1")],
    );
    let pool = full_pool(&d, 1);
    let t = Instant::now();
    let v = d.client.create_vgpu(&spec(64 * MIB, 0.3)).expect("vGPU");
    let took = t.elapsed();
    assert_eq!(v.state, VgpuState::Ready);
    let pid = v.worker_pid.expect("worker");
    assert!(
        !pool.contains(&pid),
        "the stalled pool worker kept the vGPU"
    );
    assert!(took < Duration::from_secs(20), "the fallback took {took:?}");
    let log = d.log_text();
    assert!(
        log.contains("the pool worker did not take the vGPU; starting a fresh worker"),
        "{log}"
    );
    wait_until(
        "the stalled pool worker is killed",
        Duration::from_secs(10),
        || pool.iter().all(|p| !alive(*p)),
    );
    // The fresh worker is the vGPU's own: its usual directory, socket and identity.
    let dir = d.dir.join("workers").join(v.id.to_string());
    assert!(dir.join("vgpu.sock").exists());
    if root() {
        assert_eq!(uid_of(pid), UID_BASE + v.id);
    }
    assert!(alive(pid));
}
