//! Hostile guests and injected faults (docs/hostile.md), each beside a neighbour
//! VM that checks its own results all along (gpu-load: checksums every few rounds):
//!
//! - the hostile payload attacks invariants 1-3 through vgpud while a neighbour computes;
//! - the sim backend injects device errors, out-of-memory and a slow device on demand
//!   (`VGPU_FAULTS_DIR`): the guest sees the statuses, the neighbour sees nothing;
//! - `kill -9` of a worker mid-copy, of a vmm and of a worker mid-migration;
//! - a migration target that fails: the vGPU stays where it was, no byte lost;
//! - a guest running the longest kernels it may: the neighbour's requests still come back
//!   within the kernel deadline plus a period.

use std::path::Path;
use std::time::{Duration, Instant};

use vgpu_api::api::{MigrateRequest, VgpuCreate, VmState};
use vgpu_api::client::Client;
use vgpu_tests::daemon::{alive, gpu_load, vm_on, wait_running, TestDaemon};
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

fn vgpu_spec(gpu: u32, compute: f64, memory: u64, queues: u16) -> VgpuCreate {
    VgpuCreate {
        gpu: Some(gpu),
        queues,
        ..VgpuCreate::new(memory, compute)
    }
}

fn set_faults(dir: &Path, vgpu: u32, spec: &str) {
    std::fs::write(dir.join(format!("vgpu-{vgpu}")), spec).expect("fault file");
    // The worker re-reads the file every 20 ms.
    std::thread::sleep(Duration::from_millis(80));
}

