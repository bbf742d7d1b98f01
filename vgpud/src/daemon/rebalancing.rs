//! Demand monitoring and the rebalancer task (placement of new vGPUs is in `rebalancer.rs`): the
//! daemon's side of `vgpu_scheduler::rebalance` (the policy, pure and tested in virtual
//! time). See docs/rebalance.md.
//!
//! Demand comes from the grant path, which every copy and kernel passes through already:
//! each GPU's scheduler accounts a vGPU's busy time per engine, and its grant server the
//! time the vGPU had requests waiting for a grant (two additions per scheduler event). A
//! round reads those counters (one lock per vGPU), so monitoring costs nothing per request
//! beyond that accounting.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::core::Daemon;
use super::migration;
use super::migration::MigrateCommand;
use super::rebalancer::{gpu_views, Baseline, Raw, State};
use crate::api::{self, VgpuState};
use vgpu_grant::VgpuUsage;
use vgpu_scheduler::rebalance::{Decision, Demand, Mode, Note, VgpuView};

fn event(at_ms: u64, kind: &str, gpu: Option<u32>, reason: String) -> api::RebalanceEvent {
    api::RebalanceEvent {
        id: 0,
        at_ms,
        kind: kind.into(),
        gpu,
        vgpu: None,
        target_gpu: None,
        load: None,
        load_after: None,
        bytes: None,
        migration: None,
        reason,
    }
}

