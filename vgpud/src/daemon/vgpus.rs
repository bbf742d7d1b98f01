//! The vGPU operations of the API: create, read, change shares, delete.

use std::sync::Arc;

use super::admission;
use super::admission::{
    name_free, share, validate_kernel_deadline, validate_labels, validate_name,
};
use super::attach::{remove_attach_dir, ProcessAttach};
use super::config::Config;
use super::core::{no_vgpu, Daemon, CONTROL_TIMEOUT};
use super::error::ApiError;
use super::link::Link;
use super::state::{Inner, Shares, State, VgpuAsk, VgpuRec};
use super::workers;
use super::workers::process;
use crate::api::{self, VgpuCreate, VgpuPatch, VgpuState};
use crate::control::{Command as Ctl, ReplyBody};
use crate::units::permille_to_fraction;
use vgpu_grant::GrantError;
use vgpu_scheduler::Share;

/// Creates a vGPU and starts its worker.
pub async fn create_vgpu(d: &Arc<Daemon>, spec: VgpuCreate) -> Result<api::Vgpu, ApiError> {
    d.check_running()?;
    let ask = admission::validate_vgpu(d, &spec)?;
    let process = (spec.attach == api::Attach::Process).then_some((spec.owner_uid, spec.owner_gid));
    let id = d.state.with(|inner| {
        let id = admission::admit(d, inner, ask, None)?;
        if let (Some((uid, gid)), Some(rec)) = (process, inner.vgpus.get_mut(&id)) {
            rec.hand_over_at(ProcessAttach::new(&d.cfg.state_dir, id, uid, gid));
        }
        Ok::<_, ApiError>(id)
    })?;
    if let Err(e) = workers::start_worker(d, id).await {
        forget_vgpu(d, id);
        return Err(e);
    }
    // Answered only once the definition is on disk: a restart keeps it.
    d.persist
        .save(&d.state)
        .await
        .map_err(|e| ApiError::unsaved(&format!("vGPU {id} was created"), &e))?;
    get_vgpu(&d.state, id)
}

/// Removes a vGPU record and its files (after its worker is gone).
pub(super) fn forget_vgpu(d: &Daemon, id: u32) {
    if let Some(rec) = d.state.with(|i| i.vgpus.remove(&id)) {
        let _ = std::fs::remove_file(rec.log());
        let _ = std::fs::remove_file(rec.socket());
        if rec.process().is_some() {
            remove_attach_dir(&d.cfg.state_dir, id);
        }
    }
    d.persist.mark_dirty();
    d.state.notify();
}

/// One vGPU.
pub fn get_vgpu(state: &State, id: u32) -> Result<api::Vgpu, ApiError> {
    state.vgpu_view(id).ok_or_else(|| no_vgpu(id))
}

/// Every vGPU.
pub fn list_vgpus(state: &State) -> Vec<api::Vgpu> {
    state.with(|i| i.vgpus.values().map(VgpuRec::view).collect())
}

/// Changes shares and priority at run time. The change is reserved on every GPU the
/// vGPU counts on (its own, and a migration's target) with the larger of its old and
/// new shares, told to the worker, then applied to the schedulers and recorded in one
/// step: the API never reports a share the schedulers do not enforce.
pub async fn patch_vgpu(d: &Daemon, id: u32, patch: VgpuPatch) -> Result<api::Vgpu, ApiError> {
    d.check_running()?;
    let compute = patch
        .compute_share
        .map(|v| share("compute_share", v))
        .transpose()?;
    let copy = patch
        .copy_share
        .map(|v| share("copy_share", v))
        .transpose()?;
    let meta = Meta::of(&patch)?;
    if compute.is_none() && copy.is_none() && patch.priority.is_none() {
        // Only its name, labels or kernel deadline: no share to enforce.
        d.state.with(|inner| {
            let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
            live_for_change(rec)?;
            meta.apply(inner, id).map(drop)
        })?;
        deadline_changed(d, id, patch.kernel_deadline_ms);
        d.persist.mark_dirty();
        d.persist
            .save(&d.state)
            .await
            .map_err(|e| ApiError::unsaved(&format!("vGPU {id}'s change was made"), &e))?;
        return get_vgpu(&d.state, id);
    }
    let (new, link, old_meta) = d.state.with(|inner| {
        meta.check(inner, id)?;
        let (new, link) = reserve_shares(&d.cfg, inner, id, compute, copy, patch.priority)?;
        let old = meta.apply(inner, id)?;
        Ok::<_, ApiError>((new, link, old))
    })?;
    if let Err(why) = tell_shares(&link, new).await {
        d.state.with(|inner| old_meta.restore(inner, id));
        return Err(drop_pending(&d.state, id, &why));
    }
    let committed = d.state.with(|inner| {
        let r = commit_shares(d, inner, id, new);
        if r.is_err() {
            old_meta.restore(inner, id);
        }
        r
    });
    d.state.notify();
    committed?;
    deadline_changed(d, id, patch.kernel_deadline_ms);
    tracing::info!(
        vgpu = id,
        compute = new.compute,
        copy = new.copy,
        priority = new.priority,
        "vGPU shares changed"
    );
    // Answered only once the new shares are on disk: a restart keeps them.
    d.persist
        .save(&d.state)
        .await
        .map_err(|e| ApiError::unsaved(&format!("vGPU {id}'s change was made"), &e))?;
    get_vgpu(&d.state, id)
}

