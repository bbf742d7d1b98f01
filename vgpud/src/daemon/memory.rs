//! Device memory beyond the hard shares: each GPU's pool that oversubscribed vGPUs share
//! (the planner decides who swaps), reservations (a worker asks before it grows its
//! resident memory), and shared objects (the shm registry). The only module that uses the
//! memory planner.

use std::os::fd::OwnedFd;
use std::time::Duration;

use super::core::Daemon;
use super::shm;
use super::state::VgpuRec;
use crate::api;
use crate::control::{Answer, Ask, Command as Ctl, MemReport, ReplyBody, ShmFailure};
use vgpu_scheduler::memory::{Step, Tried};

/// How many times (20 ms apart, 10 s in all) a reservation waits for busy victims before it
/// is refused (a victim's memory may be in a long copy on a loaded host).
const BUSY_RETRIES: u32 = 500;
/// How long one eviction may take (it may move gigabytes at host copy speed).
const SWAP_TIMEOUT: Duration = Duration::from_secs(120);

/// How a reservation on one pool ended.
enum Reserved {
    Granted,
    /// The vGPU is not (or no longer) in that pool.
    NotMember,
    Refused(String),
}

impl Daemon {
    /// Bytes of GPU memory (of `memory` in all) kept as the swap area.
    pub(super) fn swap_area(&self, memory: u64) -> u64 {
        (memory as f64 * self.cfg.swap_area) as u64
    }

    /// Recomputes GPU `gpu`'s oversubscription pool: what hard shares and shared objects
    /// leave, less the swap area.
    pub(super) fn refresh_pool(&self, gpu: u32) {
        let (Some(g), Some(m)) = (self.gpu(gpu), self.memory.get(gpu as usize)) else {
            return;
        };
        let hard = self.state.with(|i| i.committed(gpu, None).memory);
        let shm = self.shm_lock().bytes_on(gpu);
        let left = g.memory.saturating_sub(hard).saturating_sub(shm);
        let swap = self.swap_area(g.memory).min(left);
        m.planner().resize(left - swap, swap);
    }

    /// Oversubscribed vGPU `id` joins GPU `gpu`'s pool (or changes its priority there).
    pub(super) fn pool_join(&self, gpu: u32, id: u32, priority: i32) {
        self.pool_enter(gpu, id, priority, None);
    }

    /// [`Daemon::pool_join`], with the vGPU's latest memory report when there is one.
    fn pool_enter(&self, gpu: u32, id: u32, priority: i32, report: Option<MemReport>) {
        if let Some(m) = self.memory.get(gpu as usize) {
            let mut p = m.planner();
            p.join(id, priority);
            if let Some(r) = report {
                p.update(id, r.into());
            }
        }
    }

    /// vGPU `id` leaves GPU `gpu`'s pool.
    pub(super) fn pool_leave(&self, gpu: u32, id: u32) {
        if let Some(m) = self.memory.get(gpu as usize) {
            m.planner().leave(id);
        }
    }

    /// An oversubscribed vGPU moving to GPU `target` joins the target's pool too, because
    /// the copy puts its resident bytes there. Caller holds the state lock.
    pub(super) fn pool_follow(&self, rec: &VgpuRec, target: u32) {
        if rec.oversubscribe() && target != rec.gpu() {
            self.pool_enter(target, rec.id(), rec.priority(), rec.memory_report());
        }
    }

    /// A worker's memory report: recorded, and every pool its memory is in replans.
    pub(super) fn on_memory(&self, id: u32, m: MemReport) {
        let pools = self.state.with(|inner| {
            let rec = inner.vgpus.get_mut(&id)?;
            rec.record_memory(m);
            Some(rec.pools())
        });
        for gpu in pools.unwrap_or_default() {
            if let Some(g) = self.memory.get(gpu as usize) {
                g.planner().update(id, m.into());
            }
        }
    }