fn frac(delta: u64, dt_ns: f64) -> f64 {
    if dt_ns > 0.0 {
        (delta as f64 / dt_ns).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// What a round needs to know of one vGPU.
struct Seen {
    view: VgpuView,
}

/// Measures and decides every `rebalance_interval`, for the life of the daemon.
pub(super) async fn rebalancer(d: Arc<Daemon>) {
    let mut tick = tokio::time::interval(d.cfg.rebalance_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if d.is_shutting_down() {
            return;
        }
        rebalance_round(&d).await;
    }
}

/// One round: what the vGPUs did since the last round, what the policy makes of it,
/// and the moves it decided (started unless the rebalancer only observes).
async fn rebalance_round(d: &Arc<Daemon>) {
    let (views, seen, migrating, outcomes) = d.state.with(|inner| {
        // Where the migrations it started stand (read before its own lock: lock order).
        let outcomes: BTreeMap<u32, api::Migration> = {
            let rb = d.rb();
            rb.following
                .iter()
                .filter_map(|(mid, _)| inner.migrations.get(mid).map(|m| (*mid, m.clone())))
                .collect()
        };
        let views = gpu_views(&d.cfg, inner, &d.memory);
        let migrating = inner.vgpus.values().any(|v| v.migrating_to().is_some());
        let seen: Vec<Seen> = inner
            .vgpus
            .values()
            .filter(|v| v.holds_resources())
            .map(|v| {
                let allocated = v.samples().back().map_or(0, |s| s.memory_used);
                Seen {
                    view: VgpuView {
                        id: v.id(),
                        gpu: v.gpu(),
                        memory: v.memory(),
                        compute: v.compute(),
                        copy: v.copy(),
                        oversubscribe: v.oversubscribe(),
                        resident: v.memory_report().map_or(allocated, |m| m.resident),
                        demand: None,
                        movable: matches!(v.state(), VgpuState::Ready | VgpuState::Attached)
                            && v.worker().is_some()
                            && v.migrating_to().is_none()
                            && v.share_group().is_none(),
                    },
                }
            })
            .collect();
        (views, seen, migrating, outcomes)
    });
    // The grant servers' counters (one lock each), outside the daemon's lock.
    let usage: Vec<Option<VgpuUsage>> = seen
        .iter()
        .map(|s| d.grants.get(s.view.gpu).and_then(|g| g.usage(s.view.id)))
        .collect();
    let now = Instant::now();
    let (decisions, mode) = {
        let mut rb = d.rb();
        let vgpus = measure(&mut rb, &seen, usage, now, migrating);
        let t = u64::try_from(now.duration_since(rb.started).as_nanos()).unwrap_or(u64::MAX);
        let round = rb.policy.observe(t, &views, &vgpus);
        let dt = rb.last_round.map_or(0, |l| {
            u64::try_from(now.duration_since(l).as_nanos()).unwrap_or(0)
        });
        rb.last_round = Some(now);
        let overload = rb.policy.config().overload;
        for l in &round.loads {
            let i = l.index as usize;
            if l.load > overload {
                if let Some(o) = rb.overload_ns.get_mut(i) {
                    *o += dt;
                }
            }
            if l.idle {
                if let Some(o) = rb.idle_ns.get_mut(i) {
                    *o += dt;
                }
            }
        }
        let at = rb.ms(now);
        record_notes(&mut rb, at, round.notes);
        let decided = record_decisions(&mut rb, at, round.decisions);
        follow_migrations(&mut rb, at, &outcomes);
        (decided, rb.policy.config().mode)
    };
    if mode == Mode::Off {
        return;
    }
    for (decision, eid) in decisions {
        start_rebalance_move(d, &decision, eid).await;
    }
}

async fn start_rebalance_move(d: &Arc<Daemon>, dec: &Decision, eid: u64) {
    let r = migration::migrate_vgpu(d, dec.vgpu, MigrateCommand::to(Some(dec.to))).await;
    let mut rb = d.rb();
    match r {
        Ok(m) => {
            rb.migrations += 1;
            rb.following.push((m.id, eid));
            if let Some(e) = rb.events.iter_mut().rev().find(|e| e.id == eid) {
                e.migration = Some(m.id);
            }
        }
        Err(e) => {
            rb.policy.failed(dec);
            let at = rb.ms(Instant::now());
            let mut ev = event(
                at,
                "failed",
                Some(dec.from),
                format!(
                    "vGPU {} stays on GPU {}: the migration to GPU {} was refused: {}",
                    dec.vgpu, dec.from, dec.to, e.error
                ),
            );
            ev.vgpu = Some(dec.vgpu);
            ev.target_gpu = Some(dec.to);
            rb.push(ev);
        }
    }
}

/// The rebalancer's settings and measurements (`GET /v1/rebalancer`).
pub fn rebalancer_status(d: &Daemon) -> api::RebalancerStatus {
    let alloc: BTreeMap<u32, (u64, u64, u64)> = d.state.with(|inner| {
        inner
            .vgpus
            .values()
            .filter(|v| v.holds_resources())
            .map(|v| {
                let allocated = v.samples().back().map_or(0, |s| s.memory_used);
                (
                    v.id(),
                    (
                        v.memory_report().map_or(allocated, |m| m.resident),
                        allocated,
                        v.memory(),
                    ),
                )
            })
            .collect()
    });
    let views = d.state.with(|inner| gpu_views(&d.cfg, inner, &d.memory));
    let rb = d.rb();
    let cfg = rb.policy.config();
    let loads = rb.policy.loads();
    let gpus: Vec<api::GpuDemand> = loads
        .iter()
        .map(|l| api::GpuDemand {
            gpu: l.index,
            compute_demand: l.compute,
            copy_demand: l.copy,
            load: l.load,
            overloaded: l.overloaded,
            idle: l.idle,
            vgpus: l.vgpus,
            overload_ms: rb.overload_ns.get(l.index as usize).copied().unwrap_or(0) / 1_000_000,
            idle_ms: rb.idle_ns.get(l.index as usize).copied().unwrap_or(0) / 1_000_000,
        })
        .collect();
    let vgpus = rb
        .baselines
        .iter()
        .map(|(&id, b)| {
            let raw = rb.raw.get(&id).copied().unwrap_or_default();
            let demand = views
                .iter()
                .find(|g| g.index == b.gpu)
                .and_then(|g| rb.policy.demand_on(id, g))
                .unwrap_or_default();
            let (resident, allocated, share) = alloc.get(&id).copied().unwrap_or_default();
            api::VgpuDemand {
                vgpu: id,
                gpu: b.gpu,
                compute_busy: raw.compute_busy,
                compute_wait: raw.compute_wait,
                copy_busy: raw.copy_busy,
                copy_wait: raw.copy_wait,
                compute_demand: demand.compute,
                copy_demand: demand.copy,
                memory_resident_bytes: resident,
                memory_allocated_bytes: allocated,
                memory_share_bytes: share,
            }
        })
        .collect();
    api::RebalancerStatus {
        mode: cfg.mode.name().into(),
        interval_ms: u64::try_from(d.cfg.rebalance_interval.as_millis()).unwrap_or(u64::MAX),
        window_ms: cfg.window / 1_000_000,
        overload: cfg.overload,
        migrations: rb.migrations,
        idle_gpus: loads.iter().filter(|l| l.idle).map(|l| l.index).collect(),
        gpus,
        vgpus,
    }
}

/// Each seen vGPU with its demand since the last round (from the grant servers'
/// counters `usage`); the baselines move on.
fn measure(
    rb: &mut State,
    seen: &[Seen],
    usage: Vec<Option<VgpuUsage>>,
    now: Instant,
    migrating: bool,
) -> Vec<VgpuView> {
    let mut vgpus = Vec::with_capacity(seen.len());
    for (s, u) in seen.iter().zip(usage) {
        let mut v = s.view;
        // A round during a migration measures but moves nothing.
        v.movable &= !migrating;
        if let Some(u) = u {
            let prev = rb.baselines.insert(
                v.id,
                Baseline {
                    gpu: v.gpu,
                    usage: u,
                    at: now,
                },
            );
            if let Some(b) = prev.filter(|b| {
                b.gpu == v.gpu
                    && u.compute_busy_ns >= b.usage.compute_busy_ns
                    && u.copy_busy_ns >= b.usage.copy_busy_ns
                    && u.compute_wait_ns >= b.usage.compute_wait_ns
                    && u.copy_wait_ns >= b.usage.copy_wait_ns
            }) {
                let dt = now.duration_since(b.at).as_nanos() as f64;
                let raw = Raw {
                    compute_busy: frac(u.compute_busy_ns - b.usage.compute_busy_ns, dt),
                    compute_wait: frac(u.compute_wait_ns - b.usage.compute_wait_ns, dt),
                    copy_busy: frac(u.copy_busy_ns - b.usage.copy_busy_ns, dt),
                    copy_wait: frac(u.copy_wait_ns - b.usage.copy_wait_ns, dt),
                };
                rb.raw.insert(v.id, raw);
                v.demand = Some(Demand {
                    compute: (raw.compute_busy + raw.compute_wait).min(1.0),
                    copy: (raw.copy_busy + raw.copy_wait).min(1.0),
                });
            }
        } else {
            rb.baselines.remove(&v.id);
        }
        vgpus.push(v);
    }
    rb.baselines
        .retain(|id, _| seen.iter().any(|s| s.view.id == *id));
    rb.raw.retain(|id, _| seen.iter().any(|s| s.view.id == *id));
    vgpus
}

/// The policy's notes as events.
fn record_notes(rb: &mut State, at: u64, notes: Vec<Note>) {
    let overload = rb.policy.config().overload;
    for n in notes {
        let e = match n {
            Note::Overloaded { gpu, load } => {
                let mut e = event(at, "overloaded", Some(gpu), format!(
                            "GPU {gpu}'s demand stayed above {overload:.2} of its capacity for a window (load {load:.2})"
                        ));
                e.load = Some(load);
                e
            }
            Note::Cleared { gpu, load } => {
                let mut e = event(
                    at,
                    "cleared",
                    Some(gpu),
                    format!("GPU {gpu} is no longer overloaded (load {load:.2})"),
                );
                e.load = Some(load);
                e
            }
            Note::Idle { gpu, idle: true } => event(
                at,
                "idle",
                Some(gpu),
                format!("GPU {gpu} holds no vGPU: it can be powered down or lent out"),
            ),
            Note::Idle { gpu, idle: false } => event(
                at,
                "busy",
                Some(gpu),
                format!("GPU {gpu} holds vGPUs again"),
            ),
            Note::Stuck { gpu, why } => event(
                at,
                "stuck",
                Some(gpu),
                format!("GPU {gpu} is overloaded but no move helps: {why}"),
            ),
        };
        rb.push(e);
    }
}

/// The policy's decisions as events: each with its event id.
fn record_decisions(rb: &mut State, at: u64, decisions: Vec<Decision>) -> Vec<(Decision, u64)> {
    let mut decided = Vec::new();
    for d in decisions {
        let mut e = event(at, d.kind.name(), Some(d.from), d.reason.clone());
        e.vgpu = Some(d.vgpu);
        e.target_gpu = Some(d.to);
        e.load = Some(d.from_load);
        e.load_after = Some(d.from_load_after);
        e.bytes = Some(d.bytes);
        let eid = rb.push(e);
        decided.push((d, eid));
    }
    decided
}

/// Migrations it started earlier that failed since become events; running ones are
/// followed on.
fn follow_migrations(rb: &mut State, at: u64, outcomes: &BTreeMap<u32, api::Migration>) {
    // Migrations it started earlier that failed since.
    let following = std::mem::take(&mut rb.following);
    let mut still = Vec::new();
    for (mid, eid) in following {
        match outcomes.get(&mid) {
            Some(m) if m.state == "running" => still.push((mid, eid)),
            Some(m) if m.state == "failed" => {
                let (vgpu, from, to) = (m.vgpu, m.source_gpu, m.target_gpu);
                let mut e = event(at, "failed", Some(from), format!(
                            "migration {mid} of vGPU {vgpu} to GPU {to} (event {eid}) failed: {}; it stays on GPU {from}",
                            m.error.clone().unwrap_or_default()
                        ));
                e.vgpu = Some(vgpu);
                e.target_gpu = Some(to);
                e.migration = Some(mid);
                rb.push(e);
            }
            _ => {}
        }
    }
    rb.following = still;
}
