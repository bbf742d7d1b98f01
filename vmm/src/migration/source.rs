//! The source side: pre-copy with KVM's dirty log, pause, the rest and the state, hand
//! over; any failure before the destination confirms resumes the VM here.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES;
use serde::Serialize;

use super::channel::{Address, Stream};
use super::dirty_log::DirtyLog;
use super::ram::{count_dirty, fetch_dirty, merge, RamSender, PAGE};
use super::snapshot::{DeviceSnapshot, VmSnapshot, VringSnapshot, SNAPSHOT_VERSION};
use super::wire::{read_message, write_error, write_json, write_message, Kind, Message, WireError};
use super::{vcpu_state, MigrationError};
use crate::devices::bus::lock;
use crate::vm::VmHandles;

/// How long the vCPUs may take to reach their pause point.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the destination may take to restore and answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// A stalled destination fails the migration after this long without progress.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// What the operator asked for.
#[derive(Clone, Debug)]
pub struct MigrateRequest {
    pub destination: Address,
    /// The pause the guest may see; pre-copy goes on until the rest fits it.
    pub downtime: Duration,
    /// False: stop-and-copy (pause first, then send everything).
    pub precopy: bool,
    /// Most dirty-page rounds before the VM is paused whatever is left.
    pub max_rounds: u32,
    /// The destination's one-time token, when it demands one.
    pub token: Option<String>,
}

/// Where a migration stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    #[default]
    Idle,
    /// Copying RAM while the VM runs.
    Precopy,
    /// The VM is paused; the rest and the state are on their way.
    Stopped,
    /// The destination runs the VM; this vmm ends.
    Completed,
    /// The migration failed and the VM runs here again.
    Failed,
}

/// What the control API's `status` reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MigrationStatus {
    pub phase: Phase,
    pub destination: Option<String>,
    /// Dirty-page rounds after the first full pass.
    pub rounds: u32,
    /// RAM bytes sent so far.
    pub ram_bytes: u64,
    /// Everything sent, RAM and state and framing.
    pub bytes: u64,
    /// Measured transfer rate, bytes per second.
    pub rate_bytes_per_s: u64,
    /// RAM dirty at the pause, sent while the VM was stopped.
    pub stop_ram_bytes: u64,
    /// Pages the vhost-user backends wrote in guest RAM during the move (their dirty log).
    pub backend_dirty_pages: u64,
    pub downtime_ms: Option<f64>,
    pub total_ms: Option<f64>,
    pub error: Option<String>,
}

/// Counts the bytes written through it.
struct Counting<'a> {
    inner: &'a mut Stream,
    bytes: u64,
}