/// The neighbour finished its run with every checksum right and no error.
fn neighbour_ok(c: &Client, id: u32, rounds: u32) {
    let done = c.wait_vm(id, Duration::from_secs(240)).expect("wait");
    let out = console(c, id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(
        out.contains(&format!("GPU-LOAD OK rounds={rounds}")),
        "{out}"
    );
    let stats = c
        .vgpu_stats(done.vgpu.expect("vgpu"))
        .expect("neighbour stats");
    assert_eq!(stats.errors, 0, "the neighbour saw errors: {stats:?}");
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    t0.elapsed()
}

/// Committed compute and memory of GPU `g`.
fn committed(c: &Client, g: usize) -> (f64, u64) {
    let gpus = c.gpus().expect("gpus");
    (gpus[g].compute_committed, gpus[g].memory_committed_bytes)
}

fn kill9(pid: u32) {
    let pid = libc::pid_t::try_from(pid).expect("pid");
    // SAFETY: kill(2) with a pid the daemon reported for a process it started.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill -9 {pid}");
}

#[test]
fn a_hostile_guest_beside_a_neighbour_that_checks_its_data() {
    require_kvm!();
    let d = TestDaemon::start(
        "hostile-neighbour",
        &["--sim-gpus", "1", "--sim-memory", "1G"],
    );
    let c = &d.client;
    let neighbour = c
        .create_vm(&gpu_load(
            "rounds=600 spin_us=2000 check=5",
            0,
            0.4,
            64 * MIB,
        ))
        .expect("neighbour");
    wait_running(c, neighbour.id);
    // Three hostile guests in a row, each on a fresh vGPU of the same GPU.
    let mut errors = 0;
    for _ in 0..3 {
        let v = c
            .create_vgpu(&vgpu_spec(0, 0.3, 64 * MIB, 2))
            .expect("vgpu");
        let h = c.create_vm(&vm_on("hostile", "", v.id)).expect("hostile");
        let done = c.wait_vm(h.id, Duration::from_secs(120)).expect("wait");
        let out = console(c, h.id);
        assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
        assert!(out.contains("HOSTILE OK"), "{out}");
        errors += out.lines().filter(|l| l.starts_with("hostile: ")).count();
        // The neighbour runs on, or has finished its rounds cleanly (checked below).
        let state = c.vm(neighbour.id).expect("vm").state;
        assert!(
            matches!(state, VmState::Running | VmState::Exited { code: 0 }),
            "the neighbour must run on or have finished cleanly: {state:?}"
        );
    }
    eprintln!("hostile: {errors} attack lines answered; the neighbour kept verifying");
    neighbour_ok(c, neighbour.id, 600);
    let log = d.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

/// A guest that runs the longest `spin` it may ask for (10 s), three in a row, beside a
/// neighbour whose every request must come back within the kernel deadline (2 s) plus one
/// period plus slack, with its checksums right all along.
#[test]
fn a_kernel_past_its_deadline_does_not_hold_up_the_neighbour() {
    require_kvm!();
    let d = TestDaemon::start("deadline", &["--sim-gpus", "1", "--sim-memory", "1G"]);
    let c = &d.client;
    // The longest spin vgpu-proto allows (`builtin::MAX_SPIN_US`).
    let hog = c
        .create_vm(&gpu_load(
            "rounds=3 spin_us=10000000 check=1",
            0,
            0.5,
            64 * MIB,
        ))
        .expect("hog");
    wait_running(c, hog.id);
    let neighbour = c
        .create_vm(&gpu_load(
            "rounds=1000000 spin_us=1000 check=20 max_latency_ms=3000",
            0,
            0.5,
            64 * MIB,
        ))
        .expect("neighbour");
    wait_running(c, neighbour.id);
    let done = c.wait_vm(hog.id, Duration::from_secs(120)).expect("wait");
    let out = console(c, hog.id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(out.contains("GPU-LOAD OK rounds=3"), "{out}");
    let n = c.vm(neighbour.id).expect("vm");
    let nout = console(c, neighbour.id);
    assert_eq!(
        n.state,
        VmState::Running,
        "the neighbour must still run: {nout}"
    );
    assert!(!nout.contains("FAIL"), "{nout}");
    let worst = nout
        .lines()
        .filter_map(|l| l.strip_prefix("gpu-load: worst request so far "))
        .next_back()
        .unwrap_or_else(|| panic!("the neighbour measured nothing: {nout}"));
    let rounds = nout.lines().filter(|l| l.contains(" ok checksum=")).count() * 20;
    eprintln!(
        "deadline: neighbour ran {rounds} rounds beside three 10 s kernels; worst request {worst}"
    );
    assert!(rounds >= 200, "the neighbour hardly ran: {nout}");
    let stats = c
        .vgpu_stats(n.vgpu.expect("vgpu"))
        .expect("neighbour stats");
    assert_eq!(stats.errors, 0, "the neighbour saw errors: {stats:?}");
    c.delete_vm(neighbour.id).expect("delete");
    let log = d.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn injected_device_errors_oom_and_slowness_reach_only_their_guest() {
    require_kvm!();
    let faults = vgpu_tests::daemon::temp_dir("faults");
    let fdir = faults.display().to_string();
    let d = TestDaemon::start_with_env(
        "faults",
        &["--sim-gpus", "1", "--sim-memory", "1G"],
        &[("VGPU_FAULTS_DIR", fdir.as_str())],
    );
    let c = &d.client;
    let neighbour = c
        .create_vm(&gpu_load(
            "rounds=400 spin_us=1000 check=5",
            0,
            0.3,
            64 * MIB,
        ))
        .expect("neighbour");
    // The victim retries requests that fail with DEVICE_ERROR / OUT_OF_MEMORY: an injected
    // fault fails a request before it does anything, so its checksums must still match.
    let v = c
        .create_vgpu(&vgpu_spec(0, 0.3, 64 * MIB, 1))
        .expect("vgpu");
    set_faults(&faults, v.id, "error=4");
    let victim = c
        .create_vm(&vm_on(
            "gpu-load",
            "rounds=300 spin_us=1000 check=3 retry=100000",
            v.id,
        ))
        .expect("victim");
    wait_running(c, neighbour.id);
    wait_running(c, victim.id);
    std::thread::sleep(Duration::from_millis(700));
    set_faults(&faults, v.id, "slow=10 error=7");
    std::thread::sleep(Duration::from_millis(700));
    set_faults(&faults, v.id, "error=2 oom");
    std::thread::sleep(Duration::from_millis(500));
    set_faults(&faults, v.id, "none");
    let done = c
        .wait_vm(victim.id, Duration::from_secs(240))
        .expect("wait");
    let out = console(c, victim.id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(out.contains("GPU-LOAD OK rounds=300"), "{out}");
    let retried: u64 = out
        .lines()
        .find(|l| l.contains("requests retried"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let errs = c.vgpu_stats(v.id).expect("stats").errors;
    eprintln!("faults: the victim saw {errs} error statuses and retried {retried} requests; all checksums matched");
    assert!(retried > 10 && errs > 10, "{out}");

    // Out of memory from the start: the guest's first ALLOC fails, it says so and exits.
    let o = c
        .create_vgpu(&vgpu_spec(0, 0.1, 64 * MIB, 1))
        .expect("vgpu");
    set_faults(&faults, o.id, "oom");
    let oom = c
        .create_vm(&vm_on("gpu-load", "rounds=5", o.id))
        .expect("oom vm");
    let done = c.wait_vm(oom.id, Duration::from_secs(60)).expect("wait");
    let out = console(c, oom.id);
    assert_eq!(done.state, VmState::Exited { code: 4 }, "{out}");
    assert!(
        out.contains("ALLOC x") && out.contains("OUT_OF_MEMORY"),
        "{out}"
    );

    neighbour_ok(c, neighbour.id, 400);
}

#[test]
fn kill9_of_a_worker_mid_copy_leaves_the_neighbour_untouched() {
    require_kvm!();
    // 20 MB/s copies: the victim's 4 MiB uploads take about 0.2 s each, so the kill lands
    // inside one.
    let d = TestDaemon::start(
        "kill-worker-copy",
        &[
            "--sim-gpus",
            "1",
            "--sim-memory",
            "1G",
            "--sim-copy-bw",
            "20M",
        ],
    );
    let c = &d.client;
    let neighbour = c
        .create_vm(&gpu_load(
            "rounds=200 spin_us=2000 check=5",
            0,
            0.3,
            64 * MIB,
        ))
        .expect("neighbour");
    let victim = c
        .create_vm(&gpu_load(
            "rounds=100000 n=1048576 spin_us=0 check=1000",
            0,
            0.3,
            128 * MIB,
        ))
        .expect("victim");
    wait_running(c, neighbour.id);
    wait_running(c, victim.id);
    let vg = victim.vgpu.expect("vgpu");
    let worker = c.vgpu(vg).expect("vgpu").worker_pid.expect("worker");
    wait_until("the victim copies", Duration::from_secs(30), || {
        c.vgpu_stats(vg).map(|s| s.bytes_htod).unwrap_or(0) > 4 * MIB
    });
    std::thread::sleep(Duration::from_millis(150));
    kill9(worker);
    let freed = wait_until("shares freed", Duration::from_secs(1), || {
        let (cc, m) = committed(c, 0);
        (cc - 0.3).abs() < 1e-9 && m == 64 * MIB
    });
    eprintln!(
        "kill -9 of a worker mid-copy: shares free after {} ms",
        freed.as_millis()
    );
    wait_until("the victim VM ends", Duration::from_secs(2), || {
        !c.vm(victim.id).expect("vm").state.is_live()
    });
    assert!(!alive(worker));
    neighbour_ok(c, neighbour.id, 200);
}

fn start_migration(c: &Client, vgpu: u32, target: u32) -> u32 {
    let m = c
        .migrate_vgpu(
            vgpu,
            &MigrateRequest {
                target_gpu: Some(target),
                mode: Some("precopy".into()),
                max_downtime_ms: Some(5),
            },
        )
        .expect("migrate");
    assert_eq!(m.state, "running");
    m.id
}

/// Kills the victim's `which` ("vmm" or "worker") while its vGPU migrates from GPU 0 to 1.
fn kill_mid_migration(tag: &str, which: &str) {
    let d = TestDaemon::start(
        tag,
        &[
            "--sim-gpus",
            "2",
            "--sim-memory",
            "1G",
            "--sim-copy-bw",
            "10M",
        ],
    );
    let c = &d.client;
    // The neighbour computes for about 3 s, so it still holds its share on GPU 1 when the
    // victim's worker or vmm is killed.
    let neighbour = c
        .create_vm(&gpu_load(
            "rounds=1500 spin_us=2000 check=5",
            1,
            0.3,
            64 * MIB,
        ))
        .expect("neighbour");
    // 8 MiB of live data to move at 10 MB/s: the migration runs for about a second.
    let victim = c
        .create_vm(&gpu_load(
            "rounds=100000 n=1048576 spin_us=0 check=1000",
            0,
            0.4,
            128 * MIB,
        ))
        .expect("victim");
    wait_running(c, neighbour.id);
    wait_running(c, victim.id);
    let vg = victim.vgpu.expect("vgpu");
    wait_until("the victim computes", Duration::from_secs(30), || {
        c.vgpu_stats(vg).map(|s| s.kernels).unwrap_or(0) > 2
    });
    let mid = start_migration(c, vg, 1);
    wait_until("the migration copies", Duration::from_secs(10), || {
        let m = c.migration(mid).expect("migration");
        m.bytes > 0 || m.state != "running"
    });
    let m = c.migration(mid).expect("migration");
    assert_eq!(m.state, "running", "the migration ended too soon: {m:?}");
    let pid = match which {
        "vmm" => c.vm(victim.id).expect("vm").pid.expect("vmm pid"),
        _ => c.vgpu(vg).expect("vgpu").worker_pid.expect("worker pid"),
    };
    kill9(pid);
    let freed = wait_until("both GPUs' shares freed", Duration::from_secs(2), || {
        committed(c, 0) == (0.0, 0) && {
            let (cc, mem) = committed(c, 1);
            (cc - 0.3).abs() < 1e-9 && mem == 64 * MIB
        }
    });
    let m = c
        .wait_migration(mid, Duration::from_secs(10), |_| {})
        .expect("migration ends");
    assert_eq!(m.state, "failed", "{m:?}");
    eprintln!(
        "kill -9 of the {which} mid-migration: shares free after {} ms; migration: {:?}",
        freed.as_millis(),
        m.error
    );
    neighbour_ok(c, neighbour.id, 1500);
    let log = d.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn kill9_of_a_vmm_mid_migration_frees_both_gpus() {
    require_kvm!();
    kill_mid_migration("kill-vmm-migrate", "vmm");
}

#[test]
fn kill9_of_a_worker_mid_migration_frees_both_gpus() {
    require_kvm!();
    kill_mid_migration("kill-worker-migrate", "worker");
}

#[test]
fn a_failing_migration_target_leaves_the_vgpu_where_it_was() {
    require_kvm!();
    let faults = vgpu_tests::daemon::temp_dir("target-faults");
    let fdir = faults.display().to_string();
    let d = TestDaemon::start_with_env(
        "target-fail",
        &["--sim-gpus", "2", "--sim-memory", "512M"],
        &[("VGPU_FAULTS_DIR", fdir.as_str())],
    );
    let c = &d.client;
    let arg = "rounds=600 n=262144 spin_us=1000 check=20";
    let v = c
        .create_vgpu(&vgpu_spec(0, 0.4, 64 * MIB, 1))
        .expect("vgpu");
    let moved = c.create_vm(&vm_on("gpu-load", arg, v.id)).expect("vm");
    let reference = c
        .create_vm(&gpu_load(arg, 1, 0.4, 64 * MIB))
        .expect("reference");
    wait_running(c, moved.id);
    wait_running(c, reference.id);
    // The guest holds its device memory (a migration of an empty vGPU copies nothing, so
    // nothing could fail).
    let t0 = Instant::now();
    while c.vgpu_stats(v.id).map_or(0, |s| s.memory_used_bytes) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the guest never allocated"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    set_faults(&faults, v.id, "target-fail");
    for _ in 0..3 {
        let mid = start_migration(c, v.id, 1);
        let m = c
            .wait_migration(mid, Duration::from_secs(30), |_| {})
            .expect("wait");
        assert_eq!(m.state, "failed", "{m:?}");
        assert!(
            m.error.as_deref().unwrap_or("").contains("injected"),
            "{m:?}"
        );
        assert_eq!(c.vgpu(v.id).expect("vgpu").gpu, 0, "the vGPU must stay");
    }
    let (cc, _) = committed(c, 1);
    assert!((cc - 0.4).abs() < 1e-9, "the failed target kept a share");
    set_faults(&faults, v.id, "none");
    let mid = start_migration(c, v.id, 1);
    let m = c
        .wait_migration(mid, Duration::from_secs(60), |_| {})
        .expect("wait");
    assert_eq!(m.state, "completed", "{m:?}");
    let last = |out: &str| {
        out.lines()
            .rev()
            .find_map(|l| l.strip_prefix("GPU-LOAD OK "))
            .unwrap_or_default()
            .to_string()
    };
    for id in [moved.id, reference.id] {
        let vm = c.wait_vm(id, Duration::from_secs(240)).expect("wait");
        assert_eq!(vm.state, VmState::Exited { code: 0 }, "{}", console(c, id));
    }
    let (a, b) = (console(c, moved.id), console(c, reference.id));
    assert!(!last(&a).is_empty(), "{a}");
    assert_eq!(last(&a), last(&b), "bytes lost across failed migrations");
}

#[test]
fn kill9_of_vgpud_leaves_its_vms_running_and_a_restart_adopts_them() {
    require_kvm!();
    let mut d = TestDaemon::start("restart", &["--sim-gpus", "1", "--sim-memory", "1G"]);
    let c = &d.client;
    let vm = c
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=2000 check=50",
            0,
            0.5,
            64 * MIB,
        ))
        .expect("vm");
    wait_running(c, vm.id);
    let kids = vgpu_tests::daemon::children(d.pid());
    assert!(kids.len() >= 2, "a vmm and a worker: {kids:?}");
    kill9(d.pid());
    // No child dies with vgpud (their own sessions, no parent-death signal): the guest
    // keeps computing and the next vgpud adopts it.
    std::thread::sleep(Duration::from_millis(300));
    assert!(kids.iter().all(|k| alive(*k)), "a child died with vgpud");
    if let Some(mut ch) = d.child.take() {
        let _ = ch.wait();
    }
    // A new vgpud on the same state directory starts (the stale socket is replaced) and
    // adopts the VM with its vGPU, holding its share.
    let sock = d.socket.display().to_string();
    let pdir = vgpu_tests::bins::payload("hello")
        .parent()
        .expect("dir")
        .display()
        .to_string();
    let log = std::fs::File::create(d.dir.join("vgpud2.log")).expect("log");
    let child = vgpu_tests::daemon::vgpud_command(&[
        "--socket",
        sock.as_str(),
        "--payload-dir",
        pdir.as_str(),
        "--sim-gpus",
        "1",
        "--sim-memory",
        "1G",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(log)
    .spawn()
    .expect("vgpud again");
    d.child = Some(child);
    wait_until("vgpud serves again", Duration::from_secs(20), || {
        c.gpus().is_ok()
    });
    let vms = c.vms().expect("vms");
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0].state, VmState::Running, "{vms:?}");
    let g = vms[0].vgpu.expect("its vGPU");
    assert_eq!(
        c.vgpu(g).expect("vgpu").state,
        vgpu_api::api::VgpuState::Attached
    );
    assert_eq!(committed(c, 0).0, 0.5);
    // Stopped through the new vgpud: every GPU's capacity is free again.
    c.delete_vm(vm.id).expect("stop the adopted VM");
    assert!(kids.iter().all(|k| !alive(*k)), "children left behind");
    assert_eq!(committed(c, 0), (0.0, 0));
    let again = c
        .create_vm(&gpu_load(
            "rounds=20 spin_us=1000 check=5",
            0,
            1.0,
            64 * MIB,
        ))
        .expect("the whole GPU is free again");
    neighbour_ok(c, again.id, 20);
}

/// Whether the tests run as root (the per-worker uids need it).
fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_compromised_worker_reaches_neither_the_api_nor_another_vgpu_nor_a_call_outside_its_filter() {
    // vGPU 2's worker does what a compromised one would (the worker's probe, see
    // vgpu-worker/src/sandbox.rs): from its private directory, connect to vgpud's REST
    // socket and open vGPU 1's directory and secret; then, its filter on, open a socket.
    let d = TestDaemon::start_with_env(
        "sandbox",
        &["--sim-gpus", "1", "--sim-memory", "1G"],
        &[("VGPU_WORKER_PROBE", "2;../../vgpud.sock;../1")],
    );
    let c = &d.client;
    let neighbour = c
        .create_vgpu(&vgpu_spec(0, 0.3, 64 * MIB, 1))
        .expect("neighbour vGPU");
    assert_eq!(neighbour.id, 1);
    let reason = match c.create_vgpu(&vgpu_spec(0, 0.2, 64 * MIB, 1)) {
        Ok(v) => {
            assert_eq!(v.id, 2);
            wait_until(
                "the probing worker is killed",
                Duration::from_secs(10),
                || {
                    matches!(
                        c.vgpu(2).expect("vgpu").state,
                        vgpu_api::api::VgpuState::Failed { .. }
                    )
                },
            );
            match c.vgpu(2).expect("vgpu").state {
                vgpu_api::api::VgpuState::Failed { reason } => reason,
                other => panic!("vGPU 2 is {other:?}"),
            }
        }
        // Killed before its create answered.
        Err(e) => e.to_string(),
    };
    assert!(
        reason.contains("worker violated its seccomp filter") && reason.contains("SIGSYS"),
        "{reason}"
    );
    let log = std::fs::read_to_string(d.dir.join("vgpu-2.log")).expect("worker log");
    assert!(log.contains("probe: calling socket(2)"), "{log}");
    assert!(
        !log.contains("ALLOWED"),
        "the sandbox let something through:\n{log}"
    );
    if root() {
        for what in [
            "connect to the REST socket",
            "open another vGPU's directory",
            "read another vGPU's secret",
        ] {
            assert!(
                log.lines()
                    .any(|l| l.contains(what) && l.contains("refused")),
                "{what}: {log}"
            );
        }
    } else {
        eprintln!("SKIPPED (uid part): not root, so workers share vgpud's uid");
    }
    // The neighbour never noticed; the killed vGPU holds nothing.
    let n = c.vgpu(1).expect("neighbour");
    assert_eq!(n.state, vgpu_api::api::VgpuState::Ready);
    assert!(n.worker_pid.is_some_and(alive));
    assert!((committed(c, 0).0 - 0.3).abs() < 1e-9);
    // Workers' files are theirs alone: the API socket and the state file are vgpud's.
    use std::os::unix::fs::PermissionsExt;
    for f in ["vgpud.sock", "vgpud-state.json", "vgpu-1.log"] {
        let mode = std::fs::metadata(d.dir.join(f))
            .expect(f)
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{f} is open to others: {mode:o}");
    }
    let dir = d.dir.join("workers").join("1");
    let mode = std::fs::metadata(&dir).expect("dir").permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
}
