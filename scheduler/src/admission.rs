//! The admission rule: whether a vGPU's guaranteed shares fit on a GPU beside what that GPU
//! has committed already. vgpud asks it when it creates, changes, restores or migrates a
//! vGPU; the rebalancer asks it before every move, so a move never breaks a guarantee the
//! daemon would have refused to give.
//!
//! - A vGPU with a hard memory share needs that many bytes not yet committed to other hard
//!   shares on the GPU.
//! - An oversubscribed vGPU reserves nothing: it competes for what the hard shares leave
//!   (the GPU's pool) and swaps. It needs only room in the pool for the bytes it brings
//!   resident (none for a new vGPU).
//! - Compute and copy shares, per mille of the GPU, sum to at most [`WHOLE`] on one GPU.
//!
//! Checked in that order; the first that fails is the answer.

use crate::GpuIndex;

/// Per-mille of a whole GPU: the unit of compute and copy shares.
pub const WHOLE: u32 = 1000;

/// What a vGPU asks of a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// Its memory share, bytes (reserved on the GPU unless `oversubscribe`).
    pub memory: u64,
    /// Compute share, per mille.
    pub compute: u32,
    /// Copy share, per mille.
    pub copy: u32,
    /// Its memory is not reserved: it shares the GPU's pool and swaps.
    pub oversubscribe: bool,
    /// Bytes an oversubscribed vGPU brings resident into the pool (0 for a new vGPU).
    pub resident: u64,
}

/// A GPU's capacity and what it has committed to the vGPUs on it already.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Room {
    pub gpu: GpuIndex,
    /// Device memory for hard shares, bytes.
    pub memory: u64,
    /// Bytes committed to hard memory shares.
    pub committed_memory: u64,
    /// Per-mille committed.
    pub committed_compute: u32,
    pub committed_copy: u32,
    /// Room left in the pool oversubscribed vGPUs share, bytes.
    pub pool_free: u64,
}

/// One of a GPU's two engines, each shared out separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Compute,
    Copy,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Compute => "compute",
            Engine::Copy => "copy",
        }
    }
}

/// Why an [`Ask`] does not fit a [`Room`]. The numbers let the caller word it for its
/// audience (the REST API's messages, the rebalancer's notes); `Display` is the short form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Misfit {
    /// A hard memory share larger than what the GPU has left for hard shares.
    #[error("GPU {gpu} has no memory for its share")]
    Memory {
        gpu: GpuIndex,
        /// Bytes asked.
        want: u64,
        /// Bytes not committed to hard shares.
        free: u64,
        /// The GPU's memory for hard shares.
        total: u64,
        /// Bytes committed to other hard shares.
        committed: u64,
    },
    /// An oversubscribed vGPU's resident bytes do not fit the pool.
    #[error("GPU {gpu}'s pool has no room")]
    Pool {
        gpu: GpuIndex,
        /// Bytes it brings resident.
        need: u64,
        /// Bytes free in the pool.
        free: u64,
    },
    /// The engine's shares would sum past the whole GPU.
    #[error("{} shares on GPU {gpu} would reach {:.1}%", engine.name(), f64::from(have.saturating_add(*want)) / 10.0)]
    Share {
        gpu: GpuIndex,
        engine: Engine,
        /// Per mille committed to other vGPUs.
        have: u32,
        /// Per mille asked.
        want: u32,
    },
}

impl Misfit {
    /// The GPU it does not fit.
    pub fn gpu(&self) -> GpuIndex {
        match *self {
            Misfit::Memory { gpu, .. } | Misfit::Pool { gpu, .. } | Misfit::Share { gpu, .. } => {
                gpu
            }
        }
    }
}

