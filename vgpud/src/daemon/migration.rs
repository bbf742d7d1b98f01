//! Live migration of a vGPU between GPUs of this host: the checked command, the steps
//! that start one (is it movable, where to, does its memory fit there, the target's
//! scheduler), its progress, and its end (the GPU it left lets go).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use super::admission;
use super::core::{no_vgpu, Daemon};
use super::error::ApiError;
use super::gpu_memory::Memory;
use super::link::Link;
use super::memory;
use super::shm;
use super::state::{Inner, State, VgpuAsk, VgpuRec};
use crate::api::{self, VgpuState};
use crate::control::{
    Command as Ctl, MigrationDone, MigrationMode, MigrationProgress, ReplyBody, TargetGpu,
};
use crate::units::human_bytes;

/// How long a migration may take in all.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(600);
/// Pre-copy's downtime goal when the request gives none, ms.
pub const DEFAULT_MAX_DOWNTIME_MS: u64 = 50;

/// A migration request, checked: where to, how, and pre-copy's downtime goal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MigrateCommand {
    /// None: the least loaded other GPU with room.
    pub target_gpu: Option<u32>,
    pub mode: MigrationMode,
    /// 1 to 600 000 ms.
    pub max_downtime_ms: u64,
}

impl MigrateCommand {
    /// A pre-copy migration to `target_gpu` with the default downtime goal.
    pub fn to(target_gpu: Option<u32>) -> Self {
        Self {
            target_gpu,
            mode: MigrationMode::Precopy,
            max_downtime_ms: DEFAULT_MAX_DOWNTIME_MS,
        }
    }
}

/// The API's name of a migration mode.
pub fn mode_name(mode: MigrationMode) -> &'static str {
    match mode {
        MigrationMode::Precopy => "precopy",
        MigrationMode::StopCopy => "stop_copy",
    }
}

/// A migration that was admitted and recorded, ready to run.
struct Started {
    mid: u32,
    source: u32,
    target: u32,
    link: Link,
    target_gpu: TargetGpu,
}

/// Starts moving vGPU `id` to another GPU; the migration runs on.
pub async fn migrate_vgpu(
    d: &Arc<Daemon>,
    id: u32,
    cmd: MigrateCommand,
) -> Result<api::Migration, ApiError> {
    d.check_running()?;
    let s = d.state.with(|inner| begin_migration(d, inner, id, cmd))?;
    let fds = attach_target(d, s.mid, id, s.source, s.target)?;
    tracing::info!(
        vgpu = id,
        migration = s.mid,
        source = s.source,
        target = s.target,
        mode = ?cmd.mode,
        "migration started"
    );
    let mid = s.mid;
    run_migration(d, id, cmd, s, fds);
    migration(&d.state, mid)
}

/// Checks that vGPU `id` can move where `cmd` says, then records the migration and
/// counts its shares on the target. Caller holds the state lock.
fn begin_migration(
    d: &Daemon,
    inner: &mut Inner,
    id: u32,
    cmd: MigrateCommand,
) -> Result<Started, ApiError> {
    let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
    let link = movable(rec)?;
    check_no_shm(&d.shm_lock(), id)?;
    let source = rec.gpu();
    let target = pick_target(d, inner, rec, cmd.target_gpu)?;
    check_target_pool(&d.memory, rec, target)?;
    let g = d
        .gpu(target)
        .ok_or_else(|| ApiError::internal("target GPU vanished"))?;
    let target_gpu = TargetGpu {
        gpu: target,
        cuda_ordinal: g.cuda_ordinal,
        sim_memory: d.memory.sim_memory(g.memory, rec.oversubscribe()),
        sim_copy_bw: g.copy_bandwidth,
        sim_speed: g.speed,
        sim_threads: d.cfg.sim_threads,
    };
    // What the move will copy, as last measured, until the worker's first report.
    let allocated = rec.samples().back().map_or(0, |s| s.memory_used);
    let total_bytes = rec.memory_report().map_or(allocated, |m| m.resident);
    let mid = inner.next_migration;
    inner.next_migration += 1;
    d.persist.mark_dirty();
    begin_move(&d.memory, inner, id, target);
    inner.migrations.insert(
        mid,
        api::Migration {
            id: mid,
            vgpu: id,
            source_gpu: source,
            target_gpu: target,
            mode: mode_name(cmd.mode).into(),
            state: "running".into(),
            phase: "starting".into(),
            rounds: 0,
            bytes: 0,
            total_bytes,
            dirty_bytes: total_bytes,
            downtime_ms: None,
            elapsed_ms: 0.0,
            error: None,
            timeline: Vec::new(),
            host: None,
        },
    );
    Ok(Started {
        mid,
        source,
        target,
        link,
        target_gpu,
    })
}

