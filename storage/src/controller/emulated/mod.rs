//! An NVMe controller in software, backed by a file or block device. It exposes a BAR0
//! register file (CAP, CC, CSTS, AQA, ASQ, ACQ, doorbells) through [`Bar`], runs the
//! enable/ready/shutdown state machine, and on its own thread polls the doorbells of
//! queues that live in caller memory, fetches 64-byte SQEs, reads and writes the backing
//! file with io_uring straight into the PRP buffers, and posts CQEs with the phase bit.
//! It only touches host memory that was registered through its [`DmaMapper`], the way an
//! IOMMU would confine a real device.

mod device;
mod engine;

use crate::bar::{Bar, DmaMapper, Doorbell, DoorbellListener};
use crate::error::{Error, Result};
use crate::memory::DmaRegion;
use crate::nvme::regs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::thread::JoinHandle;

pub use engine::EngineKind;

/// How to build an emulated controller.
#[derive(Clone, Debug)]
pub struct EmulatedOptions {
    /// Backing file or block device; its size (rounded down to blocks) is the namespace.
    pub path: PathBuf,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// Largest queue depth the controller accepts (CAP.MQES + 1).
    pub max_queue_entries: u32,
    /// Number of I/O queue pairs supported.
    pub max_io_queues: u16,
    /// Open the backing file with O_DIRECT (no page cache).
    pub direct: bool,
    pub engine: EngineKind,
    /// Maximum data transfer size; 8 KiB keeps every command within PRP1 + PRP2.
    pub max_transfer: u64,
    /// Open the backing file read-only; writes complete with Namespace Write Protected.
    pub read_only: bool,
}

impl EmulatedOptions {
    pub fn new(path: impl AsRef<Path>) -> Self {
        EmulatedOptions {
            path: path.as_ref().to_path_buf(),
            block_size: 512,
            max_queue_entries: 4096,
            max_io_queues: 64,
            direct: false,
            engine: EngineKind::IoUring,
            max_transfer: 8192,
            read_only: false,
        }
    }
}

struct Window {
    iova: u64,
    len: u64,
    ptr: *mut u8,
    _region: Arc<DmaRegion>,
}

/// The doorbell registers, in page-aligned memory of their own so that a GPU can map them
/// (`cuMemHostRegister`) and ring them itself, as it would map a real controller's BAR0.
pub(crate) struct DoorbellPage {
    region: Arc<DmaRegion>,
    count: usize,
}

impl DoorbellPage {
    fn new(count: usize) -> Result<Self> {
        let region = DmaRegion::host(count * 4)?;
        Ok(DoorbellPage { region, count })
    }
}

impl std::ops::Deref for DoorbellPage {
    type Target = [AtomicU32];
    fn deref(&self) -> &[AtomicU32] {
        // SAFETY: the region is page-aligned, zeroed, at least `count * 4` bytes and lives
        // as long as `self`; every access to it (ours and a GPU's) is a 32-bit atomic or
        // volatile access, so viewing it as atomics is sound.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().cast::<AtomicU32>(), self.count) }
    }
}

/// What the register file and the device thread share.
pub(crate) struct Shared {
    cap: u64,
    cc: AtomicU32,
    csts: AtomicU32,
    aqa: AtomicU32,
    asq: AtomicU64,
    acq: AtomicU64,
    doorbells: DoorbellPage,
    /// Users that need the thread to keep polling (a GPU writes doorbells without waking it).
    pollers: AtomicU32,
    stop: AtomicBool,
    stalled: AtomicBool,
    sleeping: AtomicBool,
    thread: OnceLock<std::thread::Thread>,
    windows: RwLock<Vec<Window>>,
}

// SAFETY: `Window::ptr` points into a DmaRegion the window keeps alive; the device
// accesses it only through raw pointers.
unsafe impl Send for Shared {}
// SAFETY: as above; everything else is atomic or locked.
unsafe impl Sync for Shared {}

impl Shared {
    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Host pointer for `len` bytes at device address `iova`, if all of it is mapped.
    pub(crate) fn translate(&self, iova: u64, len: u64) -> Option<*mut u8> {
        let windows = self.windows.read().ok()?;
        windows.iter().find_map(|w| {
            let off = iova.checked_sub(w.iova)?;
            if off.checked_add(len)? <= w.len {
                // SAFETY: off + len <= window length, so the result stays in the region.
                Some(unsafe { w.ptr.add(off as usize) })
            } else {
                None
            }
        })
    }
}

