//! The control channel between vgpud and one `vgpu-worker`.
//!
//! A `SOCK_STREAM` unix socket pair: vgpud keeps one end, the worker inherits the other as
//! a file descriptor (`vgpu-worker --control-fd N`). Each message is one line of JSON
//! (newline-delimited, at most [`MAX_LINE`] bytes). The set is small and explicit:
//!
//! - worker → daemon, unprompted: [`WorkerMessage::Ready`] once the vhost-user socket is
//!   bound (vgpud starts the VM's vmm only after it), [`WorkerMessage::Connected`] when
//!   the VM's vmm connected.
//! - daemon → worker: a [`Request`] with an id; the worker answers with
//!   [`WorkerMessage::Reply`] carrying the same id. Commands: `stats`, `set_shares`,
//!   `shutdown`.
//! - worker → daemon, last: [`WorkerMessage::Final`] with its counters, before it exits.
//!
//! When the daemon's end closes (vgpud died), the worker shuts down as on SIGTERM.
//! - worker → daemon: [`WorkerMessage::Ask`] (a memory reservation of an oversubscribed
//!   vGPU, or a shared memory request) with an id; the daemon answers with
//!   [`Command::Answer`] carrying it, and for a shared object attach passes the object's
//!   file descriptor with that line (SCM_RIGHTS). A shared object is created by the
//!   worker that asks for it ([`Answer::Export`], then [`Ask::ShmCreate`] with the
//!   object's descriptor riding on the ask's line), so vgpud never loads a GPU driver.
//!   [`WorkerMessage::Memory`] reports a pager's state after it changed.
//!
//! The fast path for BAND grants is shared memory + eventfd (`vgpu-grant`), not this socket.

use serde::{Deserialize, Serialize};

/// Longest line either side accepts.
pub const MAX_LINE: usize = 64 * 1024;

/// A command from vgpud.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Report the counters now.
    Stats,
    /// Change the vGPU's shares (per-mille) and priority at run time.
    SetShares {
        compute_share: u32,
        copy_share: u32,
        priority: i32,
    },
    /// Close the frontend connection (if any) and exit.
    Shutdown,
    /// Swap out at least `bytes` of idle device memory to `tier` (memory oversubscription).
    Evict { bytes: u64, tier: SwapTier },
    /// Move at least `bytes` from the GPU's swap area on to host memory.
    Spill { bytes: u64 },
    /// Move the vGPU onto another GPU (live migration). The target GPU's grant page and
    /// doorbell ride with this line when `grant_fds` is true. The reply comes when it is
    /// done ([`ReplyBody::Migrated`]) or failed (the vGPU stays where it was); progress
    /// comes as [`WorkerMessage::Migration`] meanwhile.
    Migrate {
        target: TargetGpu,
        mode: MigrationMode,
        max_downtime_ms: u64,
        grant_fds: bool,
    },
    /// The daemon's answer to the worker's [`WorkerMessage::Ask`] `to`. The worker does
    /// not reply to it. An `Attach` answer carries the shared object's file descriptor
    /// (SCM_RIGHTS) with the first byte of its line.
    Answer { to: u64, answer: Answer },
    /// Send the vGPU's state to a worker on another host (whole-VM migration): the
    /// connected stream to it rides with this line (SCM_RIGHTS); `token` is the one-time
    /// secret the destination generated. Device memory is pre-copied while the VM runs;
    /// the rest goes at the VM's stop (its vmm stopping the rings); with `stop_copy`
    /// nothing moves before the stop. The reply ([`ReplyBody::Migrated`]) comes once the
    /// destination holds the state, or an error.
    MigrateOut {
        token: String,
        max_downtime_ms: u64,
        #[serde(default)]
        stop_copy: bool,
    },
    /// Give up a [`Command::MigrateOut`] whose VM did not stop (its move failed).
    CancelMigrateOut,
    /// A pool worker (started with `--pool`, its GPU backend built, idle) is to serve
    /// vGPU `vgpu_id`: the vGPU's grant page and doorbell ride with this line
    /// (SCM_RIGHTS). The worker binds its vhost-user socket and answers
    /// [`ReplyBody::Assigned`]; from then on it is that vGPU's worker like any other.
    Assign {
        vgpu_id: u32,
        /// The vGPU's memory share, bytes.
        memory: u64,
        queues: u16,
        /// Per-mille.
        compute_share: u32,
        copy_share: u32,
        priority: i32,
    },
}

