//! Worker processes: spawning one per vGPU (command line, grant channel, control
//! channel) in its sandbox (a private directory, its own identity, a seccomp filter:
//! docs/hostile.md), supervising it (its events, its exit) and stopping it. A vGPU's
//! worker comes from the pool of idle workers when one fits (`pool.rs`); a process
//! vGPU gets a fresh worker for its next process (`process.rs`). Starting, exiting and
//! replacing call each other, so the three live in this one module.
//!
//! A worker's private directory and sockets are `worker_files.rs`. The worker runs with
//! the directory as its working directory, so it never needs a path through the state
//! directory (0700, vgpud's). Each worker is pid 1 of a PID namespace of its own
//! (`procs/seal.rs`).

pub(super) mod pool;
pub(super) mod process;

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::Duration;

use crate::api::{VgpuState, VmState};
use crate::control::{Command as Ctl, ReplyBody};
use crate::daemon::config::{Config, GpuConfig};
use crate::daemon::core::{Daemon, STOP_GRACE, WORKER_START};
use crate::daemon::error::ApiError;
use crate::daemon::link::{self, Link};
use crate::daemon::memory;
use crate::daemon::migration;
use crate::daemon::procs::{self, Identity, Proc};
use crate::daemon::state::{Inner, State, VgpuRec, WorkerHandle};
use crate::daemon::stats;
use crate::daemon::worker_files::{
    bind_sockets, log_tail, prepare_dir, remove_dir, worker_dir, worker_env, CONTROL_LISTEN_FD,
    SECRET_FILE, VHOST_LISTEN_FD, VHOST_SOCKET,
};
use crate::units::permille_to_fraction;
use vgpu_grant::WorkerFds;

/// What a worker is started with.
struct WorkerLaunch {
    cmd: Command,
    log: std::path::PathBuf,
    fds: WorkerFds,
    gpu: u32,
}

/// Spawns vGPU `id`'s worker and waits until its socket is bound.
pub(super) async fn start_worker(d: &Arc<Daemon>, id: u32) -> Result<(), ApiError> {
    if let Some(spare) = pool::take_spare(d, id) {
        match pool::assign_spare(d, id, spare).await {
            Ok(()) => return Ok(()),
            Err(why) => tracing::warn!(vgpu = id, %why,
                "the pool worker did not take the vGPU; starting a fresh worker"),
        }
    }
    let WorkerLaunch {
        mut cmd,
        log,
        fds,
        gpu,
    } = d.state.with(|inner| worker_launch(d, inner, id))?;
    memory::refresh_pool(d, gpu);
    let identity = worker_identity(&d.cfg, id);
    let dir = worker_dir(&d.cfg.state_dir, id);
    let (vhost, to) = d
        .state
        .with(|i| {
            i.vgpus
                .get(&id)
                .map(|r| (r.socket().clone(), r.process().clone()))
        })
        .ok_or_else(|| ApiError::internal(format!("vGPU {id} vanished while starting")))?;
    // The directory, the log and the fork run off the runtime: vgpud serves other
    // requests (other launches) meanwhile, and holds no lock across any of it.
    let state_dir = d.cfg.state_dir.clone();
    let at = dir.clone();
    let setup = tokio::task::spawn_blocking(move || {
        prepare_dir(&state_dir, &at, identity)
            .map_err(|e| format!("cannot prepare the worker's directory: {e}"))?;
        let sockets = bind_sockets(&at, &vhost, to.as_ref())
            .map_err(|e| format!("cannot bind the worker's sockets: {e}"))?;
        let log_file = crate::daemon::private::create_file(&log)
            .map_err(|e| format!("cannot create the worker log {}: {e}", log.display()))?;
        Ok::<_, String>((log_file, log, sockets))
    })
    .await
    .map_err(|e| format!("the worker's set-up task failed: {e}"))
    .and_then(|r| r);
    let (log_file, log, (vhost_fd, control_fd)) = match setup {
        Ok(v) => v,
        Err(why) => {
            d.grants.detach(id, gpu);
            return Err(ApiError::internal(format!("{why} ({})", dir.display())));
        }
    };
    cmd.current_dir(&dir);
    worker_env(&mut cmd);
    let (ours, theirs) = match procs::socketpair() {
        Ok(v) => v,
        Err(e) => {
            d.grants.detach(id, gpu);
            return Err(ApiError::internal(format!(
                "cannot create a control socket: {e}"
            )));
        }
    };
    let extra = vec![
        (fds.page, procs::GRANT_PAGE_FD),
        (fds.doorbell, procs::GRANT_DOORBELL_FD),
        (vhost_fd, VHOST_LISTEN_FD),
        (control_fd, CONTROL_LISTEN_FD),
    ];
    let (child, proc) =
        procs::spawn_sealed_off_runtime(cmd, log_file, Some(theirs), extra, identity)
            .await
            .map_err(|e| {
                d.grants.detach(id, gpu);
                ApiError::internal(format!(
                    "cannot start {}: {e}; check vgpud's --worker-bin",
                    d.cfg.worker_bin.display()
                ))
            })?;
    let (link, ready) = match link::start(
        std::os::unix::net::UnixStream::from(ours),
        worker_events(d, id),
    ) {
        Ok(v) => v,
        Err(e) => {
            proc.signal(libc::SIGKILL);
            return Err(ApiError::internal(format!("control channel: {e}")));
        }
    };
    tracing::info!(
        vgpu = id,
        pid = proc.pid,
        uid = identity.map(|i| i.uid),
        pid_namespace = child.sealed,
        "worker started"
    );
    d.state.with(|i| {
        if let Some(rec) = i.vgpus.get_mut(&id) {
            rec.worker_started(WorkerHandle {
                proc: proc.clone(),
                link,
            });
        }
    });
    let p = proc.clone();
    tokio::spawn({
        let d = d.clone();
        async move {
            let status = procs::reap(child, &p).await;
            // Nothing of it meets the next worker of its uid.
            procs::clear_leftovers(p.pid, identity).await;
            on_worker_exit(&d, id, p.pid, Some(status));
        }
    });
    await_ready(&d.state, id, &proc, &log, ready).await
}

