//! Placement and rebalancing across the GPUs of one host (issue 13, after DCUDA, seed 003):
//! which GPU a new vGPU goes to, and which running vGPU to live-migrate where when a GPU
//! stays overloaded or, under light load, which GPUs can be emptied.
//!
//! Pure policy, no I/O: the caller hands in what each GPU has committed and what each vGPU
//! demanded over the last interval (compute and copy busy time plus time spent waiting for
//! a grant, as fractions of that interval), with the time; [`Rebalancer::observe`] answers
//! with decisions and the reason for each. vgpud runs it in real time, the tests and the
//! benchmark in virtual time.
//!
//! - **Demand** of a vGPU on a resource = (busy + waiting) / interval, at most 1: what it
//!   would have used had it had the engine to itself. It is kept in GPU-independent units
//!   (times the GPU's speed) and smoothed (EWMA), so a vGPU's demand survives its move.
//! - **Load** of a GPU = max over compute and copy of the sum of its vGPUs' demands over
//!   its capacity. Load above 1 means demand above capacity: someone waits.
//! - **Overloaded**: load above `overload` continuously for `window`, or above `severe`
//!   for `severe_window` (half the window); it ends only below `overload_clear` (a
//!   hysteresis band). Also *recurring*: above `overload` for `recurring_duty` of the
//!   recent past (bursts shorter than the window that repeat); such moves are judged on
//!   the vGPUs' recent peaks.
//! - **Swap**: when no single move is allowed, a light vGPU of another GPU comes in first,
//!   then a busy one goes out; each leg on its own keeps every share guaranteed.
//! - **A move** of vGPU v from s to t must keep every share guaranteed (t's committed
//!   compute, copy and memory stay within t), leave t at most at `target_max`, and lower the
//!   pair's peak load by at least `min_gain`, or end the overload (s at most at capacity
//!   after, however little the peak drops). Among the moves allowed, the one with the
//!   highest benefit per byte moved wins (benefit = how much the pair's peak drops; bytes =
//!   the vGPU's resident memory plus a fixed cost per move).
//! - **No ping-pong**: a vGPU that moved stays for `vgpu_cooldown`, never returns to the
//!   GPU it left within `return_cooldown`, a GPU that gave or took a vGPU is left alone for
//!   `gpu_cooldown` and must be overloaded for a fresh `window` before it gives again, and
//!   consolidation packs only up to `pack_max`, below `overload_clear`.
//! - **Consolidation** (mode `consolidate`, when no GPU is overloaded): a GPU whose load
//!   stayed below `light` for a window is drained onto the fullest occupied GPUs that keep
//!   at most `pack_max` after packing, best fit; only when all its vGPUs fit. GPUs left
//!   with no vGPU are reported idle (they can be powered down or lent out).

use std::collections::BTreeMap;

use crate::clock::{Nanos, MS};
use crate::state::VgpuId;

/// Index of a physical GPU.
pub type GpuIndex = u32;

/// Per-mille of a whole GPU.
const WHOLE: u32 = 1000;

/// What the rebalancer does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Measure and report only.
    #[default]
    Off,
    /// Move vGPUs off GPUs that stay overloaded.
    Balance,
    /// Balance, and under light load pack vGPUs onto fewer GPUs.
    Consolidate,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Balance => "balance",
            Mode::Consolidate => "consolidate",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Mode::Off),
            "balance" => Ok(Mode::Balance),
            "consolidate" => Ok(Mode::Consolidate),
            other => Err(format!(
                "{other:?} is not a rebalancer mode: use off, balance or consolidate"
            )),
        }
    }
}

/// The policy's knobs (see the module documentation for what each bounds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RebalanceConfig {
    pub mode: Mode,
    /// How long a condition (overload, light load) must hold before it is acted on.
    pub window: Nanos,
    /// A GPU is overloaded above this load (1.0 = demand equals capacity).
    pub overload: f64,
    /// ... and stops being overloaded below this.
    pub overload_clear: f64,
    /// A GPU whose load stays above this for `severe_window` (shorter than `window`) is
    /// overloaded too: a heavy overload is acted on sooner than a mild one.
    pub severe: f64,
    pub severe_window: Nanos,
    /// A GPU whose load was above `overload` for at least this fraction of the recent
    /// past (an EWMA with time constant `recurring_span`) is overloaded too, even when
    /// each episode is shorter than the window (bursts that repeat). Its moves are judged
    /// on the vGPUs' recent peaks, so a move fits the target even at the peaks.
    pub recurring_duty: f64,
    pub recurring_span: Nanos,
    /// The recurring rule counts the time with load above this (at least `overload`):
    /// swings just over capacity that never last a window are left to the others.
    pub recurring_level: f64,
    /// A move leaves its target at most this loaded.
    pub target_max: f64,
    /// Smallest drop of the pair's peak load worth a move.
    pub min_gain: f64,
    /// A vGPU that moved stays put this long.
    pub vgpu_cooldown: Nanos,
    /// A GPU that gave or took a vGPU is left alone this long.
    pub gpu_cooldown: Nanos,
    /// A vGPU never goes back to the GPU it left within this long.
    pub return_cooldown: Nanos,
    /// Fixed cost of any move, bytes (so a vGPU with nothing resident is not free).
    pub move_overhead_bytes: u64,
    /// Consolidation: a GPU below this load for a window is a candidate to drain ...
    pub light: f64,
    /// ... onto occupied GPUs that stay at most this loaded.
    pub pack_max: f64,
    /// Time constant of the demand smoothing (EWMA).
    pub smoothing: Nanos,
    /// Most balance moves per round.
    pub max_moves: usize,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Off,
            window: 2_000 * MS,
            overload: 1.001,
            overload_clear: 0.9,
            severe: 1.3,
            severe_window: 1_000 * MS,
            recurring_duty: 0.3,
            recurring_span: 20_000 * MS,
            recurring_level: 1.05,
            target_max: 1.0,
            min_gain: 0.05,
            vgpu_cooldown: 10_000 * MS,
            gpu_cooldown: 2_000 * MS,
            return_cooldown: 60_000 * MS,
            move_overhead_bytes: 64 << 20,
            light: 0.3,
            pack_max: 0.7,
            smoothing: 500 * MS,
            max_moves: 1,
        }
    }
}

