//! Where the vGPU is: the process transport when `VGPU_SOCKET` names a worker's socket (a
//! host or container process), the Linux transport otherwise (a program in a VM whose
//! vGPU is a virtio-mmio device).
//!
//! A process vGPU's worker serves one process; when that process exits, vgpud starts a
//! fresh worker behind the same socket. A process started meanwhile finds nothing
//! listening for a moment: the connect waits for the fresh worker (up to
//! `VGPU_CONNECT_TIMEOUT` seconds, default [`DEFAULT_CONNECT_TIMEOUT`]) instead of
//! answering CUDA_ERROR_NO_DEVICE at once (docs/tenants.md).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guest_driver::linux::{DmaSource, LinuxTransport, Paths, Registers};
use guest_driver::process::{Options, ProcessError, ProcessTransport};
use guest_driver::{DmaRegion, Transport};

/// Environment variable naming the vgpu-worker socket (selects the process transport).
pub const ENV_SOCKET: &str = "VGPU_SOCKET";
/// Environment variable: seconds the process transport waits for the vGPU's worker to
/// answer (a fresh worker is starting), decimal; 0 tries once.
pub const ENV_CONNECT_TIMEOUT: &str = "VGPU_CONNECT_TIMEOUT";
/// How long the process transport waits for the worker unless `VGPU_CONNECT_TIMEOUT` says.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Environment variable: MiB of the first DMA region (process transport).
pub const ENV_POOL_MB: &str = "VGPU_DMA_POOL_MB";
/// Environment variable: 2 MiB hugepages of DMA memory (Linux transport; default 16).
pub const ENV_HUGEPAGES: &str = "VGPU_HUGEPAGES";
/// Environment variable: DMA memory kept from the kernel instead of hugepages (Linux
/// transport), `LEN@PHYS` in bytes as the kernel's `memmap=LEN$PHYS` reserved it (decimal
/// or 0x-hex; LEN may end in K, M or G).
pub const ENV_DMA_RESERVED: &str = "VGPU_DMA_RESERVED";
/// Environment variable: the physical address of the device's registers (Linux transport;
/// default: the first `virtio_mmio.device=` of the kernel command line).
pub const ENV_MMIO_BASE: &str = "VGPU_MMIO_BASE";
/// Environment variable: the physical memory device (Linux transport; default `/dev/mem`).
pub const ENV_DEV_MEM: &str = "VGPU_DEV_MEM";

/// Why no vGPU could be reached.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Process(#[from] guest_driver::process::ProcessError),
    /// Nothing answered on the socket within the connect timeout.
    #[error(
        "no vGPU worker answers on {path} (waited {waited:.1} s, {ENV_CONNECT_TIMEOUT}): {why}"
    )]
    NoWorker {
        path: PathBuf,
        waited: f64,
        why: String,
    },
    /// The socket is there but this process may not connect to it.
    #[error(
        "permission denied on the vGPU socket {path}: this process runs as uid {uid} gid {gid}, \
         and the socket belongs to the vGPU's owner (its owner_uid and owner_gid, set by the \
         operator when creating the vGPU): run the program as that user or group, or ask the \
         operator to hand the vGPU to yours (docs/tenants.md)"
    )]
    Denied { path: PathBuf, uid: u32, gid: u32 },
    /// VGPU_SOCKET is unset and this is not a VM with a vGPU.
    #[error(
        "{ENV_SOCKET} is not set. A container or host process sets it to the \
         vgpu.sock of the directory the operator handed over (docs/tenants.md); a program in \
         a VM needs the VM's vGPU on the kernel command line (virtio_mmio.device=), which \
         this machine's lacks"
    )]
    NoSocketSet,
    #[error("{0}")]
    Linux(#[from] guest_driver::linux::LinuxError),
    #[error("the vGPU did not initialise: {0}")]
    Device(guest_driver::Error),
    #[error("{name}={value:?} is not {form}")]
    Setting {
        name: &'static str,
        value: String,
        form: &'static str,
    },
}

/// Either transport; clones share the underlying one.
#[derive(Clone, Debug)]
pub enum AnyTransport {
    Process(ProcessTransport),
    Linux(LinuxTransport),
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// A number in decimal or 0x-hex, optionally with a K, M or G suffix.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let v = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => digits.parse().ok()?,
    };
    v.checked_mul(1u64 << shift)
}