    /// Answers a worker's question; `fd` rode on its line (a created shared object).
    pub(super) async fn answer(
        &self,
        id: u32,
        ask: Ask,
        fd: Option<OwnedFd>,
    ) -> (Answer, Option<OwnedFd>) {
        let found = self
            .state
            .with(|i| i.vgpus.get(&id).map(|r| (r.gpu(), r.share_group().clone())));
        let Some((gpu, group)) = found else {
            return (
                Answer::Refused {
                    why: format!("vGPU {id} is gone"),
                },
                None,
            );
        };
        let who = shm::Asker {
            vgpu: id,
            gpu,
            group: group.as_deref(),
        };
        let shm_answer = |r: Result<[u64; 4], (ShmFailure, String)>| match r {
            Ok(values) => Answer::Values { values },
            Err((failure, message)) => Answer::ShmError { failure, message },
        };
        match ask {
            Ask::Reserve { bytes } => (self.reserve(id, bytes).await, None),
            // A new object is made by the asking worker on its GPU (vgpud loads no GPU
            // driver): it is told to export one and ask again with it.
            Ask::ShmGet { key, size, flags } => {
                let free = self.shm_free(gpu);
                match self.shm_lock().prepare(&who, key, size, flags, free) {
                    Ok(Some(shmid)) => (shm_answer(Ok([shmid, 0, 0, 0])), None),
                    Ok(None) => (Answer::Export, None),
                    Err(e) => (shm_answer(Err(e)), None),
                }
            }
            Ask::ShmCreate { key, size, flags } => {
                let r = self.shm_create(&who, key, size, flags, fd);
                self.refresh_pool(gpu);
                (shm_answer(r.map(|id| [id, 0, 0, 0])), None)
            }
            Ask::ShmAttach { shmid } => match self.shm_lock().attach(&who, shmid) {
                Ok((fd, size)) => (Answer::Attach { size }, Some(fd)),
                Err((failure, message)) => (Answer::ShmError { failure, message }, None),
            },
            Ask::ShmDetach { shmid } => {
                let r = self.shm_lock().detach(id, shmid).map(|()| [0; 4]);
                self.refresh_pool(gpu);
                (shm_answer(r), None)
            }
            Ask::ShmCtl { shmid, cmd } => {
                let r = self.shm_lock().ctl(&who, shmid, cmd);
                self.refresh_pool(gpu);
                (shm_answer(r), None)
            }
        }
    }

    /// `shmget` with the object the asker's worker created (`fd`): registered when the
    /// checks still pass and the descriptor is what was asked for; closed when the key
    /// exists by now (another mapper created it first) or the ask is refused.
    fn shm_create(
        &self,
        who: &shm::Asker<'_>,
        key: u64,
        size: u64,
        flags: u64,
        fd: Option<OwnedFd>,
    ) -> Result<u64, (ShmFailure, String)> {
        let fd = fd.ok_or_else(|| {
            (
                ShmFailure::Invalid,
                "a shared object's creation came without its descriptor".to_string(),
            )
        })?;
        let sim = self.gpu(who.gpu).is_some_and(|g| g.cuda_ordinal.is_none());
        let free = self.shm_free(who.gpu);
        let mut reg = self.shm_lock();
        if let Some(id) = reg.prepare(who, key, size, flags, free)? {
            return Ok(id);
        }
        shm::check_object(&fd, size, sim).map_err(|why| {
            tracing::warn!(vgpu = who.vgpu, key, size, %why, "shared object refused");
            (ShmFailure::Invalid, why)
        })?;
        reg.insert(who, key, size, fd)
    }

    /// Device memory GPU `gpu` has left for a new shared object.
    fn shm_free(&self, gpu: u32) -> u64 {
        let Some(g) = self.gpu(gpu) else { return 0 };
        let hard = self.state.with(|i| i.committed(gpu, None).memory);
        let shm = self.shm_lock().bytes_on(gpu);
        let resident = self
            .memory
            .get(gpu as usize)
            .map_or(0, |m| m.planner().resident());
        g.memory
            .saturating_sub(hard)
            .saturating_sub(shm)
            .saturating_sub(self.swap_area(g.memory))
            .saturating_sub(resident)
    }