/// vGPU `id`'s kernel deadline became `ms` (when given): its schedulers apply it now.
fn deadline_changed(d: &Daemon, id: u32, ms: Option<u32>) {
    if ms.is_none() {
        return;
    }
    let applied = d.state.with(|inner| {
        let rec = inner.vgpus.get(&id)?;
        Some((rec.pools(), d.grants.kernel_deadline_of(rec)))
    });
    if let Some((gpus, deadline)) = applied {
        d.grants.apply_kernel_deadline(id, deadline, &gpus);
    }
}

/// Checks vGPU `id`'s new shares against its GPU (and a migration's target) and
/// holds them as pending: (the new shares, its worker's channel). Caller holds the
/// state lock.
fn reserve_shares(
    cfg: &Config,
    inner: &mut Inner,
    id: u32,
    compute: Option<u32>,
    copy: Option<u32>,
    priority: Option<i32>,
) -> Result<(Shares, Link), ApiError> {
    let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
    live_for_change(rec)?;
    if rec.pending().is_some() {
        return Err(ApiError::conflict(
            "id",
            format!(
                "another change to vGPU {id} is on its way to its worker; retry once it answered"
            ),
        ));
    }
    let old = rec.shares();
    let new = Shares {
        compute: compute.unwrap_or(old.compute),
        copy: copy.unwrap_or(old.copy),
        priority: priority.unwrap_or(old.priority),
    };
    let ask = VgpuAsk {
        memory: 0,
        compute: new.compute.max(old.compute),
        copy: new.copy.max(old.copy),
        priority: new.priority,
        oversubscribe: false,
        queues: 1,
        ..VgpuAsk::of(rec)
    };
    for gpu in rec.pools() {
        if let Some(e) = admission::misfit(cfg, inner, gpu, &ask, Some(id)) {
            return Err(e);
        }
    }
    let Some(link) = rec.link() else {
        return Err(ApiError::conflict(
            "id",
            format!("vGPU {id}'s worker is still starting; retry once the vGPU is ready"),
        ));
    };
    let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
    rec.hold_pending(new);
    Ok((new, link))
}

/// The worker took vGPU `id`'s new shares: its schedulers take them and the record
/// says so, in one step. Caller holds the state lock.
fn commit_shares(d: &Daemon, inner: &mut Inner, id: u32, new: Shares) -> Result<(), ApiError> {
    let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
    rec.clear_pending();
    live_for_change(rec)?;
    let share = |permille: u32| Share {
        fraction: permille_to_fraction(permille),
        priority: new.priority,
    };
    // The GPU it runs on first: that one must take it. A migration's target that has
    // no channel for it yet reads the shares from the record when it attaches.
    let mut done = Vec::new();
    for gpu in rec.pools() {
        let Some(server) = d.grants.get(gpu) else {
            continue;
        };
        match server.set_shares(id, share(new.compute), share(new.copy)) {
            Ok(()) => done.push(server),
            Err(GrantError::NotAttached(_)) if gpu != rec.gpu() => {}
            Err(e) => {
                let old = rec.shares();
                for s in done {
                    let _ = s.set_shares(id, share(old.compute), share(old.copy));
                }
                tracing::error!(vgpu = id, gpu, "the scheduler refused the new shares: {e}");
                return Err(ApiError::internal(format!(
                    "GPU {gpu}'s scheduler refused vGPU {id}'s new shares ({e}); they stay as they were"
                )));
            }
        }
    }
    rec.apply_shares(new);
    if rec.oversubscribe() {
        d.memory.join(rec.gpu(), id, new.priority);
    }
    d.persist.mark_dirty();
    Ok(())
}

