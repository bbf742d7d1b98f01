//! The worker pool: a few workers per GPU started ahead of need (`--worker-pool`, 2 per
//! cuda GPU and 0 per sim GPU by default). A pool worker (`vgpu-worker --pool`) has built
//! its GPU backend (a cuda worker: its context, its reserved address space and the
//! built-in kernels, JIT-compiled while it idles) and waits on its control channel. A new
//! vGPU without storage namespaces and without memory oversubscription takes one: vgpud
//! renames the pool worker's private directory to the vGPU's (`workers/<id>/`, the worker's
//! working directory, so its relative paths follow), binds the vGPU's vhost-user socket
//! and the control socket, and sends `assign` with the vGPU's id, memory share, queues and
//! shares, its grant page, doorbell and the two listening sockets riding on the line; the
//! worker answers `assigned`. vgpud then starts
//! a replacement in the background (never under the state lock). A pool worker that
//! does not answer within [`ASSIGN_TIMEOUT`] is killed and the vGPU gets a fresh worker.
//!
//! Identity (docs/hostile.md, "Worker pool"): a pool worker's uid and directory are fixed
//! when it starts: slot S runs as `--worker-uid-base - 1 - S` (below the vGPUs' range) in
//! `workers/pool-S/` (0700, its own). A slot is reused only once its worker exited, no
//! process runs under its uid and no directory under `workers/` is owned by it (a worker
//! adopted after a restart keeps the uid it started with). Pool workers hold no tenant: they are killed when vgpud
//! stops and never adopted; one that dies idle is replaced, with a backoff after failures.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::VgpuState;
use crate::control::{Command as Ctl, ReplyBody};
use crate::daemon::config::Config;
use crate::daemon::core::Daemon;
use crate::daemon::core::WORKER_START;
use crate::daemon::link;
use crate::daemon::locks::{Rank, Ranked};
use crate::daemon::memory;
use crate::daemon::procs::{self, Identity, Proc};
use crate::daemon::spares::{Owner, Route, Spare};
use crate::daemon::state::{State, WorkerHandle};
use crate::daemon::worker_files::{self, log_tail};

/// How long a pool worker may take to bind its socket once assigned; past it the vGPU
/// gets a fresh worker.
pub(in crate::daemon) const ASSIGN_TIMEOUT: Duration = Duration::from_secs(3);
/// Most pool slots: pool slot S runs as `--worker-uid-base - 1 - S`, below the uids of
/// vGPUs' own workers (vGPU N runs as base + N), so the two ranges never meet.
pub(in crate::daemon) const MAX_SLOTS: u32 = 1_000_000;
/// Pool workers one GPU starts at a time: the driver creates one GPU's contexts one after
/// another anyway, and a refill must not take the cores a burst of launches needs.
const MAX_STARTING: usize = 4;

/// Pool slot `slot`'s private directory and log.
fn slot_dir(state_dir: &Path, slot: u32) -> PathBuf {
    state_dir.join("workers").join(format!("pool-{slot}"))
}

fn slot_log(state_dir: &Path, slot: u32) -> PathBuf {
    state_dir.join(format!("pool-{slot}.log"))
}

/// The uids owning a directory under `<state dir>/workers/` now.
fn dir_owners(state_dir: &Path) -> BTreeSet<u32> {
    std::fs::read_dir(state_dir.join("workers"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.uid())
                .collect()
        })
        .unwrap_or_default()
}

/// How many idle workers GPU `gpu` keeps.
pub(in crate::daemon) fn pool_target(d: &Daemon, gpu: u32) -> usize {
    let cuda = d.gpu(gpu).is_some_and(|g| g.cuda_ordinal.is_some());
    d.cfg.workers.pool.unwrap_or(if cuda { 2 } else { 0 })
}

/// Idle pool workers per GPU now (for the metrics).
pub(in crate::daemon) fn pool_sizes(d: &Daemon) -> Vec<(u32, usize)> {
    let p = d.spares.lock();
    (0..u32::try_from(d.cfg.gpus.len()).unwrap_or(u32::MAX))
        .map(|g| (g, p.gpus.get(&g).map_or(0, |q| q.idle.len())))
        .collect()
}

/// The identity pool slot `slot` runs under (when vgpud is root).
fn slot_identity(cfg: &Config, slot: u32) -> Option<Identity> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if slot >= MAX_SLOTS {
        return None;
    }
    let uid = cfg.workers.uid_base?.checked_sub(1)?.checked_sub(slot)?;
    root.then_some(Identity { uid, gid: uid })
}

