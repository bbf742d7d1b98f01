//! Moving a vGPU's state to a worker on another host over a stream ([`crate::wire`]).
//!
//! The source ([`RemoteSender`]) pre-copies allocations while the guest runs, round after
//! round (dirty tracking as in a local move), then at the VM's stop takes the dispatch
//! lock, copies what was written since, sends the modules and functions under the guest's
//! handles and waits for the destination's `Ack`. Its own state stays whole: if the VM's
//! move fails after this, the vGPU simply goes on at the source.
//!
//! The destination ([`Migratable::receive_from`]) trusts nothing in the stream: the token
//! must match, every allocation must lie inside the vGPU's address range (overflow
//! checked), every byte run inside an allocation it placed, handles must be new and
//! non-zero, and counts are bounded. Any failure frees everything it placed, unloads what
//! it loaded, sends `Error` with the reason, and returns it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vgpu_backend::pager::Pager;
use vgpu_backend::{require_relocation, Backend};
use vm_memory::VolatileSlice;

use crate::migratable::{Alloc, Func, Image, Migratable, Module};
use crate::wire::{read_message, ImageKind, Message, WireError, MAX_DATA, MAX_TOKEN};
use crate::{MigrationError, Mode, Phase, Report};
use vgpu_backend::sync::{lock, write};

/// Most allocations a destination accepts.
pub const MAX_ALLOCS: usize = 1 << 16;
/// Most modules a destination accepts.
pub const MAX_MODULES: usize = 4096;
/// Most functions a destination accepts.
pub const MAX_FUNCTIONS: usize = 1 << 16;
/// How long the stop waits for an oversubscribed vGPU's piece table that an operation
/// holds before the move fails (the VM then runs on at its source).
const STOP_PATIENCE: Duration = Duration::from_secs(2);

#[path = "remote_receive.rs"]
mod receive;
pub use receive::Received;

fn wire(e: WireError) -> MigrationError {
    MigrationError::Stream(e.to_string())
}

/// Tokens compared without an early exit.
fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The source end of a move to another host. Drop it to give up (the vGPU stays).
pub struct RemoteSender<'m, S: Read + Write> {
    src: &'m Migratable,
    /// The pager above `src` (an oversubscribed vGPU): the allocations are its own, and
    /// their bytes are read where it keeps them.
    pager: Option<&'m Pager>,
    /// In the stop phase (the dispatch lock is held).
    stopping: bool,
    conn: S,
    /// Allocations the destination holds.
    sent: BTreeSet<u64>,
    /// Every write at or after this epoch still has to reach the destination.
    since: u64,
    rounds: u32,
    bytes: u64,
    started: Instant,
    rate_ns_per_byte: f64,
    buf: Vec<u8>,
}

impl<S: Read + Write> Drop for RemoteSender<'_, S> {
    fn drop(&mut self) {
        self.src.vmm_frozen.store(false, Ordering::Release);
        self.src.migrating.store(false, Ordering::Release);
    }
}

impl Migratable {
    /// Starts a move of this vGPU's state to a destination worker over `conn`, which has
    /// been given `token` out of band.
    pub fn send_to<S: Read + Write>(
        &self,
        mut conn: S,
        token: &[u8],
    ) -> Result<RemoteSender<'_, S>, MigrationError> {
        if self.migrating.swap(true, Ordering::AcqRel) {
            return Err(MigrationError::Busy);
        }
        let sender_guard = ReleaseOnError(self);
        let shared = lock(&self.imported).len();
        if shared > 0 {
            return Err(MigrationError::SharedMappings(shared));
        }
        self.vmm_frozen.store(true, Ordering::Release);
        self.refuse_virtual_memory()?;
        if token.len() > MAX_TOKEN {
            return Err(MigrationError::Stream(format!(
                "the token is longer than {MAX_TOKEN} bytes"
            )));
        }
        Message::Hello {
            token,
            va_base: self.info.va_base,
            va_size: self.info.va_size,
        }
        .write(&mut conn)
        .map_err(wire)?;
        std::mem::forget(sender_guard);
        Ok(RemoteSender {
            src: self,
            pager: None,
            stopping: false,
            conn,
            sent: BTreeSet::new(),
            since: 0,
            rounds: 0,
            bytes: 0,
            started: Instant::now(),
            rate_ns_per_byte: 0.0,
            buf: Vec::new(),
        })
    }
}

/// Clears the `migrating` flag unless forgotten.
struct ReleaseOnError<'a>(&'a Migratable);

impl Drop for ReleaseOnError<'_> {
    fn drop(&mut self) {
        self.0.vmm_frozen.store(false, Ordering::Release);
        self.0.migrating.store(false, Ordering::Release);
    }
}

/// A pre-copy round's outcome.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    /// Bytes sent this round.
    pub copied: u64,
    /// Bytes of allocations written since the round began.
    pub dirty: u64,
    /// How long sending `dirty` is expected to take.
    pub expect: Duration,
}

