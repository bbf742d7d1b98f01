//! The controller thread: register state machine, command fetch, data movement, CQE posting.

use super::engine::{self, Engine, EngineKind, IoKind, IoReq};
use super::{EmulatedOptions, Shared};
use crate::error::{Error, Result};
use crate::nvme::identify::{ControllerInfo, NamespaceInfo};
use crate::nvme::sqe::{admin, nvm, CNS_CONTROLLER, CNS_NAMESPACE, FID_NUMBER_OF_QUEUES};
use crate::nvme::{regs, Cqe, NvmeStatus, Sqe, PAGE_SIZE};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests the controller keeps in flight in its engine at once.
const MAX_INFLIGHT: usize = 1024;
const NSID: u32 = 1;

#[derive(Clone, Debug)]
pub(crate) struct BackingInfo {
    pub path: PathBuf,
    pub read_only: bool,
    pub ns: NamespaceInfo,
    pub engine: EngineKind,
}

pub(crate) struct Backing {
    file: File,
    engine: Box<dyn Engine>,
    pub info: BackingInfo,
}

impl Backing {
    pub(crate) fn open(opts: &EmulatedOptions) -> Result<Self> {
        let mut oo = std::fs::OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        if opts.direct {
            oo.custom_flags(libc::O_DIRECT);
        }
        let mut file = oo
            .open(&opts.path)
            .map_err(|e| Error::io(format!("opening backing file {}", opts.path.display()), e))?;
        let size = file
            .seek(SeekFrom::End(0))
            .map_err(|e| Error::io(format!("sizing {}", opts.path.display()), e))?;
        let blocks = size / opts.block_size as u64;
        if blocks == 0 {
            return Err(Error::InvalidArgument(format!(
                "backing file {} holds no whole {}-byte block",
                opts.path.display(),
                opts.block_size
            )));
        }
        let (engine, kind) = engine::open(opts.engine, &file, 512);
        Ok(Backing {
            file,
            engine,
            info: BackingInfo {
                path: opts.path.clone(),
                read_only: opts.read_only,
                ns: NamespaceInfo {
                    nsid: NSID,
                    blocks,
                    block_size: opts.block_size,
                },
                engine: kind,
            },
        })
    }
}

struct Sq {
    base: *const Sqe,
    size: u32,
    head: u32,
    cqid: u16,
}

struct Cq {
    base: *mut Cqe,
    size: u32,
    tail: u32,
    phase: bool,
    pending: VecDeque<Completion>,
}

#[derive(Clone, Copy)]
struct Completion {
    cid: u16,
    sqid: u16,
    sq_head: u16,
    status: u16,
    dw0: u32,
}

struct Op {
    sqid: u16,
    cid: u16,
    kind: IoKind,
    expected: usize,
    iov: [libc::iovec; 2],
}

struct Device {
    shared: Arc<Shared>,
    backing: Backing,
    opts: EmulatedOptions,
    ctrl: ControllerInfo,
    ready: bool,
    sqs: Vec<Option<Sq>>,
    cqs: Vec<Option<Cq>>,
    /// Fixed capacity, never reallocated: engines hold pointers to `Op::iov`.
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    /// Ids of existing queues, so the poll loop does not scan every possible id.
    live_sqs: Vec<usize>,
    live_cqs: Vec<usize>,
    done: Vec<(u64, i32)>,
}