/// Starts pool workers until every GPU's pool is full (at start-up).
pub(in crate::daemon) fn fill_pools(d: &Arc<Daemon>) {
    for gpu in 0..u32::try_from(d.cfg.gpus.len()).unwrap_or(0) {
        if pool_target(d, gpu) > 0 {
            tracing::info!(gpu, size = pool_target(d, gpu), "worker pool");
        }
        refill(d, gpu);
    }
}

/// Starts pool workers for GPU `gpu` until its pool is full, unless a backoff is on
/// (then once it is over).
pub(in crate::daemon) fn refill(d: &Arc<Daemon>, gpu: u32) {
    if d.is_shutting_down() {
        return;
    }
    let target = pool_target(d, gpu);
    let (start, wait) = {
        let mut p = d.spares.lock();
        let q = p.gpus.entry(gpu).or_default();
        let now = Instant::now();
        match q.retry_at.filter(|t| *t > now) {
            Some(_) if q.timer => (0, None),
            Some(t) => {
                q.timer = true;
                (0, Some(t - now))
            }
            None => {
                let n = target
                    .saturating_sub(q.idle.len() + q.starting)
                    .min(MAX_STARTING.saturating_sub(q.starting));
                q.starting += n;
                (n, None)
            }
        }
    };
    for _ in 0..start {
        let d = d.clone();
        tokio::spawn(async move { start_spare(&d, gpu).await });
    }
    if let Some(wait) = wait {
        let d = d.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if let Some(q) = d.spares.lock().gpus.get_mut(&gpu) {
                q.timer = false;
            }
            refill(&d, gpu);
        });
    }
}

/// Starts one pool worker for GPU `gpu` (counted in its pool's `starting`).
async fn start_spare(d: &Arc<Daemon>, gpu: u32) {
    let started = spawn_spare(d, gpu).await;
    let ok = started.is_ok();
    add_spare(d, gpu, started);
    if ok {
        // The next ones, if the pool is not full yet.
        refill(d, gpu);
    }
}

/// Counts a finished start of a pool worker for GPU `gpu`: idle in its pool, or a
/// failure that backs the next start off.
fn add_spare(d: &Arc<Daemon>, gpu: u32, started: Result<Spare, String>) {
    let mut p = d.spares.lock();
    let q = p.gpus.entry(gpu).or_default();
    q.starting = q.starting.saturating_sub(1);
    match started {
        Ok(spare) if !d.is_shutting_down() => {
            q.failures = 0;
            q.retry_at = None;
            tracing::debug!(
                gpu,
                slot = spare.slot,
                pid = spare.proc.pid,
                "pool worker ready"
            );
            q.idle.push_back(spare);
        }
        Ok(spare) => spare.proc.signal(libc::SIGKILL),
        Err(why) => {
            let backoff = q.back_off();
            tracing::warn!(gpu, %why, failures = q.failures,
                retry_ms = backoff.as_millis() as u64, "cannot start a pool worker");
            drop(p);
            refill(d, gpu);
        }
    }
}

/// Picks a free slot, prepares its directory and log, spawns the pool worker and
/// waits until it has built its GPU backend.
async fn spawn_spare(d: &Arc<Daemon>, gpu_index: u32) -> Result<Spare, String> {
    let gpu = d
        .gpu(gpu_index)
        .ok_or_else(|| format!("GPU {gpu_index} is unknown"))?
        .clone();
    let state_dir = d.cfg.state_dir.clone();
    // A slot's uid is taken only while nothing runs under it and no directory is
    // its: nothing of its previous holder meets the next.
    let owners = {
        let s = state_dir.clone();
        tokio::task::spawn_blocking(move || {
            let mut o = dir_owners(&s);
            o.extend(procs::running_uids());
            o
        })
        .await
        .map_err(|e| e.to_string())?
    };
    let slot = {
        let mut p = d.spares.lock();
        let free = (0..MAX_SLOTS).find(|s| {
            !p.slots.contains(s)
                && slot_identity(&d.cfg, *s).is_none_or(|i| !owners.contains(&i.uid))
        });
        let Some(free) = free else {
            return Err(format!("all {MAX_SLOTS} pool slots are taken"));
        };
        p.slots.insert(free);
        free
    };
    let identity = slot_identity(&d.cfg, slot);
    spawn_in_slot(d, gpu_index, &gpu, slot, identity, &state_dir)
        .await
        .map_err(|(why, spawned)| {
            // A process that was spawned frees its slot when its reaper sees it gone.
            if !spawned {
                d.spares.lock().slots.remove(&slot);
                remove_slot_files(&state_dir, slot);
            }
            why
        })
}