/// Refuses to move a vGPU that maps shared device memory: the object lives on its GPU
/// (cuda: an allocation of that device; sim: the same rule, so both backends behave
/// alike) and every other mapper maps it there. Caller holds the state lock.
pub(super) fn check_no_shm(shm: &shm::Registry, id: u32) -> Result<(), ApiError> {
    let mapped = shm.mapped_by(id);
    if mapped.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = mapped.iter().map(u64::to_string).collect();
    Err(ApiError::conflict(
        "id",
        format!(
            "vGPU {id} maps shared device memory (objects {}) that lives on its GPU; it cannot migrate until the guest detaches them (SHM_DT)",
            ids.join(", ")
        ),
    ))
}

/// The GPU vGPU `rec` moves to: the one asked for if it fits there, else the least
/// committed other GPU it fits on.
fn pick_target(
    d: &Daemon,
    inner: &Inner,
    rec: &VgpuRec,
    asked: Option<u32>,
) -> Result<u32, ApiError> {
    let (id, source) = (rec.id(), rec.gpu());
    let ask = VgpuAsk {
        gpu: None,
        ..VgpuAsk::of(rec)
    };
    if let Some(t) = asked {
        if d.gpu(t).is_none() {
            return Err(d.no_gpu("target_gpu", t));
        }
        if t != source {
            if let Some(e) = admission::misfit(&d.cfg, inner, t, &ask, Some(id)) {
                return Err(ApiError::conflict(
                    "target_gpu",
                    format!(
                        "GPU {t} cannot take vGPU {id}; it stays on GPU {source}: {}",
                        e.error
                    ),
                ));
            }
        }
        return Ok(t);
    }
    let mut best: Option<(u32, u32)> = None;
    for g in d.gpu_indices() {
        if g != source && admission::misfit(&d.cfg, inner, g, &ask, Some(id)).is_none() {
            let load = inner.committed(g, None).compute;
            if best.is_none_or(|(_, l)| load < l) {
                best = Some((g, load));
            }
        }
    }
    best.map(|(g, _)| g).ok_or_else(|| {
        ApiError::conflict(
            "target_gpu",
            format!("no other GPU has room for vGPU {id}; it stays on GPU {source}"),
        )
    })
}

/// An oversubscribed vGPU's resident memory fits in the target's pool.
fn check_target_pool(memory: &Memory, rec: &VgpuRec, target: u32) -> Result<(), ApiError> {
    if !rec.oversubscribe() || target == rec.gpu() {
        return Ok(());
    }
    let resident = rec.memory_report().map_or(0, |m| m.resident);
    let pool = memory.figures(target);
    let free = pool.0.saturating_sub(pool.1);
    if resident > free {
        return Err(ApiError::conflict(
            "target_gpu",
            format!(
                "GPU {target} has {} free for oversubscribed vGPUs, vGPU {} holds {} resident; it stays on GPU {}",
                human_bytes(free),
                rec.id(),
                human_bytes(resident),
                rec.gpu()
            ),
        ));
    }
    Ok(())
}

/// The target GPU's scheduler takes the vGPU's shares; its grant channel rides to the
/// worker with the command (none when it stays on its GPU).
fn attach_target(
    d: &Arc<Daemon>,
    mid: u32,
    id: u32,
    source: u32,
    target: u32,
) -> Result<Vec<OwnedFd>, ApiError> {
    if target == source {
        return Ok(Vec::new());
    }
    // Read and attached in one step: a share change commits to every GPU that has a
    // channel for the vGPU, and one that has none yet reads the record here.
    let attached = d.state.with(|inner| {
        let r = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
        // Back to a GPU it left moments ago: its old channel there (kept for a grace
        // period) goes first.
        d.grants.detach(id, target);
        d.grants.attach(r, target)
    });
    match attached {
        Ok(f) => Ok(vec![f.page, f.doorbell]),
        Err(e) => {
            finish_migration(d, mid, id, Err(e.error.clone()), source, target);
            Err(e)
        }
    }
}

/// Tells the worker to migrate and records the outcome when it answers.
fn run_migration(d: &Arc<Daemon>, id: u32, cmd: MigrateCommand, s: Started, fds: Vec<OwnedFd>) {
    let grant_fds = !fds.is_empty();
    let d = d.clone();
    tokio::spawn(async move {
        let r = s
            .link
            .call_with_fds(
                Ctl::Migrate {
                    target: s.target_gpu,
                    mode: cmd.mode,
                    max_downtime_ms: cmd.max_downtime_ms,
                    grant_fds,
                },
                fds,
                MIGRATION_TIMEOUT,
            )
            .await;
        let r = match r {
            Ok(ReplyBody::Migrated { report }) => Ok(report),
            Ok(ReplyBody::Error { message }) => Err(message),
            Ok(other) => Err(format!("unexpected reply {other:?}")),
            Err(e) => Err(e),
        };
        finish_migration(&d, s.mid, id, r, s.source, s.target);
    });
}

/// Records that vGPU `id` is moving to GPU `target`: its shares count there from now
/// on, and an oversubscribed vGPU's memory joins the target's pool, because the copy
/// puts its resident bytes there and from the switch on its reservations are for that
/// GPU (vgpud hears of the switch only when the migration reports back). Caller holds
/// the state lock.
pub(super) fn begin_move(memory: &Memory, inner: &mut Inner, id: u32, target: u32) {
    let Some(rec) = inner.vgpus.get_mut(&id) else {
        return;
    };
    rec.begin_migration(target);
    memory.follow(rec, target);
}