pub(crate) fn run(shared: Arc<Shared>, backing: Backing, opts: EmulatedOptions) {
    let nq = opts.max_io_queues as usize + 1;
    let mut dev = Device {
        ctrl: ControllerInfo {
            vid: 0x1b36,
            serial: "VGPU0001".into(),
            model: "vgpu emulated NVMe".into(),
            max_transfer: opts.max_transfer,
            namespaces: 1,
        },
        shared,
        backing,
        opts,
        ready: false,
        sqs: (0..nq).map(|_| None).collect(),
        cqs: (0..nq).map(|_| None).collect(),
        ops: (0..MAX_INFLIGHT).map(|_| None).collect(),
        free: (0..MAX_INFLIGHT).rev().collect(),
        live_sqs: Vec::new(),
        live_cqs: Vec::new(),
        done: Vec::with_capacity(MAX_INFLIGHT),
    };
    let mut idle = 0u32;
    while !dev.shared.stop.load(Ordering::Acquire) {
        let mut work = dev.step_registers();
        if dev.shared.stalled.load(Ordering::Acquire) {
            std::thread::park_timeout(Duration::from_millis(1));
            continue;
        }
        if dev.ready {
            work |= dev.step_queues();
        }
        if work {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        // Spin only briefly before yielding: on a 2-core box the submitters may share our
        // core, and they are the ones who give us work.
        // Each pass also reaps engine completions. With I/O in flight, a short spin picks
        // up new doorbells, then we block in the engine until a completion (a yield here
        // measured slower with O_DIRECT); with none, yield a while, then sleep.
        if idle < 32 {
            std::hint::spin_loop();
        } else if dev.shared.pollers.load(Ordering::Acquire) > 0 {
            // Someone rings doorbells without waking us (a GPU): never sleep, but leave
            // the core to others between passes.
            std::thread::yield_now();
        } else if dev.inflight() > 0 {
            dev.backing.engine.wait(Duration::from_micros(50));
        } else if idle < 2048 {
            std::thread::yield_now();
        } else {
            dev.shared.sleeping.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if !dev.doorbell_pending() {
                std::thread::park_timeout(Duration::from_millis(1));
            }
            dev.shared.sleeping.store(false, Ordering::Relaxed);
        }
    }
    dev.drain(Duration::from_secs(5));
}

impl Device {
    fn db(&self, i: usize) -> u32 {
        self.shared
            .doorbells
            .get(i)
            .map_or(0, |d| d.load(Ordering::Acquire))
    }

    fn inflight(&self) -> usize {
        MAX_INFLIGHT - self.free.len()
    }

    fn doorbell_pending(&self) -> bool {
        self.live_sqs.iter().any(|&q| {
            self.sqs[q]
                .as_ref()
                .is_some_and(|s| self.db(2 * q) != s.head)
        }) || self.shared.cc.load(Ordering::Acquire) & regs::CC_EN != self.ready as u32
    }

    /// Enable, disable and shutdown transitions; true if anything changed.
    fn step_registers(&mut self) -> bool {
        let cc = self.shared.cc.load(Ordering::Acquire);
        let csts = self.shared.csts.load(Ordering::Acquire);
        let en = cc & regs::CC_EN != 0;
        let mut changed = false;
        if en && !self.ready && csts & regs::CSTS_CFS == 0 {
            match self.enable() {
                Ok(()) => {
                    self.ready = true;
                    self.shared.csts.store(regs::CSTS_RDY, Ordering::Release);
                }
                Err(why) => {
                    tracing::warn!(why, "emulated controller refused enable; CSTS.CFS set");
                    self.shared.csts.store(regs::CSTS_CFS, Ordering::Release);
                }
            }
            changed = true;
        } else if !en && (self.ready || csts != 0) {
            self.reset();
            self.shared.csts.store(0, Ordering::Release);
            changed = true;
        }
        if cc & regs::CC_SHN_MASK != 0
            && csts & regs::CSTS_SHST_MASK != regs::CSTS_SHST_DONE
            && self.ready
        {
            // SAFETY: fd is the open backing file.
            unsafe { libc::fsync(std::os::fd::AsRawFd::as_raw_fd(&self.backing.file)) };
            let csts = self.shared.csts.load(Ordering::Acquire);
            self.shared.csts.store(
                (csts & !regs::CSTS_SHST_MASK) | regs::CSTS_SHST_DONE,
                Ordering::Release,
            );
            changed = true;
        }
        changed
    }

    fn enable(&mut self) -> Result<(), &'static str> {
        let cc = self.shared.cc.load(Ordering::Acquire);
        if regs::cc_mps(cc) != 0 {
            return Err("CC.MPS must select 4 KiB pages");
        }
        let aqa = self.shared.aqa.load(Ordering::Acquire);
        let sq_size = (aqa & 0xfff) + 1;
        let cq_size = ((aqa >> 16) & 0xfff) + 1;
        if sq_size < 2 || cq_size < 2 {
            return Err("AQA admin queue sizes must be at least 2");
        }
        let asq = self.shared.asq.load(Ordering::Acquire);
        let acq = self.shared.acq.load(Ordering::Acquire);
        if asq % PAGE_SIZE as u64 != 0 || acq % PAGE_SIZE as u64 != 0 {
            return Err("ASQ/ACQ must be page-aligned");
        }
        let sq = self
            .shared
            .translate(asq, sq_size as u64 * 64)
            .ok_or("ASQ is not DMA-mapped")?;
        let cq = self
            .shared
            .translate(acq, cq_size as u64 * 16)
            .ok_or("ACQ is not DMA-mapped")?;
        self.shared.doorbells[0].store(0, Ordering::Release);
        self.shared.doorbells[1].store(0, Ordering::Release);
        self.sqs[0] = Some(Sq {
            base: sq as *const Sqe,
            size: sq_size,
            head: 0,
            cqid: 0,
        });
        self.cqs[0] = Some(Cq {
            base: cq as *mut Cqe,
            size: cq_size,
            tail: 0,
            phase: true,
            pending: VecDeque::new(),
        });
        self.refresh_live();
        Ok(())
    }

    fn refresh_live(&mut self) {
        self.live_sqs = (0..self.sqs.len())
            .filter(|&q| self.sqs[q].is_some())
            .collect();
        self.live_cqs = (0..self.cqs.len())
            .filter(|&q| self.cqs[q].is_some())
            .collect();
    }

    /// Controller reset: abandon every queue; in-flight data transfers finish first so no
    /// engine writes into memory the host may reuse.
    fn reset(&mut self) {
        self.drain(Duration::from_secs(5));
        self.sqs.iter_mut().for_each(|s| *s = None);
        self.cqs.iter_mut().for_each(|c| *c = None);
        self.refresh_live();
        for d in self.shared.doorbells.iter() {
            d.store(0, Ordering::Release);
        }
        self.ready = false;
    }

    fn drain(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        self.backing.engine.submit();
        while self.inflight() > 0 && Instant::now() < deadline {
            self.backing.engine.wait(Duration::from_millis(1));
            self.done.clear();
            self.backing.engine.reap(&mut self.done);
            for &(tag, _) in &self.done {
                if let Some(slot) = self.ops.get_mut(tag as usize) {
                    if slot.take().is_some() {
                        self.free.push(tag as usize);
                    }
                }
            }
        }
    }

    fn step_queues(&mut self) -> bool {
        let mut work = false;
        // Admin commands may change the list while we walk it: index, don't iterate.
        let mut i = 0;
        while let Some(&q) = self.live_sqs.get(i) {
            work |= self.fetch(q);
            i += 1;
        }
        self.backing.engine.submit();
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        self.backing.engine.reap(&mut done);
        work |= !done.is_empty();
        for &(tag, res) in &done {
            self.finish(tag as usize, res);
        }
        self.done = done;
        let mut i = 0;
        while let Some(&c) = self.live_cqs.get(i) {
            i += 1;
            if self.cqs[c].as_ref().is_some_and(|c| !c.pending.is_empty()) {
                work |= self.flush_pending(c);
            }
        }
        work
    }

    /// Fetch and start the commands between our head and the host's tail doorbell.
    fn fetch(&mut self, q: usize) -> bool {
        let tail = self.db(2 * q);
        let mut work = false;
        while let Some(sq) = self.sqs[q].as_mut() {
            if tail >= sq.size {
                tracing::warn!(
                    qid = q,
                    tail,
                    size = sq.size,
                    "SQ tail doorbell beyond the queue; ignored"
                );
                break;
            }
            if sq.head == tail || (q != 0 && self.free.is_empty()) {
                break;
            }
            // SAFETY: head < size and the queue memory was translated for size entries;
            // the acquire load of the doorbell ordered the host's entry writes before us.
            let sqe = unsafe { std::ptr::read_volatile(sq.base.add(sq.head as usize)) };
            sq.head = (sq.head + 1) % sq.size;
            work = true;
            if q == 0 {
                let (status, dw0) = match self.admin(&sqe) {
                    Ok(dw0) => (0, dw0),
                    Err(s) => (s.to_field(), 0),
                };
                self.refresh_live();
                self.post(0, sqe.cid(), status, dw0);
            } else if let Err(s) = self.start_io(q as u16, &sqe) {
                self.post(q as u16, sqe.cid(), s.to_field(), 0);
            }
        }
        work
    }

    fn start_io(&mut self, sqid: u16, sqe: &Sqe) -> Result<(), NvmeStatus> {
        let kind = match sqe.opcode() {
            nvm::READ => IoKind::Read,
            nvm::WRITE => IoKind::Write,
            nvm::FLUSH => IoKind::Flush,
            _ => return Err(NvmeStatus::InvalidOpcode),
        };
        if sqe.nsid != NSID && !(kind == IoKind::Flush && sqe.nsid == u32::MAX) {
            return Err(NvmeStatus::InvalidNamespace);
        }
        if kind == IoKind::Write && self.backing.info.read_only {
            return Err(NvmeStatus::NamespaceWriteProtected);
        }
        let mut op = Op {
            sqid,
            cid: sqe.cid(),
            kind,
            expected: 0,
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        };
        let mut n_iov = 0;
        let mut offset = 0;
        if kind != IoKind::Flush {
            let ns = self.backing.info.ns;
            let (slba, nlb) = (sqe.slba(), sqe.nlb() as u64);
            if slba.checked_add(nlb).is_none_or(|end| end > ns.blocks) {
                return Err(NvmeStatus::LbaOutOfRange);
            }
            let bytes = nlb * ns.block_size as u64;
            if bytes > self.opts.max_transfer {
                return Err(NvmeStatus::InvalidField);
            }
            n_iov = self.prps(sqe.prp1, sqe.prp2, bytes, &mut op.iov)?;
            op.expected = bytes as usize;
            offset = slba * ns.block_size as u64;
        }
        let tag = self.free.pop().ok_or(NvmeStatus::InternalError)?;
        let slot = &mut self.ops[tag];
        let op = slot.insert(op);
        let req = IoReq {
            tag: tag as u64,
            kind,
            offset,
            iov: op.iov.as_ptr(),
            n_iov,
        };
        if !self.backing.engine.push(req) {
            self.ops[tag] = None;
            self.free.push(tag);
            return Err(NvmeStatus::InternalError);
        }
        Ok(())
    }

    /// Resolve PRP1/PRP2 into at most two host segments (MDTS keeps us off PRP lists).
    fn prps(
        &self,
        prp1: u64,
        prp2: u64,
        bytes: u64,
        iov: &mut [libc::iovec; 2],
    ) -> Result<u32, NvmeStatus> {
        if prp1 % 4 != 0 {
            return Err(NvmeStatus::InvalidField);
        }
        let page = PAGE_SIZE as u64;
        let first = bytes.min(page - prp1 % page);
        let p1 = self
            .shared
            .translate(prp1, first)
            .ok_or(NvmeStatus::DataTransferError)?;
        iov[0] = libc::iovec {
            iov_base: p1 as *mut libc::c_void,
            iov_len: first as usize,
        };
        let rest = bytes - first;
        if rest == 0 {
            return Ok(1);
        }
        if rest > page || prp2 % page != 0 {
            return Err(NvmeStatus::InvalidField);
        }
        let p2 = self
            .shared
            .translate(prp2, rest)
            .ok_or(NvmeStatus::DataTransferError)?;
        iov[1] = libc::iovec {
            iov_base: p2 as *mut libc::c_void,
            iov_len: rest as usize,
        };
        Ok(2)
    }

    fn finish(&mut self, tag: usize, res: i32) {
        let Some(op) = self.ops.get_mut(tag).and_then(Option::take) else {
            tracing::warn!(tag, "completion for an unknown engine request");
            return;
        };
        self.free.push(tag);
        let failed = if op.kind == IoKind::Write {
            NvmeStatus::WriteFault
        } else {
            NvmeStatus::UnrecoveredReadError
        };
        let status = if res < 0 {
            tracing::warn!(errno = -res, kind = ?op.kind, "backing I/O failed");
            match -res {
                libc::EINVAL => NvmeStatus::InvalidField.to_field(),
                _ => failed.to_field(),
            }
        } else if (res as usize) < op.expected {
            tracing::warn!(
                got = res,
                want = op.expected,
                "short transfer: the backing file shrank"
            );
            failed.to_field()
        } else {
            0
        };
        self.post(op.sqid, op.cid, status, 0);
    }

    fn post(&mut self, sqid: u16, cid: u16, status: u16, dw0: u32) {
        let Some(sq) = self.sqs.get(sqid as usize).and_then(Option::as_ref) else {
            return; // queue deleted while the command ran: nobody to tell
        };
        let c = Completion {
            cid,
            sqid,
            sq_head: sq.head as u16,
            status,
            dw0,
        };
        let cqid = sq.cqid as usize;
        if let Some(cq) = self.cqs.get_mut(cqid).and_then(Option::as_mut) {
            cq.pending.push_back(c);
        }
        self.flush_pending(cqid);
    }

    /// Write queued completions while the CQ has room (the host's head doorbell says).
    fn flush_pending(&mut self, cqid: usize) -> bool {
        let head = self.db(2 * cqid + 1);
        let Some(cq) = self.cqs.get_mut(cqid).and_then(Option::as_mut) else {
            return false;
        };
        let mut wrote = false;
        while let Some(c) = cq.pending.front().copied() {
            if (cq.tail + 1) % cq.size == head {
                break; // full: wait for the host to move its head
            }
            // SAFETY: tail < size and the CQ memory was translated for size entries.
            let e = unsafe { cq.base.add(cq.tail as usize) };
            // SAFETY: `e` is a valid, aligned CQE slot; the host reads dword 3 first
            // (acquire) and the rest only after it sees the new phase.
            unsafe {
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).dw0), c.dw0);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).dw1), 0);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).sq_head), c.sq_head);
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*e).sq_id), c.sqid);
                AtomicU32::from_ptr(std::ptr::addr_of_mut!((*e).dw3))
                    .store(Cqe::make_dw3(c.cid, cq.phase, c.status), Ordering::Release);
            }
            cq.tail += 1;
            if cq.tail == cq.size {
                cq.tail = 0;
                cq.phase = !cq.phase;
            }
            cq.pending.pop_front();
            wrote = true;
        }
        wrote
    }

    fn admin(&mut self, sqe: &Sqe) -> Result<u32, NvmeStatus> {
        let max_q = self.opts.max_io_queues as u32;
        match sqe.opcode() {
            admin::IDENTIFY => {
                if sqe.prp1 % PAGE_SIZE as u64 != 0 {
                    return Err(NvmeStatus::InvalidField);
                }
                let dst = self
                    .shared
                    .translate(sqe.prp1, PAGE_SIZE as u64)
                    .ok_or(NvmeStatus::DataTransferError)?;
                let mut page = [0u8; PAGE_SIZE];
                match sqe.cdw10 & 0xff {
                    CNS_CONTROLLER => self.ctrl.encode(&mut page),
                    CNS_NAMESPACE if sqe.nsid == NSID => self.backing.info.ns.encode(&mut page),
                    CNS_NAMESPACE => return Err(NvmeStatus::InvalidNamespace),
                    _ => return Err(NvmeStatus::InvalidField),
                }
                // SAFETY: dst was translated for a whole page of mapped memory.
                unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), dst, PAGE_SIZE) };
                Ok(0)
            }
            admin::SET_FEATURES if sqe.cdw10 & 0xff == FID_NUMBER_OF_QUEUES => {
                Ok((max_q - 1) | ((max_q - 1) << 16))
            }
            admin::SET_FEATURES => Err(NvmeStatus::InvalidField),
            admin::CREATE_IO_CQ | admin::CREATE_IO_SQ => {
                let is_cq = sqe.opcode() == admin::CREATE_IO_CQ;
                let qid = (sqe.cdw10 & 0xffff) as usize;
                let size = (sqe.cdw10 >> 16) + 1;
                let exists = if is_cq {
                    self.cqs.get(qid).is_none_or(Option::is_some)
                } else {
                    self.sqs.get(qid).is_none_or(Option::is_some)
                };
                if qid == 0 || qid as u32 > max_q || exists {
                    return Err(NvmeStatus::InvalidQueueIdentifier);
                }
                if size < 2 || size > self.opts.max_queue_entries {
                    return Err(NvmeStatus::InvalidQueueSize);
                }
                if sqe.cdw11 & 1 == 0 || sqe.prp1 % PAGE_SIZE as u64 != 0 {
                    return Err(NvmeStatus::InvalidField);
                }
                let entry = if is_cq { 16 } else { 64 };
                let base = self
                    .shared
                    .translate(sqe.prp1, size as u64 * entry)
                    .ok_or(NvmeStatus::InvalidField)?;
                if is_cq {
                    self.shared.doorbells[2 * qid + 1].store(0, Ordering::Release);
                    self.cqs[qid] = Some(Cq {
                        base: base as *mut Cqe,
                        size,
                        tail: 0,
                        phase: true,
                        pending: VecDeque::new(),
                    });
                } else {
                    let cqid = (sqe.cdw11 >> 16) as u16;
                    if cqid == 0 || self.cqs.get(cqid as usize).is_none_or(Option::is_none) {
                        return Err(NvmeStatus::CompletionQueueInvalid);
                    }
                    self.shared.doorbells[2 * qid].store(0, Ordering::Release);
                    self.sqs[qid] = Some(Sq {
                        base: base as *const Sqe,
                        size,
                        head: 0,
                        cqid,
                    });
                }
                Ok(0)
            }
            admin::DELETE_IO_SQ => {
                let qid = (sqe.cdw10 & 0xffff) as usize;
                match self.sqs.get_mut(qid) {
                    Some(s @ Some(_)) if qid != 0 => {
                        *s = None;
                        Ok(0)
                    }
                    _ => Err(NvmeStatus::InvalidQueueIdentifier),
                }
            }
            admin::DELETE_IO_CQ => {
                let qid = (sqe.cdw10 & 0xffff) as usize;
                if qid == 0 || self.cqs.get(qid).is_none_or(Option::is_none) {
                    return Err(NvmeStatus::InvalidQueueIdentifier);
                }
                if self.sqs.iter().flatten().any(|s| s.cqid as usize == qid) {
                    return Err(NvmeStatus::InvalidQueueDeletion);
                }
                self.cqs[qid] = None;
                Ok(0)
            }
            _ => Err(NvmeStatus::InvalidOpcode),
        }
    }
}
