//! The vGPU operations of the API: create, read, change shares, delete.

use std::sync::Arc;

use super::admission::{share, VgpuAsk};
use super::core::{no_vgpu, Daemon, CONTROL_TIMEOUT};
use super::error::ApiError;
use super::link::Link;
use super::state::VgpuRec;
use crate::api::{self, VgpuCreate, VgpuPatch};
use crate::control::{Command as Ctl, ReplyBody};
use crate::units::permille_to_fraction;
use vgpu_scheduler::Share;

/// Shares and priority: (compute per-mille, copy per-mille, priority).
type Shares = (u32, u32, i32);

impl Daemon {
    /// Creates a vGPU and starts its worker.
    pub async fn create_vgpu(self: &Arc<Self>, spec: VgpuCreate) -> Result<api::Vgpu, ApiError> {
        self.check_running()?;
        let ask = self.validate_vgpu(&spec)?;
        let id = self.state.with(|inner| self.admit(inner, ask, None))?;
        if let Err(e) = self.start_worker(id).await {
            self.forget_vgpu(id);
            return Err(e);
        }
        // Answered only once the definition is on disk: a restart keeps it.
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("vGPU {id} was created"), &e))?;
        self.vgpu(id)
    }

    /// Removes a vGPU record and its files (after its worker is gone).
    pub(super) fn forget_vgpu(&self, id: u32) {
        if let Some(rec) = self.state.with(|i| i.vgpus.remove(&id)) {
            let _ = std::fs::remove_file(&rec.log);
            let _ = std::fs::remove_file(&rec.socket);
        }
        self.mark_dirty();
        self.state.notify();
    }

    pub(super) fn vgpu(&self, id: u32) -> Result<api::Vgpu, ApiError> {
        self.state.vgpu_view(id).ok_or_else(|| no_vgpu(id))
    }

    /// One vGPU.
    pub fn get_vgpu(&self, id: u32) -> Result<api::Vgpu, ApiError> {
        self.vgpu(id)
    }

    /// Every vGPU.
    pub fn list_vgpus(&self) -> Vec<api::Vgpu> {
        self.state
            .with(|i| i.vgpus.values().map(VgpuRec::view).collect())
    }

    /// Changes shares and priority at run time and tells the worker.
    pub async fn patch_vgpu(&self, id: u32, patch: VgpuPatch) -> Result<api::Vgpu, ApiError> {
        self.check_running()?;
        let compute = patch
            .compute_share
            .map(|v| share("compute_share", v))
            .transpose()?;
        let copy = patch
            .copy_share
            .map(|v| share("copy_share", v))
            .transpose()?;
        let (old, new, link) = self.admit_shares(id, compute, copy, patch.priority)?;
        if let Some(link) = link {
            self.tell_shares(id, &link, old, new).await?;
        }
        self.schedule_shares(id, new);
        tracing::info!(
            vgpu = id,
            compute = new.0,
            copy = new.1,
            priority = new.2,
            "vGPU shares changed"
        );
        // Answered only once the new shares are on disk: a restart keeps them.
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("vGPU {id}'s change was made"), &e))?;
        self.vgpu(id)
    }

    /// Checks vGPU `id`'s new shares against its GPU and records them: (old, new, its
    /// worker's channel).
    fn admit_shares(
        &self,
        id: u32,
        compute: Option<u32>,
        copy: Option<u32>,
        priority: Option<i32>,
    ) -> Result<(Shares, Shares, Option<Link>), ApiError> {
        self.state.with(|inner| {
            let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
            if !rec.holds_resources() {
                return Err(ApiError::conflict(
                    "id",
                    format!("vGPU {id} is no longer live (its worker is gone); create a new vGPU"),
                ));
            }
            let old = (rec.compute, rec.copy, rec.priority);
            let new = (
                compute.unwrap_or(rec.compute),
                copy.unwrap_or(rec.copy),
                priority.unwrap_or(rec.priority),
            );
            let ask = VgpuAsk {
                memory: 0,
                compute: new.0,
                copy: new.1,
                priority: new.2,
                oversubscribe: false,
                queues: 1,
                ..VgpuAsk::of(rec)
            };
            if let Some(e) = self.misfit(inner, rec.gpu, &ask, Some(id)) {
                return Err(e);
            }
            let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
            (rec.compute, rec.copy, rec.priority) = new;
            if rec.oversubscribe {
                self.pool_join(rec.gpu, id, new.2);
            }
            Ok((old, new, rec.link()))
        })
    }

    /// Tells vGPU `id`'s worker its new shares; puts the old ones back if it refuses.
    async fn tell_shares(
        &self,
        id: u32,
        link: &Link,
        old: Shares,
        new: Shares,
    ) -> Result<(), ApiError> {
        let cmd = Ctl::SetShares {
            compute_share: new.0,
            copy_share: new.1,
            priority: new.2,
        };
        let err = match link.call(cmd, CONTROL_TIMEOUT).await {
            Ok(ReplyBody::SharesSet { .. }) => None,
            Ok(ReplyBody::Error { message }) => Some(message),
            Ok(other) => Some(format!("unexpected reply {other:?}")),
            Err(e) => Some(e),
        };
        let Some(why) = err else { return Ok(()) };
        self.state.with(|i| {
            if let Some(rec) = i.vgpus.get_mut(&id) {
                (rec.compute, rec.copy, rec.priority) = old;
            }
        });
        // A save in between may have caught the new values.
        self.mark_dirty();
        Err(ApiError::worker(format!(
            "vGPU {id}'s worker did not take the new shares ({why}); nothing changed"
        )))
    }

    /// vGPU `id`'s GPU scheduler takes its new shares.
    fn schedule_shares(&self, id: u32, new: Shares) {
        let gpu = self.state.with(|i| i.vgpus.get(&id).map(|r| r.gpu));
        if let Some(server) = gpu.and_then(|g| self.grants.get(g as usize)) {
            let share = |permille: u32| Share {
                fraction: permille_to_fraction(permille),
                priority: new.2,
            };
            if let Err(e) = server.set_shares(id, share(new.0), share(new.1)) {
                // Admission already checked the sums; this only fails for a vGPU whose
                // worker just went away.
                tracing::warn!(vgpu = id, "the scheduler did not take the new shares: {e}");
            }
        }
    }

    /// Stops a vGPU's worker (if any) and removes the vGPU.
    pub async fn delete_vgpu(&self, id: u32) -> Result<(), ApiError> {
        let worker = self.state.with(|inner| {
            let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
            if let Some(vm) = rec.vm {
                if inner.vms.get(&vm).is_some_and(|v| v.state.is_live()) {
                    return Err(ApiError::conflict(
                        "id",
                        format!(
                            "vGPU {id} is in use by running VM {vm}; DELETE /v1/vms/{vm} first"
                        ),
                    ));
                }
            }
            let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
            rec.stopping = true;
            Ok(rec
                .worker
                .as_ref()
                .map(|w| (w.proc.clone(), w.link.clone())))
        })?;
        if let Some((p, link)) = worker {
            self.stop_worker(id, &p, &link).await;
        }
        self.state.with(|inner| {
            let vm = inner.vgpus.get(&id).and_then(|r| r.vm);
            if let Some(v) = vm.and_then(|vm| inner.vms.get_mut(&vm)) {
                v.vgpu = None;
            }
        });
        self.forget_vgpu(id);
        tracing::info!(vgpu = id, "vGPU deleted");
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("vGPU {id} was deleted"), &e))
    }
}
