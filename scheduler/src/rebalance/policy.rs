//! The policy loop: one round takes the measurements, updates the overload and light-load
//! windows, and decides the moves (a pending swap's second leg, balance moves, a swap
//! when no single move fits, consolidation under light load); the bookkeeping of a
//! decision (cool-downs) and of the caller's own moves.

use super::detect::kept;
use super::*;

impl Rebalancer {
    pub fn new(cfg: RebalanceConfig) -> Self {
        Self {
            cfg,
            vgpus: BTreeMap::new(),
            gpus: BTreeMap::new(),
            last: None,
            loads: Vec::new(),
            pending: None,
        }
    }

    pub fn config(&self) -> &RebalanceConfig {
        &self.cfg
    }

    pub fn set_mode(&mut self, mode: Mode) {
        self.cfg.mode = mode;
    }

    /// The loads of the latest round.
    pub fn loads(&self) -> &[GpuLoad] {
        &self.loads
    }

    /// A vGPU's smoothed demand on `gpu` (None before its first measurement).
    pub fn demand_on(&self, vgpu: VgpuId, gpu: &GpuView) -> Option<Demand> {
        self.vgpus
            .get(&vgpu)
            .filter(|t| t.seen)
            .map(|t| on_gpu(t.work, gpu))
    }

    /// The caller moved `vgpu` itself (an operator's migration): cool it down too.
    pub fn moved(&mut self, vgpu: VgpuId, from: GpuIndex, now: Nanos) {
        let t = self.vgpus.entry(vgpu).or_default();
        t.moved_at = Some(now);
        t.left = Some((from, now));
    }

    /// A migration the policy asked for failed: forget its cool-downs on the target so the
    /// next round may try elsewhere (the vGPU's own cool-down stays).
    pub fn failed(&mut self, d: &Decision) {
        if let Some(g) = self.gpus.get_mut(&d.to) {
            g.touched_at = None;
        }
        // A swap whose first leg failed is dropped (its second leg would not fit).
        if self.pending.as_ref().is_some_and(|p| p.first == d.vgpu) {
            self.pending = None;
        }
    }

    /// One round at `now`: takes the measurements, answers with what to move.
    pub fn observe(&mut self, now: Nanos, gpus: &[GpuView], vgpus: &[VgpuView]) -> Round {
        let cfg = self.cfg;
        let dt = self.last.map_or(0, |l| now.saturating_sub(l));
        self.last = Some(now);
        let keep = kept(dt, cfg.recurring_span);
        self.smooth(dt, keep, gpus, vgpus);
        let mut round = Round::default();
        let mut loads = self.detect(now, keep, gpus, vgpus, &mut round.notes);
        if cfg.mode != Mode::Off {
            let mut gpus_now: Vec<GpuView> = gpus.to_vec();
            let mut vgpus_now: Vec<VgpuView> = vgpus.to_vec();
            let swapping = self.pending.is_some();
            if let Some(d) = self.second_leg(now, &gpus_now, &vgpus_now) {
                self.commit(&d, now, &mut gpus_now, &mut vgpus_now);
                round.decisions.push(d);
            }
            for _ in 0..cfg.max_moves.max(1) {
                if swapping {
                    // One swap at a time; nothing else moves until its second leg.
                    break;
                }
                match self.best_balance_move(now, &gpus_now, &vgpus_now, &loads) {
                    Ok(d) => {
                        self.commit(&d, now, &mut gpus_now, &mut vgpus_now);
                        loads = gpus_now
                            .iter()
                            .map(|g| self.load_of(g, &vgpus_now, None, None))
                            .map(|mut l| {
                                l.overloaded =
                                    self.gpus.get(&l.index).is_some_and(|t| t.overloaded);
                                l
                            })
                            .collect();
                        round.decisions.push(d);
                    }
                    Err(stuck) => {
                        if round.decisions.is_empty() {
                            if let Some((first, second)) =
                                self.best_swap(now, &gpus_now, &vgpus_now, &loads)
                            {
                                self.commit(&first, now, &mut gpus_now, &mut vgpus_now);
                                round.decisions.push(first.clone());
                                self.pending = Some(Pending {
                                    first: first.vgpu,
                                    second,
                                });
                                break;
                            }
                        }
                        for (gpu, why) in stuck {
                            let tr = self.gpus.entry(gpu).or_default();
                            if !tr.stuck_noted {
                                tr.stuck_noted = true;
                                round.notes.push(Note::Stuck { gpu, why });
                            }
                        }
                        break;
                    }
                }
            }
            let any_over = loads.iter().any(|l| l.load > cfg.overload);
            if cfg.mode == Mode::Consolidate && round.decisions.is_empty() && !any_over {
                round.decisions = self.consolidate(now, &gpus_now, &vgpus_now, &loads);
                for d in round.decisions.clone() {
                    self.commit(&d, now, &mut gpus_now, &mut vgpus_now);
                }
            }
            if !round.decisions.is_empty() {
                // Report what the GPUs are expected to look like now.
                let overloaded: Vec<bool> = loads.iter().map(|l| l.overloaded).collect();
                loads = gpus_now
                    .iter()
                    .map(|g| self.load_of(g, &vgpus_now, None, None))
                    .zip(overloaded)
                    .map(|(mut l, o)| {
                        l.overloaded = o;
                        l
                    })
                    .collect();
            }
        }
        round.loads = loads.clone();
        self.loads = loads;
        round
    }
}

impl Rebalancer {
    pub(super) fn apply(d: &Decision, gpus: &mut [GpuView], vgpus: &mut [VgpuView]) {
        let Some(v) = vgpus.iter_mut().find(|v| v.id == d.vgpu) else {
            return;
        };
        let v0 = *v;
        v.gpu = d.to;
        v.movable = false;
        for g in gpus.iter_mut() {
            if g.index == d.to {
                g.committed_compute += v0.compute;
                g.committed_copy += v0.copy;
                if v0.oversubscribe {
                    g.pool_free = g.pool_free.saturating_sub(v0.resident);
                } else {
                    g.committed_memory = g.committed_memory.saturating_add(v0.memory);
                }
            } else if g.index == d.from {
                g.committed_compute = g.committed_compute.saturating_sub(v0.compute);
                g.committed_copy = g.committed_copy.saturating_sub(v0.copy);
                if v0.oversubscribe {
                    g.pool_free = g.pool_free.saturating_add(v0.resident);
                } else {
                    g.committed_memory = g.committed_memory.saturating_sub(v0.memory);
                }
            }
        }
    }

    /// Records a decision: cool-downs start, the source's overload window restarts.
    pub(super) fn commit(
        &mut self,
        d: &Decision,
        now: Nanos,
        gpus: &mut [GpuView],
        vgpus: &mut [VgpuView],
    ) {
        Self::apply(d, gpus, vgpus);
        let t = self.vgpus.entry(d.vgpu).or_default();
        t.moved_at = Some(now);
        t.left = Some((d.from, now));
        for g in [d.from, d.to] {
            let tr = self.gpus.entry(g).or_default();
            tr.touched_at = Some(now);
            tr.light_since = None;
            tr.stuck_noted = false;
        }
        if let Some(tr) = self.gpus.get_mut(&d.from) {
            if d.kind == Kind::Balance && tr.overloaded {
                tr.over_since = Some(now);
                tr.severe_since = None;
                tr.duty = 0.0;
                tr.recurring = false;
                tr.overloaded = false;
            }
        }
    }
}
