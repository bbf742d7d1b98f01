//! Bringing the daemon's records back from its state file at start (the writer is
//! `saver.rs`; the format and the atomic write are in `statefile.rs`).
//!
//! What comes back after a restart (docs/hostile.md):
//! - a vGPU created with `POST /v1/vgpus` that held its resources (ready, or attached to a
//!   VM) comes back **ready** with the same id and spec (PATCHed shares included): a new
//!   worker, empty device memory, no VM. It is validated and admitted like a fresh create,
//!   in id order; one that no longer fits or whose GPU or storage file is gone stays
//!   listed as `failed` with the reason (nothing is dropped), and is tried again at the
//!   next start (fix the cause and restart vgpud, or DELETE it);
//! - a VM whose vmm still runs (a restart, an upgrade or a `kill -9` of vgpud never
//!   touches it) is adopted with its vGPU's worker (`adopt.rs`): it reads `running`, its
//!   vGPU `attached`, with the same processes, and computes on undisturbed;
//! - a VM whose vmm or worker died while no vgpud ran ends with the reason (a vmm whose
//!   vGPU's worker is gone is stopped); other VM records come back as they ended, their
//!   console logs kept;
//! - a vGPU created inline with a VM goes with that VM's record once the VM ended:
//!   `released`, holding nothing, deleted with the VM (as when a VM ends by itself);
//! - released and failed vGPUs stay records; id counters carry on, so no id is reused.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::admission;
use super::adopt;
use super::attach::ProcessAttach;
use super::config::Config;
use super::core::Daemon;
use super::memory;
use super::procs::{self, Proc};
use super::saver::unix_ms;
use super::state::{Inner, State, VgpuDef, VgpuRec, VmRec};
use super::statefile::{SavedProc, SavedVgpu, SavedVgpuState, SavedVmState, StateFile};
use super::worker_files::worker_socket;
use super::workers;
use crate::api::{self, VgpuCreate};
use crate::units::permille_to_fraction;

/// A restored VM that was running when vgpud went away and whose vmm is gone.
fn restart_reason() -> String {
    format!(
        "{} (exit status unknown; see its console); launch it again",
        api::VM_LOST_IN_RESTART
    )
}

/// How long a restore waits for a worker of the previous vgpud to let go of a socket.
const OLD_WORKER_GRACE: Duration = Duration::from_secs(10);

/// Brings back what `saved` holds (see the module comment). Runs before the API
/// serves; never fails: what cannot come back is listed with the reason.
pub(super) async fn bring_back(d: &Arc<Daemon>, saved: StateFile) {
    let plan = d.state.with(|inner| restore_records(&d.cfg, inner, saved));
    let (mut adopted, mut lost) = (0usize, 0usize);
    for (id, proc) in plan.workers {
        // A free vGPU (no VM) is checked like any restored definition; one that serves
        // a running VM is adopted as it is.
        let free = d
            .state
            .with(|i| i.vgpus.get(&id).is_some_and(|r| r.vm().is_none()));
        if free {
            if let Err(why) = d.state.with(|inner| restorable(d, inner, id)) {
                proc.signal(libc::SIGKILL);
                let reason = format!(
                    "not restored after the vgpud restart: {why}; fix that and restart vgpud (it tries again), or DELETE /v1/vgpus/{id}"
                );
                tracing::error!(vgpu = id, %reason, "vGPU not restored");
                fail_restored(d, id, reason);
                continue;
            }
        }
        match adopt::adopt_worker(d, id, proc.clone()).await {
            Ok(()) => adopted += 1,
            Err(why) => {
                lost += 1;
                proc.signal(libc::SIGKILL);
                let reason =
                    format!("its worker could not be adopted after the vgpud restart: {why}");
                tracing::error!(vgpu = id, %reason, "worker not adopted");
                fail_restored(d, id, reason);
            }
        }
    }
    for (vm, proc) in plan.vmms {
        let vgpu_ok = d.state.with(|inner| {
            let g = inner.vms.get(&vm).and_then(|v| v.vgpu());
            g.is_none_or(|g| inner.vgpus.get(&g).is_some_and(|r| r.worker().is_some()))
        });
        if vgpu_ok {
            adopt::adopt_vmm(d, vm, proc);
        } else {
            proc.signal(libc::SIGKILL);
            d.state.with(|inner| {
                if let Some(v) = inner.vms.get_mut(&vm) {
                    v.vmm_gone();
                    v.fail("its vGPU's worker could not be adopted after the vgpud restart; the vmm was stopped".into());
                }
            });
        }
    }
    let (mut ready, mut unusable) = (0usize, 0usize);
    for id in plan.fresh {
        match restore_vgpu(d, id).await {
            Ok(()) => ready += 1,
            Err(why) => {
                unusable += 1;
                let reason = format!(
                    "not restored after the vgpud restart: {why}; fix that and restart vgpud (it tries again), or DELETE /v1/vgpus/{id}"
                );
                tracing::error!(vgpu = id, %reason, "vGPU not restored");
                fail_restored(d, id, reason);
            }
        }
    }
    d.state.with(|inner| {
        tracing::info!(
            path = %d.persist.path().display(),
            workers_adopted = adopted,
            workers_lost = lost,
            vms_running = inner.vms.values().filter(|v| v.proc().is_some()).count(),
            vgpus_ready = ready,
            vgpus_unusable = unusable,
            vgpu_records = inner.vgpus.len(),
            vm_records = inner.vms.len(),
            next_vgpu = inner.next_vgpu,
            next_vm = inner.next_vm,
            next_migration = inner.next_migration,
            "state restored"
        );
    });
}

