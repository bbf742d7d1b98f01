//! An NVMe queue pair shared by many submitters at once, after BaM (§3.3,
//! `nvm_parallel_queue.h`): a ticket counter hands out SQ slots, per-slot turn counters
//! order reuse of a slot across laps, mark bits record filled slots, and whoever wins the
//! tail lock moves the tail over every marked slot and rings one doorbell for all of them.
//! Completions are found by polling for the command identifier and the phase bit, no
//! lock held; the CQ head moves the same way, over marked (consumed) entries.
//!
//! The command identifier is the SQ slot. A slot (and so its identifier) is handed out
//! again only after the CQ head has passed the slot's completion, so a poller can never
//! match a stale completion of an earlier command with the same identifier.
//!
//! Slots are freed in order, so one completion its owner has not collected holds back
//! every slot after it. An owner that submits a batch before it waits for any can end up
//! waiting for a slot behind its own uncollected completion. A submitter kept waiting for
//! a slot therefore parks the posted completions: it claims them, keeps them by ticket (the
//! command's absolute SQ position), and lets the heads move on. Their owners find them
//! there; the fast path never touches the parked map.
//!
//! Counters are 64-bit absolute positions (they never wrap in practice); the hardware sees
//! them modulo the queue depth.

mod complete;
mod submit;

