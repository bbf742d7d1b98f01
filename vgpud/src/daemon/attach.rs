//! A process vGPU's hand-over (`"attach": "process"`): where its socket is handed to the
//! process's user, who may connect, and the checks of a create's `attach` and owner
//! fields (the next worker for the next process is `workers/process.rs`).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use super::error::ApiError;
use crate::api::{Attach, VgpuCreate};

/// The directory of the hand-over directories.
pub(super) const ATTACH_DIR: &str = "attach";
/// The socket's name in a hand-over directory.
const ATTACH_SOCKET: &str = "vgpu.sock";

/// A process vGPU's hand-over: who may connect, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ProcessAttach {
    /// The socket file's uid (None: vgpud's).
    pub(super) owner_uid: Option<u32>,
    /// The socket file's and its directory's gid (None: vgpud's).
    pub(super) owner_gid: Option<u32>,
    /// The stable path handed to the process (`attach/N/vgpu.sock`).
    pub(super) socket: PathBuf,
}

impl ProcessAttach {
    /// vGPU `id`'s hand-over under `state_dir`.
    pub(super) fn new(
        state_dir: &Path,
        id: u32,
        owner_uid: Option<u32>,
        owner_gid: Option<u32>,
    ) -> Self {
        Self {
            owner_uid,
            owner_gid,
            socket: attach_dir(state_dir, id).join(ATTACH_SOCKET),
        }
    }
}

/// vGPU `id`'s hand-over directory.
pub(super) fn attach_dir(state_dir: &Path, id: u32) -> PathBuf {
    state_dir.join(ATTACH_DIR).join(id.to_string())
}

/// Removes vGPU `id`'s hand-over directory (the vGPU is gone), and `attach/` once empty.
pub(super) fn remove_attach_dir(state_dir: &Path, id: u32) {
    let _ = std::fs::remove_dir_all(attach_dir(state_dir, id));
    let _ = std::fs::remove_dir(state_dir.join(ATTACH_DIR));
}

/// vgpud's effective uid and gid.
pub(super) fn own_ids() -> (u32, u32) {
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

/// Binds process vGPU's hand-over socket `to.socket` afresh, with `to`'s owner and
/// modes, for a new worker (which gets the listening descriptor). Every path touched
/// lies in `attach/N/`, which only vgpud writes: no worker can put a link or a symlink
/// there for the chown and chmod to follow.
pub(super) fn bind_hand_over(to: &ProcessAttach) -> std::io::Result<UnixListener> {
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
    let listener = UnixListener::bind(&to.socket)?;
    std::os::unix::fs::chown(&to.socket, Some(to.owner_uid.unwrap_or(uid)), Some(group))?;
    std::fs::set_permissions(&to.socket, std::fs::Permissions::from_mode(0o660))?;
    tracing::info!(socket = %to.socket.display(), owner_uid = to.owner_uid,
        owner_gid = to.owner_gid, "process vGPU socket handed over");
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_socket_is_bound_with_its_owner_and_modes() {
        let root = std::env::temp_dir().join(format!("vgpud-attach-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("root");
        let (uid, gid) = own_ids();
        let to = ProcessAttach::new(&root, 3, Some(uid), Some(gid));
        let first = bind_hand_over(&to).expect("bind");
        // Again, as for a fresh worker: the old socket is replaced.
        drop(first);
        let _l = bind_hand_over(&to).expect("bind again");
        use std::os::unix::fs::MetadataExt;
        let s = std::fs::metadata(&to.socket).expect("socket");
        assert_eq!((s.mode() & 0o777, s.uid(), s.gid()), (0o660, uid, gid));
        let d = std::fs::metadata(attach_dir(&root, 3)).expect("dir");
        assert_eq!((d.mode() & 0o777, d.gid()), (0o710, gid));
        std::os::unix::net::UnixStream::connect(&to.socket).expect("the socket listens");
        remove_attach_dir(&root, 3);
        assert!(!root.join(ATTACH_DIR).exists());
        std::fs::remove_dir_all(&root).expect("clean up");
    }

    #[test]
    fn a_symlink_at_the_hand_over_path_is_replaced_never_followed() {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!("vgpud-attach-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("root");
        let secret = root.join("secret");
        std::fs::write(&secret, "x").expect("secret");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let before = std::fs::metadata(&secret).expect("secret");
        let (uid, gid) = own_ids();
        let to = ProcessAttach::new(&root, 5, Some(uid), Some(gid));
        std::fs::create_dir_all(attach_dir(&root, 5)).expect("dir");
        std::os::unix::fs::symlink(&secret, &to.socket).expect("plant");
        let _l = bind_hand_over(&to).expect("bind");
        let after = std::fs::metadata(&secret).expect("secret");
        assert_eq!(
            (after.uid(), after.gid(), after.mode()),
            (before.uid(), before.gid(), before.mode())
        );
        let s = std::fs::symlink_metadata(&to.socket).expect("socket");
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&s.file_type()));
        std::fs::remove_dir_all(&root).expect("clean up");
    }
}