/// The GPU a migration moves to, as the worker builds its backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetGpu {
    /// vgpud's index of the GPU.
    pub gpu: u32,
    /// CUDA device ordinal; None: a simulated GPU with the fields below.
    pub cuda_ordinal: Option<i32>,
    pub sim_memory: u64,
    pub sim_copy_bw: u64,
    pub sim_speed: f64,
    pub sim_threads: usize,
}

/// How a migration moves memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationMode {
    StopCopy,
    Precopy,
}

/// Where a migration is (worker → daemon).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationProgress {
    /// `precopy`, `draining`, `stop_copy` or `done`.
    pub phase: String,
    pub rounds: u32,
    pub bytes: u64,
    pub total: u64,
    pub dirty: u64,
    pub elapsed_ms: f64,
}

/// A finished migration (worker → daemon).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationDone {
    pub rounds: u32,
    pub precopy_bytes: u64,
    pub stop_bytes: u64,
    pub total: u64,
    pub downtime_ms: f64,
    pub drain_ms: f64,
    pub elapsed_ms: f64,
    /// (phase, start ms, end ms).
    pub timeline: Vec<(String, f64, f64)>,
}

/// Where evicted bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapTier {
    /// The GPU's temporal swap area.
    Device,
    /// Host memory.
    Host,
}

/// What a worker asks vgpud (memory decisions and the shared memory registry).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Ask {
    /// `bytes` more resident device memory (an oversubscribed vGPU).
    Reserve { bytes: u64 },
    /// `shmget`. When a new object is to be made, vgpud answers [`Answer::Export`]: the
    /// worker creates it on its own GPU and asks [`Ask::ShmCreate`].
    ShmGet { key: u64, size: u64, flags: u64 },
    /// `shmget` once more, with the object the worker created and exported on its GPU
    /// (`SharedMemory::export`) after an [`Answer::Export`]: its file descriptor rides
    /// with the first byte of this line (SCM_RIGHTS). vgpud checks the descriptor and
    /// keeps it as the object, or closes it when the key exists by now or the ask is
    /// refused.
    ShmCreate { key: u64, size: u64, flags: u64 },
    /// `shmat`: the object's descriptor and size.
    ShmAttach { shmid: u64 },
    /// `shmdt` done: one attachment of `shmid` fewer.
    ShmDetach { shmid: u64 },
    /// `shmctl`.
    ShmCtl { shmid: u64, cmd: u32 },
}

/// Why a shared memory request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmFailure {
    NotFound,
    Exists,
    Denied,
    Invalid,
    NoMemory,
}

/// vgpud's answer to an [`Ask`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Answer {
    /// The reservation is granted.
    Granted,
    /// Refused; why.
    Refused { why: String },
    /// Result values (shm get: `[id, ..]`; ctl stat: `[size, attachments, key, 0]`).
    Values { values: [u64; 4] },
    /// A shared memory request failed.
    ShmError {
        failure: ShmFailure,
        message: String,
    },
    /// The object to map: its descriptor rides with this line.
    Attach { size: u64 },
    /// `shmget` makes a new object: create it on your GPU and ask [`Ask::ShmCreate`] with
    /// its descriptor.
    Export,
}

/// A pager's state (see `vgpu_scheduler::memory::MemState`; the `pager` feature converts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemReport {
    pub used: u64,
    pub resident: u64,
    pub device_swap: u64,
    pub host_swap: u64,
    pub swap_out_bytes: u64,
    pub swap_in_bytes: u64,
    pub swap_out_ns: u64,
    pub swap_in_ns: u64,
    pub evictions: u64,
    pub restores: u64,
}

/// A command with the id its reply will carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub id: u64,
    pub command: Command,
}

/// The worker's counters at one moment (cumulative since the worker started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerStats {
    /// Nanoseconds since the worker started (its clock for rates).
    pub uptime_ns: u64,
    pub requests: u64,
    pub errors: u64,
    pub bytes_htod: u64,
    pub bytes_dtoh: u64,
    pub bytes_dtod: u64,
    pub kernels: u64,
    /// Device time of completed kernels.
    pub kernel_ns: u64,
    /// Time spent processing requests, all queues added up.
    pub busy_ns: u64,
    /// Device memory charged by live allocations.
    pub memory_used: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Current shares (per-mille) and priority.
    pub compute_share: u32,
    pub copy_share: u32,
    pub priority: i32,
    /// Whether a vmm is connected.
    pub connected: bool,
    /// Swapping state, for an oversubscribed vGPU.
    #[serde(default)]
    pub memory: Option<MemReport>,
    /// Guest memory the worker maps and may pin in host memory (the total of its
    /// frontend's memory table).
    #[serde(default)]
    pub pinned_host_bytes: u64,
}

