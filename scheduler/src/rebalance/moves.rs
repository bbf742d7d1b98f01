//! Candidate moves and their scores: the best single balance move off an overloaded GPU,
//! a swap when no single move fits, and a pending swap's second leg.

use super::*;

impl Rebalancer {
    pub(super) fn cooling(&self, at: Option<Nanos>, now: Nanos, d: Nanos) -> bool {
        at.is_some_and(|t| now.saturating_sub(t) < d)
    }

    pub(super) fn best_balance_move(
        &self,
        now: Nanos,
        gpus: &[GpuView],
        vgpus: &[VgpuView],
        loads: &[GpuLoad],
    ) -> Result<Decision, Vec<(GpuIndex, String)>> {
        let cfg = &self.cfg;
        let track = |i: GpuIndex| self.gpus.get(&i).copied().unwrap_or_default();
        let load = |i: GpuIndex| loads.iter().find(|l| l.index == i).map_or(0.0, |l| l.load);
        let mut best: Option<Decision> = None;
        let mut stuck = Vec::new();
        for s in gpus {
            let ts = track(s.index);
            if !ts.overloaded || self.cooling(ts.touched_at, now, cfg.gpu_cooldown) {
                continue;
            }
            // Overloaded by recurring bursts: judged on the vGPUs' recent peaks.
            let peaky = ts.recurring;
            let ls = if peaky {
                self.load_by(s, vgpus, None, None, true).load
            } else {
                load(s.index)
            };
            let mut why = String::from("no vGPU on it may move now");
            for v in vgpus.iter().filter(|v| v.gpu == s.index) {
                let tv = self.vgpus.get(&v.id).copied().unwrap_or_default();
                if !v.movable || self.cooling(tv.moved_at, now, cfg.vgpu_cooldown) {
                    continue;
                }
                let after_s = self.load_by(s, vgpus, Some(v.id), None, peaky).load;
                for t in gpus.iter().filter(|t| t.index != s.index) {
                    if self.cooling(track(t.index).touched_at, now, cfg.gpu_cooldown) {
                        why = format!("GPU {} is settling after a move", t.index);
                        continue;
                    }
                    if tv.left.is_some_and(|(g, at)| {
                        g == t.index && now.saturating_sub(at) < cfg.return_cooldown
                    }) {
                        continue;
                    }
                    if let Some(m) = misfit(v, t) {
                        why = m.to_string();
                        continue;
                    }
                    let lt = if peaky {
                        self.load_by(t, vgpus, None, None, true).load
                    } else {
                        load(t.index)
                    };
                    let moved = VgpuView { gpu: t.index, ..*v };
                    let after_t = self.load_by(t, vgpus, None, Some(&moved), peaky).load;
                    if after_t > cfg.target_max {
                        why = format!(
                            "GPU {} would reach load {after_t:.2} (room up to {:.2})",
                            t.index, cfg.target_max
                        );
                        continue;
                    }
                    let benefit = ls.max(lt) - after_s.max(after_t);
                    // A move that ends the overload (both GPUs at most at capacity after,
                    // the target within `target_max` as checked above) is worth it however
                    // little it lowers the peak: a burst just over capacity beside a few
                    // light vGPUs is still an overload.
                    let ends = ls > 1.0 && after_s <= 1.0 && benefit > 0.0;
                    if benefit < cfg.min_gain && !ends {
                        why = format!("no move lowers the peak by {:.2} or more", cfg.min_gain);
                        continue;
                    }
                    let bytes = v.resident.saturating_add(cfg.move_overhead_bytes);
                    let score = benefit / gib(bytes).max(1e-9);
                    let w = on_gpu(self.work_of(v), s);
                    let over = if peaky {
                        format!(
                            "GPU {} overloaded again and again (load above {:.2} {:.0}% of the recent past; at the recent peaks {ls:.2})",
                            s.index,
                            cfg.overload,
                            100.0 * ts.duty
                        )
                    } else {
                        format!(
                            "GPU {} overloaded (load {ls:.2} > {:.2} for {} ms)",
                            s.index,
                            cfg.overload,
                            now.saturating_sub(ts.over_since.unwrap_or(now)) / MS
                        )
                    };
                    if best.as_ref().is_none_or(|b| score > b.score) {
                        best = Some(Decision {
                            at: now,
                            kind: Kind::Balance,
                            vgpu: v.id,
                            from: s.index,
                            to: t.index,
                            from_load: ls,
                            to_load: lt,
                            from_load_after: after_s,
                            to_load_after: after_t,
                            demand: w.compute.max(w.copy),
                            bytes: v.resident,
                            benefit,
                            score,
                            reason: format!(
                                "{over}; vGPU {} (demand {:.2}, {:.0} MiB resident) to GPU {} (load {lt:.2} -> {after_t:.2}) lowers the peak by {benefit:.2}, the most per byte moved",
                                v.id,
                                w.compute.max(w.copy),
                                v.resident as f64 / (1 << 20) as f64,
                                t.index,
                            ),
                        });
                    }
                }
            }
            if best.as_ref().is_none_or(|b| b.from != s.index) {
                stuck.push((s.index, why));
            }
        }
        best.ok_or(stuck)
    }

