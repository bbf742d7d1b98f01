//! The process transport (feature `process`): a host or container process that is its own
//! vhost-user frontend to a `vgpu-worker` socket, the same socket a vmm connects to.
//!
//! The existing vGPU API ([`crate::VgpuDevice`], streams, requests) runs over it unchanged:
//! [`ProcessTransport`] implements [`Transport`] with a local emulation of the
//! virtio-mmio register file ([`regs`]) that turns what the driver does into vhost-user
//! messages:
//!
//! | driver action | vhost-user |
//! | --- | --- |
//! | probe (magic, version, device id) | answered locally: a modern virtio-mmio vGPU |
//! | device features | `GET_FEATURES` at connect (less `VHOST_USER_F_PROTOCOL_FEATURES`) |
//! | config space reads | `GET_CONFIG` once at connect (the vGPU config is read-only) |
//! | queue size, ring addresses, QueueReady | recorded locally |
//! | DRIVER_OK | `SET_FEATURES`, `SET_MEM_TABLE`, per ready queue `SET_VRING_NUM/ADDR/BASE/CALL/KICK/ENABLE` |
//! | QueueNotify | a write to the queue's kick eventfd |
//! | status 0 (reset) | `GET_VRING_BASE` per started ring (stops it) |
//!
//! DMA memory is a pool of memfds the process creates and seals (`F_SEAL_SHRINK |
//! F_SEAL_GROW | F_SEAL_SEAL`: their size can never change under the worker's mapping).
//! Each memfd is one region of the memory table at a guest-physical address the transport
//! picks: regions are laid out from 4 GiB upwards, 2 MiB aligned, with a 2 MiB gap between
//! them, so no device address is ever 0 and no two regions touch. Ring addresses in
//! `SET_VRING_ADDR` are this process's virtual addresses, as vhost-user requires. When
//! the pool runs out, a new memfd is added and, if the device is running, the whole table is
//! sent again (at most [`MAX_REGIONS`] regions).
//!
//! Completions are polled from the used ring (the vGPU streams do not ask for interrupts);
//! the call eventfds exist because the backend signals them, and are never read.

mod regs;
mod watchdog;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
use vmm_sys_util::eventfd::EventFd;

use crate::error::{Error, Result};
use crate::linux::{page_size, Chunk, Mapping, Pool};
use crate::spec::feature;
use crate::transport::{DmaRegion, Transport};

use regs::Registers;

/// Bit 30 of the backend's features: it speaks the protocol-features extension.
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// Largest queue offered to the driver (as the vmm offers a guest).
pub const QUEUE_MAX_SIZE: u16 = 256;
/// Most queues one device may have.
pub const MAX_QUEUES: usize = 64;
/// Most memory-table regions (vhost-user passes one fd per region in one message).
pub const MAX_REGIONS: usize = 32;
/// Size of the first DMA region and the smallest size of every later one.
pub const DEFAULT_POOL_BYTES: usize = 64 << 20;
/// Guest-physical address of the first region.
const GPA_BASE: u64 = 1 << 32;
/// Region alignment and the gap between regions.
const GPA_ALIGN: u64 = 2 << 20;
/// Where this process's DMA regions go (a hint; the kernel places them elsewhere when the
/// range is taken): 48 TiB plus a random 2 MiB-aligned offset below 2 TiB, far from where
/// Linux puts mappings and shared libraries and from the vGPU's device addresses (32 TiB),
/// so the worker almost never has anything at the same addresses and can map the pool
/// there for the GPU (`HOST_MAP`, docs/protocol.md).
const POOL_HINT_BASE: u64 = 0x3000_0000_0000;
/// The span of [`POOL_HINT_BASE`]'s random offset.
const POOL_HINT_SPAN: u64 = 2 << 40;
/// A worker that does not answer a message within this time is treated as gone.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the process transport could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Nothing listens on the socket.
    #[error("cannot connect to the vGPU socket {path}: {source}; is its vgpu-worker running?")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The peer does not speak vhost-user correctly.
    #[error("the vGPU socket {path} failed the vhost-user handshake ({step}: {source})")]
    Handshake {
        path: PathBuf,
        step: &'static str,
        source: vhost::Error,
    },
    /// The connection was made but the worker did not answer the handshake in time: it
    /// serves another frontend (a worker serves one at a time and leaves the next waiting
    /// unanswered), or it is still starting, or it is stuck.
    #[error(
        "the vGPU socket {path} accepted the connection but its worker did not answer the \
         handshake within {waited:.1} s"
    )]
    NoAnswer { path: PathBuf, waited: f64 },
    /// The backend offers something this transport cannot drive.
    #[error("the vGPU socket {path} offers an unusable device: {why}")]
    Unusable { path: PathBuf, why: String },
    /// A memfd or eventfd could not be created, sized, sealed or mapped.
    #[error("cannot set up DMA memory or eventfds: {0}")]
    Resource(std::io::Error),
}

