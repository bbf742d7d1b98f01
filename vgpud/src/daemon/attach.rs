//! A process vGPU's hand-over (`"attach": "process"`): where its socket is handed to the
//! process's user, and who may connect (see `process.rs`).

use std::path::{Path, PathBuf};

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
