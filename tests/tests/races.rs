//! Races an operator can start through the REST API, each run many times: what the API
//! reports is what the schedulers enforce at every instant (no GPU's committed share
//! past 1.0 at any GET, a vGPU's share as its worker has it), and no race answers 5xx.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vgpu_api::api::{MigrateRequest, VgpuCreate, VgpuPatch, VgpuState, VmCreate, VmState};
use vgpu_api::client::{Client, ClientError};
use vgpu_tests::daemon::TestDaemon;
use vgpu_tests::require_kvm;

const ROUNDS: u32 = 20;
const MIB: u64 = 1 << 20;

fn spec(gpu: u32, compute: f64) -> VgpuCreate {
    VgpuCreate {
        gpu: Some(gpu),
        ..VgpuCreate::new(16 * MIB, compute)
    }
}

fn compute(c: f64) -> VgpuPatch {
    VgpuPatch {
        compute_share: Some(c),
        copy_share: Some(c),
        priority: None,
        name: None,
        labels: None,
        kernel_deadline_ms: None,
    }
}

/// The status of a call: 2xx as 200, else the API's status; anything but an API answer
/// fails the test.
fn status<T>(r: &Result<T, ClientError>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(e) => e.status().unwrap_or_else(|| panic!("no API answer: {e}")),
    }
}

fn no_5xx<T>(what: &str, r: &Result<T, ClientError>) {
    let s = status(r);
    if let Err(e) = r {
        assert!(s < 500, "{what}: {e}");
    }
}

/// Polls `GET /v1/gpus` until dropped; every answer must keep each GPU's committed
/// compute and copy shares at or below the whole GPU.
struct Watcher {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
    polls: Arc<Mutex<u64>>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    fn start(c: &Client) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let polls = Arc::new(Mutex::new(0));
        let thread = {
            let (c, stop, seen, polls) = (c.clone(), stop.clone(), seen.clone(), polls.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let gpus = c.gpus().expect("GET /v1/gpus");
                    for g in gpus {
                        if g.compute_committed > 1.0 + 1e-9 || g.copy_committed > 1.0 + 1e-9 {
                            seen.lock().expect("lock").push(format!("{g:?}"));
                        }
                    }
                    *polls.lock().expect("lock") += 1;
                }
            })
        };
        Self {
            stop,
            seen,
            polls,
            thread: Some(thread),
        }
    }

    /// Stops and asserts that no answer broke the invariant.
    fn check(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("watcher");
        }
        let seen = self.seen.lock().expect("lock");
        assert!(seen.is_empty(), "GPUs committed past 1.0: {seen:?}");
        assert!(
            *self.polls.lock().expect("lock") > 0,
            "the watcher never polled"
        );
    }
}

/// vGPU `id`'s shares as the API reports them equal what its worker has.
fn api_equals_worker(c: &Client, id: u32) {
    let v = c.vgpu(id).expect("vgpu");
    let s = c.vgpu_stats(id).expect("stats");
    assert!(
        (v.compute_share - s.compute_share).abs() < 1e-9
            && (v.copy_share - s.copy_share).abs() < 1e-9,
        "vGPU {id}: the API says {}/{}, its worker {}/{}",
        v.compute_share,
        v.copy_share,
        s.compute_share,
        s.copy_share
    );
}

/// The daemon never fell back to a warning about shares it could not apply.
fn log_clean(d: &TestDaemon) {
    let log = d.log_text();
    for bad in [
        "did not take the new shares",
        "refused the new shares",
        "cannot schedule",
    ] {
        assert!(!log.contains(bad), "vgpud logged {bad:?}:\n{log}");
    }
}

fn jitter(i: u32) {
    std::thread::sleep(Duration::from_micros(u64::from(i % 5) * 700));
}

