//! Live migration on vgpud's `migrate` command: builds the target GPU, moves the vGPU's
//! memory under the migratable layer, reports progress, and switches the grant path to
//! the target GPU's scheduler at the switch-over.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_api::control::{
    MigrationDone, MigrationMode, MigrationProgress, ReplyBody, TargetGpu, WorkerMessage,
};
use vgpu_migration::{MigrateOptions, Mode, Progress};

use crate::control::ControlState;
use crate::memlink::ControlOut;

/// At most this often a progress report in the pre-copy phase (every phase change is
/// reported).
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// A `migrate` command as the control loop received it.
pub struct MigrateCommand {
    /// The request id the reply carries.
    pub id: u64,
    pub target: TargetGpu,
    pub mode: MigrationMode,
    pub max_downtime_ms: u64,
    /// The target GPU's grant page and doorbell.
    pub grant: Option<(OwnedFd, OwnedFd)>,
}

impl ControlState {
    /// Runs a migration on its own thread; the reply goes out when it ends.
    pub fn start_migration(self: &Arc<Self>, out: Arc<ControlOut>, cmd: MigrateCommand) {
        let st = self.clone();
        let spawned = std::thread::Builder::new()
            .name("migration".into())
            .spawn(move || {
                let id = cmd.id;
                let body = match st.migrate(&out, cmd) {
                    Ok(report) => ReplyBody::Migrated { report },
                    Err(message) => ReplyBody::Error { message },
                };
                out.send(&WorkerMessage::Reply { id, body });
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the migration thread");
        }
    }

    fn migrate(&self, out: &ControlOut, cmd: MigrateCommand) -> Result<MigrationDone, String> {
        let backend = crate::backend::target(&cmd.target, self.memory, self.storage.as_ref())?;
        let client = match cmd.grant {
            Some((page, doorbell)) => {
                Some(vgpu_grant::GrantClient::from_fds(page, doorbell).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        let opts = MigrateOptions {
            mode: match cmd.mode {
                MigrationMode::StopCopy => Mode::StopCopy,
                MigrationMode::Precopy => Mode::Precopy,
            },
            max_downtime: Duration::from_millis(cmd.max_downtime_ms),
            ..MigrateOptions::default()
        };
        let mut last = Instant::now();
        let progress = |p: &Progress| {
            if last.elapsed() >= PROGRESS_EVERY || p.phase != vgpu_migration::Phase::Precopy {
                last = Instant::now();
                out.send(&WorkerMessage::Migration {
                    progress: progress_message(p),
                });
            }
        };
        let gate = self.gate.clone();
        let r = self
            .migratable
            .migrate_with(backend, &opts, progress, move || {
                if let (Some(g), Some(c)) = (gate, client) {
                    g.switch(c);
                }
            })
            .map_err(|e| e.to_string())?;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Ok(MigrationDone {
            rounds: r.rounds,
            precopy_bytes: r.precopy_bytes,
            stop_bytes: r.stop_bytes,
            total: r.total,
            downtime_ms: ms(r.downtime),
            drain_ms: ms(r.drain),
            elapsed_ms: ms(r.elapsed),
            timeline: r
                .timeline
                .iter()
                .map(|(p, a, b)| (p.name().to_string(), ms(*a), ms(*b)))
                .collect(),
        })
    }
}

/// A progress report as the control channel carries it.
fn progress_message(p: &Progress) -> MigrationProgress {
    MigrationProgress {
        phase: p.phase.name().into(),
        rounds: p.rounds,
        bytes: p.bytes,
        total: p.total,
        dirty: p.dirty,
        elapsed_ms: p.elapsed.as_secs_f64() * 1e3,
    }
}