/// Why `ask` does not fit `room`, or None when it does (see the module documentation).
pub fn misfit(ask: &Ask, room: &Room) -> Option<Misfit> {
    if ask.oversubscribe {
        if ask.resident > room.pool_free {
            return Some(Misfit::Pool {
                gpu: room.gpu,
                need: ask.resident,
                free: room.pool_free,
            });
        }
    } else {
        let free = room.memory.saturating_sub(room.committed_memory);
        if ask.memory > free {
            return Some(Misfit::Memory {
                gpu: room.gpu,
                want: ask.memory,
                free,
                total: room.memory,
                committed: room.committed_memory,
            });
        }
    }
    for (engine, have, want) in [
        (Engine::Compute, room.committed_compute, ask.compute),
        (Engine::Copy, room.committed_copy, ask.copy),
    ] {
        if have.saturating_add(want) > WHOLE {
            return Some(Misfit::Share {
                gpu: room.gpu,
                engine,
                have,
                want,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn room() -> Room {
        Room {
            gpu: 3,
            memory: 16 * GIB,
            committed_memory: 10 * GIB,
            committed_compute: 600,
            committed_copy: 300,
            pool_free: 2 * GIB,
        }
    }

    fn ask() -> Ask {
        Ask {
            memory: 6 * GIB,
            compute: 400,
            copy: 700,
            oversubscribe: false,
            resident: 0,
        }
    }

    #[test]
    fn fits_exactly() {
        assert_eq!(misfit(&ask(), &room()), None);
        let empty = Room {
            committed_memory: 0,
            committed_compute: 0,
            committed_copy: 0,
            ..room()
        };
        let whole = Ask {
            memory: 16 * GIB,
            compute: WHOLE,
            copy: WHOLE,
            ..ask()
        };
        assert_eq!(misfit(&whole, &empty), None);
    }

    #[test]
    fn over_memory() {
        let a = Ask {
            memory: 6 * GIB + 1,
            ..ask()
        };
        let m = misfit(&a, &room());
        assert_eq!(
            m,
            Some(Misfit::Memory {
                gpu: 3,
                want: 6 * GIB + 1,
                free: 6 * GIB,
                total: 16 * GIB,
                committed: 10 * GIB,
            })
        );
        assert_eq!(
            m.map(|m| m.to_string()).as_deref(),
            Some("GPU 3 has no memory for its share")
        );
    }

    #[test]
    fn over_committed_memory_leaves_nothing_free() {
        let r = Room {
            committed_memory: 20 * GIB,
            ..room()
        };
        let a = Ask { memory: 1, ..ask() };
        assert!(matches!(
            misfit(&a, &r),
            Some(Misfit::Memory { free: 0, .. })
        ));
    }

    #[test]
    fn over_compute() {
        let a = Ask {
            compute: 401,
            ..ask()
        };
        let m = misfit(&a, &room());
        assert_eq!(
            m,
            Some(Misfit::Share {
                gpu: 3,
                engine: Engine::Compute,
                have: 600,
                want: 401,
            })
        );
        assert_eq!(
            m.map(|m| m.to_string()).as_deref(),
            Some("compute shares on GPU 3 would reach 100.1%")
        );
    }

    #[test]
    fn over_copy() {
        let a = Ask { copy: 701, ..ask() };
        let m = misfit(&a, &room());
        assert_eq!(
            m,
            Some(Misfit::Share {
                gpu: 3,
                engine: Engine::Copy,
                have: 300,
                want: 701,
            })
        );
        assert_eq!(
            m.map(|m| m.to_string()).as_deref(),
            Some("copy shares on GPU 3 would reach 100.1%")
        );
    }

    #[test]
    fn memory_is_checked_before_the_shares_and_compute_before_copy() {
        let a = Ask {
            memory: 7 * GIB,
            compute: 500,
            copy: 800,
            ..ask()
        };
        assert!(matches!(misfit(&a, &room()), Some(Misfit::Memory { .. })));
        let a = Ask {
            compute: 500,
            copy: 800,
            ..ask()
        };
        assert!(matches!(
            misfit(&a, &room()),
            Some(Misfit::Share {
                engine: Engine::Compute,
                ..
            })
        ));
    }

    #[test]
    fn oversubscribed_reserves_no_memory_but_needs_pool_room_for_its_resident_bytes() {
        let a = Ask {
            memory: 64 * GIB,
            oversubscribe: true,
            resident: 0,
            ..ask()
        };
        assert_eq!(misfit(&a, &room()), None, "a new vGPU brings nothing");
        let a = Ask {
            resident: 2 * GIB,
            ..a
        };
        assert_eq!(misfit(&a, &room()), None, "exactly the pool's room");
        let a = Ask {
            resident: 2 * GIB + 1,
            ..a
        };
        let m = misfit(&a, &room());
        assert_eq!(
            m,
            Some(Misfit::Pool {
                gpu: 3,
                need: 2 * GIB + 1,
                free: 2 * GIB,
            })
        );
        assert_eq!(m.map(|m| m.gpu()), Some(3));
        assert_eq!(
            m.map(|m| m.to_string()).as_deref(),
            Some("GPU 3's pool has no room")
        );
        // Its shares still count.
        let a = Ask {
            resident: 0,
            compute: 401,
            ..a
        };
        assert!(matches!(misfit(&a, &room()), Some(Misfit::Share { .. })));
    }

    #[test]
    fn shares_never_overflow() {
        let r = Room {
            committed_compute: u32::MAX,
            ..room()
        };
        assert!(matches!(
            misfit(&ask(), &r),
            Some(Misfit::Share {
                engine: Engine::Compute,
                ..
            })
        ));
    }
}
