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
//! The fast path for BAND grants (issue 5) is shared memory + eventfd, not this socket;
//! memory-share and migration commands (issues 6 and 7) join [`Command`] and may pass file
//! descriptors over this same socket (SCM_RIGHTS).

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
    Error {
        message: String,
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
        assert!(serde_json::from_str::<Request>(r#"{"id":1,"command":{"op":"reboot"}}"#).is_err());
        assert!(
            serde_json::from_str::<Request>(r#"{"id":1,"command":{"op":"stats"},"x":1}"#).is_err()
        );
    }
}