async fn spawn_in_slot(
    d: &Arc<Daemon>,
    gpu_index: u32,
    gpu: &crate::daemon::config::GpuConfig,
    slot: u32,
    identity: Option<Identity>,
    state_dir: &Path,
) -> Result<Spare, (String, bool)> {
    let not_spawned = |why: String| (why, false);
    let dir = slot_dir(state_dir, slot);
    let log = slot_log(state_dir, slot);
    let (s, wd, l) = (state_dir.to_owned(), dir.clone(), log.clone());
    let log_file = tokio::task::spawn_blocking(move || {
        worker_files::prepare_dir(&s, &wd, identity)
            .map_err(|e| format!("cannot prepare {}: {e}", wd.display()))?;
        crate::daemon::private::create_file(&l)
            .map_err(|e| format!("cannot create {}: {e}", l.display()))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(not_spawned)?;
    let mut cmd = Command::new(&d.cfg.worker_bin);
    cmd.arg("--pool");
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
                &d.memory.sim_memory(gpu.memory, false).to_string(),
            ])
            .args(["--sim-copy-bw", &gpu.copy_bandwidth.to_string()])
            .args(["--sim-speed", &gpu.speed.to_string()])
            .args(["--sim-threads", &d.cfg.sim_threads.to_string()]);
        }
    }
    cmd.arg("--shm");
    super::sandbox_args(&d.cfg, &mut cmd);
    cmd.current_dir(&dir);
    worker_files::worker_env(&mut cmd);
    let (ours, theirs) = procs::socketpair()
        .map_err(|e| not_spawned(format!("cannot create a control socket: {e}")))?;
    let (child, proc) =
        procs::spawn_sealed_off_runtime(cmd, log_file, Some(theirs), Vec::new(), identity)
            .await
            .map_err(|e| {
                not_spawned(format!(
                    "cannot start {}: {e}; check vgpud's --worker-bin",
                    d.cfg.worker_bin.display()
                ))
            })?;
    let route = Arc::new(Route {
        owner: Ranked::new(Rank::PoolOwner, Owner::Idle),
        events: Ranked::new(Rank::PoolEvents, None),
    });
    let r = route.clone();
    let on_event = move |e: link::Event| {
        if let Some(f) = r.events.lock().as_ref() {
            f(e);
        }
    };
    let d = d.clone();
    let (r, p) = (route.clone(), proc.clone());
    tokio::spawn(async move {
        let status = procs::reap(child, &p).await;
        // Nothing of it meets the next worker of its slot's uid.
        procs::clear_leftovers(p.pid, identity).await;
        on_spare_exit(&d, gpu_index, slot, &p, &r, status);
    });
    let (link, ready) =
        link::start(std::os::unix::net::UnixStream::from(ours), on_event).map_err(|e| {
            proc.signal(libc::SIGKILL);
            (format!("control channel: {e}"), true)
        })?;
    match tokio::time::timeout(WORKER_START, ready).await {
        Ok(Ok(_)) => Ok(Spare {
            slot,
            gpu: gpu_index,
            proc,
            link,
            route,
        }),
        Ok(Err(_)) => Err((
            format!("the pool worker exited while starting{}", log_tail(&log)),
            true,
        )),
        Err(_) => {
            proc.signal(libc::SIGKILL);
            Err((
                format!(
                    "the pool worker was not ready within {} s{}",
                    WORKER_START.as_secs(),
                    log_tail(&log)
                ),
                true,
            ))
        }
    }
}