#[test]
fn a_share_change_during_a_migration_is_checked_on_both_gpus() {
    let d = TestDaemon::start("race-migrate-patch", &["--sim-gpus", "2"]);
    let c = &d.client;
    let a = c.create_vgpu(&spec(0, 0.5)).expect("a").id;
    let b = c.create_vgpu(&spec(1, 0.5)).expect("b").id;
    let w = Watcher::start(c);
    for i in 0..ROUNDS {
        let here = c.vgpu(a).expect("a").gpu;
        let target = 1 - here;
        let patch = {
            let c = c.clone();
            std::thread::spawn(move || {
                jitter(i);
                c.patch_vgpu(a, &compute(0.9))
            })
        };
        let m = c.migrate_vgpu(
            a,
            &MigrateRequest {
                target_gpu: Some(target),
                mode: None,
                max_downtime_ms: None,
            },
        );
        let p = patch.join().expect("patch thread");
        no_5xx("migrate", &m);
        no_5xx("patch", &p);
        if let Ok(m) = &m {
            let done = c
                .wait_migration(m.id, Duration::from_secs(60), |_| {})
                .expect("migration");
            assert_eq!(done.state, "completed", "{done:?}");
        }
        // B's GPU cannot hold A at 0.9 beside B's 0.5: moving there and growing to 0.9
        // exclude each other.
        if target == 1 {
            assert!(
                !(m.is_ok() && p.is_ok()),
                "round {i}: both the migration and the change to 0.9 beside B were accepted"
            );
        }
        api_equals_worker(c, a);
        if p.is_ok() {
            c.patch_vgpu(a, &compute(0.5)).expect("back to 0.5");
        }
    }
    w.check();
    api_equals_worker(c, b);
    log_clean(&d);
}

#[test]
fn a_share_decrease_frees_room_only_once_it_is_enforced() {
    let d = TestDaemon::start("race-decrease", &["--sim-gpus", "1"]);
    let c = &d.client;
    let x = c.create_vgpu(&spec(0, 0.6)).expect("x").id;
    let y = c.create_vgpu(&spec(0, 0.4)).expect("y").id;
    let w = Watcher::start(c);
    for i in 0..ROUNDS {
        let lower = {
            let c = c.clone();
            std::thread::spawn(move || c.patch_vgpu(x, &compute(0.2)))
        };
        jitter(i);
        if i % 2 == 0 {
            // A new vGPU that needs the room X gives up.
            let z = c.create_vgpu(&spec(0, 0.4));
            no_5xx("create", &z);
            lower.join().expect("thread").expect("lower X");
            if let Ok(z) = z {
                api_equals_worker(c, z.id);
                c.delete_vgpu(z.id).expect("delete z");
            }
        } else {
            // Another vGPU grows into the room X gives up.
            let grow = c.patch_vgpu(y, &compute(0.8));
            no_5xx("grow y", &grow);
            lower.join().expect("thread").expect("lower X");
            api_equals_worker(c, y);
            if grow.is_ok() {
                c.patch_vgpu(y, &compute(0.4)).expect("y back");
            }
        }
        api_equals_worker(c, x);
        c.patch_vgpu(x, &compute(0.6)).expect("x back");
    }
    w.check();
    log_clean(&d);
}

#[test]
fn a_change_to_a_vgpu_being_deleted_answers_409_or_404() {
    let d = TestDaemon::start("race-delete-patch", &["--sim-gpus", "1"]);
    let c = &d.client;
    for i in 0..ROUNDS {
        let v = c.create_vgpu(&spec(0, 0.3)).expect("create").id;
        let del = {
            let c = c.clone();
            std::thread::spawn(move || c.delete_vgpu(v))
        };
        jitter(i);
        let p = c.patch_vgpu(v, &compute(0.4));
        let s = status(&p);
        assert!(
            matches!(s, 200 | 404 | 409),
            "round {i}: PATCH during DELETE answered {p:?}"
        );
        if s == 409 {
            let e = p.err().and_then(|e| e.body().map(|b| b.error.clone()));
            assert!(
                e.as_deref().is_some_and(|e| e.contains("being released")),
                "{e:?}"
            );
        }
        del.join().expect("thread").expect("delete");
        let after = c.patch_vgpu(v, &compute(0.4));
        assert_eq!(status(&after), 404, "{after:?}");
    }
    assert!(c.vgpus().expect("list").is_empty());
    log_clean(&d);
}