impl std::io::Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn update(status: &Mutex<MigrationStatus>, f: impl FnOnce(&mut MigrationStatus)) {
    f(&mut status.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Migrates the VM of `h` as `req` says. Ok: the destination runs it (the caller ends this
/// vmm). Err: the VM runs here again, as before.
pub fn migrate(
    h: &Arc<VmHandles>,
    req: &MigrateRequest,
    status: &Mutex<MigrationStatus>,
) -> Result<(), MigrationError> {
    let started = Instant::now();
    update(status, |s| {
        *s = MigrationStatus {
            phase: Phase::Precopy,
            destination: Some(req.destination.to_string()),
            ..Default::default()
        }
    });
    let mut stream = match Stream::connect(&req.destination) {
        Ok(s) => s,
        Err(source) => {
            let e = MigrationError::Connect {
                addr: req.destination.to_string(),
                source,
            };
            update(status, |s| {
                s.phase = Phase::Failed;
                s.error = Some(e.to_string());
            });
            return Err(e);
        }
    };
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_read_timeout(Some(REPLY_TIMEOUT));
    let mut run = Run {
        h,
        status,
        sender: RamSender::default(),
        paused: false,
        logging: false,
        log: None,
        bases: Vec::new(),
        pause_at: None,
    };
    let result = run.transfer(&mut stream, req, started);
    match result {
        Ok(()) => {
            let total = started.elapsed();
            run.stop_backend_log();
            update(status, |s| {
                s.phase = Phase::Completed;
                s.total_ms = Some(total.as_secs_f64() * 1e3);
            });
            Ok(())
        }
        Err(e) => {
            let e = with_peer_reason(e, &mut stream);
            tracing::warn!("migration failed, resuming here: {e}");
            let _ = write_error(&mut stream, &e.to_string());
            run.roll_back();
            update(status, |s| {
                s.phase = Phase::Failed;
                s.error = Some(e.to_string());
                s.total_ms = Some(started.elapsed().as_secs_f64() * 1e3);
            });
            Err(e)
        }
    }
}

struct Run<'a> {
    h: &'a Arc<VmHandles>,
    status: &'a Mutex<MigrationStatus>,
    sender: RamSender,
    paused: bool,
    logging: bool,
    /// The vhost-user backends' dirty log, while they mark it.
    log: Option<Arc<DirtyLog>>,
    /// Each device's ring bases, once its rings are stopped.
    bases: Vec<Vec<VringSnapshot>>,
    pause_at: Option<Instant>,
}

impl Run<'_> {
    fn transfer(
        &mut self,
        stream: &mut Stream,
        req: &MigrateRequest,
        started: Instant,
    ) -> Result<(), MigrationError> {
        let h = self.h;
        let mut w = Counting {
            inner: stream,
            bytes: 0,
        };
        let description = super::snapshot::VmDescription {
            token: req.token.clone(),
            ..h.description.clone()
        };
        write_json(&mut w, Kind::Describe, &description)?;
        let mut pending: Option<Vec<Vec<u64>>> = None;
        if req.precopy {
            h.set_slot_flags(KVM_MEM_LOG_DIRTY_PAGES)
                .map_err(|e| MigrationError::Kvm("log dirty pages (KVM_MEM_LOG_DIRTY_PAGES)", e))?;
            self.logging = true;
            self.start_backend_log()?;
            fetch_dirty(h).map_err(|e| MigrationError::Kvm("read the dirty log", e))?;
            let t = Instant::now();
            for s in &h.slots {
                self.sender.send_range(&mut w, &h.mem, s.gpa, s.len, true)?;
            }
            let mut rate = rate_of(self.sender.sent.bytes, t.elapsed());
            self.report(&w, rate);
            let mut rounds = 0u32;
            loop {
                let maps = self.fetch_all_dirty()?;
                let bytes = count_dirty(&maps) * PAGE;
                let fits = (bytes as f64) <= rate as f64 * req.downtime.as_secs_f64();
                if fits || rounds >= req.max_rounds {
                    pending = Some(maps);
                    break;
                }
                let before = self.sender.sent.bytes;
                let t = Instant::now();
                for (s, m) in h.slots.iter().zip(&maps) {
                    self.sender.send_dirty(&mut w, &h.mem, s, m)?;
                }
                rate = rate_of(self.sender.sent.bytes - before, t.elapsed()).max(1);
                rounds += 1;
                update(self.status, |s| s.rounds = rounds);
                self.report(&w, rate);
            }
        }
        // Stop: rings first (the backends finish what is in flight and signal it), then
        // the vCPUs to their pause point (so those interrupts are in their saved state);
        // a kick that lands on a stopped ring is replayed by the restart's kick. Then the
        // rest of RAM and the state.
        flush_console(h);
        let pause_at = Instant::now();
        self.pause_at = Some(pause_at);
        update(self.status, |s| s.phase = Phase::Stopped);
        for t in &h.transports {
            let b = lock(t)
                .pause_device()
                .map_err(|e| MigrationError::Device(e.to_string()))?;
            self.bases.push(b);
        }
        let vcpus = h.control.pause_all(PAUSE_TIMEOUT)?;
        self.paused = true;
        let stop_before = self.sender.sent.bytes;
        // A device whose backend writes guest RAM without logging it: its pages are
        // unknown, so all of RAM goes again.
        let unlogged = h.transports.iter().any(|t| {
            let t = lock(t);
            t.snapshot().active && !t.device().logs_dirty()
        });
        match pending {
            Some(mut maps) if !unlogged => {
                // After the rings stopped: the backends' last writes are in their log.
                let last = self.fetch_all_dirty()?;
                merge(&mut maps, &last);
                for (s, m) in h.slots.iter().zip(&maps) {
                    self.sender.send_dirty(&mut w, &h.mem, s, m)?;
                }
            }
            // Stop-and-copy into a fresh destination skips zero pages; after a pre-copy with
            // an active device that logs nothing every page goes again.
            p => {
                for s in &h.slots {
                    self.sender
                        .send_range(&mut w, &h.mem, s.gpa, s.len, p.is_none())?;
                }
            }
        }
        let stop_ram = self.sender.sent.bytes - stop_before;
        update(self.status, |s| s.stop_ram_bytes = stop_ram);
        let snapshot = VmSnapshot {
            version: SNAPSHOT_VERSION,
            vcpus,
            kvm: vcpu_state::save_vm(&h.vm, h.has_pit)?,
            serial: lock(&h.serial).state().into(),
            devices: h
                .transports
                .iter()
                .zip(&self.bases)
                .map(|(t, b)| DeviceSnapshot {
                    transport: lock(t).snapshot(),
                    vrings: b.clone(),
                })
                .collect(),
        };
        write_json(&mut w, Kind::State, &snapshot)?;
        w.flush_all()?;
        let mut buf = Vec::new();
        match read_message(w.inner, &mut buf)? {
            Message::Ready => {}
            Message::Error(e) => return Err(WireError::Peer(e).into()),
            m => {
                return Err(WireError::Unexpected {
                    want: "Ready",
                    got: m.kind(),
                }
                .into())
            }
        }
        write_message(&mut w, Kind::Commit, &[])?;
        w.flush_all()?;
        let downtime = pause_at.elapsed();
        let total = started.elapsed();
        let bytes = w.bytes;
        update(self.status, |s| {
            s.bytes = bytes;
            s.ram_bytes = self.sender.sent.bytes;
            s.downtime_ms = Some(downtime.as_secs_f64() * 1e3);
            s.total_ms = Some(total.as_secs_f64() * 1e3);
        });
        tracing::info!(?downtime, ?total, bytes, "VM handed over");
        Ok(())
    }

    fn report(&self, w: &Counting<'_>, rate: u64) {
        let (bytes, ram) = (w.bytes, self.sender.sent.bytes);
        update(self.status, |s| {
            s.bytes = bytes;
            s.ram_bytes = ram;
            s.rate_bytes_per_s = rate;
        });
    }

    /// Gives every vhost-user backend that can log a fresh dirty log and turns logging
    /// on. An active device whose backend cannot log is left as it is (the stop re-sends
    /// all of RAM for it).
    fn start_backend_log(&mut self) -> Result<(), MigrationError> {
        let h = self.h;
        if !h.transports.iter().any(|t| lock(t).device().logs_dirty()) {
            return Ok(());
        }
        let end = h.slots.iter().map(|s| s.gpa + s.len).max().unwrap_or(0);
        let log = Arc::new(
            DirtyLog::new(end).map_err(|e| MigrationError::Device(format!("dirty log: {e}")))?,
        );
        self.log = Some(log.clone());
        for t in &h.transports {
            let mut t = lock(t);
            if !t.device().logs_dirty() {
                continue;
            }
            let path = t.device().path().display().to_string();
            t.device_mut()
                .start_dirty_log(log.clone())
                .map_err(|e| MigrationError::Device(format!("{path}: SET_LOG_BASE: {e}")))?;
        }
        tracing::debug!(bytes = log.bytes(), "vhost-user dirty log on");
        Ok(())
    }

    /// Turns the backends' logging off.
    fn stop_backend_log(&mut self) {
        if self.log.take().is_none() {
            return;
        }
        for t in &self.h.transports {
            lock(t).device_mut().stop_dirty_log();
        }
    }

    /// KVM's dirty bitmaps of every slot merged with the backends' log, both read and
    /// cleared.
    fn fetch_all_dirty(&self) -> Result<Vec<Vec<u64>>, MigrationError> {
        let mut maps =
            fetch_dirty(self.h).map_err(|e| MigrationError::Kvm("read the dirty log", e))?;
        if let Some(log) = &self.log {
            let backend = log.take(&self.h.slots);
            let n = count_dirty(&backend);
            update(self.status, |s| s.backend_dirty_pages += n);
            merge(&mut maps, &backend);
        }
        Ok(maps)
    }

    /// Puts the source back as it was: rings restarted, dirty logging off, vCPUs running.
    fn roll_back(&mut self) {
        // Before the rings restart: a restart would give the backends the log again.
        self.stop_backend_log();
        for (t, b) in self.h.transports.iter().zip(&self.bases) {
            if let Err(e) = lock(t).resume_device(b) {
                tracing::error!("cannot restart a device's rings after the failed migration: {e}");
            }
        }
        self.bases.clear();
        if self.logging {
            if let Err(e) = self.h.set_slot_flags(0) {
                tracing::warn!("cannot turn dirty logging off: {e}");
            }
            self.logging = false;
        }
        if self.paused {
            self.h.control.resume_all();
            self.paused = false;
            if let Some(t) = self.pause_at {
                tracing::info!(paused = ?t.elapsed(), "VM resumed on the source");
            }
        }
    }
}

impl Counting<'_> {
    fn flush_all(&mut self) -> Result<(), WireError> {
        use std::io::Write;
        self.flush().map_err(WireError::Io)
    }
}

/// A write that failed because the destination hung up: its `Error` message, if it sent
/// one first, says why.
fn with_peer_reason(e: MigrationError, stream: &mut Stream) -> MigrationError {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
    let MigrationError::Wire(WireError::Io(io)) = &e else {
        return e;
    };
    if !matches!(io.kind(), BrokenPipe | ConnectionReset) {
        return e;
    }
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = Vec::new();
    match read_message(stream, &mut buf) {
        Ok(Message::Error(why)) => WireError::Peer(why).into(),
        _ => e,
    }
}

fn flush_console(h: &VmHandles) {
    lock(&h.serial).flush();
}

fn rate_of(bytes: u64, d: Duration) -> u64 {
    let s = d.as_secs_f64();
    if s <= 0.0 {
        return u64::MAX;
    }
    (bytes as f64 / s) as u64
}