    /// The second leg of a pending swap, once its first leg landed (and still allowed:
    /// shares, memory and the target's room are checked again); a swap whose first leg
    /// did not land within `vgpu_cooldown` is dropped.
    pub(super) fn second_leg(
        &mut self,
        now: Nanos,
        gpus: &[GpuView],
        vgpus: &[VgpuView],
    ) -> Option<Decision> {
        let p = self.pending.clone()?;
        let d = &p.second;
        let first = vgpus.iter().find(|v| v.id == p.first);
        let v = vgpus.iter().find(|v| v.id == d.vgpu);
        let (Some(first), Some(v)) = (first, v) else {
            self.pending = None;
            return None;
        };
        if now.saturating_sub(d.at) > self.cfg.vgpu_cooldown || v.gpu != d.from {
            self.pending = None;
            return None;
        }
        if first.gpu != d.from || !first.movable || !v.movable {
            return None; // The first leg is still under way.
        }
        self.pending = None;
        let t = gpus.iter().find(|g| g.index == d.to)?;
        let s = gpus.iter().find(|g| g.index == d.from)?;
        if misfit(v, t).is_some() {
            return None;
        }
        let moved = VgpuView { gpu: t.index, ..*v };
        let to_load = self.load_of(t, vgpus, None, None).load;
        let to_after = self.load_of(t, vgpus, None, Some(&moved)).load;
        if to_after > self.cfg.target_max {
            return None;
        }
        let from_load = self.load_of(s, vgpus, None, None).load;
        let from_after = self.load_of(s, vgpus, Some(v.id), None).load;
        Some(Decision {
            at: now,
            from_load,
            to_load,
            from_load_after: from_after,
            to_load_after: to_after,
            ..d.clone()
        })
    }

