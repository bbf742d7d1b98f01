//! Starting VMs with a vGPU: from the REST call (`POST /v1/vms` with an inline vGPU) to
//! the payload's `main` (the `hello` payload's first console line), one at a time (median)
//! and many launched concurrently (all at `main`), each beside its anchor from the same
//! run: the same VMs started by hand (`vgpu-worker` on a socket, then `vmm` on it).
//! Through vgpud without a worker pool (`--worker-pool 0`), and with `--pool N` also
//! through a vgpud with N pool workers per GPU, each measurement started with the pool
//! full (the figures say how many starts took a pool worker).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_api::api::{VgpuCreate, VmCreate};
use vgpu_api::client::Client;

use crate::bench::{median, Figure};
use crate::bins::{binary, payload};
use crate::daemon::TestDaemon;
use crate::worker::Worker;

/// What the `hello` payload prints first, at its `main`.
const HELLO: &str = "hello from vgpu payload";
/// Longest a single start may take before the bench gives up.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// Each vGPU's memory share on `backend`: a cuda share holds the context's reserve
/// (stacks of every resident thread: 273 MiB on the H200 at the default limits).
fn vgpu_memory(backend: &str) -> u64 {
    if backend == "cuda" {
        512 << 20
    } else {
        64 << 20
    }
}
/// Longest the worker pool may take to fill (a cuda GPU creates contexts one at a time).
const POOL_DEADLINE: Duration = Duration::from_secs(180);

/// What `vgpu-bench start` measures.
pub struct Params {
    /// `sim` or `cuda`.
    pub backend: String,
    /// Single starts timed (the median is reported).
    pub runs: usize,
    /// VMs launched at once.
    pub concurrent: usize,
    /// Pool workers per GPU for the pool figures; 0: none measured.
    pub pool: usize,
}

/// Runs the start figures.
pub fn run(p: &Params) -> Vec<Figure> {
    if !crate::bins::have_kvm() {
        eprintln!("vgpu-bench start: /dev/kvm is not available; nothing to measure");
        std::process::exit(2);
    }
    let backend_args: Vec<&str> = match p.backend.as_str() {
        "cuda" => vec!["--backend", "cuda"],
        _ => vec!["--sim-gpus", "1", "--sim-memory", "16G"],
    };
    let mut no_pool = backend_args.clone();
    no_pool.extend(["--worker-pool", "0"]);
    let d = TestDaemon::start("bench-start", &no_pool);
    let c = &d.client;
    let share = vgpu_memory(&p.backend);
    let one = |c: &Client| {
        let (ms, id) = start_via_vgpud(c, share, poll_every(1));
        remove_vms(c, vec![id]);
        ms
    };
    // The first launch warms the page cache for the programs and the payload.
    let _ = one(c);
    let single: Vec<f64> = (0..p.runs).map(|_| one(c)).collect();
    let by_hand: Vec<f64> = (0..p.runs).map(|_| start_by_hand(&p.backend).0).collect();
    let poll = poll_every(p.concurrent);
    let (all, ids) = time_concurrent(p.concurrent, || start_via_vgpud(c, share, poll));
    remove_vms(c, ids);
    let (all_by_hand, kept) = time_concurrent(p.concurrent, || start_by_hand(&p.backend));
    drop(kept);
    drop(d);
    let k = p.concurrent;
    let (hand, all_hand) = (median(by_hand), all_by_hand);
    let mut figures = vec![
        Figure {
            name: format!(
                "VM start to main through vgpud, {} (median of {})",
                p.backend, p.runs
            ),
            value: median(single),
            unit: "ms".into(),
            anchor_name: "vgpu-worker + vmm started by hand".into(),
            anchor: hand,
            anchor_unit: "ms".into(),
        },
        Figure {
            name: format!("{k} VMs launched concurrently through vgpud, all at main"),
            value: all,
            unit: "ms".into(),
            anchor_name: format!("{k} started by hand concurrently"),
            anchor: all_hand,
            anchor_unit: "ms".into(),
        },
    ];
    if p.pool > 0 {
        figures.extend(with_pool(p, &backend_args, hand, all_hand));
    }
    figures
}

/// The same starts through a vgpud with `p.pool` pool workers per GPU, each measurement
/// begun with the pool full.
fn with_pool(p: &Params, backend_args: &[&str], hand: f64, all_hand: f64) -> Vec<Figure> {
    let n = p.pool.to_string();
    let mut args = backend_args.to_vec();
    args.extend(["--worker-pool", n.as_str()]);
    let d = TestDaemon::start("bench-start-pool", &args);
    let c = &d.client;
    let share = vgpu_memory(&p.backend);
    let one = |c: &Client| {
        let (ms, id) = start_via_vgpud(c, share, poll_every(1));
        remove_vms(c, vec![id]);
        ms
    };
    wait_pool_full(c, p.pool);
    let _ = one(c);
    let single: Vec<f64> = (0..p.runs)
        .map(|_| {
            wait_pool_full(c, p.pool);
            one(c)
        })
        .collect();
    wait_pool_full(c, p.pool);
    let k = p.concurrent;
    let (all, ids) = time_concurrent(k, || start_via_vgpud(c, share, poll_every(k)));
    remove_vms(c, ids);
    let hits = d.log_text().matches("worker ready (from the pool)").count();
    let starts = 1 + p.runs + k;
    println!("pool hits: {hits} of {starts} starts took a pool worker");
    let pool = p.pool;
    vec![
        Figure {
            name: format!(
                "VM start to main through vgpud with a pool of {pool}, {} (median of {}, pool full)",
                p.backend, p.runs
            ),
            value: median(single),
            unit: "ms".into(),
            anchor_name: "vgpu-worker + vmm started by hand".into(),
            anchor: hand,
            anchor_unit: "ms".into(),
        },
        Figure {
            name: format!("{k} VMs launched concurrently through vgpud with a pool of {pool}, all at main"),
            value: all,
            unit: "ms".into(),
            anchor_name: format!("{k} started by hand concurrently"),
            anchor: all_hand,
            anchor_unit: "ms".into(),
        },
    ]
}

