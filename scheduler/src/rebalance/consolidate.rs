//! Consolidation under light load: a GPU that stayed lightly loaded for a window is
//! emptied onto the fullest occupied GPUs that stay at most `pack_max`, when all its vGPUs
//! fit.

use super::*;

impl Rebalancer {
    pub(super) fn consolidate(
        &self,
        now: Nanos,
        gpus: &[GpuView],
        vgpus: &[VgpuView],
        loads: &[GpuLoad],
    ) -> Vec<Decision> {
        let cfg = &self.cfg;
        let track = |i: GpuIndex| self.gpus.get(&i).copied().unwrap_or_default();
        let mut order: Vec<&GpuLoad> = loads
            .iter()
            .filter(|l| {
                let t = track(l.index);
                l.vgpus > 0
                    && t.light_since
                        .is_some_and(|s| now.saturating_sub(s) >= cfg.window)
                    && !self.cooling(t.touched_at, now, cfg.gpu_cooldown)
            })
            .collect();
        order.sort_by(|a, b| a.load.total_cmp(&b.load).then(a.index.cmp(&b.index)));
        for src in order {
            let Some(s) = gpus.iter().find(|g| g.index == src.index) else {
                continue;
            };
            // Plan every vGPU of s onto other occupied GPUs, largest demand first.
            let mut g_now: Vec<GpuView> = gpus.to_vec();
            let mut v_now: Vec<VgpuView> = vgpus.to_vec();
            let mut mine: Vec<VgpuView> =
                vgpus.iter().filter(|v| v.gpu == s.index).copied().collect();
            mine.sort_by(|a, b| {
                let (wa, wb) = (self.work_of(a), self.work_of(b));
                wb.compute.max(wb.copy).total_cmp(&wa.compute.max(wa.copy))
            });
            let mut plan = Vec::new();
            let mut ok = true;
            for v in &mine {
                let tv = self.vgpus.get(&v.id).copied().unwrap_or_default();
                if !v.movable || self.cooling(tv.moved_at, now, cfg.vgpu_cooldown) {
                    ok = false;
                    break;
                }
                let mut pick: Option<(GpuIndex, f64, f64)> = None;
                for t in g_now.iter().filter(|t| t.index != s.index) {
                    let occupied = v_now.iter().any(|o| o.gpu == t.index);
                    if !occupied
                        || self.cooling(track(t.index).touched_at, now, cfg.gpu_cooldown)
                        || misfit(v, t).is_some()
                        || tv.left.is_some_and(|(g, at)| {
                            g == t.index && now.saturating_sub(at) < cfg.return_cooldown
                        })
                    {
                        continue;
                    }
                    let before = self.load_of(t, &v_now, None, None).load;
                    let moved = VgpuView { gpu: t.index, ..*v };
                    let after = self.load_of(t, &v_now, None, Some(&moved)).load;
                    if after <= cfg.pack_max && pick.is_none_or(|(_, _, a)| after > a) {
                        pick = Some((t.index, before, after));
                    }
                }
                let Some((to, before, after)) = pick else {
                    ok = false;
                    break;
                };
                let from_load = self.load_of(s, &v_now, None, None).load;
                let from_after = self.load_of(s, &v_now, Some(v.id), None).load;
                let w = on_gpu(self.work_of(v), s);
                let d = Decision {
                    at: now,
                    kind: Kind::Consolidate,
                    vgpu: v.id,
                    from: s.index,
                    to,
                    from_load,
                    to_load: before,
                    from_load_after: from_after,
                    to_load_after: after,
                    demand: w.compute.max(w.copy),
                    bytes: v.resident,
                    benefit: 0.0,
                    score: 0.0,
                    reason: format!(
                        "light load: GPU {} at {:.2} (< {:.2} for {} ms) is emptied; vGPU {} (demand {:.2}) packs onto GPU {to} ({before:.2} -> {after:.2}, at most {:.2})",
                        s.index,
                        src.load,
                        cfg.light,
                        now.saturating_sub(track(s.index).light_since.unwrap_or(now)) / MS,
                        v.id,
                        w.compute.max(w.copy),
                        cfg.pack_max
                    ),
                };
                Self::apply(&d, &mut g_now, &mut v_now);
                plan.push(d);
            }
            if ok && !plan.is_empty() {
                return plan;
            }
        }
        Vec::new()
    }
}