/// vGPU `id`'s worker command line, with its GPU's scheduler attached (and its pool
/// joined when it oversubscribes). Caller holds the state lock.
fn worker_launch(d: &Daemon, inner: &Inner, id: u32) -> Result<WorkerLaunch, ApiError> {
    let rec = inner
        .vgpus
        .get(&id)
        .ok_or_else(|| ApiError::internal(format!("vGPU {id} vanished while starting")))?;
    let gpu = d
        .gpu(rec.gpu())
        .ok_or_else(|| ApiError::internal(format!("vGPU {id} is on an unknown GPU")))?;
    let fds = d.grants.attach(rec, rec.gpu())?;
    let mut cmd = worker_command(d, rec, gpu);
    // The VM it serves maps its memory and no more (docs/hostile.md); a vGPU made
    // before its VM keeps the worker's default bound.
    if let Some(vm) = rec.vm().and_then(|v| inner.vms.get(&v)) {
        cmd.args(["--max-guest-memory", &vm.memory().to_string()]);
    }
    if rec.oversubscribe() {
        d.memory.join(rec.gpu(), id, rec.priority());
    }
    Ok(WorkerLaunch {
        cmd,
        log: rec.log().clone(),
        fds,
        gpu: rec.gpu(),
    })
}

/// The `vgpu-worker` command line for vGPU `rec` on GPU `gpu`.
fn worker_command(d: &Daemon, rec: &VgpuRec, gpu: &GpuConfig) -> Command {
    let mut cmd = Command::new(&d.cfg.worker_bin);
    // Relative to its private directory, its working directory.
    cmd.args(["--socket", VHOST_SOCKET])
        .args(["--vgpu-id", &rec.id().to_string()])
        .args(["--memory", &rec.memory().to_string()])
        .args(["--queues", &rec.queues().to_string()])
        .args([
            "--compute-share",
            &permille_to_fraction(rec.compute()).to_string(),
        ])
        .args([
            "--copy-share",
            &permille_to_fraction(rec.copy()).to_string(),
        ])
        .args(["--priority", &rec.priority().to_string()]);
    if d.cfg.queue_poll_us > 0 {
        cmd.args(["--poll-us", &d.cfg.queue_poll_us.to_string()]);
    }
    match gpu.cuda_ordinal {
        Some(ordinal) => {
            cmd.args(["--backend", "cuda", "--gpu", &ordinal.to_string()]);
        }
        None => {
            cmd.args([
                "--sim-memory",
                &d.memory
                    .sim_memory(gpu.memory, rec.oversubscribe())
                    .to_string(),
            ])
            .args(["--sim-copy-bw", &gpu.copy_bandwidth.to_string()])
            .args(["--sim-speed", &gpu.speed.to_string()])
            .args(["--sim-threads", &d.cfg.sim_threads.to_string()]);
        }
    }
    if rec.oversubscribe() {
        cmd.arg("--oversubscribe");
    }
    cmd.arg("--shm");
    if let Some(incoming) = d.host.worker(rec.id()) {
        // It receives the vGPU's state from another host's worker first; its fresh
        // secret is the stream's one-time token.
        cmd.arg("--migrate-in")
            .arg(&incoming.address)
            .args(["--migrate-token-file", SECRET_FILE]);
    }
    for s in rec.storage() {
        cmd.arg("--storage").arg(s.to_arg());
    }
    cmd.args([
        "--grant-fds",
        &format!("{},{}", procs::GRANT_PAGE_FD, procs::GRANT_DOORBELL_FD),
    ]);
    cmd.args(["--listen-fd", &VHOST_LISTEN_FD.to_string()])
        .args(["--control-listen-fd", &CONTROL_LISTEN_FD.to_string()]);
    sandbox_args(&d.cfg, &mut cmd);
    cmd
}