    /// When no single move helps an overloaded GPU `s` (the shares or the room on every
    /// other GPU forbid it), a swap: a light vGPU `u` of another GPU `t` goes to `s`
    /// first, then a heavy `v` of `s` goes to `t`. Each leg on its own keeps every share
    /// guaranteed (`u` fits `s` as it is now; `v` fits `t` once `u` left), `t` ends at
    /// most at `target_max`, and the pair's peak drops by at least `min_gain`. The best by
    /// benefit per byte of both legs; returns the first leg and the second.
    pub(super) fn best_swap(
        &self,
        now: Nanos,
        gpus: &[GpuView],
        vgpus: &[VgpuView],
        loads: &[GpuLoad],
    ) -> Option<(Decision, Decision)> {
        let cfg = &self.cfg;
        let track = |i: GpuIndex| self.gpus.get(&i).copied().unwrap_or_default();
        let load = |i: GpuIndex| loads.iter().find(|l| l.index == i).map_or(0.0, |l| l.load);
        let free = |v: &VgpuView| {
            let tv = self.vgpus.get(&v.id).copied().unwrap_or_default();
            v.movable && !self.cooling(tv.moved_at, now, cfg.vgpu_cooldown)
        };
        let returns = |v: &VgpuView, g: GpuIndex| {
            self.vgpus
                .get(&v.id)
                .and_then(|t| t.left)
                .is_some_and(|(l, at)| l == g && now.saturating_sub(at) < cfg.return_cooldown)
        };
        let mut best: Option<(f64, Decision, Decision)> = None;
        for s in gpus {
            let ts = track(s.index);
            if !ts.overloaded || self.cooling(ts.touched_at, now, cfg.gpu_cooldown) {
                continue;
            }
            let ls = load(s.index);
            for t in gpus.iter().filter(|t| t.index != s.index) {
                if self.cooling(track(t.index).touched_at, now, cfg.gpu_cooldown) {
                    continue;
                }
                let lt = load(t.index);
                for v in vgpus.iter().filter(|v| v.gpu == s.index && free(v)) {
                    if returns(v, t.index) {
                        continue;
                    }
                    for u in vgpus.iter().filter(|u| u.gpu == t.index && free(u)) {
                        if returns(u, s.index) || misfit(u, s).is_some() {
                            continue;
                        }
                        // t once u left.
                        let mut t2 = *t;
                        t2.committed_compute = t2.committed_compute.saturating_sub(u.compute);
                        t2.committed_copy = t2.committed_copy.saturating_sub(u.copy);
                        if u.oversubscribe {
                            t2.pool_free = t2.pool_free.saturating_add(u.resident);
                        } else {
                            t2.committed_memory = t2.committed_memory.saturating_sub(u.memory);
                        }
                        if misfit(v, &t2).is_some() {
                            continue;
                        }
                        let u_on_s = VgpuView { gpu: s.index, ..*u };
                        let v_on_t = VgpuView { gpu: t.index, ..*v };
                        let after_s = self.load_of(s, vgpus, Some(v.id), Some(&u_on_s)).load;
                        let after_t = self.load_of(t, vgpus, Some(u.id), Some(&v_on_t)).load;
                        if after_t > cfg.target_max {
                            continue;
                        }
                        let benefit = ls.max(lt) - after_s.max(after_t);
                        if benefit < cfg.min_gain {
                            continue;
                        }
                        let bytes = v
                            .resident
                            .saturating_add(u.resident)
                            .saturating_add(2 * cfg.move_overhead_bytes);
                        let score = benefit / gib(bytes).max(1e-9);
                        if best.as_ref().is_some_and(|b| score <= b.0) {
                            continue;
                        }
                        let (wv, wu) = (on_gpu(self.work_of(v), s), on_gpu(self.work_of(u), t));
                        let why = format!(
                            "GPU {} overloaded (load {ls:.2} for {} ms) and no single move fits (shares or room); swap: vGPU {} (demand {:.2}) from GPU {} to GPU {}, then vGPU {} (demand {:.2}) to GPU {}: loads {ls:.2}/{lt:.2} -> {after_s:.2}/{after_t:.2}, the peak drops by {benefit:.2}",
                            s.index,
                            now.saturating_sub(ts.over_since.unwrap_or(now)) / MS,
                            u.id,
                            wu.compute.max(wu.copy),
                            t.index,
                            s.index,
                            v.id,
                            wv.compute.max(wv.copy),
                            t.index,
                        );
                        let first = Decision {
                            at: now,
                            kind: Kind::Balance,
                            vgpu: u.id,
                            from: t.index,
                            to: s.index,
                            from_load: lt,
                            to_load: ls,
                            from_load_after: self.load_of(t, vgpus, Some(u.id), None).load,
                            to_load_after: self.load_of(s, vgpus, None, Some(&u_on_s)).load,
                            demand: wu.compute.max(wu.copy),
                            bytes: u.resident,
                            benefit,
                            score,
                            reason: format!("{why} (first leg)"),
                        };
                        let second = Decision {
                            at: now,
                            kind: Kind::Balance,
                            vgpu: v.id,
                            from: s.index,
                            to: t.index,
                            from_load: ls,
                            to_load: lt,
                            from_load_after: after_s,
                            to_load_after: after_t,
                            demand: wv.compute.max(wv.copy),
                            bytes: v.resident,
                            benefit,
                            score,
                            reason: format!("{why} (second leg)"),
                        };
                        best = Some((score, first, second));
                    }
                }
            }
        }
        best.map(|(_, a, b)| (a, b))
    }
}