/// Where the Linux transport finds the device and its DMA memory: `/dev/mem`, the first
/// device of the kernel command line and hugepages, unless the environment says otherwise.
fn linux_setup() -> Result<(Paths, u64, DmaSource), OpenError> {
    let mut paths = Paths::default();
    if let Some(mem) = std::env::var_os(ENV_DEV_MEM) {
        paths.mem = PathBuf::from(mem);
    }
    let base = match std::env::var(ENV_MMIO_BASE) {
        Ok(v) => parse_size(&v).ok_or(OpenError::Setting {
            name: ENV_MMIO_BASE,
            value: v,
            form: "an address (decimal or 0x-hex)",
        })?,
        Err(_) => match LinuxTransport::first_device(&paths) {
            Ok(d) => d.base,
            Err(guest_driver::linux::LinuxError::NoDevice) => return Err(OpenError::NoSocketSet),
            Err(e) => return Err(e.into()),
        },
    };
    let dma = match std::env::var(ENV_DMA_RESERVED) {
        Ok(v) => {
            let bad = || OpenError::Setting {
                name: ENV_DMA_RESERVED,
                value: v.clone(),
                form: "LEN@PHYS (e.g. 16M@0x100000)",
            };
            let (len, phys) = v.split_once('@').ok_or_else(bad)?;
            let len = parse_size(len)
                .and_then(|l| usize::try_from(l).ok())
                .ok_or_else(bad)?;
            let phys = parse_size(phys).ok_or_else(bad)?;
            DmaSource::Reserved { phys, len }
        }
        Err(_) => DmaSource::Hugepages {
            count: env_usize(ENV_HUGEPAGES).unwrap_or(16).max(1),
        },
    };
    Ok((paths, base, dma))
}

/// `VGPU_CONNECT_TIMEOUT`, or the default.
fn connect_timeout() -> Result<Duration, OpenError> {
    match std::env::var(ENV_CONNECT_TIMEOUT) {
        Err(_) => Ok(DEFAULT_CONNECT_TIMEOUT),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or(OpenError::Setting {
                name: ENV_CONNECT_TIMEOUT,
                value: v,
                form: "a number of seconds (e.g. 5 or 0.5)",
            }),
    }
}

/// Whether a failed connect may succeed once a fresh worker listens: nothing listens yet,
/// the link is being replaced, or the worker went away mid-handshake.
fn worth_waiting(e: &ProcessError) -> bool {
    match e {
        ProcessError::Connect { source, .. } => matches!(
            source.kind(),
            ErrorKind::NotFound
                | ErrorKind::ConnectionRefused
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
        ),
        ProcessError::Handshake { .. } | ProcessError::NoAnswer { .. } => true,
        _ => false,
    }
}

/// What a connect that kept failing means, in the tenant's terms.
fn why_no_worker(e: &ProcessError) -> String {
    match e {
        ProcessError::Connect { source, .. } if source.kind() == ErrorKind::NotFound => {
            "the socket does not exist: VGPU_SOCKET must name the vgpu.sock in the directory \
             the operator handed over; if it existed before, the vGPU was deleted"
                .into()
        }
        ProcessError::Connect { source, .. } => format!(
            "{source}: the vGPU's worker is not running and no fresh one started; the vGPU \
             may have failed or been deleted, or vgpud is not running: ask the operator \
             (`vgpuctl vgpu show ID` shows its state)"
        ),
        ProcessError::NoAnswer { .. } => format!(
            "{e}: the vGPU serves one process at a time and another process holds it, or its \
             worker is stuck (docs/tenants.md)"
        ),
        other => format!("{other}: the vGPU's worker went away during the handshake"),
    }
}

/// The least time one handshake gets, however little of the wait is left (a short
/// `VGPU_CONNECT_TIMEOUT`, or 0 for one try, still gets an answer from a worker that serves).
const MIN_HANDSHAKE: Duration = Duration::from_secs(1);