/// The sandbox and control channel arguments every worker gets (the grant page and
/// doorbell and the listening sockets of a pool worker come with its assignment).
pub(super) fn sandbox_args(cfg: &Config, cmd: &mut Command) {
    let sandbox = &cfg.workers;
    cmd.args(["--seccomp", sandbox.seccomp.as_str()])
        .args(["--secret-file", SECRET_FILE])
        .args([
            "--control-reconnect-s",
            &sandbox.control_reconnect.as_secs().to_string(),
        ]);
    cmd.args(["--control-fd", &procs::CONTROL_FD.to_string()]);
}

/// The identity vGPU `id`'s worker runs under: its own uid and gid when vgpud runs as
/// root (`--worker-uid-base`), else vgpud's.
pub(super) fn worker_identity(cfg: &Config, id: u32) -> Option<Identity> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let uid = cfg.workers.uid_base?.checked_add(id)?;
    root.then_some(Identity { uid, gid: uid })
}

/// What vGPU `id`'s worker tells over its control channel, dispatched to the daemon.
/// The events carry the generation of the worker they come from (the vGPU's current one
/// when they are set up), so a process vGPU's last worker's final report, come after the
/// next worker took over, adds to the counters instead of standing for the fresh worker's.
pub(super) fn worker_events(d: &Arc<Daemon>, id: u32) -> impl Fn(link::Event) + Send + 'static {
    let weak = Arc::downgrade(d);
    let generation = d
        .state
        .with(|i| i.vgpus.get(&id).map(|r| r.worker_generation()))
        .unwrap_or(0);
    move |e: link::Event| {
        let Some(d) = weak.upgrade() else { return };
        match e {
            link::Event::Connected => on_connected(&d.state, id),
            link::Event::Final(stats) => {
                stats::record_final(&d.state, &d.cfg, id, generation, stats)
            }
            link::Event::Memory(m) => memory::on_memory(&d, id, m),
            link::Event::Migration(p) => migration::on_migration_progress(&d, id, p),
            link::Event::Ask {
                id: ask_id,
                ask,
                fd: ask_fd,
            } => {
                tokio::spawn(async move {
                    let (answer, fd) = memory::answer(&d, id, ask, ask_fd).await;
                    if let Some(link) = d.state.link_of(id) {
                        if let Err(e) = link.tell(Ctl::Answer { to: ask_id, answer }, fd).await {
                            tracing::debug!(vgpu = id, error = %e, "answer not delivered");
                        }
                    }
                });
            }
        }
    }
}

/// Waits until vGPU `id`'s worker says it is ready (its socket is bound).
pub(super) async fn await_ready<T, E>(
    state: &State,
    id: u32,
    proc: &Proc,
    log: &Path,
    ready: impl std::future::Future<Output = Result<T, E>>,
) -> Result<(), ApiError> {
    match tokio::time::timeout(WORKER_START, ready).await {
        Ok(Ok(_pid)) => {
            state.with(|i| {
                if let Some(rec) = i.vgpus.get_mut(&id) {
                    if *rec.state() == VgpuState::Starting {
                        rec.mark_ready();
                    }
                }
            });
            state.notify();
            tracing::info!(vgpu = id, "worker ready");
            Ok(())
        }
        Ok(Err(_)) => {
            // The channel closed: the worker exited. Wait for the reaper's verdict.
            state
                .wait_until(Duration::from_secs(2), |i| i.worker_gone(id))
                .await;
            let why = match state.with(|i| i.vgpus.get(&id).map(|r| r.state().clone())) {
                Some(VgpuState::Failed { reason }) => reason,
                _ => format!("the worker exited before it was ready{}", log_tail(log)),
            };
            Err(ApiError::internal(why))
        }
        Err(_) => {
            proc.signal(libc::SIGKILL);
            Err(ApiError::internal(format!(
                "the worker did not bind its socket within {} s{}",
                WORKER_START.as_secs(),
                log_tail(log)
            )))
        }
    }
}

