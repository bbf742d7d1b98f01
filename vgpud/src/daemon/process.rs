//! vGPUs whose frontend is a host or container process (`"attach": "process"`): the
//! socket handed over to the process's user, and a fresh worker for the next process
//! once one exits.
//!
//! The worker's own socket lives in its private directory (`workers/N/`, 0700, the
//! worker's identity), which a new worker replaces. A process vGPU's socket is handed
//! over at a path that stays the same for the vGPU's life: `attach/N/vgpu.sock`, a hard
//! link to the socket of whichever worker serves the vGPU now. `attach/N/` holds nothing
//! else; it belongs to vgpud's uid and the owner's group (0710; 0711 when no group was
//! given), and the socket to the owner's uid and group (0660), so the owner reaches the
//! socket and nothing else. A container runtime bind-mounts `attach/N/` (the directory,
//! whose inode survives a worker's replacement) into the container (docs/hostile.md).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::attach::ProcessAttach;
use super::core::{Daemon, WORKER_START};
use super::error::ApiError;
use super::state::VgpuRec;
use crate::api::{Attach, VgpuCreate, VgpuState};

/// vgpud's effective uid and gid.
fn own_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// The `attach`, `owner_uid` and `owner_gid` fields of a create: an owner only for a
/// process vGPU, and one vgpud can hand the socket to.
pub(super) fn validate(spec: &VgpuCreate) -> Result<(), ApiError> {
    if spec.attach == Attach::Vm {
        for (field, v) in [("owner_uid", spec.owner_uid), ("owner_gid", spec.owner_gid)] {
            if v.is_some() {
                return Err(ApiError::bad(
                    field,
                    format!("{field} is for \"attach\": \"process\" (a VM's vmm is started by vgpud); drop it or set attach to process"),
                ));
            }
        }
        return Ok(());
    }
    let (uid, gid) = own_ids();
    if uid != 0 {
        if let Some(o) = spec.owner_uid.filter(|o| *o != uid) {
            return Err(ApiError::bad(
                "owner_uid",
                format!("vgpud runs as uid {uid}, not root: it can hand the socket only to its own uid, not {o}"),
            ));
        }
        if let Some(o) = spec.owner_gid.filter(|o| *o != gid && !in_groups(*o)) {
            return Err(ApiError::bad(
                "owner_gid",
                format!("vgpud runs as uid {uid}, not root: it can hand the socket only to a group it is in, not {o}"),
            ));
        }
    }
    Ok(())
}

/// A VM's inline vGPU is the VM's: `attach` must be `vm`.
pub(super) fn refuse_inline(spec: &VgpuCreate) -> Result<(), ApiError> {
    if spec.attach == Attach::Process {
        return Err(ApiError::bad(
            "attach",
            "a VM's own vGPU has attach \"vm\"; create a process vGPU with POST /v1/vgpus",
        ));
    }
    Ok(())
}

/// Whether vgpud's process is in group `gid` (supplementary groups).
fn in_groups(gid: u32) -> bool {
    let mut groups = vec![0 as libc::gid_t; 256];
    let len = libc::c_int::try_from(groups.len()).unwrap_or(0);
    // SAFETY: `groups` has room for `len` entries; getgroups writes at most that many.
    let n = unsafe { libc::getgroups(len, groups.as_mut_ptr()) };
    usize::try_from(n)
        .ok()
        .is_some_and(|n| groups.iter().take(n).any(|g| *g == gid))
}

/// Whether vGPU `rec`'s worker exited because its process hung up (a clean exit while a
/// process was connected, and no one asked it to stop): a fresh worker then serves the
/// next process on the same socket.
pub(super) fn next_process(rec: &VgpuRec, clean: bool) -> bool {
    rec.process.is_some()
        && clean
        && !rec.stopping
        && rec.migrating_to.is_none()
        && *rec.state() == VgpuState::Attached
}

/// Links `worker_socket` at `to.socket` with `to`'s owner and modes.
fn link_socket(worker_socket: &Path, to: &ProcessAttach) -> std::io::Result<()> {
    let (uid, gid) = own_ids();
    let dir = to
        .socket
        .parent()
        .ok_or_else(|| std::io::Error::other("the hand-over path has no directory"))?;
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let group = to.owner_gid.unwrap_or(gid);
    std::os::unix::fs::chown(dir, Some(uid), Some(group))?;
    let dir_mode = if to.owner_gid.is_some() { 0o710 } else { 0o711 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))?;
    match std::fs::remove_file(&to.socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::hard_link(worker_socket, &to.socket)?;
    std::os::unix::fs::chown(&to.socket, Some(to.owner_uid.unwrap_or(uid)), Some(group))?;
    std::fs::set_permissions(&to.socket, std::fs::Permissions::from_mode(0o660))
}

