//! The decisions of memory oversubscription, without I/O: whether a reservation fits, and
//! if not, whose memory to evict and where to put it (Gdev §4: a lower-priority owner's
//! allocation first; the device-side temporal swap area before host memory).
//!
//! vgpud runs one [`Planner`] per physical GPU over the vGPUs that oversubscribe it; the
//! backend's `LocalBroker` runs one inside a single process.

use std::collections::BTreeMap;

use super::{MemState, Tier};

/// One vGPU in the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Larger = more important; victims are taken from the lowest first.
    pub priority: i32,
    /// As last reported, plus grants since.
    pub state: MemState,
}

/// What to do next for a reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// It fits: count the bytes as resident for the requester.
    Grant,
    /// Ask `victim` to evict at least `bytes` to `tier`, then plan again.
    Evict {
        /// The vGPU whose memory goes.
        victim: u32,
        /// Bytes to free.
        bytes: u64,
        /// Where they go.
        tier: Tier,
    },
    /// Ask `victim` to move `bytes` from the swap area to host memory (making room in the
    /// swap area), then plan again.
    Spill {
        /// The vGPU whose swapped bytes move.
        victim: u32,
        /// Bytes to move.
        bytes: u64,
    },
    /// It cannot fit; the reason, for the guest and the log.
    Deny(String),
}

/// Victims that already failed to give anything during one reservation.
#[derive(Clone, Debug, Default)]
pub struct Tried {
    /// Members that evicted nothing when asked.
    pub evict: Vec<u32>,
    /// Members that spilled nothing when asked.
    pub spill: Vec<u32>,
}

/// One physical GPU's oversubscribed memory pool.
#[derive(Clone, Debug, Default)]
pub struct Planner {
    /// Bytes of device memory the pool's members may keep resident together.
    capacity: u64,
    /// Bytes of the temporal swap area.
    swap_area: u64,
    members: BTreeMap<u32, Member>,
}

impl Planner {
    /// A pool of `capacity` resident bytes with a swap area of `swap_area` bytes.
    pub fn new(capacity: u64, swap_area: u64) -> Self {
        Self {
            capacity,
            swap_area,
            members: BTreeMap::new(),
        }
    }

    /// Changes the pool's size (vGPUs with hard shares came or went).
    pub fn resize(&mut self, capacity: u64, swap_area: u64) {
        self.capacity = capacity;
        self.swap_area = swap_area;
    }

    /// Adds member `id` (or changes its priority).
    pub fn join(&mut self, id: u32, priority: i32) {
        self.members.entry(id).or_default().priority = priority;
    }

    /// Removes member `id` (its vGPU is gone, and its memory with it).
    pub fn leave(&mut self, id: u32) {
        self.members.remove(&id);
    }

    /// Member `id`'s last state.
    pub fn member(&self, id: u32) -> Option<&Member> {
        self.members.get(&id)
    }

    /// Resident bytes capacity of the pool.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of the swap area.
    pub fn swap_area(&self) -> u64 {
        self.swap_area
    }

    /// Bytes resident across the pool.
    pub fn resident(&self) -> u64 {
        self.members.values().map(|m| m.state.resident).sum()
    }

    /// Bytes held in the swap area across the pool.
    pub fn device_swap(&self) -> u64 {
        self.members.values().map(|m| m.state.device_swap).sum()
    }

    /// Records member `id`'s reported state.
    pub fn update(&mut self, id: u32, state: MemState) {
        if let Some(m) = self.members.get_mut(&id) {
            m.state = state;
        }
    }

    /// Counts `bytes` as resident for `id` (until its next report says otherwise).
    pub fn grant(&mut self, id: u32, bytes: u64) {
        if let Some(m) = self.members.get_mut(&id) {
            m.state.resident = m.state.resident.saturating_add(bytes);
        }
    }

