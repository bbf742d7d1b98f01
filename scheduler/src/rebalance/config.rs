//! What the rebalancer does ([`Mode`]) and its knobs ([`RebalanceConfig`]).

use crate::clock::{Nanos, MS};

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