use crate::bar::Doorbell;
use crate::error::{Error, Result};
use crate::memory::DmaSlice;
use crate::nvme::{Cqe, Sqe, PAGE_SIZE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub use submit::Submitted;

/// Bytes of queue memory a pair of `depth` entries needs (SQ and CQ each page-aligned).
pub fn queue_memory_bytes(depth: u32) -> usize {
    sq_bytes(depth) + (depth as usize * 16).div_ceil(PAGE_SIZE) * PAGE_SIZE
}

fn sq_bytes(depth: u32) -> usize {
    (depth as usize * 64).div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// Where a queue pair's entries live and how to ring it.
pub struct QueueSetup {
    pub qid: u16,
    /// Entries per queue; a power of two, at least 2. One slot stays empty, so at most
    /// `depth - 1` commands are in flight.
    pub depth: u32,
    /// At least [`queue_memory_bytes`]`(depth)` bytes, page-aligned, zeroed.
    pub memory: DmaSlice,
    pub sq_doorbell: Doorbell,
    pub cq_doorbell: Doorbell,
    /// How long a submitter waits for a slot or a completion before giving up.
    pub timeout: Duration,
}

pub struct QueuePair {
    qid: u16,
    depth: u64,
    mask: u64,
    log2: u32,
    sq: *mut Sqe,
    cq: *mut Cqe,
    memory: DmaSlice,
    sq_db: Doorbell,
    cq_db: Doorbell,
    timeout: Duration,
    poisoned: AtomicBool,

    // submission side
    in_ticket: AtomicU64,
    turns: Box<[AtomicU64]>,
    tail_mark: Box<[AtomicBool]>,
    tail: AtomicU64,
    tail_lock: AtomicBool,
    /// Slots freed so far; advanced only by the CQ head mover (single writer).
    sq_head: AtomicU64,
    sq_free_mark: Box<[AtomicBool]>,

    // completion side
    cq_head: AtomicU64,
    cq_mark: Box<[AtomicBool]>,
    cq_lock: AtomicBool,
    /// Completions claimed for owners that had not collected them, by ticket.
    parked: Mutex<HashMap<u64, Cqe>>,
    /// Entries in `parked`: lets pollers skip the lock while nothing is parked.
    parked_n: AtomicUsize,
}

// SAFETY: the raw queue pointers point into `memory`, kept alive by the pair; all shared
// state is atomic and entries are accessed with volatile/atomic operations only.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

fn atomics<T: Default>(n: u64) -> Box<[T]> {
    (0..n).map(|_| T::default()).collect()
}

impl QueuePair {
    pub fn new(setup: QueueSetup) -> Result<Self> {
        let depth = setup.depth;
        if !depth.is_power_of_two() || !(2..=65536).contains(&depth) {
            return Err(Error::InvalidArgument(format!(
                "queue depth {depth} must be a power of two in 2..=65536"
            )));
        }
        if setup.memory.len() < queue_memory_bytes(depth)
            || setup.memory.iova() % PAGE_SIZE as u64 != 0
        {
            return Err(Error::InvalidArgument(format!(
                "queue memory must be page-aligned and hold {} bytes for depth {depth}",
                queue_memory_bytes(depth)
            )));
        }
        let d = depth as u64;
        let sq = setup.memory.as_ptr() as *mut Sqe;
        // SAFETY: sq_bytes(depth) < memory length, checked above.
        let cq = unsafe { setup.memory.as_ptr().add(sq_bytes(depth)) } as *mut Cqe;
        // Zero the CQ so no stale phase bit looks like a completion.
        // SAFETY: the CQ range lies inside the memory (checked above).
        unsafe { std::ptr::write_bytes(cq as *mut u8, 0, depth as usize * 16) };
        Ok(QueuePair {
            qid: setup.qid,
            depth: d,
            mask: d - 1,
            log2: depth.trailing_zeros(),
            sq,
            cq,
            memory: setup.memory,
            sq_db: setup.sq_doorbell,
            cq_db: setup.cq_doorbell,
            timeout: setup.timeout,
            poisoned: AtomicBool::new(false),
            in_ticket: AtomicU64::new(0),
            turns: atomics(d),
            tail_mark: atomics(d),
            tail: AtomicU64::new(0),
            tail_lock: AtomicBool::new(false),
            sq_head: AtomicU64::new(0),
            sq_free_mark: atomics(d),
            cq_head: AtomicU64::new(0),
            cq_mark: atomics(d),
            cq_lock: AtomicBool::new(false),
            parked: Mutex::new(HashMap::new()),
            parked_n: AtomicUsize::new(0),
        })
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }
    pub fn depth(&self) -> u32 {
        self.depth as u32
    }
    /// Device address of the submission queue (for Create I/O SQ).
    pub fn sq_iova(&self) -> u64 {
        self.memory.iova()
    }
    /// Device address of the completion queue (for Create I/O CQ).
    pub fn cq_iova(&self) -> u64 {
        self.memory.iova() + sq_bytes(self.depth as u32) as u64
    }
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Commands submitted and not yet freed (in flight or completed but not consumed).
    pub fn outstanding(&self) -> u64 {
        self.tail.load(Ordering::Acquire) - self.sq_head.load(Ordering::Acquire)
    }

    fn poison(&self) -> Error {
        if !self.poisoned.swap(true, Ordering::AcqRel) {
            tracing::error!(qid = self.qid, "queue pair poisoned after a timeout");
        }
        Error::Timeout(self.timeout)
    }

    fn check(&self) -> Result<()> {
        if self.is_poisoned() {
            Err(Error::Poisoned(self.qid))
        } else {
            Ok(())
        }
    }

    /// Submit and wait: the synchronous path for admin commands and simple callers.
    pub fn execute(&self, sqe: Sqe) -> Result<Cqe> {
        let s = self.submit(sqe)?;
        self.wait(s)
    }
}

/// Back off while waiting on another thread: spin briefly, yield, then sleep in short
/// naps. On a box with fewer cores than waiters (the CI box has two) a waiter must not
/// starve the controller thread it waits for.
#[derive(Default)]
pub(crate) struct Backoff(u32);

impl Backoff {
    /// Past spinning and yielding: the wait is a long one.
    pub(crate) fn is_sleeping(&self) -> bool {
        self.0 >= 64
    }

    pub(crate) fn snooze(&mut self) {
        if self.0 < 16 {
            std::hint::spin_loop();
        } else if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        self.0 = self.0.saturating_add(1);
    }
}
