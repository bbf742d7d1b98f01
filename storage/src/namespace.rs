//! The handle the rest of the stack holds: one controller, its namespace 1, and a set of
//! I/O queue pairs that submitters spread over. vgpud creates it from a file path
//! ([`Namespace::open_file`]) or a VFIO-bound PCI device ([`Namespace::open_vfio`]).

use crate::bar::{Bar, DmaMapper};
use crate::controller::{
    Driver, DriverOptions, EmulatedController, EmulatedOptions, EngineKind, PollGuard,
};
use crate::error::{Error, Result};
use crate::memory::{DmaRegion, DmaSlice};
use crate::nvme::identify::{ControllerInfo, NamespaceInfo};
use crate::nvme::{Sqe, PAGE_SIZE};
use crate::queue::{queue_memory_bytes, QueuePair, Submitted};
use crate::sync::lock;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct NamespaceOptions {
    /// I/O queue pairs to create (capped by what the controller grants).
    pub queues: u16,
    /// Entries per queue (power of two); at most depth-1 commands in flight per queue.
    pub queue_depth: u32,
    /// How long a submitter waits for a slot or a completion before it gets an error.
    pub timeout: Duration,
    /// Emulated controller only: logical block size, O_DIRECT, engine.
    pub block_size: u32,
    pub direct: bool,
    pub engine: EngineKind,
    /// Emulated controller only: open the backing file read-only (writes complete with
    /// Namespace Write Protected).
    pub read_only: bool,
}

impl Default for NamespaceOptions {
    fn default() -> Self {
        NamespaceOptions {
            queues: 4,
            queue_depth: 1024,
            // Long enough for a loaded 2-core host running thousands of submitters; a
            // hung controller still surfaces as an error, never a hang.
            timeout: Duration::from_secs(30),
            block_size: 512,
            direct: false,
            engine: EngineKind::IoUring,
            read_only: false,
        }
    }
}

pub struct Namespace {
    queues: Vec<Arc<QueuePair>>,
    driver: Driver,
    info: NamespaceInfo,
    max_transfer: u64,
    next_queue: AtomicUsize,
    /// Queue ids handed to device-side submitters ([`Namespace::device_queue`]).
    device_qids: Mutex<Vec<u16>>,
    // Dropped last: the controller thread must outlive the queues it serves.
    emulated: Option<EmulatedController>,
}