impl DoorbellListener for Shared {
    fn rung(&self) {
        // The doorbell store must be visible before we read `sleeping`; pairs with the
        // fence the device thread issues after setting it.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.wake();
        }
    }
}

/// The emulated controller's BAR0 and DMA mapper.
#[derive(Clone)]
pub struct EmulatedBar(Arc<Shared>);

impl Bar for EmulatedBar {
    fn read32(&self, offset: u64) -> u32 {
        let s = &self.0;
        match offset {
            regs::CAP => s.cap as u32,
            o if o == regs::CAP + 4 => (s.cap >> 32) as u32,
            regs::VS => 0x0001_0400,
            regs::CC => s.cc.load(Ordering::Acquire),
            regs::CSTS => s.csts.load(Ordering::Acquire),
            regs::AQA => s.aqa.load(Ordering::Acquire),
            regs::ASQ => s.asq.load(Ordering::Acquire) as u32,
            o if o == regs::ASQ + 4 => (s.asq.load(Ordering::Acquire) >> 32) as u32,
            regs::ACQ => s.acq.load(Ordering::Acquire) as u32,
            o if o == regs::ACQ + 4 => (s.acq.load(Ordering::Acquire) >> 32) as u32,
            // Doorbells are write-only; reserved registers read as zero.
            _ => 0,
        }
    }

    fn write32(&self, offset: u64, value: u32) {
        let s = &self.0;
        let set_lo = |r: &AtomicU64| {
            let v = r.load(Ordering::Acquire);
            r.store((v & !0xffff_ffff) | value as u64, Ordering::Release)
        };
        let set_hi = |r: &AtomicU64| {
            let v = r.load(Ordering::Acquire);
            r.store(
                (v & 0xffff_ffff) | ((value as u64) << 32),
                Ordering::Release,
            )
        };
        match offset {
            regs::CC => {
                s.cc.store(value, Ordering::Release);
                s.wake();
            }
            regs::AQA => s.aqa.store(value, Ordering::Release),
            regs::ASQ => set_lo(&s.asq),
            o if o == regs::ASQ + 4 => set_hi(&s.asq),
            regs::ACQ => set_lo(&s.acq),
            o if o == regs::ACQ + 4 => set_hi(&s.acq),
            o if o >= regs::DOORBELL_BASE && o % 4 == 0 => {
                let i = ((o - regs::DOORBELL_BASE) / 4) as usize;
                if let Some(db) = s.doorbells.get(i) {
                    db.store(value, Ordering::Release);
                    s.rung();
                }
            }
            _ => tracing::debug!(
                offset,
                value,
                "write to a read-only or reserved register ignored"
            ),
        }
    }

    fn doorbell(&self, offset: u64) -> Result<Doorbell> {
        let i = offset
            .checked_sub(regs::DOORBELL_BASE)
            .filter(|o| o % 4 == 0)
            .map(|o| (o / 4) as usize)
            .filter(|&i| i < self.0.doorbells.len())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("no doorbell at BAR offset {offset:#x}"))
            })?;
        let reg: *const AtomicU32 = &self.0.doorbells[i];
        let listener: Arc<dyn DoorbellListener> = self.0.clone();
        let keep: Arc<dyn Send + Sync> = self.0.clone();
        // SAFETY: `reg` points into `Shared::doorbells`, kept alive by `keep`.
        Ok(unsafe { Doorbell::new(reg, Some(listener), keep) })
    }
}

/// Keeps the controller thread polling its doorbells instead of sleeping between them,
/// for as long as it lives ([`EmulatedBar::keep_polling`]).
pub struct PollGuard(Arc<Shared>);