#[test]
fn a_delete_racing_a_vm_launch_lets_only_one_win() {
    require_kvm!();
    let d = TestDaemon::start("race-delete-vm", &["--sim-gpus", "1"]);
    let c = &d.client;
    let mut launched = 0;
    for i in 0..ROUNDS {
        let v = c.create_vgpu(&spec(0, 0.3)).expect("create").id;
        let del = {
            let c = c.clone();
            std::thread::spawn(move || {
                jitter(i);
                c.delete_vgpu(v)
            })
        };
        let vm = c.create_vm(&VmCreate {
            payload: Some("hello".into()),
            memory_bytes: 64 * MIB,
            vgpu_id: Some(v),
            ..Default::default()
        });
        let gone = del.join().expect("thread");
        no_5xx("launch", &vm);
        no_5xx("delete", &gone);
        // Both succeed only when the VM ran to its end before the DELETE came (hello
        // exits at once); a VM never loses its vGPU while it runs.
        assert!(
            vm.is_ok() || gone.is_ok(),
            "round {i}: launch {vm:?}, delete {gone:?}: neither won"
        );
        if let Ok(vm) = vm {
            launched += 1;
            let end = c.wait_vm(vm.id, Duration::from_secs(60)).expect("wait");
            let out =
                String::from_utf8_lossy(&c.console(vm.id, 0).unwrap_or_default()).into_owned();
            assert_eq!(end.state, VmState::Exited { code: 0 }, "{end:?}\n{out}");
            c.delete_vm(vm.id).expect("delete vm");
            let r = c.delete_vgpu(v);
            assert!(matches!(status(&r), 200 | 404), "{r:?}");
        }
    }
    eprintln!("{launched} of {ROUNDS} launches won the race");
    log_clean(&d);
}

#[test]
fn released_vgpus_leave_the_list_and_the_metrics_after_their_retention() {
    require_kvm!();
    let d = TestDaemon::start(
        "released-gc",
        &["--sim-gpus", "1", "--released-retention-s", "0"],
    );
    let c = &d.client;
    let v = c.create_vgpu(&spec(0, 0.3)).expect("create").id;
    let vm = c
        .create_vm(&VmCreate {
            payload: Some("hello".into()),
            memory_bytes: 64 * MIB,
            vgpu_id: Some(v),
            ..Default::default()
        })
        .expect("launch");
    let end = c.wait_vm(vm.id, Duration::from_secs(60)).expect("wait");
    assert_eq!(end.state, VmState::Exited { code: 0 }, "{end:?}");
    let t0 = Instant::now();
    let series = format!("vgpu=\"{v}\"");
    loop {
        let listed = c.vgpus().expect("list").iter().any(|g| g.id == v);
        let in_metrics = c.metrics().expect("metrics").contains(&series);
        if !listed && !in_metrics {
            break;
        }
        if let Ok(g) = c.vgpu(v) {
            assert!(
                matches!(g.state, VgpuState::Attached | VgpuState::Released),
                "{g:?}"
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "released vGPU {v} still listed ({listed}) or in the metrics ({in_metrics})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.gpus().expect("gpus")[0].compute_committed, 0.0);
}

#[test]
fn concurrent_increases_never_commit_past_the_gpu() {
    let d = TestDaemon::start("race-increases", &["--sim-gpus", "1"]);
    let c = &d.client;
    let x = c.create_vgpu(&spec(0, 0.3)).expect("x").id;
    let y = c.create_vgpu(&spec(0, 0.3)).expect("y").id;
    let w = Watcher::start(c);
    for i in 0..ROUNDS {
        let grow_x = {
            let c = c.clone();
            std::thread::spawn(move || c.patch_vgpu(x, &compute(0.6)))
        };
        jitter(i);
        let gy = c.patch_vgpu(y, &compute(0.6));
        let gx = grow_x.join().expect("thread");
        no_5xx("grow x", &gx);
        no_5xx("grow y", &gy);
        assert!(
            !(gx.is_ok() && gy.is_ok()),
            "round {i}: both grew to 0.6 on one GPU"
        );
        api_equals_worker(c, x);
        api_equals_worker(c, y);
        for (id, r) in [(x, gx), (y, gy)] {
            if r.is_ok() {
                c.patch_vgpu(id, &compute(0.3)).expect("back");
            }
        }
    }
    w.check();
    log_clean(&d);
}