impl RebalanceConfig {
    /// The defaults with every duration scaled to a decision `window` (the daemon's flag).
    pub fn with_window(mode: Mode, window: Nanos) -> Self {
        let d = Self::default();
        let scale = |v: Nanos| {
            (v as u128 * window as u128 / d.window.max(1) as u128).min(u64::MAX as u128) as Nanos
        };
        Self {
            mode,
            window,
            vgpu_cooldown: scale(d.vgpu_cooldown),
            gpu_cooldown: scale(d.gpu_cooldown),
            return_cooldown: scale(d.return_cooldown),
            smoothing: scale(d.smoothing),
            severe_window: scale(d.severe_window),
            recurring_span: scale(d.recurring_span),
            ..d
        }
    }
}

/// Demand on one GPU's engines, fractions of an interval (busy + waiting), each ≤ 1.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    pub compute: f64,
    pub copy: f64,
}

impl Demand {
    fn clamp(self) -> Self {
        let c = |v: f64| {
            if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        Self {
            compute: c(self.compute),
            copy: c(self.copy),
        }
    }
}

/// One GPU as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuView {
    pub index: GpuIndex,
    /// Compute rate relative to nominal (a vGPU's compute demand scales by speed ratios).
    pub speed: f64,
    /// Copy rate relative to nominal.
    pub copy_rate: f64,
    /// Device memory for hard shares.
    pub memory: u64,
    pub committed_memory: u64,
    /// Per-mille committed.
    pub committed_compute: u32,
    pub committed_copy: u32,
    /// Room left in the pool oversubscribed vGPUs share.
    pub pool_free: u64,
}

/// One vGPU as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VgpuView {
    pub id: VgpuId,
    pub gpu: GpuIndex,
    /// Its memory share (reserved on its GPU unless oversubscribed).
    pub memory: u64,
    /// Shares, per-mille.
    pub compute: u32,
    pub copy: u32,
    pub oversubscribe: bool,
    /// Bytes a move copies (resident device memory).
    pub resident: u64,
    /// Demand over the last interval on its GPU; None = not measured this time.
    pub demand: Option<Demand>,
    /// False while it cannot move (migrating, starting, no worker).
    pub movable: bool,
}

/// Why a vGPU moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Its GPU stayed overloaded.
    Balance,
    /// Its GPU is lightly loaded and is being emptied.
    Consolidate,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Balance => "balance",
            Kind::Consolidate => "consolidate",
        }
    }
}

/// One decision: move `vgpu` from `from` to `to`.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub at: Nanos,
    pub kind: Kind,
    pub vgpu: VgpuId,
    pub from: GpuIndex,
    pub to: GpuIndex,
    /// Loads before and after the move (as predicted).
    pub from_load: f64,
    pub to_load: f64,
    pub from_load_after: f64,
    pub to_load_after: f64,
    /// The vGPU's smoothed demand (max of compute and copy, on its source).
    pub demand: f64,
    /// Bytes the move copies.
    pub bytes: u64,
    /// How much the pair's peak load drops.
    pub benefit: f64,
    /// Benefit per GiB moved (with the fixed cost).
    pub score: f64,
    /// In words.
    pub reason: String,
}

/// One GPU's state after a round.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuLoad {
    pub index: GpuIndex,
    /// Smoothed demand over capacity, per engine.
    pub compute: f64,
    pub copy: f64,
    /// max(compute, copy).
    pub load: f64,
    /// Overloaded for a whole window now.
    pub overloaded: bool,
    /// Above `overload` since (even if not yet for a window).
    pub over_since: Option<Nanos>,
    /// Holds no vGPU.
    pub idle: bool,
    /// vGPUs on it.
    pub vgpus: u32,
}

