//! The frontend side of one vhost-user device.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::migration::dirty_log::DirtyLog;
use crate::migration::snapshot::VringSnapshot;
use crate::virtio::{ActivateError, QueueConfig, VirtioDevice};

/// Bit 30 of the backend's features: it speaks the protocol-features extension.
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// Bit 26 of the backend's features: it marks the guest pages it writes in the dirty log
/// the frontend gives it (`SET_LOG_BASE`).
const VHOST_F_LOG_ALL: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();
/// Feature bits of the vhost-user protocol itself, never offered to the guest.
const VHOST_USER_ONLY: u64 = VHOST_USER_F_PROTOCOL_FEATURES | VHOST_F_LOG_ALL;
/// Largest queue the vmm offers the guest.
pub const QUEUE_MAX_SIZE: u16 = 256;
/// Most queues one device may have.
pub const MAX_QUEUES: usize = 64;
/// A backend that does not answer a request within this time is treated as gone.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the vhost-user backend could not be used.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserError {
    /// Nothing listens on the socket.
    #[error("cannot connect to the vhost-user backend at {path}: {source}; start its vgpu-worker first or fix the path")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The peer does not speak vhost-user correctly.
    #[error("the vhost-user backend at {path} failed the handshake ({step}: {source}); is it a vhost-user backend?")]
    Handshake {
        path: PathBuf,
        step: &'static str,
        source: vhost::Error,
    },
    /// The backend offers an unusable device.
    #[error("the vhost-user backend at {path} offers an unusable device: {why}")]
    Unusable { path: PathBuf, why: String },
    /// Eventfd creation failed.
    #[error("cannot create an eventfd for the vhost-user device: {0}")]
    EventFd(std::io::Error),
}

/// State the event loop and the transport share.
pub struct Shared {
    /// Set once the backend's socket hung up.
    pub gone: AtomicBool,
    /// Bumped when config space changes.
    pub generation: AtomicU32,
}

/// A vhost-user device (the frontend half).
pub struct VhostUserDevice {
    frontend: Frontend,
    path: PathBuf,
    device_type: u32,
    backend_features: u64,
    protocol: VhostUserProtocolFeatures,
    queue_sizes: Vec<u16>,
    kick: Vec<EventFd>,
    call: Vec<EventFd>,
    active: Vec<u16>,
    shared: Arc<Shared>,
    /// The features the guest accepted, once the device was started.
    acked: Option<u64>,
    /// The dirty log the backend marks while a migration runs.
    log: Option<Arc<DirtyLog>>,
}