    /// The next step of a reservation of `bytes` by `who`.
    pub fn next_step(&self, who: u32, bytes: u64, tried: &Tried) -> Step {
        let Some(me) = self.members.get(&who) else {
            return Step::Deny(format!("vGPU {who} is not in this GPU's memory pool"));
        };
        let resident = self.resident();
        let free = self.capacity.saturating_sub(resident);
        if bytes <= free {
            return Step::Grant;
        }
        if bytes > self.capacity {
            return Step::Deny(format!(
                "{bytes} bytes exceed the {} bytes of device memory oversubscribed vGPUs share on this GPU",
                self.capacity
            ));
        }
        let need = bytes - free;
        // Gdev: evict from lower-priority owners first; among equals, the one holding the
        // most, and the requester's own memory last.
        let victim = self
            .members
            .iter()
            .filter(|(id, m)| {
                m.state.resident > 0 && m.priority <= me.priority && !tried.evict.contains(id)
            })
            .min_by_key(|(id, m)| (m.priority, **id == who, std::cmp::Reverse(m.state.resident)))
            .map(|(id, _)| *id);
        let Some(victim) = victim else {
            return Step::Deny(format!(
                "device memory is exhausted: {bytes} bytes requested, {free} free, and no vGPU of equal or lower priority has idle resident memory to swap out"
            ));
        };
        let swap_free = self.swap_area.saturating_sub(self.device_swap());
        if need <= swap_free {
            return Step::Evict {
                victim,
                bytes: need,
                tier: Tier::Device,
            };
        }
        // The swap area is full: move its oldest holder's bytes on to host memory first,
        // so the fast tier keeps taking fresh evictions.
        let holder = self
            .members
            .iter()
            .filter(|(id, m)| m.state.device_swap > 0 && !tried.spill.contains(id))
            .max_by_key(|(_, m)| m.state.device_swap)
            .map(|(id, _)| *id);
        match holder {
            Some(h) if self.swap_area >= need => Step::Spill {
                victim: h,
                bytes: need - swap_free,
            },
            _ => Step::Evict {
                victim,
                bytes: need,
                tier: Tier::Host,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(resident: u64, device_swap: u64) -> MemState {
        MemState {
            resident,
            device_swap,
            ..MemState::default()
        }
    }

    #[test]
    fn grants_what_fits_and_evicts_lower_priority_first() {
        let mut p = Planner::new(100, 20);
        p.join(1, 0);
        p.join(2, 5);
        p.join(3, 10);
        p.update(1, state(30, 0));
        p.update(2, state(40, 0));
        assert_eq!(p.next_step(3, 30, &Tried::default()), Step::Grant);
        p.grant(3, 30);
        assert_eq!(p.resident(), 100);
        assert_eq!(
            p.next_step(3, 10, &Tried::default()),
            Step::Evict {
                victim: 1,
                bytes: 10,
                tier: Tier::Device
            },
            "the lowest priority owner goes first, into the swap area"
        );
        let tried = Tried {
            evict: vec![1],
            ..Tried::default()
        };
        assert_eq!(
            p.next_step(3, 10, &tried),
            Step::Evict {
                victim: 2,
                bytes: 10,
                tier: Tier::Device
            }
        );
    }

    #[test]
    fn a_low_priority_vgpu_never_evicts_a_higher_one() {
        let mut p = Planner::new(100, 20);
        p.join(1, 0);
        p.join(2, 5);
        p.update(2, state(100, 0));
        assert!(matches!(
            p.next_step(1, 10, &Tried::default()),
            Step::Deny(_)
        ));
        assert!(matches!(
            p.next_step(1, 200, &Tried::default()),
            Step::Deny(why) if why.contains("exceed")
        ));
    }

    #[test]
    fn a_full_swap_area_spills_to_host_then_evicts_to_host() {
        let mut p = Planner::new(100, 20);
        p.join(1, 0);
        p.join(2, 0);
        p.update(1, state(50, 20));
        p.update(2, state(50, 0));
        assert_eq!(
            p.next_step(2, 10, &Tried::default()),
            Step::Spill {
                victim: 1,
                bytes: 10
            }
        );
        let tried = Tried {
            spill: vec![1],
            ..Tried::default()
        };
        assert_eq!(
            p.next_step(2, 10, &tried),
            Step::Evict {
                victim: 1,
                bytes: 10,
                tier: Tier::Host
            },
            "nothing to spill: straight to host memory"
        );
    }

    #[test]
    fn own_memory_is_the_last_resort() {
        let mut p = Planner::new(100, 0);
        p.join(1, 0);
        p.join(2, 0);
        p.update(1, state(10, 0));
        p.update(2, state(90, 0));
        assert_eq!(
            p.next_step(2, 20, &Tried::default()),
            Step::Evict {
                victim: 1,
                bytes: 20,
                tier: Tier::Host
            }
        );
        let tried = Tried {
            evict: vec![1],
            ..Tried::default()
        };
        assert_eq!(
            p.next_step(2, 20, &tried),
            Step::Evict {
                victim: 2,
                bytes: 20,
                tier: Tier::Host
            }
        );
    }
}