/// Something the caller should log beside the decisions.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// A GPU has been overloaded for a window.
    Overloaded { gpu: GpuIndex, load: f64 },
    /// It no longer is.
    Cleared { gpu: GpuIndex, load: f64 },
    /// A GPU became idle (no vGPU) or busy again.
    Idle { gpu: GpuIndex, idle: bool },
    /// An overloaded GPU had no move that helps (why, in words).
    Stuck { gpu: GpuIndex, why: String },
}

/// What one round decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Round {
    pub decisions: Vec<Decision>,
    pub loads: Vec<GpuLoad>,
    pub notes: Vec<Note>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Tracked {
    /// Smoothed demand in nominal units (times speed / copy rate).
    work: Demand,
    /// Recent peak of the measured demand (nominal units), decaying with
    /// `recurring_span`.
    peak: Demand,
    seen: bool,
    moved_at: Option<Nanos>,
    left: Option<(GpuIndex, Nanos)>,
}

#[derive(Clone, Copy, Debug, Default)]
struct GpuTrack {
    over_since: Option<Nanos>,
    severe_since: Option<Nanos>,
    /// Fraction of the recent past with load above `overload` (EWMA).
    duty: f64,
    /// Overloaded only by recurrence (its moves are judged on peaks).
    recurring: bool,
    overloaded: bool,
    light_since: Option<Nanos>,
    touched_at: Option<Nanos>,
    idle: Option<bool>,
    stuck_noted: bool,
}

/// The rebalancer's memory between rounds.
#[derive(Clone, Debug)]
pub struct Rebalancer {
    cfg: RebalanceConfig,
    vgpus: BTreeMap<VgpuId, Tracked>,
    gpus: BTreeMap<GpuIndex, GpuTrack>,
    last: Option<Nanos>,
    loads: Vec<GpuLoad>,
    /// The second leg of a swap, waiting for the first to land.
    pending: Option<Pending>,
}

/// A swap's second leg: once `first` (the light vGPU) is on `second.from`, move
/// `second.vgpu` to `second.to`.
#[derive(Clone, Debug)]
struct Pending {
    first: VgpuId,
    second: Decision,
}

/// A candidate GPU for a new vGPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlaceCandidate {
    pub gpu: GpuIndex,
    /// Its expected load now (measured, or the shares where nothing is measured yet).
    pub load: f64,
    /// What the new vGPU is expected to add (its share).
    pub add: f64,
    /// Fraction of its memory still free after the new vGPU.
    pub free_memory_after: f64,
    /// It holds vGPUs already.
    pub occupied: bool,
}