/// One sealed memfd of the DMA pool and where it sits.
#[derive(Debug)]
struct Region {
    fd: OwnedFd,
    hva: u64,
    gpa: u64,
    len: u64,
}

/// The DMA pool and the memory table that describes it.
#[derive(Debug, Default)]
struct Memory {
    pool: Pool,
    regions: Vec<Region>,
    /// Where the next region is asked to go (0: not chosen yet).
    hint: u64,
}

/// A random 2 MiB-aligned address in `[POOL_HINT_BASE, POOL_HINT_BASE + POOL_HINT_SPAN)`.
fn pool_hint() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let r = h.finish() % (POOL_HINT_SPAN / GPA_ALIGN);
    POOL_HINT_BASE + r * GPA_ALIGN
}

impl Memory {
    fn next_gpa(&self) -> u64 {
        self.regions.last().map_or(GPA_BASE, |r| {
            (r.gpa + r.len).next_multiple_of(GPA_ALIGN) + GPA_ALIGN
        })
    }

    /// Creates, sizes, seals and maps one memfd of `len` bytes and adds it to the pool.
    fn grow(&mut self, len: usize) -> std::io::Result<()> {
        if self.regions.len() >= MAX_REGIONS {
            return Err(std::io::Error::other(format!(
                "the memory table is full ({MAX_REGIONS} regions)"
            )));
        }
        let len = len.next_multiple_of(GPA_ALIGN as usize);
        let fd = sealed_memfd(len)?;
        // The linux module maps files by path; /proc/self/fd/N reopens this very memfd.
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        if self.hint == 0 {
            self.hint = pool_hint();
        }
        let map = Mapping::file_near(&path, 0, len, self.hint).map_err(std::io::Error::other)?;
        let gpa = self.next_gpa();
        let hva = map.base().as_ptr() as u64;
        self.hint = (hva + len as u64).next_multiple_of(GPA_ALIGN) + GPA_ALIGN;
        self.pool.add(Chunk::new(map, gpa));
        self.regions.push(Region {
            fd,
            hva,
            gpa,
            len: len as u64,
        });
        tracing::debug!(gpa = format_args!("{gpa:#x}"), len, "DMA region added");
        Ok(())
    }

    /// The memory table as sent to the worker. Its fds stay open as long as the
    /// transport lives: regions are never removed.
    fn snapshot(&self) -> Table {
        Table {
            regions: self
                .regions
                .iter()
                .map(|r| VhostUserMemoryRegionInfo {
                    guest_phys_addr: r.gpa,
                    memory_size: r.len,
                    userspace_addr: r.hva,
                    mmap_offset: 0,
                    mmap_handle: r.fd.as_raw_fd(),
                })
                .collect(),
        }
    }
}

/// A snapshot of the memory table.
#[derive(Default)]
pub(crate) struct Table {
    regions: Vec<VhostUserMemoryRegionInfo>,
}

impl Table {
    /// This process's address of guest-physical `gpa`, if some region holds it.
    fn hva(&self, gpa: u64) -> Option<u64> {
        self.regions
            .iter()
            .find(|r| gpa >= r.guest_phys_addr && gpa - r.guest_phys_addr < r.memory_size)
            .map(|r| r.userspace_addr + (gpa - r.guest_phys_addr))
    }
}

/// A memfd of `len` bytes that can never shrink or grow, its seals themselves sealed.
fn sealed_memfd(len: usize) -> std::io::Result<OwnedFd> {
    let name = CString::new("vgpu-dma").map_err(std::io::Error::other)?;
    // SAFETY: name is a valid NUL-terminated string; the flags are plain bits.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: fd is an open memfd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS on our own memfd with valid seal bits.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Options of [`ProcessTransport::connect_with`].
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Bytes of the first DMA region (and the least of each later one).
    pub pool_bytes: usize,
    /// How long the handshake may take before the connect gives up with
    /// [`ProcessError::NoAnswer`] (default [`REPLY_TIMEOUT`]).
    pub handshake_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pool_bytes: DEFAULT_POOL_BYTES,
            handshake_timeout: REPLY_TIMEOUT,
        }
    }
}

struct Inner {
    /// The vhost-user socket (owned by the frontend inside `regs`), polled for hang-up.
    socket: std::os::fd::RawFd,
    regs: Mutex<Registers>,
    memory: Mutex<Memory>,
    kick: Vec<EventFd>,
    grow_bytes: usize,
}