/// Migration `mid` of vGPU `id` ended with `r`: the vGPU is on `target` (or still on
/// `source`), and the GPU it left lets its shares and memory go.
pub(super) fn finish_migration(
    d: &Arc<Daemon>,
    mid: u32,
    id: u32,
    r: Result<MigrationDone, String>,
    source: u32,
    target: u32,
) {
    let moved = r.is_ok();
    d.state.with(|inner| {
        record_outcome(inner, mid, id, &r, target);
        if source != target {
            // The GPU the vGPU left (or never reached) lets its shares and its memory
            // pool go in the same step (an oversubscribed vGPU joined the target's at
            // the start), so admission and the scheduler agree at every instant.
            let leave = if moved { source } else { target };
            let back = inner
                .vgpus
                .get(&id)
                .is_some_and(|r| r.pools().contains(&leave));
            if !back {
                d.grants.detach(id, leave);
                d.memory.leave(leave, id);
            }
        }
    });
    if source != target {
        memory::refresh_pool(d, source);
        memory::refresh_pool(d, target);
    }
    match &r {
        Ok(rep) => tracing::info!(
            vgpu = id,
            migration = mid,
            source,
            target,
            downtime_ms = rep.downtime_ms,
            total_ms = rep.elapsed_ms,
            "migration completed"
        ),
        Err(why) => tracing::warn!(vgpu = id, migration = mid, source, target, %why,
            "migration failed; the vGPU stays on its source"),
    }
    // Its GPU changed (or not): the state file says where it is.
    d.persist.mark_dirty();
    d.state.notify();
}

/// A worker's report on its running migration.
pub(super) fn on_migration_progress(d: &Daemon, id: u32, p: MigrationProgress) {
    d.state.with(|inner| {
        if let Some(m) = inner
            .migrations
            .values_mut()
            .rev()
            .find(|m| m.vgpu == id && m.state == "running")
        {
            if let Some(h) = &mut m.host {
                // A whole-VM move: the vGPU's part of it.
                d.host.vgpu_reported(id);
                h.vgpu_rounds = p.rounds;
                h.vgpu_bytes = p.bytes;
                m.bytes = h.vmm_bytes + p.bytes;
                return;
            }
            m.phase = p.phase;
            m.rounds = p.rounds;
            m.bytes = p.bytes;
            m.total_bytes = p.total;
            m.dirty_bytes = p.dirty;
            m.elapsed_ms = p.elapsed_ms;
        }
    });
}

/// One migration.
pub fn migration(state: &State, id: u32) -> Result<api::Migration, ApiError> {
    state
        .with(|i| i.migrations.get(&id).cloned())
        .ok_or_else(|| {
            ApiError::not_found(
                "id",
                format!("no migration {id}; list them with GET /v1/migrations"),
            )
        })
}

/// Every migration.
pub fn migrations(state: &State) -> Vec<api::Migration> {
    state.with(|i| i.migrations.values().cloned().collect())
}

/// A live vGPU's worker channel, or why it cannot migrate now.
fn movable(rec: &VgpuRec) -> Result<Link, ApiError> {
    let id = rec.id();
    if !matches!(rec.state(), VgpuState::Ready | VgpuState::Attached) || rec.worker().is_none() {
        return Err(ApiError::conflict(
            "id",
            format!(
                "vGPU {id} is not running (state {:?}); only a live vGPU migrates",
                rec.state()
            ),
        ));
    }
    if rec.migrating_to().is_some() {
        return Err(ApiError::conflict(
            "id",
            format!("vGPU {id} is already migrating; follow GET /v1/migrations"),
        ));
    }
    rec.link()
        .ok_or_else(|| ApiError::conflict("id", format!("vGPU {id} has no worker")))
}

/// Migration `mid`'s record and vGPU `id`'s GPU after it ended with `r`.
fn record_outcome(
    inner: &mut Inner,
    mid: u32,
    id: u32,
    r: &Result<MigrationDone, String>,
    target: u32,
) {
    if let Some(rec) = inner.vgpus.get_mut(&id) {
        rec.end_migration(r.is_ok().then_some(target));
    }
    let Some(m) = inner.migrations.get_mut(&mid) else {
        return;
    };
    match r {
        Ok(rep) => {
            m.state = "completed".into();
            m.phase = "done".into();
            m.rounds = rep.rounds;
            m.bytes = rep.precopy_bytes + rep.stop_bytes;
            m.total_bytes = rep.total;
            m.dirty_bytes = 0;
            m.downtime_ms = Some(rep.downtime_ms);
            m.elapsed_ms = rep.elapsed_ms;
            m.timeline = rep
                .timeline
                .iter()
                .map(|(p, a, b)| api::MigrationSpan {
                    phase: p.clone(),
                    start_ms: *a,
                    end_ms: *b,
                })
                .collect();
        }
        Err(why) => {
            m.state = "failed".into();
            m.error = Some(why.clone());
        }
    }
}