/// Pool worker `proc` of slot `slot` exited with `status`.
fn on_spare_exit(
    d: &Arc<Daemon>,
    gpu: u32,
    slot: u32,
    proc: &Proc,
    route: &Route,
    status: ExitStatus,
) {
    let owner = {
        let mut o = route.owner.lock();
        match &*o {
            Owner::Assigning => {
                *o = Owner::Exited(status);
                None
            }
            Owner::Idle => Some(None),
            Owner::Vgpu(id) => Some(Some(*id)),
            Owner::Exited(_) | Owner::Discarded => Some(None),
        }
    };
    // Assigning: the assigner sees the exit and releases the slot.
    let Some(vgpu) = owner else { return };
    let idle = {
        let mut p = d.spares.lock();
        p.slots.remove(&slot);
        let q = p.gpus.entry(gpu).or_default();
        let before = q.idle.len();
        q.idle.retain(|s| s.proc.pid != proc.pid);
        before != q.idle.len()
    };
    match vgpu {
        Some(id) => super::on_worker_exit(d, id, proc.pid, Some(status)),
        None => {
            remove_slot_files(&d.cfg.state_dir, slot);
            if idle && !d.is_shutting_down() {
                tracing::warn!(
                    gpu,
                    slot,
                    pid = proc.pid,
                    how = procs::describe(&status),
                    "an idle pool worker exited; replacing it"
                );
                let mut p = d.spares.lock();
                p.gpus.entry(gpu).or_default().back_off();
                drop(p);
                refill(d, gpu);
            }
        }
    }
}

/// An idle pool worker for vGPU `id`, when its GPU has one and the vGPU can use it
/// (no storage namespaces, no memory oversubscription: those are fixed when a
/// worker's GPU backend is built).
pub(in crate::daemon) fn take_spare(d: &Daemon, id: u32) -> Option<Spare> {
    // A vGPU arriving from another host needs a worker started to receive its state
    // (`--migrate-in`), which a pool worker is not.
    if d.host.worker(id).is_some() {
        return None;
    }
    let gpu = d.state.with(|i| {
        i.vgpus
            .get(&id)
            .filter(|r| r.storage().is_empty() && !r.oversubscribe())
            .map(|r| r.gpu())
    })?;
    d.spares.lock().gpus.get_mut(&gpu)?.idle.pop_front()
}

/// Hands vGPU `id` to pool worker `spare`: its directory becomes the vGPU's, it gets
/// the vGPU's configuration and grant channel, and answers once its socket is bound.
/// On any failure the pool worker is killed and the vGPU holds nothing of it.
pub(in crate::daemon) async fn assign_spare(
    d: &Arc<Daemon>,
    id: u32,
    spare: Spare,
) -> Result<(), String> {
    let gpu = spare.gpu;
    refill(d, gpu);
    let t = Instant::now();
    let got = d.state.with(|inner| {
        let rec = inner
            .vgpus
            .get(&id)
            .ok_or_else(|| format!("vGPU {id} vanished while starting"))?;
        let fds = d.grants.attach(rec, rec.gpu()).map_err(|e| e.error)?;
        let cmd = Ctl::Assign {
            vgpu_id: id,
            memory: rec.memory(),
            queues: rec.queues(),
            compute_share: rec.compute(),
            copy_share: rec.copy(),
            priority: rec.priority(),
        };
        let sockets = (rec.socket().clone(), rec.process().clone());
        Ok::<_, String>((fds, cmd, rec.log().clone(), sockets))
    });
    let (fds, cmd, log, (vhost, hand_over)) = match got {
        Ok(v) => v,
        Err(e) => {
            let _ = discard(d, &spare);
            return Err(e);
        }
    };
    memory::refresh_pool(d, gpu);
    {
        let mut o = spare.route.owner.lock();
        if !matches!(*o, Owner::Idle) {
            drop(o);
            d.grants.detach(id, gpu);
            let _ = discard(d, &spare);
            return Err("the pool worker exited".into());
        }
        *o = Owner::Assigning;
    }
    let state_dir = d.cfg.state_dir.clone();
    let (from, to) = (
        slot_dir(&state_dir, spare.slot),
        worker_files::worker_dir(&state_dir, id),
    );
    // Its directory becomes the vGPU's, and vgpud binds the sockets the worker serves
    // (it gets the listening descriptors with the assignment).
    let moved = tokio::task::spawn_blocking(move || {
        match std::fs::remove_dir_all(&to) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("cannot move the pool worker's directory: {e}"))
            }
            _ => {}
        }
        std::fs::rename(&from, &to)
            .map_err(|e| format!("cannot move the pool worker's directory: {e}"))?;
        worker_files::bind_sockets(&to, &vhost, hand_over.as_ref())
            .map_err(|e| format!("cannot bind the worker's sockets: {e}"))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let (vhost_fd, control_fd) = match moved {
        Ok(v) => v,
        Err(e) => {
            d.grants.detach(id, gpu);
            let _ = discard(d, &spare);
            return Err(e);
        }
    };
    *spare.route.events.lock() = Some(Box::new(super::worker_events(d, id)));
    d.state.with(|i| {
        if let Some(rec) = i.vgpus.get_mut(&id) {
            rec.worker_started(WorkerHandle {
                proc: spare.proc.clone(),
                link: spare.link.clone(),
            });
        }
    });
    let reply = spare
        .link
        .call_with_fds(
            cmd,
            vec![fds.page, fds.doorbell, vhost_fd, control_fd],
            ASSIGN_TIMEOUT,
        )
        .await;
    let why = match reply {
        Ok(ReplyBody::Assigned { .. }) => {
            let mut o = spare.route.owner.lock();
            if matches!(*o, Owner::Assigning) {
                *o = Owner::Vgpu(id);
                drop(o);
                let _ = std::fs::rename(slot_log(&state_dir, spare.slot), &log);
                pool_ready(&d.state, id, spare.proc.pid, t);
                return Ok(());
            }
            "the pool worker exited right after it took the vGPU".to_string()
        }
        Ok(ReplyBody::Error { message }) => message,
        Ok(other) => format!("unexpected answer {other:?}"),
        Err(e) => e,
    };
    // Take it back: the record, the grants, the process.
    d.state.with(|i| {
        if let Some(rec) = i.vgpus.get_mut(&id) {
            if rec.worker().map(|w| w.proc.pid) == Some(spare.proc.pid) {
                rec.drop_worker();
            }
        }
    });
    d.grants.detach(id, gpu);
    *spare.route.events.lock() = None;
    let tail = log_tail(&slot_log(&state_dir, spare.slot));
    let how = discard(d, &spare)
        .map(|s| format!(" (it exited: {})", procs::describe(&s)))
        .unwrap_or_default();
    Err(format!("{why}{how}{tail}"))
}