/// The worker did not take vGPU `id`'s change (`why`): the pending shares are
/// dropped. The answer says why, or that the vGPU went away meanwhile.
fn drop_pending(state: &State, id: u32, why: &str) -> ApiError {
    let gone = state.with(|inner| {
        let rec = inner.vgpus.get_mut(&id)?;
        rec.clear_pending();
        live_for_change(rec).err()
    });
    state.notify();
    match state.with(|i| i.vgpus.contains_key(&id)) {
        false => no_vgpu(id),
        true => gone.unwrap_or_else(|| {
            ApiError::worker(format!(
                "vGPU {id}'s worker did not take the new shares ({why}); nothing changed"
            ))
        }),
    }
}

/// Stops a vGPU's worker (if any) and removes the vGPU.
pub async fn delete_vgpu(d: &Daemon, id: u32) -> Result<(), ApiError> {
    // A process vGPU between two workers: its fresh one is the one to stop.
    process::await_next_worker(d, id).await;
    let worker = d.state.with(|inner| {
        let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
        if *rec.state() == VgpuState::Releasing {
            return Err(being_released(id));
        }
        if let Some(vm) = rec.vm() {
            if inner.vms.get(&vm).is_some_and(|v| v.state().is_live()) {
                return Err(ApiError::conflict(
                    "id",
                    format!("vGPU {id} is in use by running VM {vm}; DELETE /v1/vms/{vm} first"),
                ));
            }
        }
        let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
        rec.begin_release();
        Ok(rec.worker().map(|w| (w.proc.clone(), w.link.clone())))
    })?;
    d.state.notify();
    if let Some((p, link)) = worker {
        workers::stop_worker(d, id, &p, &link).await;
    }
    d.state.with(|inner| {
        let vm = inner.vgpus.get(&id).and_then(|r| r.vm());
        if let Some(v) = vm.and_then(|vm| inner.vms.get_mut(&vm)) {
            v.forget_vgpu();
        }
    });
    forget_vgpu(d, id);
    tracing::info!(vgpu = id, "vGPU deleted");
    d.persist
        .save(&d.state)
        .await
        .map_err(|e| ApiError::unsaved(&format!("vGPU {id} was deleted"), &e))
}

/// The answer to a change of a vGPU that a DELETE is removing.
fn being_released(id: u32) -> ApiError {
    ApiError::conflict(
        "id",
        format!("vGPU {id} is being released (it was deleted); create a new vGPU"),
    )
}

/// Whether vGPU `rec` can take a change now.
fn live_for_change(rec: &VgpuRec) -> Result<(), ApiError> {
    let id = rec.id();
    // Asked to stop: its worker may already be gone, its record not yet.
    if *rec.state() == VgpuState::Releasing || rec.stopping() {
        return Err(being_released(id));
    }
    if !rec.holds_resources() {
        return Err(ApiError::conflict(
            "id",
            format!("vGPU {id} is no longer live (its worker is gone); create a new vGPU"),
        ));
    }
    Ok(())
}

/// Tells a worker its new shares.
async fn tell_shares(link: &Link, new: Shares) -> Result<(), String> {
    let cmd = Ctl::SetShares {
        compute_share: new.compute,
        copy_share: new.copy,
        priority: new.priority,
    };
    match link.call(cmd, CONTROL_TIMEOUT).await {
        Ok(ReplyBody::SharesSet { .. }) => Ok(()),
        Ok(ReplyBody::Error { message }) => Err(message),
        Ok(other) => Err(format!("unexpected reply {other:?}")),
        Err(e) => Err(e),
    }
}

/// A change of a vGPU's name, labels or kernel deadline, validated.
struct Meta {
    /// `Some(None)`: remove the name.
    name: Option<Option<String>>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    /// `Some(None)`: the daemon's deadline (only when putting back a replaced value).
    kernel_deadline_ms: Option<Option<u32>>,
}