    /// Makes room for `bytes` more resident memory of oversubscribed vGPU `id` in every
    /// pool its memory is in (its GPU's, and during a migration the target's too: the
    /// copy puts every resident byte there), swapping out other vGPUs' (or its own idle)
    /// memory as each plan says.
    ///
    /// The pools are read when each is planned, not when the worker asked: a migration
    /// may finish while the reservation waits for a pool (another reservation holds it),
    /// and then the vGPU's memory is no longer on the GPU it left.
    pub(super) async fn reserve(&self, id: u32, bytes: u64) -> Answer {
        let mut done: Vec<u32> = Vec::new();
        let mut granted = false;
        loop {
            let Some(pools) = self.state.with(|i| i.vgpus.get(&id).map(VgpuRec::pools)) else {
                return Answer::Refused {
                    why: format!("vGPU {id} is gone"),
                };
            };
            let Some(gpu) = pools.into_iter().find(|g| !done.contains(g)) else {
                break;
            };
            match self.reserve_on(id, gpu, bytes).await {
                Reserved::Granted => granted = true,
                // It left that pool meanwhile (its migration finished or failed).
                Reserved::NotMember => {}
                Reserved::Refused(why) => return Answer::Refused { why },
            }
            done.push(gpu);
        }
        if granted {
            Answer::Granted
        } else {
            let why = format!("vGPU {id} is in no GPU's memory pool (pools tried: {done:?})");
            tracing::warn!(vgpu = id, bytes, %why, "memory reservation refused");
            Answer::Refused { why }
        }
    }