/// A vGPU driven from this process over its worker's vhost-user socket. Clones share the
/// connection and the DMA pool; the connection closes (and the worker exits) when the last
/// clone is dropped.
#[derive(Clone)]
pub struct ProcessTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProcessTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessTransport")
            .field("queues", &self.inner.kick.len())
            .finish_non_exhaustive()
    }
}

impl ProcessTransport {
    /// Connects to the worker at `socket` with the default pool size.
    pub fn connect(socket: &Path) -> std::result::Result<Self, ProcessError> {
        Self::connect_with(socket, Options::default())
    }

    /// Connects to the worker at `socket`: the vhost-user handshake, the config space,
    /// eventfds and the first DMA region.
    pub fn connect_with(socket: &Path, opts: Options) -> std::result::Result<Self, ProcessError> {
        let connect_err = |source| ProcessError::Connect {
            path: socket.into(),
            source,
        };
        let stream = UnixStream::connect(socket).map_err(connect_err)?;
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(connect_err)?;
        stream
            .set_write_timeout(Some(REPLY_TIMEOUT))
            .map_err(connect_err)?;
        // vhost's frontend retries a read that timed out, so the read timeout alone never
        // ends a handshake nobody answers: the watchdog shuts the socket down instead.
        let watchdog = watchdog::Watchdog::arm(&stream, opts.handshake_timeout)
            .map_err(ProcessError::Resource)?;
        let mut frontend = Frontend::from_stream(stream, MAX_QUEUES as u64);
        let hs = |step| {
            let watchdog = &watchdog;
            move |source| match watchdog.fired() {
                Some(waited) => ProcessError::NoAnswer {
                    path: socket.into(),
                    waited: waited.as_secs_f64(),
                },
                None => ProcessError::Handshake {
                    path: socket.into(),
                    step,
                    source,
                },
            }
        };
        let unusable = |why: String| ProcessError::Unusable {
            path: socket.into(),
            why,
        };
        frontend.set_owner().map_err(hs("SET_OWNER"))?;
        let backend_features = frontend.get_features().map_err(hs("GET_FEATURES"))?;
        if backend_features & VHOST_USER_F_PROTOCOL_FEATURES == 0 {
            return Err(unusable(
                "no protocol features (config space, queues)".into(),
            ));
        }
        if backend_features & feature::VERSION_1 == 0 {
            return Err(unusable("no VIRTIO_F_VERSION_1".into()));
        }
        let offered = frontend
            .get_protocol_features()
            .map_err(hs("GET_PROTOCOL_FEATURES"))?;
        let wanted = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG;
        if !offered.contains(wanted) {
            return Err(unusable(format!(
                "protocol features {offered:?} lack MQ and CONFIG"
            )));
        }
        frontend
            .set_protocol_features(wanted)
            .map_err(hs("SET_PROTOCOL_FEATURES"))?;
        let n = frontend.get_queue_num().map_err(hs("GET_QUEUE_NUM"))?;
        let queues = usize::try_from(n).unwrap_or(usize::MAX);
        if queues == 0 || queues > MAX_QUEUES {
            return Err(unusable(format!(
                "{queues} queues (1..={MAX_QUEUES} supported)"
            )));
        }
        let size = vgpu_proto::VgpuConfig::SIZE as u32;
        let zero = vec![0u8; vgpu_proto::VgpuConfig::SIZE];
        let (_, config) = frontend
            .get_config(0, size, VhostUserConfigFlags::empty(), &zero)
            .map_err(hs("GET_CONFIG"))?;
        if let Some(waited) = watchdog.disarm() {
            // The deadline passed as the last answer came: the socket is shut down.
            return Err(ProcessError::NoAnswer {
                path: socket.into(),
                waited: waited.as_secs_f64(),
            });
        }
        let mk = || EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC);
        let kick = (0..queues)
            .map(|_| mk())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(ProcessError::Resource)?;
        let call = (0..queues)
            .map(|_| mk())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(ProcessError::Resource)?;
        let mut memory = Memory::default();
        let pool_bytes = opts.pool_bytes.max(page_size() as usize);
        memory.grow(pool_bytes).map_err(ProcessError::Resource)?;
        let kick_clones = kick
            .iter()
            .map(EventFd::try_clone)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(ProcessError::Resource)?;
        tracing::info!(socket = %socket.display(), queues, pool_bytes, "vGPU process transport connected");
        let socket_fd = frontend.as_raw_fd();
        Ok(ProcessTransport {
            inner: Arc::new(Inner {
                socket: socket_fd,
                regs: Mutex::new(Registers::new(
                    frontend,
                    backend_features & !VHOST_USER_F_PROTOCOL_FEATURES,
                    config,
                    kick_clones,
                    call,
                )),
                memory: Mutex::new(memory),
                kick,
                grow_bytes: pool_bytes,
            }),
        })
    }

    fn regs(&self) -> MutexGuard<'_, Registers> {
        self.inner.regs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        self.inner.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device address of `ptr..ptr + len` if it lies inside one DMA region.
    pub fn phys_range(&self, ptr: *const u8, len: usize) -> Option<u64> {
        self.memory().pool.phys(ptr, len.max(1))
    }

    /// The number of memory-table regions (sealed memfds) the pool has.
    pub fn regions(&self) -> usize {
        self.memory().regions.len()
    }

    /// Whether the worker hung up or refused the device setup (status DEVICE_NEEDS_RESET).
    pub fn failed(&self) -> bool {
        self.regs().failed()
    }

    /// Whether the worker hung up its socket (it exited or was killed): nothing will
    /// complete any more. Cheap (one `poll` with no wait): callers check it while they
    /// wait for completions.
    pub fn peer_gone(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.inner.socket,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the socket stays open while `inner` lives (the
        // frontend owning it is inside `inner`).
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0
            && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    }

    /// Each DMA region of the pool: (device address, this process's address, bytes).
    pub fn region_ranges(&self) -> Vec<(u64, u64, u64)> {
        self.memory()
            .regions
            .iter()
            .map(|r| (r.gpa, r.hva, r.len))
            .collect()
    }

    /// The memfds of the pool (for checking their seals).
    pub fn region_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.memory()
            .regions
            .iter()
            .map(|r| r.fd.as_raw_fd())
            .collect()
    }
}