impl<'m, S: Read + Write> RemoteSender<'m, S> {
    /// Sends an oversubscribed vGPU: `pager` is the pager above this vGPU's migratable
    /// layer. Every byte of its allocations goes, swapped pieces read where they are
    /// (nothing is restored); its swap-area buffers do not go as allocations of their own.
    pub fn through(mut self, pager: &'m Pager) -> Self {
        self.pager = Some(pager);
        self
    }

    /// Rounds so far.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    /// Bytes sent so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes the vGPU holds now.
    pub fn total(&self) -> u64 {
        self.live().iter().map(|l| l.1).sum()
    }

    fn live(&self) -> Vec<(u64, u64, u64)> {
        lock(&self.src.allocs)
            .iter()
            .filter(|(a, _)| self.pager.is_none_or(|p| p.owns(**a)))
            .map(|(a, x)| (*a, x.size, x.written.load(Ordering::Acquire)))
            .collect()
    }

    /// Frees on the destination what the source freed, places what is new.
    fn reconcile(&mut self, live: &[(u64, u64, u64)]) -> Result<(), MigrationError> {
        let keep: BTreeSet<u64> = live.iter().map(|l| l.0).collect();
        let gone: Vec<u64> = self.sent.difference(&keep).copied().collect();
        for addr in gone {
            Message::Free { addr }.write(&mut self.conn).map_err(wire)?;
            self.sent.remove(&addr);
        }
        for (addr, size, _) in live {
            if self.sent.insert(*addr) {
                Message::Alloc {
                    addr: *addr,
                    size: *size,
                }
                .write(&mut self.conn)
                .map_err(wire)?;
            }
        }
        Ok(())
    }

    /// Sends allocation `addr`'s bytes: all of them through the pager, else its resident
    /// ones (without a pager nothing is swapped out).
    fn send_one(
        &mut self,
        source: &dyn Backend,
        addr: u64,
        size: u64,
    ) -> Result<u64, MigrationError> {
        if let Some(p) = self.pager {
            return self.send_paged(p, source, addr, size);
        }
        let dec: BTreeMap<u64, u64> = match lock(&self.src.allocs).get(&addr) {
            Some(a) => lock(&a.decommitted).clone(),
            None => return Ok(0),
        };
        let mut ranges = Vec::new();
        let mut at = 0;
        for (o, l) in &dec {
            if *o > at {
                ranges.push((at, (*o).min(size)));
            }
            at = o.saturating_add(*l);
        }
        if at < size {
            ranges.push((at, size));
        }
        let mut sent = 0;
        for (from, to) in ranges {
            let mut off = from;
            while off < to {
                let n = (to - off).min(MAX_DATA as u64) as usize;
                self.buf.resize(n, 0);
                let slice = VolatileSlice::from(&mut self.buf[..n]);
                if let Err(e) = source.copy_dtoh(addr + off, &slice) {
                    if !lock(&self.src.allocs).contains_key(&addr) {
                        // Freed while we copied: the next reconcile frees it there too.
                        return Ok(sent);
                    }
                    return Err(MigrationError::Source(e));
                }
                Message::Data {
                    addr,
                    offset: off,
                    bytes: &self.buf[..n],
                }
                .write(&mut self.conn)
                .map_err(wire)?;
                off += n as u64;
                sent += n as u64;
            }
        }
        self.bytes += sent;
        Ok(sent)
    }

    /// Sends all `size` bytes of allocation `addr`, each piece read where `pager` keeps it
    /// (device memory through `source`, the GPU under the migratable layer).
    fn send_paged(
        &mut self,
        pager: &Pager,
        source: &dyn Backend,
        addr: u64,
        size: u64,
    ) -> Result<u64, MigrationError> {
        let mut sent = 0;
        while sent < size {
            let n = (size - sent).min(MAX_DATA as u64) as usize;
            self.buf.resize(n, 0);
            let slice = VolatileSlice::from(&mut self.buf[..n]);
            // At the stop, a piece table an operation holds (it waits for the dispatch lock
            // the stop holds) fails the move instead of waiting for ever.
            let patience = self.stopping.then_some(STOP_PATIENCE);
            if let Err(e) = pager.read_for_move(source, addr + sent, &slice, patience) {
                if !pager.owns(addr) {
                    // Freed while we copied: the next reconcile frees it there too.
                    self.bytes += sent;
                    return Ok(sent);
                }
                return Err(MigrationError::Source(e));
            }
            Message::Data {
                addr,
                offset: sent,
                bytes: &self.buf[..n],
            }
            .write(&mut self.conn)
            .map_err(wire)?;
            sent += n as u64;
        }
        self.bytes += sent;
        Ok(sent)
    }