/// vGPU `id`'s pool worker `pid` answered `assigned`: the vGPU is ready.
fn pool_ready(state: &State, id: u32, pid: u32, since: Instant) {
    state.with(|i| {
        if let Some(rec) = i.vgpus.get_mut(&id) {
            if *rec.state() == VgpuState::Starting {
                rec.mark_ready();
            }
        }
    });
    state.notify();
    tracing::info!(
        vgpu = id,
        pid,
        assign_ms = since.elapsed().as_secs_f64() * 1e3,
        "worker ready (from the pool)"
    );
}

/// Kills pool worker `spare` for good (a failed assignment) and frees its slot once
/// it is gone.
/// Returns how it exited when it had exited already.
fn discard(d: &Daemon, spare: &Spare) -> Option<ExitStatus> {
    let exited = {
        let mut o = spare.route.owner.lock();
        match std::mem::replace(&mut *o, Owner::Discarded) {
            Owner::Exited(status) => Some(status),
            _ => None,
        }
    };
    spare.proc.signal(libc::SIGKILL);
    if exited.is_some() {
        // Its reaper ran already and left the slot to us.
        d.spares.lock().slots.remove(&spare.slot);
        remove_slot_files(&d.cfg.state_dir, spare.slot);
    }
    exited
}

/// Kills every idle pool worker (vgpud stops: they hold no tenant and are never
/// adopted) and removes their directories.
pub(in crate::daemon) fn stop_pools(d: &Daemon) {
    let idle: Vec<Spare> = {
        let mut p = d.spares.lock();
        p.gpus.values_mut().flat_map(|q| q.idle.drain(..)).collect()
    };
    for s in &idle {
        s.proc.signal(libc::SIGKILL);
        remove_slot_files(&d.cfg.state_dir, s.slot);
    }
    if !idle.is_empty() {
        tracing::info!(workers = idle.len(), "idle pool workers stopped");
    }
}

/// Removes pool slot `slot`'s directory and log.
fn remove_slot_files(state_dir: &Path, slot: u32) {
    let _ = std::fs::remove_dir_all(slot_dir(state_dir, slot));
    let _ = std::fs::remove_file(slot_log(state_dir, slot));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_live_beside_the_vgpus_directories() {
        let s = Path::new("/run/vgpud");
        assert_eq!(slot_dir(s, 3), Path::new("/run/vgpud/workers/pool-3"));
        assert_eq!(slot_log(s, 3), Path::new("/run/vgpud/pool-3.log"));
    }
}