impl Transport for ProcessTransport {
    fn read8(&self, offset: usize) -> u8 {
        let word = self.read32(offset & !3);
        (word >> ((offset & 3) * 8)) as u8
    }

    fn read16(&self, offset: usize) -> u16 {
        let word = self.read32(offset & !3);
        (word >> ((offset & 2) * 8)) as u16
    }

    fn read32(&self, offset: usize) -> u32 {
        self.regs().read32(offset)
    }

    fn write8(&self, offset: usize, value: u8) {
        tracing::debug!(offset, value, "8-bit register write ignored");
    }

    fn write16(&self, offset: usize, value: u16) {
        tracing::debug!(offset, value, "16-bit register write ignored");
    }

    fn write32(&self, offset: usize, value: u32) {
        if offset == crate::spec::reg::QUEUE_NOTIFY {
            // The doorbell stays off the register lock: one eventfd write.
            match self.inner.kick.get(value as usize) {
                Some(fd) => {
                    if let Err(e) = fd.write(1) {
                        tracing::warn!(queue = value, "kick failed: {e}");
                    }
                }
                None => tracing::debug!(queue = value, "notify of a queue that does not exist"),
            }
            return;
        }
        // The memory table is read before the register lock is taken (lock order: memory,
        // then registers, as dma_alloc takes them); only a status write may need it.
        let table = (offset == crate::spec::reg::STATUS).then(|| self.memory().snapshot());
        self.regs().write32(offset, value, table);
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Result<DmaRegion> {
        let mut memory = self.memory();
        let (ptr, phys): (NonNull<u8>, u64) = match memory.pool.alloc(len, align) {
            Some(got) => got,
            None => {
                let want = len
                    .checked_add(align)
                    .ok_or(Error::OutOfDmaMemory)?
                    .max(self.inner.grow_bytes);
                memory.grow(want).map_err(|e| {
                    tracing::warn!("cannot grow the DMA pool by {want} bytes: {e}");
                    Error::OutOfDmaMemory
                })?;
                let got = memory.pool.alloc(len, align).ok_or(Error::OutOfDmaMemory)?;
                // Lock order: memory, then registers.
                self.regs().update_memory(memory.snapshot());
                got
            }
        };
        // SAFETY: the pool handed this range out to us alone until dma_free; it lies in a
        // mapping the transport keeps alive (every clone holds the Arc), and the worker
        // sees the same bytes at `phys` through the memory table.
        Ok(unsafe { DmaRegion::new(ptr, phys, len) })
    }

    unsafe fn dma_free(&self, region: DmaRegion) {
        if !self.memory().pool.free(region.virt().as_ptr()) {
            tracing::warn!(
                phys = region.phys(),
                "dma_free of memory this transport did not allocate"
            );
        }
    }

    fn virt_to_phys(&self, ptr: *const u8) -> Result<u64> {
        self.memory()
            .pool
            .phys(ptr, 1)
            .ok_or(Error::AddressNotTranslatable)
    }
}

#[cfg(test)]
mod tests;
