//! Stats: every GPU with its commitments, worker samples (collected by a periodic sampler
//! and on demand), each vGPU's utilization over the window, and the counts the metrics
//! feed reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::config::Config;
use super::core::{no_vgpu, Daemon, CONTROL_TIMEOUT};
use super::error::ApiError;
use super::grants::Grants;
use super::link::Link;
use super::state::{State, VgpuRec};
use crate::api::{self, VgpuState, VmState};
use crate::control::{Command as Ctl, ReplyBody, WorkerStats};
use crate::units::permille_to_fraction;
use vgpu_grant::{GrantServer, Handovers};

/// Every physical GPU with its commitments.
pub fn gpus(d: &Daemon) -> Vec<api::Gpu> {
    // Read before the state lock: each grant server's lock is its own.
    let hands: Vec<Handovers> = d
        .gpu_indices()
        .map(|i| {
            d.grants
                .get(i)
                .map(GrantServer::handovers)
                .unwrap_or_default()
        })
        .collect();
    d.state.with(|inner| {
        d.cfg
            .gpus
            .iter()
            .zip(d.gpu_indices())
            .zip(hands)
            .map(|((g, index), hands)| {
                let c = inner.committed(index, None);
                let pool = d.memory.figures(index);
                api::Gpu {
                    index,
                    name: g.name.clone(),
                    backend: if g.cuda_ordinal.is_some() {
                        "cuda"
                    } else {
                        "sim"
                    }
                    .into(),
                    memory_bytes: g.memory,
                    memory_committed_bytes: c.memory,
                    memory_free_bytes: g.memory.saturating_sub(c.memory),
                    memory_shared_bytes: d.shm_lock().bytes_on(index),
                    oversubscribed_pool_bytes: pool.0,
                    oversubscribed_resident_bytes: pool.1,
                    swap_area_bytes: pool.2,
                    swap_area_used_bytes: pool.3,
                    copy_bandwidth: g.copy_bandwidth,
                    speed: g.speed,
                    compute_committed: permille_to_fraction(c.compute),
                    copy_committed: permille_to_fraction(c.copy),
                    vgpus: inner
                        .vgpus
                        .values()
                        .filter(|v| v.gpu() == index && v.holds_resources())
                        .map(|v| v.id())
                        .collect(),
                    compute_handovers: hands.compute,
                    copy_handovers: hands.copy,
                }
            })
            .collect()
    })
}

/// Counters and utilization of one vGPU (fresh from its worker when it runs).
pub async fn vgpu_stats(d: &Daemon, id: u32) -> Result<api::VgpuStats, ApiError> {
    let link = d.state.with(|inner| {
        let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
        Ok::<_, ApiError>(rec.link())
    })?;
    if let Some(link) = link {
        if let Ok(ReplyBody::Stats { stats }) = link.call(Ctl::Stats, CONTROL_TIMEOUT).await {
            record_sample(&d.state, &d.cfg, id, stats);
        }
    }
    d.state.with(|inner| {
        let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
        Ok(stats_of(&d.cfg, &d.grants, rec))
    })
}

/// Keeps worker sample `s` of vGPU `id` (two windows' worth are kept).
pub(super) fn record_sample(state: &State, cfg: &Config, id: u32, s: WorkerStats) {
    let keep_ns = keep_ns(cfg);
    state.with(|inner| {
        let Some(rec) = inner.vgpus.get_mut(&id) else {
            return;
        };
        rec.record_sample(s, keep_ns);
    });
}

/// The final counters `s` of vGPU `id`'s worker of `generation`.
pub(super) fn record_final(state: &State, cfg: &Config, id: u32, generation: u64, s: WorkerStats) {
    let keep_ns = keep_ns(cfg);
    state.with(|inner| {
        if let Some(rec) = inner.vgpus.get_mut(&id) {
            rec.record_final(generation, s, keep_ns);
        }
    });
}