impl Drop for PollGuard {
    fn drop(&mut self) {
        self.0.pollers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl EmulatedBar {
    /// The page holding the doorbell registers (doorbell `2*qid + is_cq` is the 32-bit word
    /// at that index, DSTRD = 0). Writers other than [`Doorbell::ring`] (a GPU) do not wake
    /// the controller thread: hold a [`PollGuard`] while they may write.
    pub fn doorbell_page(&self) -> Arc<DmaRegion> {
        self.0.doorbells.region.clone()
    }

    /// While the guard lives, the controller thread polls its doorbells without sleeping,
    /// so doorbells written straight into [`EmulatedBar::doorbell_page`] are seen within
    /// microseconds.
    pub fn keep_polling(&self) -> PollGuard {
        self.0.pollers.fetch_add(1, Ordering::AcqRel);
        self.0.wake();
        PollGuard(self.0.clone())
    }

    /// Fault injection: while stalled the controller ignores its queues, as a hung device
    /// would, so callers can check they get errors instead of hanging.
    pub fn set_stalled(&self, stalled: bool) {
        self.0.stalled.store(stalled, Ordering::Release);
        self.0.wake();
    }
}

impl DmaMapper for EmulatedBar {
    fn map(&self, region: &Arc<DmaRegion>) -> Result<()> {
        let mut w = self
            .0
            .windows
            .write()
            .map_err(|_| Error::InvalidArgument("DMA window table poisoned".into()))?;
        if !w
            .iter()
            .any(|x| x.iova == region.iova() && x.len == region.len() as u64)
        {
            w.push(Window {
                iova: region.iova(),
                len: region.len() as u64,
                ptr: region.as_ptr(),
                _region: region.clone(),
            });
        }
        Ok(())
    }

    fn unmap(&self, region: &Arc<DmaRegion>) -> Result<()> {
        let mut w = self
            .0
            .windows
            .write()
            .map_err(|_| Error::InvalidArgument("DMA window table poisoned".into()))?;
        w.retain(|x| !(x.iova == region.iova() && x.len == region.len() as u64));
        Ok(())
    }
}

/// A running emulated controller; stopping it (drop) joins its thread.
pub struct EmulatedController {
    bar: EmulatedBar,
    thread: Option<JoinHandle<()>>,
    pub(crate) info: device::BackingInfo,
}

impl EmulatedController {
    pub fn start(opts: EmulatedOptions) -> Result<Self> {
        if opts.block_size != 512 && opts.block_size != 4096 {
            return Err(Error::InvalidArgument(format!(
                "block size {} must be 512 or 4096",
                opts.block_size
            )));
        }
        if !opts.max_queue_entries.is_power_of_two()
            || !(2..=65536).contains(&opts.max_queue_entries)
        {
            return Err(Error::InvalidArgument(format!(
                "max queue entries {} must be a power of two in 2..=65536",
                opts.max_queue_entries
            )));
        }
        let backing = device::Backing::open(&opts)?;
        let info = backing.info.clone();
        // MQES (0-based), CQR=1 (contiguous queues only), TO=2 (1 s), DSTRD=0, CSS=NVM.
        let cap = (opts.max_queue_entries as u64 - 1) | (1 << 16) | (2 << 24) | (1 << 37);
        let shared = Arc::new(Shared {
            cap,
            cc: AtomicU32::new(0),
            csts: AtomicU32::new(0),
            aqa: AtomicU32::new(0),
            asq: AtomicU64::new(0),
            acq: AtomicU64::new(0),
            doorbells: DoorbellPage::new(2 * (opts.max_io_queues as usize + 1))?,
            pollers: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
            windows: RwLock::new(Vec::new()),
        });
        let dev_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nvme-emu".into())
            .spawn(move || {
                let s = dev_shared.clone();
                let run = std::panic::AssertUnwindSafe(|| device::run(dev_shared, backing, opts));
                if std::panic::catch_unwind(run).is_err() {
                    // A controller bug must not hang its users: report a fatal status,
                    // queued commands time out.
                    tracing::error!("emulated controller thread panicked; CSTS.CFS set");
                    s.csts.store(regs::CSTS_CFS, Ordering::Release);
                }
            })
            .map_err(|e| Error::io("spawning the emulated controller thread", e))?;
        let _ = shared.thread.set(thread.thread().clone());
        tracing::info!(path = %info.path.display(), blocks = info.ns.blocks, block_size = info.ns.block_size, engine = ?info.engine, "emulated NVMe controller started");
        Ok(EmulatedController {
            bar: EmulatedBar(shared),
            thread: Some(thread),
            info,
        })
    }

    /// The controller's BAR0 (also its DMA mapper).
    pub fn bar(&self) -> EmulatedBar {
        self.bar.clone()
    }

    /// The I/O engine that actually ran (io_uring, or the pread fallback where the
    /// kernel refuses io_uring).
    pub fn engine(&self) -> EngineKind {
        self.info.engine
    }
}

impl Drop for EmulatedController {
    fn drop(&mut self) {
        self.bar.0.stop.store(true, Ordering::Release);
        self.bar.0.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