/// Picks a GPU for a new vGPU among those it fits on: the lowest expected load after
/// placing plus memory pressure (1 - free memory share after), so both measured load and
/// free memory count, not the number of vGPUs. In `consolidate` mode, the fullest
/// occupied GPU that stays at most `pack_max` (best fit), else as above.
pub fn place(cfg: &RebalanceConfig, candidates: &[PlaceCandidate]) -> Option<GpuIndex> {
    if cfg.mode == Mode::Consolidate {
        let packed = candidates
            .iter()
            .filter(|c| c.occupied && c.load + c.add <= cfg.pack_max)
            .max_by(|a, b| (a.load + a.add).total_cmp(&(b.load + b.add)));
        if let Some(c) = packed {
            return Some(c.gpu);
        }
    }
    let cost = |c: &PlaceCandidate| c.load + c.add + 0.5 * (1.0 - c.free_memory_after);
    candidates
        .iter()
        .min_by(|a, b| cost(a).total_cmp(&cost(b)).then(a.gpu.cmp(&b.gpu)))
        .map(|c| c.gpu)
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

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
        let alpha = if cfg.smoothing == 0 {
            1.0
        } else {
            1.0 - (-(dt as f64) / cfg.smoothing as f64).exp()
        };
        let keep = if cfg.recurring_span == 0 {
            0.0
        } else {
            (-(dt as f64) / cfg.recurring_span as f64).exp()
        };
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
        let mut round = Round::default();
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
                round.notes.push(if over {
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
                    round.notes.push(Note::Idle {
                        gpu: l.index,
                        idle: l.idle,
                    });
                }
                tr.idle = Some(l.idle);
            }
        }
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

    /// `g`'s load with the vGPUs on it (optionally without `minus`, with `plus`).
    fn load_of(
        &self,
        g: &GpuView,
        vgpus: &[VgpuView],
        minus: Option<VgpuId>,
        plus: Option<&VgpuView>,
    ) -> GpuLoad {
        self.load_by(g, vgpus, minus, plus, false)
    }

    /// As `load_of`, on the vGPUs' recent peaks (`peak`) or their smoothed demand.
    fn load_by(
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
    fn peak_of(&self, v: &VgpuView) -> Demand {
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
    fn work_of(&self, v: &VgpuView) -> Demand {
        match self.vgpus.get(&v.id) {
            Some(t) if t.seen => t.work,
            _ => Demand {
                compute: f64::from(v.compute) / f64::from(WHOLE),
                copy: f64::from(v.copy) / f64::from(WHOLE),
            },
        }
    }

    fn cooling(&self, at: Option<Nanos>, now: Nanos, d: Nanos) -> bool {
        at.is_some_and(|t| now.saturating_sub(t) < d)
    }

    /// Why `v` cannot go to `t` (shares and memory stay guaranteed), or None.
    fn misfit(v: &VgpuView, t: &GpuView) -> Option<String> {
        if t.committed_compute + v.compute > WHOLE {
            return Some(format!(
                "compute shares on GPU {} would reach {:.1}%",
                t.index,
                f64::from(t.committed_compute + v.compute) / 10.0
            ));
        }
        if t.committed_copy + v.copy > WHOLE {
            return Some(format!(
                "copy shares on GPU {} would reach {:.1}%",
                t.index,
                f64::from(t.committed_copy + v.copy) / 10.0
            ));
        }
        if v.oversubscribe {
            if v.resident > t.pool_free {
                return Some(format!("GPU {}'s pool has no room", t.index));
            }
        } else if t.committed_memory.saturating_add(v.memory) > t.memory {
            return Some(format!("GPU {} has no memory for its share", t.index));
        }
        None
    }

    fn best_balance_move(
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
                    if let Some(m) = Self::misfit(v, t) {
                        why = m;
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
    fn second_leg(&mut self, now: Nanos, gpus: &[GpuView], vgpus: &[VgpuView]) -> Option<Decision> {
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
        if Self::misfit(v, t).is_some() {
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
    fn best_swap(
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
                        if returns(u, s.index) || Self::misfit(u, s).is_some() {
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
                        if Self::misfit(v, &t2).is_some() {
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

    fn consolidate(
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
                        || Self::misfit(v, t).is_some()
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

    fn apply(d: &Decision, gpus: &mut [GpuView], vgpus: &mut [VgpuView]) {
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
    fn commit(&mut self, d: &Decision, now: Nanos, gpus: &mut [GpuView], vgpus: &mut [VgpuView]) {
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

fn on_gpu(w: Demand, g: &GpuView) -> Demand {
    Demand {
        compute: w.compute / g.speed.max(1e-9),
        copy: w.copy / g.copy_rate.max(1e-9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpus(n: u32) -> Vec<GpuView> {
        (0..n)
            .map(|i| GpuView {
                index: i,
                speed: 1.0,
                copy_rate: 1.0,
                memory: 16 * GIB,
                committed_memory: 0,
                committed_compute: 0,
                committed_copy: 0,
                pool_free: 0,
            })
            .collect()
    }

    fn v(id: VgpuId, gpu: GpuIndex, share: u32, resident: u64, compute: f64) -> VgpuView {
        VgpuView {
            id,
            gpu,
            memory: resident.max(GIB),
            compute: share,
            copy: share,
            oversubscribe: false,
            resident,
            demand: Some(Demand {
                compute,
                copy: 0.05,
            }),
            movable: true,
        }
    }

    /// Fills in committed shares and memory from the vGPUs.
    fn commit_all(gs: &mut [GpuView], vs: &[VgpuView]) {
        for g in gs.iter_mut() {
            g.committed_compute = vs
                .iter()
                .filter(|v| v.gpu == g.index)
                .map(|v| v.compute)
                .sum();
            g.committed_copy = vs.iter().filter(|v| v.gpu == g.index).map(|v| v.copy).sum();
            g.committed_memory = vs
                .iter()
                .filter(|v| v.gpu == g.index)
                .map(|v| v.memory)
                .sum();
        }
    }

    fn cfg(mode: Mode) -> RebalanceConfig {
        RebalanceConfig {
            mode,
            ..RebalanceConfig::default()
        }
    }

    /// Runs rounds every 250 ms of virtual time for `secs`, moving vGPUs as decided;
    /// `demand(t, vgpu)` gives each vGPU's compute demand at time t.
    fn run(
        r: &mut Rebalancer,
        gs: &mut [GpuView],
        vs: &mut [VgpuView],
        from: Nanos,
        secs: u64,
        demand: impl Fn(Nanos, VgpuId) -> f64,
    ) -> Vec<Decision> {
        let mut all = Vec::new();
        let mut now = from;
        while now < from + secs * 1000 * MS {
            now += 250 * MS;
            for v in vs.iter_mut() {
                v.demand = Some(Demand {
                    compute: demand(now, v.id),
                    copy: 0.05,
                });
                v.movable = true;
            }
            commit_all(gs, vs);
            let round = r.observe(now, gs, vs);
            for d in &round.decisions {
                if let Some(x) = vs.iter_mut().find(|x| x.id == d.vgpu) {
                    x.gpu = d.to;
                }
                // Every move on its own keeps every GPU within its shares and memory.
                commit_all(gs, vs);
                for g in gs.iter() {
                    assert!(
                        g.committed_compute <= WHOLE
                            && g.committed_copy <= WHOLE
                            && g.committed_memory <= g.memory,
                        "{d:?} oversubscribes GPU {}: {g:?}",
                        g.index
                    );
                }
            }
            all.extend(round.decisions);
        }
        all
    }

    /// No vGPU goes back to the GPU it left within the return cool-down.
    fn assert_no_return(d: &[Decision], return_cooldown: Nanos) {
        let mut left: BTreeMap<VgpuId, (GpuIndex, Nanos)> = BTreeMap::new();
        for x in d {
            if let Some((g, at)) = left.get(&x.vgpu) {
                assert!(
                    !(x.to == *g && x.at - at < return_cooldown),
                    "vGPU {} went back to GPU {} after {} ms: {d:#?}",
                    x.vgpu,
                    g,
                    (x.at - at) / MS
                );
            }
            left.insert(x.vgpu, (x.from, x.at));
        }
    }

    #[test]
    fn off_measures_but_never_moves() {
        let mut r = Rebalancer::new(cfg(Mode::Off));
        let mut gs = gpus(2);
        let mut vs = vec![v(1, 0, 300, GIB, 0.9), v(2, 0, 300, GIB, 0.9)];
        let d = run(&mut r, &mut gs, &mut vs, 0, 10, |_, _| 0.9);
        assert!(d.is_empty());
        assert!(r.loads()[0].overloaded);
        assert!((r.loads()[0].load - 1.8).abs() < 0.01, "{:?}", r.loads());
        assert!(r.loads()[1].idle);
    }

    #[test]
    fn overload_is_detected_only_after_a_window() {
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        // A mild overload (1.1, below `severe`) waits for the whole window.
        let mut vs = vec![v(1, 0, 300, GIB, 0.55), v(2, 0, 300, GIB, 0.55)];
        // 1.5 s of overload: shorter than the 2 s window.
        let d = run(&mut r, &mut gs, &mut vs, 0, 1, |_, _| 0.55);
        assert!(d.is_empty(), "{d:?}");
        assert!(!r.loads()[0].overloaded);
        let d = run(&mut r, &mut gs, &mut vs, 1000 * MS, 2, |_, _| 0.55);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].from, d[0].to, d[0].kind), (0, 1, Kind::Balance));
        assert!(d[0].reason.contains("overloaded"), "{}", d[0].reason);
        assert!(d[0].at >= 2000 * MS, "acted after the window: {}", d[0].at);
    }

    #[test]
    fn a_severe_overload_is_acted_on_within_the_severe_window() {
        // Load 1.6 (above `severe`, 1.3): acted on after `severe_window` (1 s), not after
        // the whole 2 s window.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        let mut vs = vec![v(1, 0, 300, GIB, 0.8), v(2, 0, 300, GIB, 0.8)];
        let d = run(&mut r, &mut gs, &mut vs, 0, 3, |_, _| 0.8);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].from, d[0].to), (0, 1));
        let c = r.config();
        assert!(
            d[0].at <= c.severe_window + 500 * MS && d[0].at < c.window,
            "acted at {} ms",
            d[0].at / MS
        );
        // A spike above `severe` shorter than `severe_window` moves nothing.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut vs = vec![v(1, 0, 300, GIB, 0.3), v(2, 0, 300, GIB, 0.3)];
        let d = run(&mut r, &mut gs, &mut vs, 0, 20, |t, _| {
            // 0.5 s at full demand (load 2) every 2 s, 0.3 otherwise.
            if t % (2000 * MS) < 500 * MS {
                1.0
            } else {
                0.3
            }
        });
        assert!(d.is_empty(), "{d:#?}");
    }

    #[test]
    fn a_swap_when_no_single_move_fits_the_shares() {
        // GPU 0: two busy vGPUs (0.7 each, 20% shares). GPU 1: its shares are full (20% +
        // 80%), with a light vGPU 3 (0.1) and vGPU 4 (0.2). No single move fits GPU 1's
        // shares; swapping vGPU 3 with a busy one does, each leg on its own.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        let mut vs = vec![
            v(1, 0, 200, GIB, 0.7),
            v(2, 0, 200, GIB, 0.7),
            v(3, 1, 200, GIB, 0.1),
            v(4, 1, 800, GIB, 0.2),
        ];
        let demand = |_: Nanos, id: VgpuId| match id {
            1 | 2 => 0.7,
            3 => 0.1,
            _ => 0.2,
        };
        let d = run(&mut r, &mut gs, &mut vs, 0, 60, demand);
        assert_eq!(d.len(), 2, "{d:#?}");
        assert_eq!((d[0].vgpu, d[0].from, d[0].to), (3, 1, 0), "{d:#?}");
        assert!(d[1].vgpu <= 2 && (d[1].from, d[1].to) == (0, 1), "{d:#?}");
        assert!(d[0].reason.contains("swap"), "{}", d[0].reason);
        assert!(r.loads().iter().all(|l| l.load <= 1.0 && !l.overloaded));
        // And it stays.
        let more = run(&mut r, &mut gs, &mut vs, 60_000 * MS, 60, demand);
        assert!(more.is_empty(), "{more:#?}");
    }

    #[test]
    fn a_refused_first_leg_drops_the_swap() {
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        let vs = vec![
            v(1, 0, 200, GIB, 0.7),
            v(2, 0, 200, GIB, 0.7),
            v(3, 1, 200, GIB, 0.1),
            v(4, 1, 800, GIB, 0.2),
        ];
        commit_all(&mut gs, &vs);
        let mut first = None;
        let mut now = 0;
        while first.is_none() && now < 10_000 * MS {
            now += 250 * MS;
            first = r.observe(now, &gs, &vs).decisions.into_iter().next();
        }
        let first = first.expect("a swap's first leg");
        assert!(first.reason.contains("first leg"), "{}", first.reason);
        assert!(r.pending.is_some());
        // vgpud's migration of the first leg is refused: the second leg is forgotten and
        // other moves are no longer held back.
        r.failed(&first);
        assert!(r.pending.is_none());
    }

    #[test]
    fn swaps_do_not_ping_pong_under_oscillating_load() {
        // As above, but which pair is busy swings every 3 s for two minutes.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        let mut vs = vec![
            v(1, 0, 200, GIB, 0.7),
            v(2, 0, 200, GIB, 0.7),
            v(3, 1, 200, GIB, 0.1),
            v(4, 1, 800, GIB, 0.2),
        ];
        let d = run(&mut r, &mut gs, &mut vs, 0, 120, |t, id| {
            let phase = (t / (3000 * MS)) % 2 == 0;
            match (phase, id) {
                (true, 1 | 2) | (false, 3 | 4) => 0.7,
                _ => 0.1,
            }
        });
        assert!(d.iter().any(|x| x.reason.contains("swap")), "{d:#?}");
        assert_no_return(&d, r.config().return_cooldown);
        assert!(d.len() <= 8, "{} moves: {d:#?}", d.len());
    }

    #[test]
    fn recurring_bursts_shorter_than_the_window_move_a_vgpu_once() {
        // GPU 0: vGPU 1 bursts to 0.9 for 1.25 s every 3 s (0.05 otherwise) beside a
        // steady vGPU 2 at 0.6; GPU 1 holds a nearly idle vGPU 3. Each overload lasts less
        // than the window (and less than `severe_window` above `severe`), so the old rules
        // never moved anything; the pattern repeats, so the recurring rule moves one vGPU,
        // to where it fits even at the peaks, once.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        let mut vs = vec![
            v(1, 0, 200, GIB, 0.05),
            v(2, 0, 200, GIB, 0.6),
            v(3, 1, 200, GIB, 0.05),
        ];
        let demand = |t: Nanos, id: VgpuId| match id {
            1 if t % (3000 * MS) < 1250 * MS => 0.9,
            1 | 3 => 0.05,
            _ => 0.6,
        };
        let d = run(&mut r, &mut gs, &mut vs, 0, 120, demand);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!((d[0].from, d[0].to), (0, 1), "{d:#?}");
        assert!(d[0].reason.contains("again and again"), "{}", d[0].reason);
        assert!(d[0].to_load_after <= 1.0, "{d:#?}");
        // Gone: the bursts no longer overload anything.
        let more = run(&mut r, &mut gs, &mut vs, 120_000 * MS, 60, demand);
        assert!(more.is_empty(), "{more:#?}");
        assert!(r.loads().iter().all(|l| !l.overloaded), "{:?}", r.loads());
    }

    #[test]
    fn the_candidate_that_helps_most_per_byte_moves() {
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        // 3 and 4 help as much as each other (0.5 demand); 3 holds 8 GiB, 4 holds 1 GiB.
        // 5 is tiny (0.02): moving it does not help enough. 6 is big and busy but the
        // move would overload GPU 1.
        let mut vs = vec![
            v(3, 0, 200, 8 * GIB, 0.5),
            v(4, 0, 200, GIB, 0.5),
            v(5, 0, 100, 0, 0.02),
            v(6, 0, 200, GIB, 0.95),
            v(7, 1, 200, GIB, 0.3),
        ];
        let d = run(&mut r, &mut gs, &mut vs, 0, 3, |_, id| match id {
            3 | 4 => 0.5,
            5 => 0.02,
            6 => 0.95,
            _ => 0.3,
        });
        // The first move (later ones may follow while GPU 0 stays overloaded).
        assert!(!d.is_empty(), "{d:?}");
        assert_eq!(d[0].vgpu, 4, "{d:?}");
        assert!(d[0].to_load_after <= 0.9 + 1e-9);
    }

    #[test]
    fn a_move_never_oversubscribes_shares_or_memory() {
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        gs[1].memory = 2 * GIB;
        // GPU 1 has 80% of its compute committed and 1 GiB memory left: vGPU 1 (30%)
        // cannot go; vGPU 2 (10%, 4 GiB share) cannot either (memory).
        let mut big = v(2, 0, 100, GIB, 0.8);
        big.memory = 4 * GIB;
        let mut vs = vec![v(1, 0, 300, GIB, 0.8), big, v(9, 1, 800, GIB, 0.0)];
        let d = run(&mut r, &mut gs, &mut vs, 0, 10, |_, id| {
            if id == 9 {
                0.0
            } else {
                0.8
            }
        });
        assert!(d.is_empty(), "{d:?}");
        assert!(r.loads()[0].overloaded);
    }

    #[test]
    fn no_ping_pong_under_oscillating_load() {
        // Two GPUs; the load swings between them every 3 s (longer than the window, so
        // each swing is a real overload): 4 vGPUs, two per GPU, the pair on the "hot" GPU
        // demands 0.7 each, the other pair 0.1.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        let mut vs = vec![
            v(1, 0, 200, GIB, 0.7),
            v(2, 0, 200, GIB, 0.7),
            v(3, 1, 200, GIB, 0.1),
            v(4, 1, 200, GIB, 0.1),
        ];
        let d = run(&mut r, &mut gs, &mut vs, 0, 120, |t, id| {
            let phase = (t / (3000 * MS)) % 2 == 0;
            let hot = if phase { id <= 2 } else { id > 2 };
            if hot {
                0.7
            } else {
                0.1
            }
        });
        // Never back to the GPU it left within the return cool-down.
        let mut left: BTreeMap<VgpuId, (GpuIndex, Nanos)> = BTreeMap::new();
        for x in &d {
            if let Some((g, at)) = left.get(&x.vgpu) {
                assert!(
                    !(x.to == *g && x.at - at < r.config().return_cooldown),
                    "vGPU {} went back to GPU {} after {} ms: {d:#?}",
                    x.vgpu,
                    g,
                    (x.at - at) / MS
                );
            }
            left.insert(x.vgpu, (x.from, x.at));
        }
        // A few moves at most in two minutes of swinging (one per vGPU per return
        // cool-down at the very most).
        assert!(d.len() <= 4, "{} moves: {d:#?}", d.len());
        // Swings faster than the window never move anything.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut vs2 = vec![
            v(1, 0, 200, GIB, 0.7),
            v(2, 0, 200, GIB, 0.7),
            v(3, 1, 200, GIB, 0.1),
            v(4, 1, 200, GIB, 0.1),
        ];
        let d = run(&mut r, &mut gs, &mut vs2, 0, 60, |t, id| {
            let phase = (t / (1000 * MS)) % 2 == 0;
            if phase == (id <= 2) {
                0.7
            } else {
                0.1
            }
        });
        assert!(d.is_empty(), "{d:#?}");
    }

    #[test]
    fn the_fast_migration_settings_do_not_ping_pong() {
        // The settings `vgpu-bench rebalance` runs where moves are cheap (H200: window
        // 500 ms, smoothing 50 ms; every cool-down scales with the window). Load swinging
        // every 750 ms, longer than the window, moves each vGPU at most once per return
        // cool-down and never back within it, and no two moves come closer than the GPU
        // cool-down.
        let mut fast = RebalanceConfig::with_window(Mode::Balance, 500 * MS);
        fast.smoothing = 50 * MS;
        let swing = |period: Nanos| {
            move |t: Nanos, id: VgpuId| {
                let phase = (t / period) % 2 == 0;
                if phase == (id <= 2) {
                    0.7
                } else {
                    0.1
                }
            }
        };
        let four = || {
            vec![
                v(1, 0, 200, GIB, 0.7),
                v(2, 0, 200, GIB, 0.7),
                v(3, 1, 200, GIB, 0.1),
                v(4, 1, 200, GIB, 0.1),
            ]
        };
        let mut r = Rebalancer::new(fast);
        let mut gs = gpus(2);
        let mut vs = four();
        let d = run(&mut r, &mut gs, &mut vs, 0, 120, swing(750 * MS));
        assert!(
            !d.is_empty(),
            "a swing longer than the window is an overload"
        );
        assert_no_return(&d, fast.return_cooldown);
        let per_vgpu = 120_000 * MS / fast.return_cooldown + 1;
        for id in 1..=4 {
            let n = d.iter().filter(|x| x.vgpu == id).count() as u64;
            assert!(n <= per_vgpu, "vGPU {id} moved {n} times: {d:#?}");
        }
        for w in d.windows(2) {
            assert!(
                w[1].at - w[0].at >= fast.gpu_cooldown,
                "moves closer than the GPU cool-down: {d:#?}"
            );
        }
        // Swings of one round: with so little smoothing GPU 0 is above `overload` every
        // other round, a recurring overload; it is fixed once (one move or one swap) and
        // nothing moves after that.
        let mut r = Rebalancer::new(fast);
        let mut vs = four();
        let d = run(&mut r, &mut gs, &mut vs, 0, 60, swing(250 * MS));
        assert!(d.len() <= 2, "{d:#?}");
        assert_no_return(&d, fast.return_cooldown);
        let more = run(&mut r, &mut gs, &mut vs, 60_000 * MS, 60, swing(250 * MS));
        assert!(more.is_empty(), "{more:#?}");
    }

    #[test]
    fn a_move_that_ends_an_overload_is_made_however_small() {
        // GPU 0: vGPU 1 at 0.97 beside a light vGPU 2 at 0.04: load 1.01, just over
        // capacity, for good. Moving vGPU 1 would overload GPU 1; moving vGPU 2 lowers the
        // peak by only 0.04 (< min_gain) but ends the overload, so it moves, once.
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(2);
        let mut vs = vec![
            v(1, 0, 200, GIB, 0.97),
            v(2, 0, 200, GIB, 0.04),
            v(3, 1, 200, GIB, 0.5),
        ];
        let demand = |_: Nanos, id: VgpuId| match id {
            1 => 0.97,
            2 => 0.04,
            _ => 0.5,
        };
        let d = run(&mut r, &mut gs, &mut vs, 0, 60, demand);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!((d[0].vgpu, d[0].from, d[0].to), (2, 0, 1), "{d:#?}");
        assert!(d[0].benefit < r.config().min_gain, "{d:#?}");
        assert!(
            d[0].from_load_after <= 1.0 && d[0].to_load_after <= 1.0,
            "{d:#?}"
        );
        assert!(r.loads().iter().all(|l| l.load <= 1.0), "{:?}", r.loads());
    }

    #[test]
    fn imbalance_converges_and_stays() {
        let mut r = Rebalancer::new(cfg(Mode::Balance));
        let mut gs = gpus(4);
        let mut vs: Vec<VgpuView> = (1..=6).map(|i| v(i, 0, 150, GIB, 0.4)).collect();
        let d = run(&mut r, &mut gs, &mut vs, 0, 120, |_, _| 0.4);
        // 6 × 0.4 = 2.4 on GPU 0; a target takes two at most (0.8 <= 0.9): four moves
        // bring GPU 0 to 0.8 and nothing stays overloaded.
        let loads = r.loads();
        assert!(loads.iter().all(|l| l.load <= 0.9 + 1e-9), "{loads:?}");
        assert_eq!(d.len(), 4, "{d:#?}");
        // And then nothing more happens.
        let more = run(&mut r, &mut gs, &mut vs, 120_000 * MS, 60, |_, _| 0.4);
        assert!(more.is_empty(), "{more:#?}");
    }

    #[test]
    fn consolidation_empties_light_gpus_and_reports_them_idle() {
        let mut r = Rebalancer::new(cfg(Mode::Consolidate));
        let mut gs = gpus(4);
        let mut vs: Vec<VgpuView> = (0..4).map(|i| v(i + 1, i, 200, GIB, 0.1)).collect();
        let d = run(&mut r, &mut gs, &mut vs, 0, 60, |_, _| 0.1);
        assert!(d.iter().all(|x| x.kind == Kind::Consolidate), "{d:#?}");
        let idle: Vec<GpuIndex> = r
            .loads()
            .iter()
            .filter(|l| l.idle)
            .map(|l| l.index)
            .collect();
        assert_eq!(idle.len(), 3, "4 × 0.1 fits one GPU: {:?}", r.loads());
        assert!(r.loads().iter().all(|l| l.load <= 0.7 + 1e-9));
        // Stable afterwards.
        let more = run(&mut r, &mut gs, &mut vs, 60_000 * MS, 60, |_, _| 0.1);
        assert!(more.is_empty(), "{more:#?}");
        // Load rises: the packed GPU overloads and balancing spreads it again.
        let spread = run(&mut r, &mut gs, &mut vs, 120_000 * MS, 60, |_, _| 0.5);
        assert!(!spread.is_empty());
        assert!(spread.iter().all(|x| x.kind == Kind::Balance));
        assert!(r.loads().iter().all(|l| !l.overloaded), "{:?}", r.loads());
    }

    #[test]
    fn placement_weighs_load_and_free_memory() {
        let c = cfg(Mode::Balance);
        let cands = [
            PlaceCandidate {
                gpu: 0,
                load: 0.9,
                add: 0.1,
                free_memory_after: 0.9,
                occupied: true,
            },
            PlaceCandidate {
                gpu: 1,
                load: 0.2,
                add: 0.1,
                free_memory_after: 0.1,
                occupied: true,
            },
            PlaceCandidate {
                gpu: 2,
                load: 0.3,
                add: 0.1,
                free_memory_after: 0.8,
                occupied: true,
            },
        ];
        assert_eq!(place(&c, &cands), Some(2));
        assert_eq!(place(&cfg(Mode::Consolidate), &cands), Some(2));
        let packed = [
            PlaceCandidate {
                load: 0.5,
                ..cands[2]
            },
            PlaceCandidate {
                gpu: 3,
                load: 0.0,
                occupied: false,
                ..cands[2]
            },
        ];
        assert_eq!(place(&cfg(Mode::Consolidate), &packed), Some(2));
        assert_eq!(place(&c, &packed), Some(3));
        assert_eq!(place(&c, &[]), None);
    }
}