/// A reply's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReplyBody {
    Stats {
        stats: WorkerStats,
    },
    SharesSet {
        compute_share: u32,
        copy_share: u32,
        priority: i32,
    },
    ShuttingDown,
    Evicted {
        freed: u64,
        memory: MemReport,
    },
    Spilled {
        moved: u64,
        memory: MemReport,
    },
    Migrated {
        report: MigrationDone,
    },
    Error {
        message: String,
    },
    /// A [`Command::CancelMigrateOut`] was taken; whether a move was running.
    Cancelled {
        running: bool,
    },
    /// A pool worker took its vGPU ([`Command::Assign`]): its socket is bound.
    Assigned {
        pid: u32,
    },
}

/// A message from the worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkerMessage {
    /// The vhost-user socket is bound; the vmm may connect.
    Ready { pid: u32 },
    /// The vmm connected.
    Connected,
    /// The answer to request `id`.
    Reply { id: u64, body: ReplyBody },
    /// The counters at the end, sent just before the worker exits (so the daemon's
    /// accounting sees the last requests, not only its last sample).
    Final { stats: WorkerStats },
    /// A question for vgpud; it answers with [`Command::Answer`] `to: id`.
    Ask { id: u64, ask: Ask },
    /// The oversubscribed vGPU's memory changed (frees, evictions, restores).
    Memory { memory: MemReport },
    /// A migration moved on.
    Migration { progress: MigrationProgress },
}

/// One message as a line (with its newline).
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising these plain structs cannot fail (no maps with non-string keys).
    let mut v = serde_json::to_vec(msg).unwrap_or_else(|e| {
        format!("{{\"msg\":\"encode-error\",\"why\":{:?}}}", e.to_string()).into_bytes()
    });
    v.push(b'\n');
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_lines() {
        let r = Request {
            id: 7,
            command: Command::SetShares {
                compute_share: 300,
                copy_share: 250,
                priority: 2,
            },
        };
        let line = encode(&r);
        assert_eq!(line.last(), Some(&b'\n'));
        let back: Request = serde_json::from_slice(&line).expect("parse");
        assert_eq!(back, r);
        let m = WorkerMessage::Reply {
            id: 7,
            body: ReplyBody::Stats {
                stats: WorkerStats {
                    kernels: 3,
                    ..WorkerStats::default()
                },
            },
        };
        let back: WorkerMessage = serde_json::from_slice(&encode(&m)).expect("parse");
        assert_eq!(back, m);
        let ask = WorkerMessage::Ask {
            id: 3,
            ask: Ask::ShmCreate {
                key: 9,
                size: 4096,
                flags: 1,
            },
        };
        let back: WorkerMessage = serde_json::from_slice(&encode(&ask)).expect("parse");
        assert_eq!(back, ask);
        let export = Command::Answer {
            to: 3,
            answer: Answer::Export,
        };
        let line = encode(&export);
        assert_eq!(
            std::str::from_utf8(&line).expect("utf-8"),
            "{\"op\":\"answer\",\"to\":3,\"answer\":{\"kind\":\"export\"}}\n"
        );
        assert!(serde_json::from_str::<Request>(r#"{"id":1,"command":{"op":"reboot"}}"#).is_err());
        assert!(
            serde_json::from_str::<Request>(r#"{"id":1,"command":{"op":"stats"},"x":1}"#).is_err()
        );
    }
}

/// One NVIDIA GPU as `vgpu-worker --list-cuda-gpus` describes it (one JSON array on
/// stdout), so vgpud learns the machine's GPUs without loading the GPU driver itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaDevice {
    /// CUDA device ordinal.
    pub ordinal: i32,
    /// The driver's name for it.
    pub name: String,
    /// Physical memory in bytes.
    pub memory: u64,
}

/// The worker's exit status when a guest kernel ran past its hard limit and its GPU
/// context was given up (the cuda backend's `EXIT_KERNEL_HARD_LIMIT`); vgpud then marks the
/// vGPU failed with that reason.
pub const EXIT_KERNEL_HARD_LIMIT: i32 = 75;
