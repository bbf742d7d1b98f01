//! Demand smoothing and the overload detector: each vGPU's demand as an EWMA (and its
//! decaying recent peak), each GPU's load, and the windows that make a load an overload
//! (continuous, severe, or recurring) or a light load.

use super::*;

/// The fraction of an EWMA with time constant `span` that `dt` later still counts (0 when
/// `span` is 0: nothing is remembered).
pub(super) fn kept(dt: Nanos, span: Nanos) -> f64 {
    if span == 0 {
        0.0
    } else {
        (-(dt as f64) / span as f64).exp()
    }
}

impl Rebalancer {
    /// Takes this round's measurements, `dt` after the last: each vGPU's demand in nominal
    /// units, smoothed with time constant `smoothing`, and its recent peak, of which
    /// `keep` survives from the last round. vGPUs no longer handed in are forgotten.
    pub(super) fn smooth(&mut self, dt: Nanos, keep: f64, gpus: &[GpuView], vgpus: &[VgpuView]) {
        let alpha = 1.0 - kept(dt, self.cfg.smoothing);
        let gpu_of = |i: GpuIndex| gpus.iter().find(|g| g.index == i);
        // Demand, smoothed, in nominal units.
        self.vgpus.retain(|id, _| vgpus.iter().any(|v| v.id == *id));
        for v in vgpus {
            let t = self.vgpus.entry(v.id).or_default();
            if let (Some(d), Some(g)) = (v.demand, gpu_of(v.gpu)) {
                let d = d.clamp();
                let w = Demand {
                    compute: d.compute * g.speed,
                    copy: d.copy * g.copy_rate,
                };
                if t.seen {
                    t.work.compute += alpha * (w.compute - t.work.compute);
                    t.work.copy += alpha * (w.copy - t.work.copy);
                    t.peak.compute = w.compute.max(t.peak.compute * keep);
                    t.peak.copy = w.copy.max(t.peak.copy * keep);
                } else {
                    t.work = w;
                    t.peak = w;
                    t.seen = true;
                }
            }
        }
    }

    /// Each GPU's load now, and the windows it updates: overload (continuous, severe or
    /// recurring, with `keep` of the duty EWMA surviving from the last round), light load,
    /// idleness. Changes of state go to `notes`.
    pub(super) fn detect(
        &mut self,
        now: Nanos,
        keep: f64,
        gpus: &[GpuView],
        vgpus: &[VgpuView],
        notes: &mut Vec<Note>,
    ) -> Vec<GpuLoad> {
        let cfg = self.cfg;
        // Loads and the overload / light-load windows.
        let mut loads: Vec<GpuLoad> = gpus
            .iter()
            .map(|g| self.load_of(g, vgpus, None, None))
            .collect();
        for l in &mut loads {
            let tr = self.gpus.entry(l.index).or_default();
            if l.load > cfg.overload {
                tr.over_since.get_or_insert(now);
            } else if l.load < cfg.overload_clear {
                tr.over_since = None;
            }
            if l.load > cfg.severe {
                tr.severe_since.get_or_insert(now);
            } else {
                tr.severe_since = None;
            }
            let above = if l.load > cfg.overload.max(cfg.recurring_level) {
                1.0
            } else {
                0.0
            };
            tr.duty = tr.duty * keep + (1.0 - keep) * above;
            let windowed = tr
                .over_since
                .is_some_and(|s| now.saturating_sub(s) >= cfg.window)
                || (tr.over_since.is_some()
                    && tr
                        .severe_since
                        .is_some_and(|s| now.saturating_sub(s) >= cfg.severe_window));
            tr.recurring = !windowed && tr.duty >= cfg.recurring_duty;
            let over = windowed || tr.recurring;
            if over != tr.overloaded {
                tr.overloaded = over;
                notes.push(if over {
                    Note::Overloaded {
                        gpu: l.index,
                        load: l.load,
                    }
                } else {
                    tr.stuck_noted = false;
                    Note::Cleared {
                        gpu: l.index,
                        load: l.load,
                    }
                });
            }
            if l.load < cfg.light && l.vgpus > 0 {
                tr.light_since.get_or_insert(now);
            } else {
                tr.light_since = None;
            }
            l.overloaded = over;
            l.over_since = tr.over_since;
            if tr.idle != Some(l.idle) {
                if tr.idle.is_some() || l.idle {
                    notes.push(Note::Idle {
                        gpu: l.index,
                        idle: l.idle,
                    });
                }
                tr.idle = Some(l.idle);
            }
        }
        loads
    }

    /// `g`'s load with the vGPUs on it (optionally without `minus`, with `plus`).
    pub(super) fn load_of(
        &self,
        g: &GpuView,
        vgpus: &[VgpuView],
        minus: Option<VgpuId>,
        plus: Option<&VgpuView>,
    ) -> GpuLoad {
        self.load_by(g, vgpus, minus, plus, false)
    }

    /// As `load_of`, on the vGPUs' recent peaks (`peak`) or their smoothed demand.
    pub(super) fn load_by(
        &self,
        g: &GpuView,
        vgpus: &[VgpuView],
        minus: Option<VgpuId>,
        plus: Option<&VgpuView>,
        peak: bool,
    ) -> GpuLoad {
        let mut d = Demand::default();
        let mut n = 0;
        for v in vgpus
            .iter()
            .filter(|v| v.gpu == g.index && Some(v.id) != minus)
            .chain(plus)
        {
            n += 1;
            let w = if peak {
                self.peak_of(v)
            } else {
                self.work_of(v)
            };
            d.compute += w.compute;
            d.copy += w.copy;
        }
        let compute = d.compute / g.speed.max(1e-9);
        let copy = d.copy / g.copy_rate.max(1e-9);
        GpuLoad {
            index: g.index,
            compute,
            copy,
            load: compute.max(copy),
            overloaded: false,
            over_since: None,
            idle: n == 0,
            vgpus: n,
        }
    }

    /// A vGPU's recent peak demand (never below its smoothed demand), nominal units.
    pub(super) fn peak_of(&self, v: &VgpuView) -> Demand {
        let w = self.work_of(v);
        match self.vgpus.get(&v.id) {
            Some(t) if t.seen => Demand {
                compute: w.compute.max(t.peak.compute),
                copy: w.copy.max(t.peak.copy),
            },
            _ => w,
        }
    }

    /// A vGPU's demand in nominal units: measured, else its shares.
    pub(super) fn work_of(&self, v: &VgpuView) -> Demand {
        match self.vgpus.get(&v.id) {
            Some(t) if t.seen => t.work,
            _ => Demand {
                compute: f64::from(v.compute) / f64::from(WHOLE),
                copy: f64::from(v.copy) / f64::from(WHOLE),
            },
        }
    }
}
