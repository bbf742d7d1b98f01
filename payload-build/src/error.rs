//! What can go wrong finding or building a payload.

use std::path::PathBuf;

/// Cloneable so one build's outcome can be handed to every caller in the process.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown payload {name:?}; known payloads: {known}")]
    UnknownPayload { name: String, known: String },
    #[error("cannot run {cargo} (is cargo installed? set VGPU_PAYLOAD_DIR to use prebuilt payloads): {reason}")]
    CargoMissing { cargo: String, reason: String },
    #[error("building the payloads in {dir} failed ({status}); cargo said:\n{stderr_tail}")]
    BuildFailed {
        dir: PathBuf,
        status: String,
        stderr_tail: String,
    },
    #[error("the payload build finished but {0} is missing")]
    NotProduced(PathBuf),
    #[error("prebuilt payload {0} not found (VGPU_PAYLOAD_DIR)")]
    PrebuiltMissing(PathBuf),
    #[error("guests workspace not found at {0} (set VGPU_PAYLOAD_DIR to use prebuilt payloads)")]
    NoGuestsWorkspace(PathBuf),
    #[error("build lock {path}: {reason}")]
    Lock { path: PathBuf, reason: String },
}
