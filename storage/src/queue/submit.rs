//! The submission side: ticket, turn, fill, mark, and the tail-lock winner's doorbell.

use super::{Backoff, QueuePair};
use crate::error::{Error, Result};
use crate::nvme::Sqe;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A command in flight: its slot, which is also its command identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a submitted command must be waited for, or its slot is never freed"]
pub struct Submitted {
    pub(crate) cid: u16,
    /// The absolute SQ position: which lap of the slot this command holds.
    pub(crate) ticket: u64,
}

impl Submitted {
    pub fn cid(&self) -> u16 {
        self.cid
    }
}

impl QueuePair {
    /// Enqueue a command, waiting (up to the timeout) for a free slot. A submitter that
    /// holds a ticket cannot hand it back, so a timeout here poisons the pair.
    pub fn submit(&self, sqe: Sqe) -> Result<Submitted> {
        self.check()?;
        let ticket = self.in_ticket.fetch_add(1, Ordering::AcqRel);
        self.wait_for_slot(ticket)?;
        Ok(self.fill_and_publish(ticket, sqe))
    }

    /// Enqueue only if a slot is free right now; `Error::QueueFull` otherwise. Never waits.
    pub fn try_submit(&self, sqe: Sqe) -> Result<Submitted> {
        self.check()?;
        let mut ticket = self.in_ticket.load(Ordering::Acquire);
        loop {
            // The head only grows, so a slot free now stays free for this ticket.
            if ticket + 1 - self.sq_head.load(Ordering::Acquire) >= self.depth {
                return Err(Error::QueueFull(self.qid));
            }
            match self.in_ticket.compare_exchange_weak(
                ticket,
                ticket + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(t) => ticket = t,
            }
        }
        Ok(self.fill_and_publish(ticket, sqe))
    }

    fn wait_for_slot(&self, ticket: u64) -> Result<()> {
        let pos = (ticket & self.mask) as usize;
        let turn = ticket >> self.log2;
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::default();
        // Our turn at this slot comes when the previous lap's command there was freed; and
        // one slot always stays empty so the controller can tell full from empty.
        while self.turns[pos].load(Ordering::Acquire) != turn
            || ticket + 1 - self.sq_head.load(Ordering::Acquire) >= self.depth
        {
            if self.is_poisoned() {
                return Err(Error::Poisoned(self.qid));
            }
            if Instant::now() > deadline {
                return Err(self.poison());
            }
            // Slots are freed in order, and the oldest may be held by a completion whose
            // owner is itself waiting here for a slot (it submits a batch before it waits
            // for any): park what the controller has posted so the slots free up.
            if backoff.is_sleeping() {
                self.park_posted();
            }
            backoff.snooze();
        }
        Ok(())
    }

    fn fill_and_publish(&self, ticket: u64, mut sqe: Sqe) -> Submitted {
        let pos = (ticket & self.mask) as usize;
        let cid = pos as u16;
        sqe.set_cid(cid);
        // SAFETY: pos < depth, so the entry is inside the SQ; the slot is ours until the
        // tail passes it (turn protocol), so no other submitter writes it concurrently.
        unsafe { std::ptr::write_volatile(self.sq.add(pos), sqe) };
        self.tail_mark[pos].store(true, Ordering::Release);

        let mut backoff = Backoff::default();
        // Wait until some lock winner (maybe us) has moved the tail over our entry.
        while self.tail_mark[pos].load(Ordering::Acquire) {
            if !self.tail_lock.swap(true, Ordering::AcqRel) {
                self.move_tail();
                self.tail_lock.store(false, Ordering::Release);
            } else {
                backoff.snooze();
            }
        }
        Submitted { cid, ticket }
    }

    /// Called with the tail lock held: claim every consecutive marked slot from the tail
    /// and ring the doorbell once for all of them.
    fn move_tail(&self) {
        let cur = self.tail.load(Ordering::Acquire);
        let mut n = 0u64;
        while n < self.depth
            && self.tail_mark[((cur + n) & self.mask) as usize].swap(false, Ordering::AcqRel)
        {
            n += 1;
        }
        if n > 0 {
            let new = cur + n;
            self.sq_db.ring((new & self.mask) as u32);
            self.tail.store(new, Ordering::Release);
        }
    }
}
