//! The workloads: VM kinds, their demand over their run, and the deterministic traces of
//! VMs arriving.

use vgpu_scheduler::clock::Nanos;
use vgpu_scheduler::rebalance::Demand;

use super::GIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Compute,
    Copy,
    Bursty,
    Idle,
}

pub(super) const KINDS: [Kind; 4] = [Kind::Compute, Kind::Copy, Kind::Bursty, Kind::Idle];

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Compute => "compute-heavy",
            Kind::Copy => "copy-heavy",
            Kind::Bursty => "bursty",
            Kind::Idle => "idle",
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Job {
    pub(super) arrival: Nanos,
    pub(super) kind: Kind,
    /// Per-mille shares.
    pub(super) share: u32,
    pub(super) memory: u64,
    pub(super) resident: u64,
    /// Seconds of progress it needs.
    pub(super) work: f64,
}

impl Job {
    /// What it wants at `progress` seconds into its work.
    pub(super) fn demand(&self, progress: f64) -> Demand {
        match self.kind {
            Kind::Compute => Demand {
                compute: 0.9,
                copy: 0.1,
            },
            Kind::Copy => Demand {
                compute: 0.1,
                copy: 0.9,
            },
            Kind::Bursty => {
                if progress % 5.0 < 2.0 {
                    Demand {
                        compute: 0.95,
                        copy: 0.3,
                    }
                } else {
                    Demand {
                        compute: 0.05,
                        copy: 0.02,
                    }
                }
            }
            Kind::Idle => Demand {
                compute: 0.03,
                copy: 0.02,
            },
        }
    }
}

/// xorshift64*: a deterministic trace without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[((self.next() * xs.len() as f64) as usize).min(xs.len() - 1)]
    }
}

/// `n` VMs arriving about every `gap_s` seconds; `light` makes the mix mostly idle and
/// bursty with long lives.
pub(super) fn trace(seed: u64, n: usize, gap_s: f64, light: bool) -> Vec<Job> {
    let mut r = Rng(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += -gap_s * (1.0 - r.next()).ln();
            let kind = if light {
                r.pick(&[Kind::Idle, Kind::Idle, Kind::Bursty, Kind::Idle])
            } else {
                r.pick(&[Kind::Compute, Kind::Copy, Kind::Bursty, Kind::Idle])
            };
            // Shares are what the tenant bought, not what it uses (DCUDA's point: demand
            // estimated before the run is often wrong).
            let share = r.pick(&[100, 150, 200, 250]);
            let memory = r.pick(&[1, 2, 3, 4]) * GIB;
            let resident = (memory as f64 * (0.3 + 0.7 * r.next())) as u64;
            let work = match kind {
                Kind::Compute | Kind::Copy => 20.0 + 40.0 * r.next(),
                Kind::Bursty => 30.0 + 60.0 * r.next(),
                Kind::Idle => {
                    if light {
                        300.0 + 600.0 * r.next()
                    } else {
                        60.0 + 120.0 * r.next()
                    }
                }
            };
            Job {
                arrival: (t * 1e9) as Nanos,
                kind,
                share,
                memory,
                resident,
                work,
            }
        })
        .collect()
}