    /// One pre-copy round while the guest runs: everything written since the last round
    /// began (round 1: everything).
    pub fn precopy_round(&mut self) -> Result<Round, MigrationError> {
        let round_start = self.src.epoch.fetch_add(1, Ordering::SeqCst);
        let live = self.live();
        self.reconcile(&live)?;
        let source = self.src.current();
        let t = Instant::now();
        let mut copied = 0;
        for (addr, size, written) in &live {
            if *written >= self.since {
                copied += self.send_one(&*source, *addr, *size)?;
            }
        }
        self.rounds += 1;
        if copied > 0 {
            self.rate_ns_per_byte = t.elapsed().as_nanos() as f64 / copied as f64;
        }
        self.since = round_start + 1;
        let dirty: u64 = self
            .live()
            .iter()
            .filter(|l| l.2 >= self.since)
            .map(|l| l.1)
            .sum();
        let expect = Duration::from_nanos((dirty as f64 * self.rate_ns_per_byte) as u64);
        tracing::debug!(
            rounds = self.rounds,
            copied,
            dirty,
            ?expect,
            "vGPU pre-copy round to the destination"
        );
        Ok(Round {
            copied,
            dirty,
            expect,
        })
    }

    /// Stops dispatch (running work finishes: a kernel boundary), sends the rest, the
    /// modules and the functions, and waits for the destination to hold it all. The
    /// source keeps its state either way.
    pub fn finish(mut self) -> Result<Report, MigrationError> {
        let precopy_bytes = self.bytes;
        let stop = Instant::now();
        let t_drain = self.started.elapsed();
        // Swapping holds still first (an eviction takes it before the dispatch lock).
        let swapping = self.pager.map(Pager::hold_swapping);
        let held = write(&self.src.dispatch);
        self.stopping = true;
        let source = self.src.current();
        source.synchronize();
        let drain = stop.elapsed();
        let t_copy = self.started.elapsed();
        let r = (|| {
            let live = self.live();
            self.reconcile(&live)?;
            for (addr, size, written) in &live {
                if self.rounds == 0 || *written >= self.since {
                    self.send_one(&*source, *addr, *size)?;
                }
            }
            let modules: Vec<(u64, Image)> = lock(&self.src.modules)
                .iter()
                .map(|(h, m)| (*h, m.image.clone()))
                .collect();
            for (handle, image) in &modules {
                let (kind, image) = match image {
                    Image::Builtin(b) => (ImageKind::Builtin, b),
                    Image::Ptx(b) => (ImageKind::Ptx, b),
                    Image::Binary(b) => (ImageKind::Binary, b),
                };
                Message::Module {
                    handle: *handle,
                    kind,
                    image,
                }
                .write(&mut self.conn)
                .map_err(wire)?;
            }
            let functions: Vec<(u64, u64, Vec<u8>)> = lock(&self.src.functions)
                .iter()
                .map(|(h, f)| (*h, f.module, f.name.clone()))
                .collect();
            for (handle, module, name) in &functions {
                Message::Function {
                    handle: *handle,
                    module: *module,
                    name,
                }
                .write(&mut self.conn)
                .map_err(wire)?;
            }
            // Module variables' bytes (the stream's version 2 messages).
            let pairs: Vec<(u64, u64)> = lock(&self.src.modules)
                .iter()
                .map(|(h, m)| (*h, m.real))
                .collect();
            for c in &self.src.read_vars(&*source, &pairs)? {
                crate::globals::send_var(&mut self.conn, c)?;
                self.bytes += c.bytes.len() as u64;
            }
            Message::Done {
                next_handle: self.src.next_handle.load(Ordering::Relaxed),
            }
            .write(&mut self.conn)
            .map_err(wire)?;
            let mut buf = Vec::new();
            match read_message(&mut self.conn, &mut buf).map_err(wire)? {
                Message::Ack => Ok(()),
                Message::Error { reason } => Err(MigrationError::Refused(reason.to_string())),
                other => Err(MigrationError::Stream(format!(
                    "the destination answered {other:?} instead of an acknowledgement"
                ))),
            }
        })();
        let downtime = stop.elapsed();
        drop(held);
        drop(swapping);
        if let Err(e) = &r {
            tracing::warn!(error = %e, "the vGPU's state did not reach the destination; it stays here");
            let _ = Message::Error {
                reason: &e.to_string(),
            }
            .write(&mut self.conn);
        }
        r?;
        let report = Report {
            mode: if self.rounds == 0 {
                Mode::StopCopy
            } else {
                Mode::Precopy
            },
            rounds: self.rounds,
            precopy_bytes,
            stop_bytes: self.bytes - precopy_bytes,
            total: self.total(),
            downtime,
            drain,
            elapsed: self.started.elapsed(),
            timeline: vec![
                (Phase::Precopy, Duration::ZERO, t_drain),
                (Phase::Draining, t_drain, t_copy),
                (Phase::StopCopy, t_copy, self.started.elapsed()),
            ],
        };
        tracing::info!(
            rounds = report.rounds,
            bytes = self.bytes,
            downtime_us = downtime.as_micros() as u64,
            "vGPU state sent to the destination"
        );
        Ok(report)
    }
}