impl Daemon {
    /// Hands vGPU `id`'s new worker's socket over at its stable path (a process vGPU;
    /// nothing for a VM's).
    pub(super) fn hand_over(&self, id: u32) -> Result<(), ApiError> {
        let Some((worker_socket, to)) = self.state.with(|i| {
            i.vgpus
                .get(&id)
                .and_then(|r| Some((r.socket.clone(), r.process.clone()?)))
        }) else {
            return Ok(());
        };
        link_socket(&worker_socket, &to).map_err(|e| {
            ApiError::internal(format!(
                "cannot hand vGPU {id}'s socket over at {}: {e}",
                to.socket.display()
            ))
        })?;
        tracing::info!(vgpu = id, socket = %to.socket.display(), owner_uid = to.owner_uid,
            owner_gid = to.owner_gid, "process vGPU socket handed over");
        Ok(())
    }

    /// Starts a fresh worker for process vGPU `id` (its last process hung up; the vGPU
    /// held its resources meanwhile, state `starting`). If it cannot start, the vGPU
    /// fails with the reason.
    pub(super) async fn next_worker(self: &Arc<Self>, id: u32) {
        tracing::info!(
            vgpu = id,
            "its process hung up; starting a fresh worker for the next one"
        );
        // The fresh worker's counters and clock start at zero: the last one's samples go
        // (again once it is ready: the last one's final counters may come in meanwhile).
        let forget_samples = || {
            self.state.with(|i| {
                if let Some(rec) = i.vgpus.get_mut(&id) {
                    rec.samples.clear();
                    rec.memory_report = None;
                }
            })
        };
        forget_samples();
        let result = self.start_worker(id).await;
        if result.is_ok() {
            forget_samples();
        }
        if let Err(e) = result {
            self.state.with(|i| {
                if let Some(rec) = i.vgpus.get_mut(&id) {
                    if *rec.state() == VgpuState::Starting && rec.worker.is_none() {
                        rec.fail(format!(
                            "no fresh worker after its process hung up: {}",
                            e.error
                        ));
                    }
                }
            });
            tracing::warn!(vgpu = id, error = %e.error, "no fresh worker for the process vGPU");
        }
        self.mark_dirty();
        self.state.notify();
    }

    /// Waits while process vGPU `id` is between two workers (its old one gone, its fresh
    /// one starting), so that a delete finds the fresh one.
    pub(super) async fn await_next_worker(&self, id: u32) {
        let between = |i: &super::state::Inner| {
            i.vgpus.get(&id).is_some_and(|r| {
                r.process.is_some() && *r.state() == VgpuState::Starting && r.worker.is_none()
            })
        };
        if self.state.with(|i| between(i)) {
            let limit = WORKER_START + Duration::from_secs(2);
            self.state.wait_until(limit, |i| !between(i)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::attach::{attach_dir, remove_attach_dir, ATTACH_DIR};

    fn spec(attach: Attach, uid: Option<u32>, gid: Option<u32>) -> VgpuCreate {
        let mut s = super::super::core::testing::spec(Some(0), 1 << 20, 0.1);
        (s.attach, s.owner_uid, s.owner_gid) = (attach, uid, gid);
        s
    }

    #[test]
    fn an_owner_is_only_for_a_process_vgpu() {
        let e = validate(&spec(Attach::Vm, Some(1000), None)).expect_err("vm with owner");
        assert_eq!(e.field.as_deref(), Some("owner_uid"), "{e}");
        let e = validate(&spec(Attach::Vm, None, Some(1000))).expect_err("vm with group");
        assert_eq!(e.field.as_deref(), Some("owner_gid"), "{e}");
        let (uid, gid) = own_ids();
        validate(&spec(Attach::Process, Some(uid), Some(gid))).expect("own ids");
        validate(&spec(Attach::Vm, None, None)).expect("plain vm");
        let e = refuse_inline(&spec(Attach::Process, None, None)).expect_err("inline");
        assert_eq!(e.field.as_deref(), Some("attach"), "{e}");
    }

    #[test]
    fn the_socket_is_linked_with_its_owner_and_modes() {
        let root = std::env::temp_dir().join(format!("vgpud-attach-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("root");
        let worker = root.join("worker.sock");
        let _l = std::os::unix::net::UnixListener::bind(&worker).expect("bind");
        let (uid, gid) = own_ids();
        let to = ProcessAttach::new(&root, 3, Some(uid), Some(gid));
        link_socket(&worker, &to).expect("link");
        // Again, as for a fresh worker: the old link is replaced.
        link_socket(&worker, &to).expect("relink");
        use std::os::unix::fs::MetadataExt;
        let s = std::fs::metadata(&to.socket).expect("socket");
        assert_eq!((s.mode() & 0o777, s.uid(), s.gid()), (0o660, uid, gid));
        let d = std::fs::metadata(attach_dir(&root, 3)).expect("dir");
        assert_eq!((d.mode() & 0o777, d.gid()), (0o710, gid));
        std::os::unix::net::UnixStream::connect(&to.socket).expect("the link reaches the socket");
        remove_attach_dir(&root, 3);
        assert!(!root.join(ATTACH_DIR).exists());
        std::fs::remove_dir_all(&root).expect("clean up");
    }
}