impl Meta {
    fn of(patch: &VgpuPatch) -> Result<Self, ApiError> {
        let name = match patch.name.as_deref() {
            None => None,
            Some("") => Some(None),
            Some(n) => {
                validate_name(n)?;
                Some(Some(n.to_owned()))
            }
        };
        if let Some(l) = &patch.labels {
            validate_labels(l)?;
        }
        if let Some(ms) = patch.kernel_deadline_ms {
            validate_kernel_deadline(ms)?;
        }
        Ok(Self {
            name,
            labels: patch.labels.clone(),
            kernel_deadline_ms: patch.kernel_deadline_ms.map(Some),
        })
    }

    /// Its new name is free. Caller holds the state lock.
    fn check(&self, inner: &Inner, id: u32) -> Result<(), ApiError> {
        match &self.name {
            Some(Some(n)) => name_free(inner, n, Some(id)),
            _ => Ok(()),
        }
    }

    /// Records it on vGPU `id`; returns what it replaced. Caller holds the state lock.
    fn apply(&self, inner: &mut Inner, id: u32) -> Result<Meta, ApiError> {
        self.check(inner, id)?;
        let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
        let old = Meta {
            name: self.name.as_ref().map(|_| rec.name().clone()),
            labels: self.labels.as_ref().map(|_| rec.labels().clone()),
            kernel_deadline_ms: self.kernel_deadline_ms.map(|_| rec.kernel_deadline_ms()),
        };
        rec.set_meta(
            self.name.clone(),
            self.labels.clone(),
            self.kernel_deadline_ms,
        );
        Ok(old)
    }

    /// Puts back what [`Meta::apply`] replaced. Caller holds the state lock.
    fn restore(self, inner: &mut Inner, id: u32) {
        if let Some(rec) = inner.vgpus.get_mut(&id) {
            rec.set_meta(self.name, self.labels, self.kernel_deadline_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::admission::tests::admit;
    use super::super::core::testing::{daemon, spec};
    use super::reserve_shares;

    #[test]
    fn a_share_change_is_checked_on_the_migration_target_too() {
        let d = daemon(2);
        let a = admit(&d, spec(Some(0), 1 << 30, 0.3)).expect("a");
        admit(&d, spec(Some(1), 1 << 30, 0.6)).expect("b on the target");
        d.state.with(|i| {
            if let Some(r) = i.vgpus.get_mut(&a) {
                r.begin_migration(1);
            }
        });
        let e = d
            .state
            .with(|i| reserve_shares(&d.cfg, i, a, Some(700), None, None))
            .expect_err("GPU 1 has 0.1 left");
        assert_eq!(e.field.as_deref(), Some("compute_share"), "{e}");
        assert!(e.error.contains("GPU 1"), "{e}");
        let held = d.state.with(|i| i.vgpus[&a].pending());
        assert_eq!(held, None, "a refused change holds nothing");
    }

    #[test]
    fn a_vgpu_being_released_takes_no_change() {
        let d = daemon(1);
        let a = admit(&d, spec(Some(0), 1 << 30, 0.3)).expect("a");
        d.state.with(|i| {
            if let Some(r) = i.vgpus.get_mut(&a) {
                r.begin_release();
            }
        });
        let e = d
            .state
            .with(|i| reserve_shares(&d.cfg, i, a, Some(100), None, None))
            .expect_err("releasing");
        assert_eq!(e.status, axum::http::StatusCode::CONFLICT);
        assert!(e.error.contains("being released"), "{e}");
        assert_eq!(
            super::super::stats::gpus(&d)[0].compute_committed,
            0.3,
            "it holds its shares until its worker is gone"
        );
        let e = d
            .state
            .with(|i| reserve_shares(&d.cfg, i, 99, Some(100), None, None))
            .expect_err("unknown");
        assert_eq!(e.status, axum::http::StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_vgpu_without_a_worker_yet_takes_no_change() {
        let d = daemon(1);
        let a = admit(&d, spec(Some(0), 1 << 30, 0.3)).expect("a");
        let e = d
            .state
            .with(|i| reserve_shares(&d.cfg, i, a, Some(100), None, None))
            .expect_err("starting");
        assert!(e.error.contains("starting"), "{e}");
        assert_eq!(d.state.with(|i| i.vgpus[&a].pending()), None);
    }
}
