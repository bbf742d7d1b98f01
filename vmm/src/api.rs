//! The vmm's control API on a unix socket (`--api-socket PATH`): one JSON request per
//! line, one JSON reply per line. Requests: `{"command":"status"}`,
//! `{"command":"pause"}`, `{"command":"resume"}`, and
//! `{"command":"migrate","destination":"unix:/path","downtime_ms":300,"precopy":true}`
//! (docs/migration.md). The socket is the operator's (vgpud's): it is created mode 0600.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::migration::{source, Address, MigrateRequest, MigrationStatus, Phase};
use crate::vm::VmHandles;

/// Longest request line.
const MAX_REQUEST: u64 = 4096;
/// Default downtime budget.
const DEFAULT_DOWNTIME_MS: u64 = 300;
/// Default cap on dirty-page rounds.
const DEFAULT_MAX_ROUNDS: u32 = 30;

/// A control request.
#[derive(Debug, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Status,
    Pause,
    Resume,
    Migrate {
        destination: String,
        downtime_ms: Option<u64>,
        precopy: Option<bool>,
        max_rounds: Option<u32>,
        /// The destination's one-time token.
        #[serde(default)]
        token: Option<String>,
    },
}

/// A reply.
#[derive(Debug, Serialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `running` or `paused`.
    pub vm: &'static str,
    pub migration: MigrationStatus,
}

struct State {
    h: Arc<VmHandles>,
    status: Arc<Mutex<MigrationStatus>>,
    paused: AtomicBool,
    busy: AtomicBool,
}

/// The running control API; its socket file goes when it is dropped.
pub struct ApiServer {
    path: PathBuf,
}

impl ApiServer {
    /// Listens on `path` and serves requests on a thread of its own.
    pub fn start(path: &Path, h: Arc<VmHandles>) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let state = Arc::new(State {
            h,
            status: Arc::new(Mutex::new(MigrationStatus::default())),
            paused: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        });
        std::thread::Builder::new()
            .name("vmm-api".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(c) => serve(&state, c),
                        Err(e) => tracing::warn!("control socket accept failed: {e}"),
                    }
                }
            })?;
        Ok(Self { path: path.into() })
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(state: &Arc<State>, conn: UnixStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let Ok(reader) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(reader).take(MAX_REQUEST);
    if let Err(e) = reader.read_line(&mut line) {
        tracing::debug!("control request unreadable: {e}");
        return;
    }
    let result = match serde_json::from_str::<Request>(line.trim()) {
        Ok(req) => handle(state, req),
        Err(e) => Err(format!("bad request: {e}")),
    };
    let reply = Reply {
        ok: result.is_ok(),
        error: result.err(),
        vm: if state.paused.load(Ordering::SeqCst) {
            "paused"
        } else {
            "running"
        },
        migration: state
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    };
    let mut conn = conn;
    if let Ok(mut text) = serde_json::to_string(&reply) {
        text.push('\n');
        let _ = conn.write_all(text.as_bytes());
    }
}

fn handle(state: &Arc<State>, req: Request) -> Result<(), String> {
    match req {
        Request::Status => Ok(()),
        Request::Pause => {
            if state.busy.load(Ordering::SeqCst) {
                return Err("a migration is running".into());
            }
            state
                .h
                .control
                .pause_all(Duration::from_secs(5))
                .map_err(|e| e.to_string())?;
            state.paused.store(true, Ordering::SeqCst);
            Ok(())
        }
        Request::Resume => {
            if state.paused.swap(false, Ordering::SeqCst) {
                state.h.control.resume_all();
            }
            Ok(())
        }
        Request::Migrate {
            destination,
            downtime_ms,
            precopy,
            max_rounds,
            token,
        } => {
            let destination: Address = destination.parse().map_err(|e| format!("{e}"))?;
            if state.paused.load(Ordering::SeqCst) {
                return Err("the VM is paused: resume it before migrating".into());
            }
            if state.busy.swap(true, Ordering::SeqCst) {
                return Err("a migration is already running".into());
            }
            let req = MigrateRequest {
                destination,
                downtime: Duration::from_millis(downtime_ms.unwrap_or(DEFAULT_DOWNTIME_MS)),
                precopy: precopy.unwrap_or(true),
                max_rounds: max_rounds.unwrap_or(DEFAULT_MAX_ROUNDS),
                token,
            };
            {
                // Anew before the reply: a status read right after it must not show the
                // figures of this vmm's last move (the one that brought the VM here).
                let mut s = state.status.lock().unwrap_or_else(|p| p.into_inner());
                *s = MigrationStatus {
                    phase: Phase::Precopy,
                    destination: Some(req.destination.to_string()),
                    ..MigrationStatus::default()
                };
            }
            let st = state.clone();
            std::thread::Builder::new()
                .name("vmm-migrate".into())
                .spawn(move || {
                    let result = source::migrate(&st.h, &req, &st.status);
                    match result {
                        Ok(()) => {
                            let s = st.status.lock().unwrap_or_else(|p| p.into_inner()).clone();
                            eprintln!(
                                "vmm: the VM moved to {}: downtime_ms={:.1} total_ms={:.1} bytes={} ram_bytes={} stop_ram_bytes={} rounds={}",
                                req.destination,
                                s.downtime_ms.unwrap_or(0.0),
                                s.total_ms.unwrap_or(0.0),
                                s.bytes,
                                s.ram_bytes,
                                s.stop_ram_bytes,
                                s.rounds
                            );
                            // The VM lives on at the destination; this vmm ends.
                            st.h.exit.request(0);
                        }
                        Err(e) => eprintln!(
                            "vmm: migration to {} failed, the VM runs on here: {e}",
                            req.destination
                        ),
                    }
                    st.busy.store(false, Ordering::SeqCst);
                })
                .map_err(|e| {
                    state.busy.store(false, Ordering::SeqCst);
                    format!("cannot start the migration: {e}")
                })?;
            Ok(())
        }
    }
}