    /// [`Daemon::reserve`] on GPU `gpu`'s pool.
    async fn reserve_on(&self, id: u32, gpu: u32, bytes: u64) -> Reserved {
        let Some(m) = self.memory.get(gpu as usize) else {
            return Reserved::Refused(format!("vGPU {id} is on an unknown GPU {gpu}"));
        };
        let _one = m.serial.lock().await;
        let mut tried = Tried::default();
        let mut busy_retries = 0;
        loop {
            let step = {
                let p = m.planner();
                if p.member(id).is_none() {
                    return Reserved::NotMember;
                }
                p.next_step(id, bytes, &tried)
            };
            match step {
                Step::Grant => {
                    m.planner().grant(id, bytes);
                    return Reserved::Granted;
                }
                Step::Deny(why) => {
                    // Victims that gave nothing were busy (their memory is in use by a
                    // copy or kernel right now): wait for them (up to 10 s) before refusing.
                    if !tried.evict.is_empty() && busy_retries < BUSY_RETRIES {
                        busy_retries += 1;
                        tried = Tried::default();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    tracing::info!(vgpu = id, gpu, bytes, %why, "memory reservation refused");
                    return Reserved::Refused(why);
                }
                Step::Evict {
                    victim,
                    bytes: want,
                    tier,
                } => {
                    let freed = self.evict(victim, want, tier.into()).await;
                    tracing::debug!(
                        vgpu = id,
                        victim,
                        want,
                        freed,
                        ?tier,
                        "evicted for a reservation"
                    );
                    if freed == 0 {
                        tried.evict.push(victim);
                    }
                }
                Step::Spill {
                    victim,
                    bytes: want,
                } => {
                    if self.spill(victim, want).await == 0 {
                        tried.spill.push(victim);
                    }
                }
            }
        }
    }

    /// Asks `victim`'s worker to swap out `want` bytes to `tier`: the bytes it freed.
    async fn evict(&self, victim: u32, want: u64, tier: crate::control::SwapTier) -> u64 {
        let Some(l) = self.state.link_of(victim) else {
            return 0;
        };
        match l.call(Ctl::Evict { bytes: want, tier }, SWAP_TIMEOUT).await {
            Ok(ReplyBody::Evicted { freed, memory }) => {
                self.on_memory(victim, memory);
                freed
            }
            Ok(other) => {
                tracing::warn!(vgpu = victim, ?other, "eviction not done");
                0
            }
            Err(e) => {
                tracing::warn!(vgpu = victim, error = %e, "eviction failed");
                0
            }
        }
    }

    /// Asks `victim`'s worker to move `want` bytes from the device swap area to the host:
    /// the bytes it moved.
    async fn spill(&self, victim: u32, want: u64) -> u64 {
        let Some(l) = self.state.link_of(victim) else {
            return 0;
        };
        match l.call(Ctl::Spill { bytes: want }, SWAP_TIMEOUT).await {
            Ok(ReplyBody::Spilled { moved, memory }) => {
                self.on_memory(victim, memory);
                moved
            }
            _ => 0,
        }
    }

    /// Shared objects, for the API.
    pub fn shm_objects(&self) -> Vec<api::ShmObject> {
        self.shm_lock()
            .objects()
            .map(|o| api::ShmObject {
                id: o.id,
                key: o.key,
                size_bytes: o.size,
                gpu: o.gpu,
                share_group: o.group.clone(),
                creator_vgpu: o.creator,
                attachments: o.attachments(),
                attached_vgpus: o.attached.keys().copied().collect(),
                removed: o.removed,
            })
            .collect()
    }

    /// Per-GPU memory pool figures, for the API: (capacity, resident, swap area, device
    /// swap in use).
    pub(super) fn pool_of(&self, gpu: u32) -> (u64, u64, u64, u64) {
        self.memory.get(gpu as usize).map_or((0, 0, 0, 0), |m| {
            let p = m.planner();
            (p.capacity(), p.resident(), p.swap_area(), p.device_swap())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::admission::tests::admit;
    use super::super::core::testing::{daemon, spec};
    use super::*;
    use crate::api::VgpuCreate;

    /// Regression (migration::swapped_out_memory_migrates_intact failed 4 in 15): a
    /// worker's reservation that waits for its source GPU's pool (another reservation holds
    /// it) while its migration finishes was planned on the pool the vGPU had just left:
    /// refused ("not in this GPU's memory pool"), and the guest's next copy failed with
    /// OUT_OF_MEMORY. It must land on the target's pool.
    #[test]
    fn a_reservation_during_a_migration_lands_where_the_memory_is() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let d = Arc::new(daemon(2));
            let id = admit(
                &d,
                VgpuCreate {
                    oversubscribe: true,
                    ..spec(Some(0), 1 << 30, 0.2)
                },
            )
            .expect("admitted");
            // As its worker starts, it joins GPU 0's pool.
            d.memory[0].planner().join(id, 0);
            let resident = |g: usize| d.memory[g].planner().resident();
            let member = |g: usize| d.memory[g].planner().member(id).is_some();

            // The migration to GPU 1 starts: the memory is in both pools until it ends,
            // and a reservation now (its worker may have switched already) counts in both.
            d.state.with(|i| d.begin_move(i, id, 1));
            assert!(member(0) && member(1));
            assert_eq!(d.reserve(id, 2 << 20).await, Answer::Granted);
            assert_eq!((resident(0), resident(1)), (2 << 20, 2 << 20));

            // Another reservation holds GPU 0's pool; the vGPU asks for more meanwhile...
            let held = d.memory[0].serial.lock().await;
            let asking = tokio::spawn({
                let d = d.clone();
                async move { d.reserve(id, 4 << 20).await }
            });
            tokio::task::yield_now().await;
            assert!(!asking.is_finished(), "it waits for GPU 0's pool");
            // ... and the migration completes before it gets GPU 0's pool.
            let done = crate::control::MigrationDone {
                rounds: 1,
                precopy_bytes: 0,
                stop_bytes: 0,
                total: 0,
                downtime_ms: 1.0,
                drain_ms: 0.0,
                elapsed_ms: 1.0,
                timeline: Vec::new(),
            };
            d.finish_migration(1, id, Ok(done), 0, 1);
            assert!(!member(0) && member(1), "it left GPU 0's pool");
            drop(held);
            assert_eq!(asking.await.expect("task"), Answer::Granted);
            assert_eq!(resident(1), 6 << 20, "counted on the GPU its memory is on");
            assert_eq!(d.state.with(|i| i.vgpus[&id].gpu()), 1);

            // A failed migration leaves the target's pool again.
            d.state.with(|i| d.begin_move(i, id, 0));
            assert!(member(0) && member(1));
            d.finish_migration(2, id, Err("injected".into()), 1, 0);
            assert!(!member(0) && member(1));
        });
    }
}