/// A VM's frontend connected to vGPU `vgpu`: the VM runs (a process vGPU is attached).
fn on_connected(state: &State, vgpu: u32) {
    state.with(|inner| {
        if let Some(rec) = inner.vgpus.get_mut(&vgpu) {
            // Starting too: an adopted worker says `connected` right after `ready`,
            // which may still be on its way through `await_ready`.
            if rec.process().is_some()
                && matches!(rec.state(), VgpuState::Ready | VgpuState::Starting)
            {
                rec.mark_attached();
                tracing::info!(vgpu, "a process connected to the vGPU");
            }
        }
        let vm = inner.vgpus.get(&vgpu).and_then(|r| r.vm());
        if let Some(vm) = vm.and_then(|v| inner.vms.get_mut(&v)) {
            if *vm.state() == VmState::Starting {
                vm.mark_running();
                tracing::info!(vm = vm.id(), vgpu, "VM running (its vGPU is connected)");
            }
        }
    });
    state.notify();
}

/// Worker `pid` of vGPU `id` exited (with `status`, when it was our child): the vGPU
/// lets go of everything it held.
pub(super) fn on_worker_exit(d: &Arc<Daemon>, id: u32, pid: u32, status: Option<ExitStatus>) {
    let Some((gpu, alive)) = d
        .state
        .with(|inner| worker_exited(d, inner, id, pid, status.as_ref()))
    else {
        return;
    };
    remove_dir(&d.cfg.state_dir, id);
    d.shm_lock().vgpu_gone(id, |gpu, group| {
        alive.iter().any(|(g, n)| *g == gpu && n == group)
    });
    memory::refresh_pool(d, gpu);
    d.persist.mark_dirty();
    d.state.notify();
    let next = d.state.with(|i| {
        i.vgpus.get(&id).is_some_and(|r| {
            r.process().is_some() && *r.state() == VgpuState::Starting && r.worker().is_none()
        })
    });
    if next {
        let d = d.clone();
        tokio::spawn(async move { process::next_worker(&d, id).await });
    }
}

/// [`on_worker_exit`] under the state lock: the record's new state, its VM
/// failed if it crashed. Returns its GPU and the share groups still alive per GPU, or
/// None when `pid` is not (or no longer) its worker.
fn worker_exited(
    d: &Daemon,
    inner: &mut Inner,
    id: u32,
    pid: u32,
    status: Option<&ExitStatus>,
) -> Option<(u32, Vec<(u32, String)>)> {
    let vm_running = inner
        .vgpus
        .get(&id)
        .and_then(|r| r.vm())
        .and_then(|v| inner.vms.get(&v))
        .is_some_and(|v| v.proc().is_some());
    let rec = inner.vgpus.get_mut(&id)?;
    if rec.worker().map(|w| w.proc.pid) != Some(pid) {
        return None;
    }
    rec.drop_worker();
    d.grants.detach(id, rec.gpu());
    for gpu in rec.pools() {
        d.memory.leave(gpu, id);
    }
    let gpu = rec.gpu();
    let vm = rec.vm();
    let new_state = match d.grants.expelled(id, rec.gpu()) {
        Some(reason) if *rec.state() != VgpuState::Released => VgpuState::Failed { reason },
        // Its process hung up, or the worker failed under it: the vGPU holds its
        // resources for the next process.
        _ if process::next_process(rec) => {
            if !status.is_none_or(ExitStatus::success) {
                let how = status.map_or_else(String::new, procs::describe);
                tracing::warn!(
                    vgpu = id,
                    pid,
                    how,
                    tail = log_tail(rec.log()),
                    "the worker failed under its process; a fresh worker serves the next one"
                );
            }
            VgpuState::Starting
        }
        _ => exit_state(rec, status, vm_running),
    };
    if let VgpuState::Failed { reason } = &new_state {
        tracing::warn!(vgpu = id, pid, %reason, "vGPU failed");
    } else {
        let how = status.map_or_else(|| "status unknown".into(), procs::describe);
        tracing::info!(vgpu = id, pid, how, "worker exited; vGPU released");
    }
    rec.end_worker(new_state.clone());
    if let (VgpuState::Failed { reason }, Some(vm_id)) = (&new_state, vm) {
        fail_vm(inner, vm_id, id, reason);
    }
    let alive: Vec<(u32, String)> = inner
        .vgpus
        .values()
        .filter(|r| r.id() != id && r.worker().is_some())
        .filter_map(|r| r.share_group().clone().map(|g| (r.gpu(), g)))
        .collect();
    Some((gpu, alive))
}