impl VhostUserDevice {
    /// Connects to the backend at `path` and learns what it offers. Fails fast (bounded by
    /// a reply timeout) on a missing socket or a peer that speaks garbage.
    pub fn connect(path: &Path, device_type: u32) -> Result<Self, VhostUserError> {
        let stream = UnixStream::connect(path).map_err(|source| VhostUserError::Connect {
            path: path.into(),
            source,
        })?;
        for set in [UnixStream::set_read_timeout, UnixStream::set_write_timeout] {
            set(&stream, Some(REPLY_TIMEOUT)).map_err(|source| VhostUserError::Connect {
                path: path.into(),
                source,
            })?;
        }
        let mut frontend = Frontend::from_stream(stream, MAX_QUEUES as u64);
        let hs = |step| {
            move |source| VhostUserError::Handshake {
                path: path.into(),
                step,
                source,
            }
        };
        frontend.set_owner().map_err(hs("SET_OWNER"))?;
        let backend_features = frontend.get_features().map_err(hs("GET_FEATURES"))?;
        let mut protocol = VhostUserProtocolFeatures::empty();
        let mut queues = 1usize;
        if backend_features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            let offered = frontend
                .get_protocol_features()
                .map_err(hs("GET_PROTOCOL_FEATURES"))?;
            protocol = offered
                & (VhostUserProtocolFeatures::MQ
                    | VhostUserProtocolFeatures::CONFIG
                    | VhostUserProtocolFeatures::LOG_SHMFD);
            frontend
                .set_protocol_features(protocol)
                .map_err(hs("SET_PROTOCOL_FEATURES"))?;
            if protocol.contains(VhostUserProtocolFeatures::MQ) {
                let n = frontend.get_queue_num().map_err(hs("GET_QUEUE_NUM"))?;
                queues = usize::try_from(n).unwrap_or(usize::MAX);
            }
        }
        if queues == 0 || queues > MAX_QUEUES {
            return Err(VhostUserError::Unusable {
                path: path.into(),
                why: format!("{queues} queues (1..={MAX_QUEUES} supported)"),
            });
        }
        if backend_features & crate::virtio::VIRTIO_F_VERSION_1 == 0 {
            return Err(VhostUserError::Unusable {
                path: path.into(),
                why: "no VIRTIO_F_VERSION_1".into(),
            });
        }
        let mk = || EventFd::new(libc::EFD_NONBLOCK).map_err(VhostUserError::EventFd);
        let kick = (0..queues).map(|_| mk()).collect::<Result<Vec<_>, _>>()?;
        let call = (0..queues).map(|_| mk()).collect::<Result<Vec<_>, _>>()?;
        tracing::info!(path = %path.display(), queues, features = backend_features, "vhost-user backend connected");
        Ok(Self {
            frontend,
            path: path.into(),
            device_type,
            backend_features,
            protocol,
            queue_sizes: vec![QUEUE_MAX_SIZE; queues],
            kick,
            call,
            active: Vec::new(),
            shared: Arc::new(Shared {
                gone: AtomicBool::new(false),
                generation: AtomicU32::new(0),
            }),
            acked: None,
            log: None,
        })
    }

    /// The eventfds the guest's QueueNotify writes land on (register as ioeventfds).
    pub fn kick_fds(&self) -> &[EventFd] {
        &self.kick
    }

    /// The eventfds the backend signals when a used ring advances.
    pub fn call_fds(&self) -> &[EventFd] {
        &self.call
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The socket, so the event loop can notice the backend hanging up.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.frontend.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn gone(&self) -> bool {
        self.shared.gone.load(Ordering::SeqCst)
    }

    /// True when the backend marks the pages it writes in a dirty log the vmm gives it
    /// (feature `LOG_ALL`, protocol feature `LOG_SHMFD`).
    pub fn logs_dirty(&self) -> bool {
        self.backend_features & VHOST_F_LOG_ALL != 0
            && self.protocol.contains(VhostUserProtocolFeatures::LOG_SHMFD)
    }

    /// The features sent with `SET_FEATURES`: the guest's, the protocol extension, and
    /// `LOG_ALL` while a dirty log is set.
    fn backend_acked(&self, acked: u64) -> u64 {
        let log = if self.log.is_some() {
            VHOST_F_LOG_ALL
        } else {
            0
        };
        (acked & !VHOST_USER_ONLY) | (self.backend_features & VHOST_USER_F_PROTOCOL_FEATURES) | log
    }

    /// Gives the backend `log` (`SET_LOG_BASE`) and turns logging on (`LOG_ALL`); a device
    /// started later gets it too. The backend's memory table must be in place, so a device
    /// not started yet only keeps it for its start.
    pub fn start_dirty_log(&mut self, log: Arc<DirtyLog>) -> Result<(), vhost::Error> {
        if !self.logs_dirty() {
            return Err(vhost::Error::InvalidOperation);
        }
        self.log = Some(log);
        if let Some(acked) = self.acked {
            self.send_log(acked)?;
        }
        Ok(())
    }

    fn send_log(&self, acked: u64) -> Result<(), vhost::Error> {
        if let Some(log) = &self.log {
            self.frontend.set_log_base(0, Some(log.region()))?;
        }
        self.frontend.set_features(self.backend_acked(acked))
    }

    /// Turns logging off (`SET_FEATURES` without `LOG_ALL`). The backend keeps its mapping
    /// of the log until its next memory table.
    pub fn stop_dirty_log(&mut self) {
        if self.log.take().is_none() || self.gone() {
            return;
        }
        if let Some(acked) = self.acked {
            if let Err(e) = self.frontend.set_features(self.backend_acked(acked)) {
                tracing::warn!(path = %self.path.display(), "cannot turn the backend's dirty logging off: {e}");
            }
        }
    }

    fn start(
        &mut self,
        mem: &GuestMemoryMmap,
        acked: u64,
        queues: &[QueueConfig],
        bases: &[VringSnapshot],
    ) -> Result<(), vhost::Error> {
        self.frontend.set_features(self.backend_acked(acked))?;
        let regions = mem
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()?;
        self.frontend.set_mem_table(&regions)?;
        self.acked = Some(acked);
        // A new memory table comes without a log: give it the log again.
        if self.log.is_some() {
            self.send_log(acked)?;
        }
        for q in queues {
            let i = usize::from(q.index);
            let hva = |gpa: u64| {
                mem.get_host_address(GuestAddress(gpa))
                    .map(|p| p as u64)
                    .map_err(|_| vhost::Error::InvalidGuestMemory)
            };
            self.frontend.set_vring_num(i, q.size)?;
            let config = VringConfigData {
                queue_max_size: QUEUE_MAX_SIZE,
                queue_size: q.size,
                flags: 0,
                desc_table_addr: hva(q.desc)?,
                used_ring_addr: hva(q.device)?,
                avail_ring_addr: hva(q.driver)?,
                log_addr: None,
            };
            self.frontend.set_vring_addr(i, &config)?;
            let base = bases
                .iter()
                .find(|b| b.index == q.index)
                .map_or(0, |b| u16::try_from(b.base).unwrap_or(0));
            self.frontend.set_vring_base(i, base)?;
            self.frontend.set_vring_call(i, &self.call[i])?;
            self.frontend.set_vring_kick(i, &self.kick[i])?;
            if self.backend_features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
                // With protocol features, rings start disabled (vhost-user spec).
                self.frontend.set_vring_enable(i, true)?;
            }
            self.active.push(q.index);
        }
        Ok(())
    }
}