/// How long samples are kept: two stats windows.
fn keep_ns(cfg: &Config) -> u64 {
    u64::try_from(cfg.stats_window.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_mul(2)
}

/// vGPU `rec`'s stats over the window, from its samples.
fn stats_of(cfg: &Config, grants: &Grants, rec: &VgpuRec) -> api::VgpuStats {
    let window_ns = u64::try_from(cfg.stats_window.as_nanos()).unwrap_or(u64::MAX);
    let last = rec.samples().back().copied().unwrap_or_default();
    let first = rec
        .samples()
        .iter()
        .find(|s| last.uptime_ns.saturating_sub(s.uptime_ns) <= window_ns)
        .copied()
        .unwrap_or(last);
    let dt = last.uptime_ns.saturating_sub(first.uptime_ns);
    let bw = cfg
        .gpus
        .get(rec.gpu() as usize)
        .map_or(0, |g| g.copy_bandwidth);
    // A vGPU whose worker is gone uses nothing, whatever its last window said.
    let (compute, copy) = if dt == 0 || rec.worker().is_none() {
        (0.0, (bw > 0).then_some(0.0))
    } else {
        let secs = dt as f64 / 1e9;
        let k = last.kernel_ns.saturating_sub(first.kernel_ns) as f64 / dt as f64;
        let bytes = (last.bytes_htod + last.bytes_dtoh)
            .saturating_sub(first.bytes_htod + first.bytes_dtoh) as f64;
        (k, (bw > 0).then(|| bytes / (bw as f64 * secs)))
    };
    let live = rec.worker().is_some() && !rec.samples().is_empty();
    let counted = rec.counters();
    // The grant path's counters (its own lock, a leaf).
    let usage = grants
        .get(rec.gpu())
        .and_then(|g| g.usage(rec.id()))
        .unwrap_or_default();
    api::VgpuStats {
        vgpu: rec.id(),
        gpu: rec.gpu(),
        live,
        window_ms: dt / 1_000_000,
        compute_utilization: compute,
        copy_utilization: copy,
        memory_share_bytes: rec.memory(),
        memory_used_bytes: last.memory_used,
        memory_resident_bytes: rec.memory_report().map_or(last.memory_used, |m| m.resident),
        memory_swapped_bytes: rec
            .memory_report()
            .map_or(0, |m| m.device_swap + m.host_swap),
        memory_device_swap_bytes: rec.memory_report().map_or(0, |m| m.device_swap),
        pinned_host_bytes: last.pinned_host_bytes,
        swap_out_bytes: rec.memory_report().map_or(0, |m| m.swap_out_bytes),
        swap_in_bytes: rec.memory_report().map_or(0, |m| m.swap_in_bytes),
        swap_out_ms: rec
            .memory_report()
            .map_or(0.0, |m| m.swap_out_ns as f64 / 1e6),
        swap_in_ms: rec
            .memory_report()
            .map_or(0.0, |m| m.swap_in_ns as f64 / 1e6),
        evictions: rec.memory_report().map_or(0, |m| m.evictions),
        allocations: last.allocations,
        requests: counted.requests,
        errors: counted.errors,
        kernels: counted.kernels,
        kernel_ns: counted.kernel_ns,
        bytes_htod: counted.bytes_htod,
        bytes_dtoh: counted.bytes_dtoh,
        bytes_dtod: counted.bytes_dtod,
        compute_share: permille_to_fraction(if rec.samples().is_empty() {
            rec.compute()
        } else {
            last.compute_share
        }),
        copy_share: permille_to_fraction(if rec.samples().is_empty() {
            rec.copy()
        } else {
            last.copy_share
        }),
        priority: if rec.samples().is_empty() {
            rec.priority()
        } else {
            last.priority
        },
        compute_overruns: usage.compute_overruns,
        copy_overruns: usage.copy_overruns,
        violations: usage.violations,
    }
}

/// Stats of every vGPU, from the latest samples (for metrics and `top`).
pub fn all_stats(d: &Daemon) -> Vec<api::VgpuStats> {
    d.state.with(|inner| {
        inner
            .vgpus
            .values()
            .map(|r| stats_of(&d.cfg, &d.grants, r))
            .collect()
    })
}

/// Samples every running worker every `stats_interval`.
pub(super) async fn sampler(d: Arc<Daemon>) {
    let mut tick = tokio::time::interval(d.cfg.stats_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        collect_released(&d, Instant::now());
        stop_expelled(&d);
        let links: Vec<(u32, Link)> = d.state.with(|inner| {
            inner
                .vgpus
                .values()
                .filter_map(|r| r.link().map(|l| (r.id(), l)))
                .collect()
        });
        for (id, link) in links {
            if let Ok(ReplyBody::Stats { stats }) = link.call(Ctl::Stats, CONTROL_TIMEOUT).await {
                record_sample(&d.state, &d.cfg, id, stats);
            }
        }
    }
}

/// Stops the workers their GPU's grant path detached for writing values that cannot be
/// true: such a worker gets no grant any more, so its vGPU fails (with that reason, when
/// the worker's exit is seen) and lets go of what it held.
fn stop_expelled(d: &Daemon) {
    let running: Vec<(u32, u32, super::procs::Proc)> = d.state.with(|inner| {
        inner
            .vgpus
            .values()
            .filter_map(|r| r.worker_proc().map(|p| (r.id(), r.gpu(), p)))
            .collect()
    });
    for (id, gpu, proc) in running {
        if let Some(why) = d.grants.expelled(id, gpu) {
            tracing::warn!(vgpu = id, gpu, pid = proc.pid, reason = %why,
                "the GPU's scheduler detached this vGPU's worker; stopping it");
            proc.signal(libc::SIGKILL);
        }
    }
}

/// Forgets the vGPUs released for at least the retention time (`--released-retention-s`):
/// they leave the API's lists, the metrics and the state file.
pub(super) fn collect_released(d: &Daemon, now: Instant) {
    let retention = d.cfg.released_retention;
    let gone: Vec<VgpuRec> = d.state.with(|inner| {
        let mut expired = Vec::new();
        for r in inner.vgpus.values_mut() {
            if *r.state() == VgpuState::Released && r.worker().is_none() {
                let at = r.released_since(now);
                if now.saturating_duration_since(at) >= retention {
                    expired.push(r.id());
                }
            } else {
                r.clear_released();
            }
        }
        expired
            .iter()
            .filter_map(|id| inner.vgpus.remove(id))
            .collect()
    });
    if gone.is_empty() {
        return;
    }
    for rec in &gone {
        let _ = std::fs::remove_file(rec.log());
        let _ = std::fs::remove_file(rec.socket());
        tracing::info!(
            vgpu = rec.id(),
            "released vGPU forgotten after its retention time"
        );
    }
    d.persist.mark_dirty();
    d.state.notify();
}

/// Counts of VMs per state name, for metrics.
pub fn vm_states(state: &State) -> BTreeMap<&'static str, u64> {
    state.with(|inner| {
        let mut m = BTreeMap::new();
        for v in inner.vms.values() {
            let k = match v.state() {
                VmState::Starting => "starting",
                VmState::Running => "running",
                VmState::Exited { .. } => "exited",
                VmState::Failed { .. } => "failed",
            };
            *m.entry(k).or_insert(0) += 1;
        }
        m
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::admission::tests::admit;
    use super::super::core::testing::{daemon, spec};
    use super::super::vgpus;
    use super::*;

    #[test]
    fn released_vgpus_are_forgotten_after_the_retention_time() {
        let d = daemon(1);
        let a = admit(&d, spec(Some(0), 1 << 30, 0.3)).expect("a");
        let b = admit(&d, spec(Some(0), 1 << 30, 0.3)).expect("b");
        d.state.with(|i| {
            if let Some(r) = i.vgpus.get_mut(&a) {
                r.end_worker(VgpuState::Released);
            }
        });
        let t0 = Instant::now();
        collect_released(&d, t0);
        assert_eq!(
            vgpus::list_vgpus(&d.state).len(),
            2,
            "kept for the retention time"
        );
        collect_released(&d, t0 + Duration::from_secs(299));
        assert_eq!(vgpus::list_vgpus(&d.state).len(), 2);
        collect_released(&d, t0 + Duration::from_secs(300));
        let left: Vec<u32> = vgpus::list_vgpus(&d.state).iter().map(|v| v.id).collect();
        assert_eq!(left, vec![b], "the live one stays");
        assert!(all_stats(&d).iter().all(|s| s.vgpu != a));
    }
}