/// Asks worker `id` to shut down over its control channel; falls back to signals.
pub(super) async fn stop_worker(d: &Daemon, id: u32, p: &Proc, link: &Link) {
    let gone = |i: &Inner| i.worker_gone(id);
    match link.call(Ctl::Shutdown, STOP_GRACE).await {
        Ok(ReplyBody::ShuttingDown) => {
            if d.state.wait_until(STOP_GRACE * 2, gone).await {
                return;
            }
            tracing::warn!(vgpu = id, pid = p.pid, "worker did not exit after shutdown");
        }
        Ok(other) => tracing::warn!(vgpu = id, reply = ?other, "unexpected reply to shutdown"),
        Err(e) => {
            tracing::debug!(vgpu = id, error = %e, "shutdown over the control channel failed")
        }
    }
    stop_proc(&d.state, p, gone).await;
}

/// SIGTERM, then SIGKILL after the grace period, until `gone` holds.
pub(super) async fn stop_proc(state: &State, p: &Proc, mut gone: impl FnMut(&Inner) -> bool) {
    p.signal(libc::SIGTERM);
    if !state.wait_until(STOP_GRACE * 4, &mut gone).await {
        tracing::warn!(pid = p.pid, "did not stop after SIGTERM; sending SIGKILL");
        p.signal(libc::SIGKILL);
        state.wait_until(Duration::from_secs(2), gone).await;
    }
}

/// The state a vGPU is in once its worker exited with `status` (None: a worker adopted
/// after a vgpud restart, whose status only its parent sees; it counts as a clean exit
/// when its VM's vmm is gone too, see `adopt.rs`).
fn exit_state(rec: &VgpuRec, status: Option<&ExitStatus>, vm_running: bool) -> VgpuState {
    use std::os::unix::process::ExitStatusExt;
    let was = rec.state();
    let success = status.map_or(!vm_running, ExitStatus::success);
    // A worker exits 0 when its vmm disconnects (the VM ended; its exit may be reaped a
    // moment later) or when told to stop; anything else is a crash.
    if rec.stopping() || (*was == VgpuState::Attached && success) {
        return VgpuState::Released;
    }
    let how = match status {
        Some(s) if s.signal() == Some(libc::SIGSYS) => format!(
            "worker violated its seccomp filter: {}; vgpud's --worker-seccomp log lets it through for debugging",
            procs::describe(s)
        ),
        Some(s) if s.code() == Some(crate::control::EXIT_KERNEL_HARD_LIMIT) => {
            "a guest kernel ran past the worker's hard limit and its GPU context was given up; \
             the guest was answered KERNEL_FAULT (docs/scheduler.md, kernel deadlines)"
                .to_string()
        }
        Some(s) => procs::describe(s),
        None => "status unknown: it was adopted after a vgpud restart".into(),
    };
    let reason = match was {
        VgpuState::Starting => {
            format!(
                "the worker exited while starting ({how}){}",
                log_tail(rec.log())
            )
        }
        _ => format!(
            "the worker exited unexpectedly ({how}){}",
            log_tail(rec.log())
        ),
    };
    match was {
        VgpuState::Failed { reason } => VgpuState::Failed {
            reason: reason.clone(),
        },
        VgpuState::Released => VgpuState::Released,
        _ => VgpuState::Failed { reason },
    }
}

/// VM `vm_id` fails with its vGPU `vgpu`: its vmm is stopped.
fn fail_vm(inner: &mut Inner, vm_id: u32, vgpu: u32, reason: &str) {
    let Some(v) = inner.vms.get_mut(&vm_id) else {
        return;
    };
    if !v.state().is_live() {
        return;
    }
    v.fail(format!("its vGPU {vgpu} failed: {reason}"));
    if let Some(p) = v.proc() {
        terminate(p.clone());
    }
}

/// SIGTERM now, SIGKILL after the grace period.
pub(super) fn terminate(p: Proc) {
    p.signal(libc::SIGTERM);
    tokio::spawn(async move {
        tokio::time::sleep(STOP_GRACE).await;
        p.signal(libc::SIGKILL);
    });
}