impl VirtioDevice for VhostUserDevice {
    fn device_type(&self) -> u32 {
        self.device_type
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.backend_features & !VHOST_USER_ONLY
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if self.gone() || !self.protocol.contains(VhostUserProtocolFeatures::CONFIG) {
            return;
        }
        let (Ok(off), Ok(len)) = (u32::try_from(offset), u32::try_from(data.len())) else {
            return;
        };
        // Frontend is a handle to one shared connection; the clone only lets a `&self`
        // read borrow it mutably.
        match self
            .frontend
            .clone()
            .get_config(off, len, VhostUserConfigFlags::empty(), data)
        {
            Ok((_, payload)) => {
                let n = payload.len().min(data.len());
                data[..n].copy_from_slice(&payload[..n]);
            }
            Err(e) => tracing::debug!("config read from the backend failed: {e}"),
        }
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if self.gone() || !self.protocol.contains(VhostUserProtocolFeatures::CONFIG) {
            return;
        }
        let Ok(off) = u32::try_from(offset) else {
            return;
        };
        if let Err(e) = self
            .frontend
            .set_config(off, VhostUserConfigFlags::WRITABLE, data)
        {
            tracing::debug!("config write to the backend failed: {e}");
        }
    }

    fn activate(
        &mut self,
        mem: &GuestMemoryMmap,
        acked: u64,
        queues: &[QueueConfig],
    ) -> Result<(), ActivateError> {
        if self.gone() {
            return Err(ActivateError::Backend(format!(
                "backend {} is gone",
                self.path.display()
            )));
        }
        self.start(mem, acked, queues, &[]).map_err(|e| {
            tracing::warn!(path = %self.path.display(), "vhost-user activation failed: {e}");
            ActivateError::Backend(e.to_string())
        })
    }

    fn take_pending_calls(&self) -> bool {
        // Each read resets the eventfd's counter; a non-blocking read of an unsignalled
        // one fails with EAGAIN.
        let mut any = false;
        for fd in &self.call {
            any |= fd.read().is_ok();
        }
        any
    }

    fn kick_all(&self) {
        for q in &self.active {
            if let Some(fd) = self.kick.get(usize::from(*q)) {
                if let Err(e) = fd.write(1) {
                    tracing::debug!(queue = q, "cannot kick the ring: {e}");
                }
            }
        }
    }

    fn pause_rings(&mut self) -> Result<Vec<VringSnapshot>, ActivateError> {
        if self.gone() {
            return Err(ActivateError::Backend(format!(
                "backend {} is gone",
                self.path.display()
            )));
        }
        // GET_VRING_BASE stops the ring in the backend and returns the next available
        // index it would have read (vhost-user spec); in-flight requests complete first.
        let mut out = Vec::with_capacity(self.active.len());
        for q in std::mem::take(&mut self.active) {
            let base = self
                .frontend
                .get_vring_base(usize::from(q))
                .map_err(|e| ActivateError::Backend(format!("GET_VRING_BASE {q}: {e}")))?;
            out.push(VringSnapshot { index: q, base });
        }
        Ok(out)
    }

    fn resume_rings(
        &mut self,
        mem: &GuestMemoryMmap,
        acked: u64,
        queues: &[QueueConfig],
        bases: &[VringSnapshot],
    ) -> Result<(), ActivateError> {
        if self.gone() {
            return Err(ActivateError::Backend(format!(
                "backend {} is gone",
                self.path.display()
            )));
        }
        self.active.clear();
        self.start(mem, acked, queues, bases)
            .map_err(|e| ActivateError::Backend(e.to_string()))
    }

    fn reset(&mut self) {
        // GET_VRING_BASE stops a ring; the backend keeps its memory table until the next
        // activation replaces it.
        for q in std::mem::take(&mut self.active) {
            if self.gone() {
                break;
            }
            if let Err(e) = self.frontend.get_vring_base(usize::from(q)) {
                tracing::debug!(queue = q, "stopping the ring failed: {e}");
            }
        }
    }

    fn needs_reset(&self) -> bool {
        self.gone()
    }

    fn config_generation(&self) -> u32 {
        self.shared.generation.load(Ordering::SeqCst)
    }
}
