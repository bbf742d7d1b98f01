//! How a pager asks for device memory: the [`Broker`] that decides (vgpud across worker
//! processes; [`LocalBroker`] inside one process), and the state a pager reports to it.

use std::sync::{Arc, Mutex, Weak};

use super::Pager;
use super::{MemState, Planner, Step, Tried};

/// The party that decides whether a pager may make more bytes resident.
pub trait Broker: Send + Sync {
    /// Asks for `bytes` more resident device memory; returns once they are granted (other
    /// vGPUs' memory may have been evicted for it) or with the reason they cannot be.
    fn reserve(&self, bytes: u64) -> Result<(), String>;
    /// Tells the broker the pager's state after it changed (frees, evictions, restores).
    fn report(&self, state: MemState);
}

/// A broker inside one process: one pool of device memory shared by the pagers
/// registered with it, decided by the same [`Planner`] vgpud uses. Tests and single-process
/// tools use it; workers use vgpud's broker instead.
#[derive(Default)]
pub struct LocalBroker {
    inner: Mutex<Local>,
    /// One reservation at a time: its plan stays valid while it evicts.
    serial: Mutex<()>,
}

#[derive(Default)]
struct Local {
    planner: Planner,
    pagers: Vec<(u32, Weak<Pager>)>,
}

/// One member's handle on a [`LocalBroker`].
pub struct LocalMember {
    broker: Arc<LocalBroker>,
    id: u32,
}

impl LocalBroker {
    /// A pool of `capacity` bytes for resident memory plus a swap area of `swap_area` bytes.
    pub fn new(capacity: u64, swap_area: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Local {
                planner: Planner::new(capacity, swap_area),
                pagers: Vec::new(),
            }),
            serial: Mutex::new(()),
        })
    }

    /// A broker handle for member `id` with `priority` (larger = more important).
    pub fn member(self: &Arc<Self>, id: u32, priority: i32) -> Arc<LocalMember> {
        self.lock().planner.join(id, priority);
        Arc::new(LocalMember {
            broker: self.clone(),
            id,
        })
    }

    /// Registers the pager member `id` runs, so others' reservations can evict from it.
    pub fn attach(&self, id: u32, pager: &Arc<Pager>) {
        self.lock().pagers.push((id, Arc::downgrade(pager)));
    }

    /// The planner's view (for tests and reports).
    pub fn planner(&self) -> Planner {
        self.lock().planner.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Local> {
        vgpu_sync::lock(&self.inner)
    }

    fn pager(&self, id: u32) -> Option<Arc<Pager>> {
        self.lock()
            .pagers
            .iter()
            .find(|(i, _)| *i == id)
            .and_then(|(_, w)| w.upgrade())
    }
}

impl Broker for LocalMember {
    fn reserve(&self, bytes: u64) -> Result<(), String> {
        // Evictions run without the planner's lock held: the victim reports back through
        // it. One reservation at a time per pool keeps the plan consistent.
        let _one = vgpu_sync::lock(&self.broker.serial);
        let mut tried = Tried::default();
        loop {
            let step = self.broker.lock().planner.next_step(self.id, bytes, &tried);
            match step {
                Step::Grant => {
                    self.broker.lock().planner.grant(self.id, bytes);
                    return Ok(());
                }
                Step::Deny(why) => return Err(why),
                Step::Evict {
                    victim,
                    bytes: b,
                    tier,
                } => {
                    let freed = match self.broker.pager(victim) {
                        Some(p) => p.evict(b, tier),
                        None => 0,
                    };
                    if freed == 0 {
                        tried.evict.push(victim);
                    }
                }
                Step::Spill { victim, bytes: b } => {
                    let moved = match self.broker.pager(victim) {
                        Some(p) => p.spill(b),
                        None => 0,
                    };
                    if moved == 0 {
                        tried.spill.push(victim);
                    }
                }
            }
        }
    }

    fn report(&self, state: MemState) {
        self.broker.lock().planner.update(self.id, state);
    }
}