thread_local! {
    static QUEUE_HINT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

impl Namespace {
    /// Attach to a file or block device through the emulated controller (the default).
    pub fn open_file(path: impl AsRef<Path>, opts: &NamespaceOptions) -> Result<Arc<Self>> {
        let mut eo = EmulatedOptions::new(path);
        eo.block_size = opts.block_size;
        eo.direct = opts.direct;
        eo.engine = opts.engine;
        eo.read_only = opts.read_only;
        eo.max_queue_entries = eo.max_queue_entries.max(opts.queue_depth);
        let ctrl = EmulatedController::start(eo)?;
        let bar = Arc::new(ctrl.bar());
        let mut ns = Self::attach(bar.clone(), bar, opts)?;
        ns.emulated = Some(ctrl);
        Ok(Arc::new(ns))
    }

    /// Attach to a real controller bound to vfio-pci (`/sys/bus/pci/devices/<bdf>`).
    pub fn open_vfio(sysfs_path: impl AsRef<Path>, opts: &NamespaceOptions) -> Result<Arc<Self>> {
        let c = crate::controller::vfio::VfioController::open(sysfs_path.as_ref())?;
        Ok(Arc::new(Self::attach(c.clone(), c, opts)?))
    }

    /// Bring up any controller reachable through `bar` and create the I/O queues, their
    /// memory from fresh host regions.
    pub fn attach(
        bar: Arc<dyn Bar>,
        dma: Arc<dyn DmaMapper>,
        opts: &NamespaceOptions,
    ) -> Result<Self> {
        let driver = Driver::init(
            bar,
            dma,
            &DriverOptions {
                timeout: opts.timeout,
                ..Default::default()
            },
        )?;
        let n = opts.queues.clamp(1, driver.io_queues().max(1));
        let mut queues = Vec::with_capacity(n as usize);
        for qid in 1..=n {
            let mem = DmaSlice::whole(DmaRegion::host(queue_memory_bytes(opts.queue_depth))?);
            queues.push(Arc::new(driver.create_queue_pair(
                qid,
                opts.queue_depth,
                mem,
                opts.timeout,
            )?));
        }
        let info = driver.namespace();
        let mt = driver.controller().max_transfer;
        Ok(Namespace {
            queues,
            info,
            max_transfer: if mt == 0 { 1 << 20 } else { mt },
            next_queue: AtomicUsize::new(0),
            device_qids: Mutex::new(Vec::new()),
            driver,
            emulated: None,
        })
    }

    pub fn info(&self) -> NamespaceInfo {
        self.info
    }
    pub fn controller_info(&self) -> &ControllerInfo {
        self.driver.controller()
    }
    pub fn block_size(&self) -> u32 {
        self.info.block_size
    }
    pub fn bytes(&self) -> u64 {
        self.info.bytes()
    }
    /// Largest single command, in bytes.
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }
    /// The emulated controller's engine, if this namespace is emulated.
    pub fn engine(&self) -> Option<EngineKind> {
        self.emulated.as_ref().map(|c| c.engine())
    }
    pub fn queues(&self) -> &[Arc<QueuePair>] {
        &self.queues
    }

    /// The queue this thread submits to: threads are spread round-robin on first use.
    pub fn queue(&self) -> &QueuePair {
        let i = QUEUE_HINT.with(|h| match h.get() {
            Some(i) => i,
            None => {
                let i = self.next_queue.fetch_add(1, Ordering::Relaxed);
                h.set(Some(i));
                i
            }
        });
        &self.queues[i % self.queues.len()]
    }

    /// Host memory the controller can reach, for I/O buffers and cache lines.
    pub fn alloc_dma(&self, len: usize) -> Result<Arc<DmaRegion>> {
        let r = DmaRegion::host(len)?;
        self.driver.dma().map(&r)?;
        Ok(r)
    }

    /// Make caller-provided memory (e.g. pinned and mapped to the GPU) reachable.
    pub fn map_dma(&self, region: &Arc<DmaRegion>) -> Result<()> {
        self.driver.dma().map(region)
    }

    /// Undo [`Namespace::map_dma`]; the caller makes sure no command still transfers into
    /// `region` (every command it submitted there completed).
    pub fn unmap_dma(&self, region: &Arc<DmaRegion>) -> Result<()> {
        self.driver.dma().unmap(region)
    }

    fn command(&self, write: bool, offset: u64, buf: &DmaSlice) -> Result<Sqe> {
        let bs = self.info.block_size as u64;
        let len = buf.len() as u64;
        if offset % bs != 0 || len % bs != 0 || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} and length {len} must be non-zero multiples of the {bs}-byte block"
            )));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.bytes()) {
            return Err(Error::OutOfRange {
                offset,
                len,
                size: self.bytes(),
            });
        }
        self.raw_command(write, offset / bs, (len / bs) as u32, buf)
    }

    /// Build a read/write without range checks (the controller checks; tests use this to
    /// see its status codes).
    pub fn raw_command(&self, write: bool, slba: u64, nlb: u32, buf: &DmaSlice) -> Result<Sqe> {
        let page = PAGE_SIZE as u64;
        let iova = buf.iova();
        let len = buf.len() as u64;
        let first = len.min(page - iova % page);
        let prp2 = if len > first { iova + first } else { 0 };
        if len - first > page || len > self.max_transfer {
            return Err(Error::InvalidArgument(format!(
                "a {len}-byte transfer at device address {iova:#x} needs more than two PRP entries; split it"
            )));
        }
        let nlb = match u16::try_from(nlb) {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{nlb} blocks in one command; use 1..=65535"
                )))
            }
        };
        Ok(if write {
            Sqe::write(self.info.nsid, slba, nlb, iova, prp2)
        } else {
            Sqe::read(self.info.nsid, slba, nlb, iova, prp2)
        })
    }

    /// Start a read of `buf.len()` bytes at byte `offset` on queue `q`; one command, so
    /// the buffer must span at most two memory pages and `max_transfer` bytes.
    pub fn submit_read(&self, q: &QueuePair, offset: u64, buf: &DmaSlice) -> Result<Submitted> {
        q.submit(self.command(false, offset, buf)?)
    }

    pub fn submit_write(&self, q: &QueuePair, offset: u64, buf: &DmaSlice) -> Result<Submitted> {
        q.submit(self.command(true, offset, buf)?)
    }

    fn chunks(&self, offset: u64, buf: &DmaSlice, write: bool) -> Result<()> {
        let q = self.queue();
        let bs = self.info.block_size as usize;
        let mut pending: Vec<Submitted> = Vec::new();
        let mut first_err: Option<Error> = None;
        let mut done = 0usize;
        while done < buf.len() && first_err.is_none() {
            let iova = buf.iova() + done as u64;
            let to_two_pages = 2 * PAGE_SIZE - (iova % PAGE_SIZE as u64) as usize;
            let n = (buf.len() - done)
                .min(self.max_transfer as usize)
                .min(to_two_pages);
            // Whole blocks per command; a short tail is rejected by `command`.
            let n = if n >= bs { n - n % bs } else { n };
            let s = buf.slice(done, n).and_then(|part| {
                if write {
                    self.submit_write(q, offset + done as u64, &part)
                } else {
                    self.submit_read(q, offset + done as u64, &part)
                }
            });
            match s {
                Ok(s) => pending.push(s),
                Err(e) => first_err = Some(e),
            }
            done += n;
            // Keep well under the queue depth so one large read cannot fill the queue.
            if pending.len() >= 32 {
                for s in pending.drain(..) {
                    if let Err(e) = q.wait(s) {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        // Every submitted command is waited for, even after an error, so its slot is freed.
        for s in pending {
            if let Err(e) = q.wait(s) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Read `buf.len()` bytes at byte `offset`, splitting into commands as needed.
    pub fn read(&self, offset: u64, buf: &DmaSlice) -> Result<()> {
        self.chunks(offset, buf, false)
    }

    pub fn write(&self, offset: u64, buf: &DmaSlice) -> Result<()> {
        self.chunks(offset, buf, true)
    }

    pub fn flush(&self) -> Result<()> {
        self.queue().execute(Sqe::flush(self.info.nsid)).map(|_| ())
    }

    /// A queue pair for submitters that are not on this host's CPU (GPU threads): created
    /// on the controller with its entries in `memory` (at least
    /// [`crate::queue::queue_memory_bytes`]`(depth)` bytes, page-aligned, mapped to the
    /// submitters), under a queue id the host queues do not use. The submitters run the
    /// same protocol as [`QueuePair`] on their own copy of its counters and ring the
    /// doorbells in [`Namespace::doorbell_page`]. Deleted from the controller when the
    /// returned handle drops.
    pub fn device_queue(self: &Arc<Self>, depth: u32, memory: DmaSlice) -> Result<DeviceQueue> {
        let qid = {
            let mut used = lock(&self.device_qids);
            let first = self.queues.len() as u16 + 1;
            let qid = (first..=self.driver.io_queues())
                .find(|q| !used.contains(q))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "the controller granted {} I/O queues and all are in use; release a device queue first",
                        self.driver.io_queues()
                    ))
                })?;
            used.push(qid);
            qid
        };
        match self
            .driver
            .create_queue_pair(qid, depth, memory, self.queues[0].timeout())
        {
            Ok(pair) => Ok(DeviceQueue {
                pair,
                ns: self.clone(),
            }),
            Err(e) => {
                self.release_qid(qid);
                Err(e)
            }
        }
    }

    fn release_qid(&self, qid: u16) {
        lock(&self.device_qids).retain(|q| *q != qid);
    }

    /// The page of doorbell registers, for submitters that ring them directly; only the
    /// emulated controller has one here (for a VFIO controller it would be BAR0's doorbell
    /// page, which needs `CU_MEMHOSTREGISTER_IOMEMORY`; not built).
    pub fn doorbell_page(&self) -> Option<Arc<DmaRegion>> {
        self.emulated.as_ref().map(|c| c.bar().doorbell_page())
    }

    /// Keeps the emulated controller polling while device-side submitters may ring its
    /// doorbells (they cannot wake it); `None` for a real controller, which needs none.
    pub fn keep_polling(&self) -> Option<PollGuard> {
        self.emulated.as_ref().map(|c| c.bar().keep_polling())
    }

    /// Fault injection (emulated controller only): a stalled controller ignores its
    /// queues, as a hung device would.
    pub fn set_stalled(&self, stalled: bool) {
        if let Some(c) = &self.emulated {
            c.bar().set_stalled(stalled);
        }
    }

    /// Delete the I/O queues and shut the controller down cleanly.
    pub fn shutdown(&self) -> Result<()> {
        for q in &self.queues {
            self.driver.delete_queue_pair(q.qid())?;
        }
        self.driver.shutdown()
    }
}

/// A queue pair on the controller for device-side submitters (see
/// [`Namespace::device_queue`]); deleted from the controller when dropped.
pub struct DeviceQueue {
    pair: QueuePair,
    ns: Arc<Namespace>,
}

impl DeviceQueue {
    pub fn qid(&self) -> u16 {
        self.pair.qid()
    }
    pub fn depth(&self) -> u32 {
        self.pair.depth()
    }
    /// Byte offset of the SQ tail doorbell in [`Namespace::doorbell_page`].
    pub fn sq_doorbell_offset(&self) -> u64 {
        crate::nvme::regs::doorbell_offset(self.qid(), false, 0) - crate::nvme::regs::DOORBELL_BASE
    }
    /// Byte offset of the CQ head doorbell in [`Namespace::doorbell_page`].
    pub fn cq_doorbell_offset(&self) -> u64 {
        crate::nvme::regs::doorbell_offset(self.qid(), true, 0) - crate::nvme::regs::DOORBELL_BASE
    }
    /// Offset of the completion queue in the queue memory (the SQ starts at 0).
    pub fn cq_offset(&self) -> u64 {
        self.pair.cq_iova() - self.pair.sq_iova()
    }
}

impl Drop for DeviceQueue {
    fn drop(&mut self) {
        if let Err(e) = self.ns.driver.delete_queue_pair(self.qid()) {
            tracing::warn!(qid = self.qid(), error = %e, "deleting a device queue pair failed");
        }
        self.ns.release_qid(self.qid());
    }
}