/// Waits until the pool holds `n` idle workers.
fn wait_pool_full(c: &Client, n: usize) {
    let t = Instant::now();
    while crate::daemon::pool_idle(c, None).unwrap_or(0) < n as u64 {
        if t.elapsed() > POOL_DEADLINE {
            fail(&format!(
                "the worker pool did not reach {n} idle workers within {} s (it has {})",
                POOL_DEADLINE.as_secs(),
                crate::daemon::pool_idle(c, None).unwrap_or(0)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `start` on `k` threads at once: ms until the last is at `main`, and what each
/// start left to clean up. Nothing is cleaned up before the last is at `main`, so the
/// figure is the starts alone.
fn time_concurrent<T: Send>(k: usize, start: impl Fn() -> (f64, T) + Sync) -> (f64, Vec<T>) {
    let t = Instant::now();
    let mut last = t;
    let mut kept = Vec::with_capacity(k);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..k)
            .map(|_| {
                s.spawn(|| {
                    let (_, keep) = start();
                    (Instant::now(), keep)
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok((at, keep)) => {
                    last = last.max(at);
                    kept.push(keep);
                }
                Err(_) => fail("a concurrent start panicked"),
            }
        }
    });
    (last.duration_since(t).as_secs_f64() * 1e3, kept)
}

/// How often a start polls its VM's console for `main`: every 0.5 ms for one start; with
/// `k` at once, 0.5 ms x k (at most 20 ms), so the polling itself does not load vgpud.
fn poll_every(k: usize) -> Duration {
    Duration::from_micros(500 * k.max(1) as u64).min(Duration::from_millis(20))
}

/// Stops and removes VMs left by starts through vgpud.
fn remove_vms(c: &Client, ids: Vec<u32>) {
    for id in ids {
        let _ = c.delete_vm(id);
    }
}

/// One VM with an inline vGPU through vgpud: ms from the REST call to `main`, and the VM's
/// id (the caller removes it).
fn start_via_vgpud(c: &Client, share: u64, poll: Duration) -> (f64, u32) {
    let req = VmCreate {
        payload: Some(payload("hello").display().to_string()),
        memory_bytes: 64 << 20,
        vgpu: Some(VgpuCreate {
            ..VgpuCreate::new(share, 0.01)
        }),
        ..Default::default()
    };
    let t = Instant::now();
    let vm = c
        .create_vm(&req)
        .unwrap_or_else(|e| fail(&format!("POST /v1/vms: {e}")));
    loop {
        let out = c.console(vm.id, 0).unwrap_or_default();
        if String::from_utf8_lossy(&out).contains(HELLO) {
            break;
        }
        if t.elapsed() > START_DEADLINE {
            fail(&format!("VM {} did not reach main", vm.id));
        }
        std::thread::sleep(poll);
    }
    (t.elapsed().as_secs_f64() * 1e3, vm.id)
}

/// A VM started by hand: its vmm and worker, stopped when dropped.
struct ByHand {
    vmm: std::process::Child,
    _worker: Worker,
}

impl Drop for ByHand {
    fn drop(&mut self) {
        let _ = self.vmm.kill();
        let _ = self.vmm.wait();
    }
}

/// One VM with a vGPU started by hand: ms from starting `vgpu-worker` to `main`, and the
/// processes (stopped when dropped).
fn start_by_hand(backend: &str) -> (f64, ByHand) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let extra: &[&str] = if backend == "cuda" {
        &["--gpu", "0"]
    } else {
        &[]
    };
    let t = Instant::now();
    let share = vgpu_memory(backend).to_string();
    let worker = Worker::start(backend, &format!("bench-start-{n}"), &share, 1, extra)
        .unwrap_or_else(|e| fail(&e));
    let mut spec = std::ffi::OsString::from("socket=");
    spec.push(worker.socket.as_os_str());
    let mut vmm = Command::new(binary("vmm"))
        .arg("--payload")
        .arg(payload("hello"))
        .args(["--memory", &(64u64 << 20).to_string(), "--vcpus", "1"])
        .arg("--vgpu")
        .arg(spec)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("cannot start vmm: {e}")));
    let Some(stdout) = vmm.stdout.take() else {
        fail("the vmm has no stdout");
    };
    let mut reached = false;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        if line.contains(HELLO) {
            reached = true;
            break;
        }
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let started = ByHand {
        vmm,
        _worker: worker,
    };
    if !reached {
        drop(started);
        fail("a VM started by hand did not reach main");
    }
    (ms, started)
}

fn fail(why: &str) -> ! {
    eprintln!("vgpu-bench start: {why}");
    std::process::exit(1);
}
