//! Device memory beyond the hard shares, as the workers ask for it: reservations (a worker
//! asks before it grows its resident memory; the pools of `gpu_memory.rs` plan who swaps),
//! and shared objects (the shm registry).

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

/// Recomputes GPU `gpu`'s oversubscription pool: what hard shares and shared objects
/// leave, less the swap area.
pub(super) fn refresh_pool(d: &Daemon, gpu: u32) {
    let Some(g) = d.gpu(gpu) else { return };
    let hard = d.state.with(|i| i.committed(gpu, None).memory);
    let shm = d.shm_lock().bytes_on(gpu);
    d.memory.resize(gpu, g.memory, hard, shm);
}

/// A worker's memory report: recorded, and every pool its memory is in replans.
pub(super) fn on_memory(d: &Daemon, id: u32, m: MemReport) {
    let pools = d.state.with(|inner| {
        let rec = inner.vgpus.get_mut(&id)?;
        rec.record_memory(m);
        Some(rec.pools())
    });
    d.memory.update(&pools.unwrap_or_default(), id, m);
}

/// Answers a worker's question; `fd` rode on its line (a created shared object).
pub(super) async fn answer(
    d: &Daemon,
    id: u32,
    ask: Ask,
    fd: Option<OwnedFd>,
) -> (Answer, Option<OwnedFd>) {
    let found = d
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
        Ask::Reserve { bytes } => (reserve(d, id, bytes).await, None),
        // A new object is made by the asking worker on its GPU (vgpud loads no GPU
        // driver): it is told to export one and ask again with it.
        Ask::ShmGet { key, size, flags } => {
            let free = shm_free(d, gpu);
            match d.shm_lock().prepare(&who, key, size, flags, free) {
                Ok(Some(shmid)) => (shm_answer(Ok([shmid, 0, 0, 0])), None),
                Ok(None) => (Answer::Export, None),
                Err(e) => (shm_answer(Err(e)), None),
            }
        }
        Ask::ShmCreate { key, size, flags } => {
            let r = shm_create(d, &who, key, size, flags, fd);
            refresh_pool(d, gpu);
            (shm_answer(r.map(|id| [id, 0, 0, 0])), None)
        }
        Ask::ShmAttach { shmid } => match d.shm_lock().attach(&who, shmid) {
            Ok((fd, size)) => (Answer::Attach { size }, Some(fd)),
            Err((failure, message)) => (Answer::ShmError { failure, message }, None),
        },
        Ask::ShmDetach { shmid } => {
            let r = d.shm_lock().detach(id, shmid).map(|()| [0; 4]);
            refresh_pool(d, gpu);
            (shm_answer(r), None)
        }
        Ask::ShmCtl { shmid, cmd } => {
            let r = d.shm_lock().ctl(&who, shmid, cmd);
            refresh_pool(d, gpu);
            (shm_answer(r), None)
        }
    }
}

/// `shmget` with the object the asker's worker created (`fd`): registered when the
/// checks still pass and the descriptor is what was asked for; closed when the key
/// exists by now (another mapper created it first) or the ask is refused.
fn shm_create(
    d: &Daemon,
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
    let sim = d.gpu(who.gpu).is_some_and(|g| g.cuda_ordinal.is_none());
    let free = shm_free(d, who.gpu);
    let mut reg = d.shm_lock();
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
fn shm_free(d: &Daemon, gpu: u32) -> u64 {
    let Some(g) = d.gpu(gpu) else { return 0 };
    let hard = d.state.with(|i| i.committed(gpu, None).memory);
    let shm = d.shm_lock().bytes_on(gpu);
    let resident = d.memory.resident(gpu);
    g.memory
        .saturating_sub(hard)
        .saturating_sub(shm)
        .saturating_sub(d.memory.swap_area(g.memory))
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
pub(super) async fn reserve(d: &Daemon, id: u32, bytes: u64) -> Answer {
    let mut done: Vec<u32> = Vec::new();
    let mut granted = false;
    loop {
        let Some(pools) = d.state.with(|i| i.vgpus.get(&id).map(VgpuRec::pools)) else {
            return Answer::Refused {
                why: format!("vGPU {id} is gone"),
            };
        };
        let Some(gpu) = pools.into_iter().find(|g| !done.contains(g)) else {
            break;
        };
        match reserve_on(d, id, gpu, bytes).await {
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

/// [`reserve`] on GPU `gpu`'s pool.
async fn reserve_on(d: &Daemon, id: u32, gpu: u32, bytes: u64) -> Reserved {
    let Some(m) = d.memory.get(gpu) else {
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
                let freed = evict(d, victim, want, tier.into()).await;
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
                if spill(d, victim, want).await == 0 {
                    tried.spill.push(victim);
                }
            }
        }
    }
}

/// Asks `victim`'s worker to swap out `want` bytes to `tier`: the bytes it freed.
async fn evict(d: &Daemon, victim: u32, want: u64, tier: crate::control::SwapTier) -> u64 {
    let Some(l) = d.state.link_of(victim) else {
        return 0;
    };
    match l.call(Ctl::Evict { bytes: want, tier }, SWAP_TIMEOUT).await {
        Ok(ReplyBody::Evicted { freed, memory }) => {
            on_memory(d, victim, memory);
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
async fn spill(d: &Daemon, victim: u32, want: u64) -> u64 {
    let Some(l) = d.state.link_of(victim) else {
        return 0;
    };
    match l.call(Ctl::Spill { bytes: want }, SWAP_TIMEOUT).await {
        Ok(ReplyBody::Spilled { moved, memory }) => {
            on_memory(d, victim, memory);
            moved
        }
        _ => 0,
    }
}

/// Shared objects, for the API.
pub fn shm_objects(reg: &shm::Registry) -> Vec<api::ShmObject> {
    reg.objects()
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::admission::tests::admit;
    use super::super::core::testing::{daemon, spec};
    use super::super::migration;
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
            d.memory.get(0).expect("GPU 0").planner().join(id, 0);
            let resident = |g: u32| d.memory.get(g).expect("the GPU").planner().resident();
            let member = |g: u32| {
                d.memory
                    .get(g)
                    .expect("the GPU")
                    .planner()
                    .member(id)
                    .is_some()
            };

            // The migration to GPU 1 starts: the memory is in both pools until it ends,
            // and a reservation now (its worker may have switched already) counts in both.
            d.state.with(|i| migration::begin_move(&d.memory, i, id, 1));
            assert!(member(0) && member(1));
            assert_eq!(reserve(&d, id, 2 << 20).await, Answer::Granted);
            assert_eq!((resident(0), resident(1)), (2 << 20, 2 << 20));

            // Another reservation holds GPU 0's pool; the vGPU asks for more meanwhile...
            let held = d.memory.get(0).expect("GPU 0").serial.lock().await;
            let asking = tokio::spawn({
                let d = d.clone();
                async move { reserve(&d, id, 4 << 20).await }
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
            migration::finish_migration(&d, 1, id, Ok(done), 0, 1);
            assert!(!member(0) && member(1), "it left GPU 0's pool");
            drop(held);
            assert_eq!(asking.await.expect("task"), Answer::Granted);
            assert_eq!(resident(1), 6 << 20, "counted on the GPU its memory is on");
            assert_eq!(d.state.with(|i| i.vgpus[&id].gpu()), 1);

            // A failed migration leaves the target's pool again.
            d.state.with(|i| migration::begin_move(&d.memory, i, id, 0));
            assert!(member(0) && member(1));
            migration::finish_migration(&d, 2, id, Err("injected".into()), 1, 0);
            assert!(!member(0) && member(1));
        });
    }
}