/// Validates, admits and starts restored vGPU `id` like a fresh create on its GPU.
async fn restore_vgpu(d: &Arc<Daemon>, id: u32) -> Result<(), String> {
    d.state.with(|inner| restorable(d, inner, id))?;
    wait_socket_free(&d.state, id).await?;
    workers::start_worker(d, id).await.map_err(|e| e.error)?;
    d.state.with(|inner| {
        if let Some(rec) = inner.vgpus.get_mut(&id) {
            rec.clear_restore_failed();
        }
    });
    tracing::info!(vgpu = id, "vGPU restored");
    Ok(())
}

/// Validates and admits restored vGPU `id` like a fresh create on its GPU; it holds
/// its resources (`starting`) once admitted. Caller holds the state lock.
fn restorable(d: &Daemon, inner: &mut Inner, id: u32) -> Result<(), String> {
    let rec = inner
        .vgpus
        .get(&id)
        .ok_or_else(|| "its record vanished".to_owned())?;
    let spec = VgpuCreate {
        gpu: Some(rec.gpu()),
        memory_bytes: rec.memory(),
        compute_share: permille_to_fraction(rec.compute()),
        copy_share: Some(permille_to_fraction(rec.copy())),
        priority: rec.priority(),
        oversubscribe: rec.oversubscribe(),
        share_group: rec.share_group().clone(),
        queues: rec.queues(),
        storage: rec.storage().clone(),
        name: rec.name().clone(),
        labels: rec.labels().clone(),
        kernel_deadline_ms: rec.kernel_deadline_ms(),
        attach: if rec.process().is_some() {
            api::Attach::Process
        } else {
            api::Attach::Vm
        },
        owner_uid: rec.process().as_ref().and_then(|p| p.owner_uid),
        owner_gid: rec.process().as_ref().and_then(|p| p.owner_gid),
    };
    let mut ask = admission::validate_vgpu(d, &spec).map_err(|e| e.error.clone())?;
    // Exactly the shares it had (no round trip through fractions).
    (ask.compute, ask.copy) = (rec.compute(), rec.copy());
    if let Some(e) = admission::misfit(&d.cfg, inner, rec.gpu(), &ask, Some(id)) {
        return Err(e.error);
    }
    let rec = inner
        .vgpus
        .get_mut(&id)
        .ok_or_else(|| "its record vanished".to_owned())?;
    rec.mark_starting();
    Ok(())
}