/// Connects to the worker at `path`, waiting up to `wait` for one to answer.
fn connect_waiting(
    path: &Path,
    mut opts: Options,
    wait: Duration,
) -> Result<ProcessTransport, OpenError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    let mut logged = false;
    loop {
        // A worker that accepted nothing (it serves another process) answers no
        // handshake: give each try what is left of the wait.
        opts.handshake_timeout = wait.saturating_sub(start.elapsed()).clamp(
            MIN_HANDSHAKE,
            guest_driver::process::REPLY_TIMEOUT.max(MIN_HANDSHAKE),
        );
        let e = match ProcessTransport::connect_with(path, opts) {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        if let ProcessError::Connect { source, .. } = &e {
            if source.kind() == ErrorKind::PermissionDenied {
                // SAFETY: getuid and getgid have no preconditions and cannot fail.
                let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
                return Err(OpenError::Denied {
                    path: path.into(),
                    uid,
                    gid,
                });
            }
        }
        let waited = start.elapsed();
        if !worth_waiting(&e) {
            return Err(e.into());
        }
        if waited >= wait {
            return Err(OpenError::NoWorker {
                path: path.into(),
                waited: waited.as_secs_f64(),
                why: why_no_worker(&e),
            });
        }
        if !logged {
            tracing::info!(socket = %path.display(), error = %e,
                "the vGPU's worker does not answer yet; waiting for it");
            logged = true;
        }
        std::thread::sleep(pause.min(wait - waited));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Whether the environment names a vGPU, without opening it: `VGPU_SOCKET` is set (the
/// process transport; its worker may still be starting), or the kernel command line names a
/// vGPU device (the Linux transport). The error says what is missing, as `open` would.
pub fn configured() -> Result<(), OpenError> {
    if std::env::var_os(ENV_SOCKET).is_some() {
        return connect_timeout().map(|_| ());
    }
    linux_setup().map(|_| ())
}

impl AnyTransport {
    /// Opens the transport the environment selects.
    pub fn open() -> Result<Self, OpenError> {
        if let Some(socket) = std::env::var_os(ENV_SOCKET) {
            let mut opts = Options::default();
            if let Some(mb) = env_usize(ENV_POOL_MB) {
                opts.pool_bytes = mb.max(1) << 20;
            }
            let path = PathBuf::from(socket);
            let wait = connect_timeout()?;
            return Ok(AnyTransport::Process(connect_waiting(&path, opts, wait)?));
        }
        let (paths, base, dma) = linux_setup()?;
        Ok(AnyTransport::Linux(LinuxTransport::open(
            &paths,
            &Registers::DevMem { base },
            &dma,
        )?))
    }

    /// The device address of `ptr..ptr + len` when the whole range is DMA memory the
    /// device reaches in one piece (memory from `dma_alloc`), else `None`.
    pub fn phys_range(&self, ptr: *const u8, len: usize) -> Option<u64> {
        if ptr.is_null() {
            return None;
        }
        match self {
            AnyTransport::Process(t) => t.phys_range(ptr, len),
            AnyTransport::Linux(t) => {
                let first = t.virt_to_phys(ptr).ok()?;
                let last_ptr = ptr.wrapping_add(len.max(1) - 1);
                let last = t.virt_to_phys(last_ptr).ok()?;
                (last.checked_sub(first)? == (len.max(1) - 1) as u64).then_some(first)
            }
        }
    }
}

impl Transport for AnyTransport {
    fn read8(&self, offset: usize) -> u8 {
        match self {
            AnyTransport::Process(t) => t.read8(offset),
            AnyTransport::Linux(t) => t.read8(offset),
        }
    }
    fn read16(&self, offset: usize) -> u16 {
        match self {
            AnyTransport::Process(t) => t.read16(offset),
            AnyTransport::Linux(t) => t.read16(offset),
        }
    }
    fn read32(&self, offset: usize) -> u32 {
        match self {
            AnyTransport::Process(t) => t.read32(offset),
            AnyTransport::Linux(t) => t.read32(offset),
        }
    }
    fn write8(&self, offset: usize, value: u8) {
        match self {
            AnyTransport::Process(t) => t.write8(offset, value),
            AnyTransport::Linux(t) => t.write8(offset, value),
        }
    }
    fn write16(&self, offset: usize, value: u16) {
        match self {
            AnyTransport::Process(t) => t.write16(offset, value),
            AnyTransport::Linux(t) => t.write16(offset, value),
        }
    }
    fn write32(&self, offset: usize, value: u32) {
        match self {
            AnyTransport::Process(t) => t.write32(offset, value),
            AnyTransport::Linux(t) => t.write32(offset, value),
        }
    }
    fn dma_alloc(&self, len: usize, align: usize) -> guest_driver::Result<DmaRegion> {
        match self {
            AnyTransport::Process(t) => t.dma_alloc(len, align),
            AnyTransport::Linux(t) => t.dma_alloc(len, align),
        }
    }
    unsafe fn dma_free(&self, region: DmaRegion) {
        match self {
            // SAFETY: the caller guarantees the device no longer uses the region.
            AnyTransport::Process(t) => unsafe { t.dma_free(region) },
            // SAFETY: as above.
            AnyTransport::Linux(t) => unsafe { t.dma_free(region) },
        }
    }
    fn virt_to_phys(&self, ptr: *const u8) -> guest_driver::Result<u64> {
        match self {
            AnyTransport::Process(t) => t.virt_to_phys(ptr),
            AnyTransport::Linux(t) => t.virt_to_phys(ptr),
        }
    }
}
