//! The completion side: lock-free polling for (command identifier, phase), then claiming
//! the entry; the CQ-lock winner moves the head over claimed entries, rings the CQ
//! doorbell once, and frees their SQ slots. Completions parked for owners that had not
//! collected them are found by ticket.

use super::{Backoff, QueuePair, Submitted};
use crate::error::{Error, Result};
use crate::nvme::Cqe;
use crate::sync::lock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

impl QueuePair {
    /// Phase tag the controller writes on the lap that contains absolute position `pos`.
    fn phase_of(&self, pos: u64) -> bool {
        (pos >> self.log2) & 1 == 0
    }

    fn load_dw3(&self, loc: usize) -> u32 {
        // SAFETY: loc < depth so the entry is inside the CQ; dword 3 is 4-byte aligned
        // and the controller writes it atomically, last.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.cq.add(loc)).dw3)) }
            .load(Ordering::Acquire)
    }

    /// The entries the controller has posted from absolute position `head` on, in order:
    /// (index in the CQ, dword 3). Ends at the first entry without this lap's phase.
    fn posted_from(&self, head: u64) -> impl Iterator<Item = (usize, u32)> + '_ {
        (head..head + self.depth)
            .map(move |pos| (pos, (pos & self.mask) as usize))
            .map(move |(pos, loc)| (pos, loc, self.load_dw3(loc)))
            .take_while(move |&(pos, _, dw3)| (dw3 & (1 << 16) != 0) == self.phase_of(pos))
            .map(|(_, loc, dw3)| (loc, dw3))
    }

    /// Look for the completion of `s` once; `Ok(None)` if it has not arrived. On success
    /// the entry is consumed: the caller must not poll for the same command again.
    pub fn poll(&self, s: Submitted) -> Result<Option<Cqe>> {
        self.check()?;
        if let Some(cqe) = self.take_parked(s) {
            return Ok(Some(cqe));
        }
        let lap = s.ticket >> self.log2;
        // The controller posts in order: nothing newer past the first unposted entry.
        for (loc, dw3) in self.posted_from(self.cq_head.load(Ordering::Acquire)) {
            if dw3 as u16 != s.cid {
                continue;
            }
            // The slot moved on: our completion was parked. (The acquire load of dw3
            // orders this load after the submission of any newer command in the slot.)
            if self.turns[(s.cid as u64 & self.mask) as usize].load(Ordering::Acquire) != lap {
                break;
            }
            // SeqCst: see `collect`.
            if self.cq_mark[loc]
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                break; // a parker claimed it: it is in the parked map now or soon
            }
            // SAFETY: loc < depth; the acquire load of dw3 orders the rest of the entry.
            let cqe = unsafe { std::ptr::read_volatile(self.cq.add(loc)) };
            self.collect();
            return Ok(Some(cqe));
        }
        Ok(self.take_parked(s))
    }

    /// Wait for the completion of `s`, up to the pair's timeout, and turn an error status
    /// into a typed error.
    pub fn wait(&self, s: Submitted) -> Result<Cqe> {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::default();
        loop {
            if let Some(cqe) = self.poll(s)? {
                cqe.status().map_err(Error::Status)?;
                return Ok(cqe);
            }
            if Instant::now() > deadline {
                return Err(self.poison());
            }
            backoff.snooze();
        }
    }

    fn take_parked(&self, s: Submitted) -> Option<Cqe> {
        if self.parked_n.load(Ordering::Acquire) == 0 {
            return None;
        }
        let cqe = lock(&self.parked).remove(&s.ticket)?;
        self.parked_n.fetch_sub(1, Ordering::AcqRel);
        Some(cqe)
    }

    /// Claim every posted completion nobody has consumed yet, keep it for its owner by
    /// ticket, and move the heads past all of them. Does nothing while another thread
    /// moves the head (it frees the same slots).
    pub(super) fn park_posted(&self) {
        if self.cq_lock.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut claimed = Vec::new();
        for (loc, dw3) in self.posted_from(self.cq_head.load(Ordering::Acquire)) {
            if self.cq_mark[loc]
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let slot = dw3 as u16 as u64 & self.mask;
                // The slot is still held by this completion's command (it is freed only
                // once the head has passed it, below), so its turn names the lap.
                let ticket = self.turns[slot as usize].load(Ordering::Acquire) << self.log2 | slot;
                // SAFETY: loc < depth; the acquire load of dw3 orders the rest of the entry.
                claimed.push((ticket, unsafe { std::ptr::read_volatile(self.cq.add(loc)) }));
            }
        }
        if !claimed.is_empty() {
            tracing::debug!(
                qid = self.qid,
                parked = claimed.len(),
                "submitters wait for slots: parked completions their owners had not collected"
            );
            let n = claimed.len();
            lock(&self.parked).extend(claimed);
            // Before the head moves (and the slots free): an owner that sees either sees
            // the parked entries too.
            self.parked_n.fetch_add(n, Ordering::AcqRel);
        }
        self.move_cq_head();
        self.cq_lock.store(false, Ordering::SeqCst);
        // Entries consumed while we held the lock: move over them too.
        self.collect();
    }

    /// After marking an entry consumed: move the heads if nobody else is.
    fn collect(&self) {
        // SeqCst on the mark and the lock: either we see the lock free, or the holder's
        // re-check after unlocking sees our mark (no lost head move).
        while !self.cq_lock.swap(true, Ordering::SeqCst) {
            self.move_cq_head();
            self.cq_lock.store(false, Ordering::SeqCst);
            let head = self.cq_head.load(Ordering::SeqCst);
            if !self.cq_mark[(head & self.mask) as usize].load(Ordering::SeqCst) {
                break;
            }
        }
    }

    /// Called with the CQ lock held.
    fn move_cq_head(&self) {
        let cur = self.cq_head.load(Ordering::Acquire);
        let mut n = 0u64;
        while n < self.depth {
            let loc = ((cur + n) & self.mask) as usize;
            if !self.cq_mark[loc].load(Ordering::Acquire) {
                break;
            }
            let cid = self.load_dw3(loc) as u16;
            self.sq_free_mark[(cid as u64 & self.mask) as usize].store(true, Ordering::Release);
            self.cq_mark[loc].store(false, Ordering::Release);
            n += 1;
        }
        if n == 0 {
            return;
        }
        let new = cur + n;
        self.cq_head.store(new, Ordering::Release);
        self.cq_db.ring((new & self.mask) as u32);
        self.move_sq_head();
    }

    /// Free SQ slots in order; only the CQ-lock holder gets here, so one writer.
    fn move_sq_head(&self) {
        let cur = self.sq_head.load(Ordering::Acquire);
        let mut n = 0u64;
        while n < self.depth {
            let loc = ((cur + n) & self.mask) as usize;
            if !self.sq_free_mark[loc].swap(false, Ordering::AcqRel) {
                break;
            }
            self.turns[loc].fetch_add(1, Ordering::Release);
            n += 1;
        }
        if n > 0 {
            self.sq_head.store(cur + n, Ordering::Release);
        }
    }
}