/// A worker of the previous vgpud that is being stopped (its VM ended while no vgpud
/// ran) may still serve vGPU `id`'s socket for a moment: wait until none does.
async fn wait_socket_free(state: &State, id: u32) -> Result<(), String> {
    let Some(socket) = state.with(|i| i.vgpus.get(&id).map(|r| r.socket().clone())) else {
        return Ok(());
    };
    let deadline = Instant::now() + OLD_WORKER_GRACE;
    let mut logged = false;
    while std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        if Instant::now() >= deadline {
            return Err(format!(
                "{} is still served by another process after {} s (a worker of the previous vgpud?); stop it",
                socket.display(),
                OLD_WORKER_GRACE.as_secs()
            ));
        }
        if !logged {
            tracing::info!(vgpu = id, socket = %socket.display(),
                "a worker of the previous vgpud still serves this vGPU's socket; waiting for it to exit");
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Restored vGPU `id` cannot run: listed as failed with `reason`, holding nothing.
fn fail_restored(d: &Daemon, id: u32, reason: String) {
    let gpu = d.state.with(|inner| {
        let rec = inner.vgpus.get_mut(&id)?;
        rec.fail(reason);
        rec.mark_restore_failed();
        if rec.worker().is_some() {
            // Its reaper lets go of the rest.
            None
        } else {
            Some(rec.gpu())
        }
    });
    if let Some(gpu) = gpu {
        d.grants.detach(id, gpu);
        d.memory.leave(gpu, id);
        memory::refresh_pool(d, gpu);
    }
    d.state.notify();
}

/// What a restore does once the records are in.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// vGPUs whose worker still runs: reconnect to it.
    workers: Vec<(u32, Proc)>,
    /// VMs whose vmm still runs: supervise it.
    vmms: Vec<(u32, Proc)>,
    /// vGPU definitions to start with a new worker.
    fresh: Vec<u32>,
}

/// The processes of `saved` that still run: the vmms of live VMs and the workers of live
/// vGPUs, paired (a VM runs only with its vGPU's worker; a worker attached to a VM goes
/// with that VM's vmm). What is not kept is killed; why, per VM, is returned.
fn running_procs(
    saved: &StateFile,
) -> (
    BTreeMap<u32, Proc>,
    BTreeMap<u32, Proc>,
    BTreeMap<u32, String>,
) {
    let adopt = |p: Option<SavedProc>| p.and_then(|p| procs::adopt(p.pid, p.start_time));
    let mut vmms: BTreeMap<u32, Proc> = saved
        .vms
        .iter()
        .filter(|v| v.state == SavedVmState::Live)
        .filter_map(|v| Some((v.id, adopt(v.vmm)?)))
        .collect();
    let mut workers: BTreeMap<u32, Proc> = saved
        .vgpus
        .iter()
        .filter(|v| v.state == SavedVgpuState::Live)
        .filter_map(|v| Some((v.id, adopt(v.worker)?)))
        .collect();
    let mut why = BTreeMap::new();
    for v in &saved.vms {
        let Some(g) = v.vgpu else { continue };
        if !workers.contains_key(&g) {
            if let Some(p) = vmms.remove(&v.id) {
                tracing::warn!(
                    vm = v.id,
                    vgpu = g,
                    pid = p.pid,
                    "the VM's vGPU worker exited while vgpud was down; stopping its vmm"
                );
                p.signal(libc::SIGKILL);
                why.insert(
                    v.id,
                    format!(
                        "its vGPU {g}'s worker exited while vgpud was down; the vmm was stopped"
                    ),
                );
            }
        }
    }
    for g in &saved.vgpus {
        let Some(vm) = g.vm else { continue };
        if vmms.contains_key(&vm) {
            continue;
        }
        if let Some(p) = workers.remove(&g.id) {
            tracing::info!(
                vgpu = g.id,
                vm,
                pid = p.pid,
                "the vGPU's VM ended while vgpud was down; stopping its worker"
            );
            p.signal(libc::SIGKILL);
        }
    }
    (vmms, workers, why)
}

/// Puts `saved`'s records into `inner`: what to adopt and what to start afresh.
fn restore_records(cfg: &Config, inner: &mut Inner, saved: StateFile) -> Plan {
    let now_unix = unix_ms(SystemTime::now());
    let max_vgpu = saved.vgpus.iter().map(|v| v.id).max().unwrap_or(0);
    let max_vm = saved.vms.iter().map(|v| v.id).max().unwrap_or(0);
    inner.next_vgpu = saved.next_vgpu.max(max_vgpu.saturating_add(1)).max(1);
    inner.next_vm = saved.next_vm.max(max_vm.saturating_add(1)).max(1);
    inner.next_migration = saved.next_migration.max(1);
    let (vmms, mut workers, why) = running_procs(&saved);
    let mut plan = Plan::default();
    for v in saved.vgpus {
        let worker = workers.remove(&v.id);
        let saved_vm = v.vm;
        let lost = v.vm.and_then(|vm| why.get(&vm).map(|_| vm));
        let (mut rec, bring_back) = restored_vgpu(cfg, v);
        if let Some(p) = worker {
            // Held (starting) until its worker answers on the control socket.
            rec.mark_starting();
            rec.serve_restored_vm(saved_vm.filter(|vm| vmms.contains_key(vm)));
            rec.mark_restore_failed();
            plan.workers.push((rec.id(), p));
        } else {
            if let (Some(vm), true) = (lost, rec.owned()) {
                let reason = format!(
                    "its worker exited while vgpud was down{}; VM {vm} was stopped",
                    super::worker_files::log_tail(rec.log())
                );
                rec.fail(reason);
            }
            if bring_back {
                plan.fresh.push(rec.id());
            }
        }
        inner.vgpus.insert(rec.id(), rec);
    }
    for v in saved.vms {
        let proc = vmms.get(&v.id).cloned();
        let lost = why.get(&v.id).cloned();
        if let Some(p) = &proc {
            plan.vmms.push((v.id, p.clone()));
        }
        let console = cfg.state_dir.join(format!("vm-{}.log", v.id));
        let lost = lost.unwrap_or_else(restart_reason);
        inner
            .vms
            .insert(v.id, VmRec::restored(v, console, now_unix, proc, lost));
    }
    plan
}

/// A saved vGPU's record, and whether it is to be brought back (it is held as failed
/// until it is validated and admitted).
fn restored_vgpu(cfg: &Config, v: SavedVgpu) -> (VgpuRec, bool) {
    let id = v.id;
    let bring_back = v.state == SavedVgpuState::Live && !v.owned_by_vm;
    let def = VgpuDef {
        id,
        gpu: v.gpu,
        memory: v.memory_bytes,
        compute: v.compute_permille,
        copy: v.copy_permille,
        priority: v.priority,
        oversubscribe: v.oversubscribe,
        share_group: v.share_group,
        queues: v.queues,
        storage: v
            .storage
            .into_iter()
            .map(|s| api::StorageAttachment {
                namespace: s.namespace,
                path: s.path,
                read_only: s.read_only,
            })
            .collect(),
        // A vGPU that comes back is free for a new VM.
        vm: if bring_back { None } else { v.vm },
        owned: v.owned_by_vm,
        socket: worker_socket(&cfg.state_dir, id),
        log: cfg.state_dir.join(format!("vgpu-{id}.log")),
        restore_failed: bring_back,
        name: v.name,
        labels: v.labels,
        kernel_deadline_ms: v.kernel_deadline_ms,
        process: (v.attach == api::Attach::Process)
            .then(|| ProcessAttach::new(&cfg.state_dir, id, v.owner_uid, v.owner_gid)),
    };
    (VgpuRec::restored(def, v.state, bring_back), bring_back)
}

#[cfg(test)]
mod tests {
    use super::super::admission::tests::admit;
    use super::super::core::testing::{daemon, spec};
    use super::super::saver::snapshot_of;
    use super::*;
    use crate::api::VgpuState;

    #[test]
    fn a_snapshot_restores_definitions_and_ended_vms() {
        let d = daemon(1);
        let live = admit(&d, spec(Some(0), 1 << 20, 0.1)).expect("live");
        let gone = admit(&d, spec(Some(0), 1 << 20, 0.1)).expect("gone");
        d.state.with(|i| {
            if let Some(r) = i.vgpus.get_mut(&live) {
                r.mark_ready();
            }
            if let Some(r) = i.vgpus.get_mut(&gone) {
                r.end_worker(VgpuState::Released);
            }
        });
        let file = d.state.with(|i| snapshot_of(i, false));
        assert_eq!(file.vgpus.len(), 2);

        let mut back = Inner::default();
        let plan = restore_records(&d.cfg, &mut back, file);
        assert_eq!(
            plan.fresh,
            vec![live],
            "only the live definition comes back"
        );
        assert!(plan.workers.is_empty() && plan.vmms.is_empty(), "{plan:?}");
        assert_eq!(back.next_vgpu, gone + 1, "ids are not reused");
        let r = &back.vgpus[&live];
        assert!(
            r.restore_failed() && !r.holds_resources(),
            "held until admitted"
        );
        assert_eq!(*back.vgpus[&gone].state(), VgpuState::Released);
    }
}
