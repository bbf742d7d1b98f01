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

/// What a destination received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Received {
    pub allocations: usize,
    pub bytes: u64,
    pub modules: usize,
    pub functions: usize,
    /// Module variables whose bytes arrived.
    pub variables: usize,
}

impl Migratable {
    /// Receives a vGPU's state from a source worker over `conn` into this fresh vGPU;
    /// `token` is the one-time secret the source must present. Dispatch is held from the
    /// start (`on_locked` runs once it is): the guest's requests wait until the state is
    /// in place. On any failure everything placed is freed again and the source hears why.
    pub fn receive_from<S: Read + Write>(
        &self,
        conn: S,
        token: &[u8],
        on_locked: impl FnOnce(),
    ) -> Result<Received, MigrationError> {
        self.receive_into(conn, token, None, on_locked)
    }

    /// As [`Migratable::receive_from`], for an oversubscribed vGPU when `pager` is the
    /// pager above this migratable layer: every allocation placed becomes the pager's own
    /// (charged to its share and its broker's reservation, evictable once the state is
    /// in place).
    pub fn receive_into<S: Read + Write>(
        &self,
        mut conn: S,
        token: &[u8],
        pager: Option<&Pager>,
        on_locked: impl FnOnce(),
    ) -> Result<Received, MigrationError> {
        let held = write(&self.dispatch);
        on_locked();
        let mut rx = Receiver {
            m: self,
            pager,
            got: Received::default(),
            placed: BTreeSet::new(),
            loaded: BTreeMap::new(),
            vars: Default::default(),
        };
        let r = rx.run(&mut conn, token);
        match &r {
            Ok(_) => {
                if let Err(e) = Message::Ack.write(&mut conn) {
                    rx.undo();
                    drop(held);
                    return Err(wire(e));
                }
                rx.commit();
            }
            Err(e) => {
                tracing::warn!(error = %e, "refused the incoming vGPU state");
                let _ = Message::Error {
                    reason: &e.to_string(),
                }
                .write(&mut conn);
                rx.undo();
            }
        }
        drop(held);
        r.map(|()| rx.got)
    }
}

struct Receiver<'m> {
    m: &'m Migratable,
    pager: Option<&'m Pager>,
    got: Received,
    /// Allocations placed on the backend (addr -> size).
    placed: BTreeSet<u64>,
    /// Modules loaded: guest handle -> (real handle, image).
    loaded: BTreeMap<u64, (u64, Image)>,
    /// Module variables received, by the guest's address.
    vars: crate::globals::Received,
}

impl Receiver<'_> {
    fn bad(why: impl Into<String>) -> MigrationError {
        MigrationError::Stream(why.into())
    }

    fn run(&mut self, conn: &mut impl Read, token: &[u8]) -> Result<(), MigrationError> {
        if !lock(&self.m.allocs).is_empty() || !lock(&self.m.modules).is_empty() {
            return Err(Self::bad(
                "this vGPU is in use already; incoming state needs a fresh one",
            ));
        }
        let backend = self.m.current();
        let (va_base, va_size) = (self.m.info.va_base, self.m.info.va_size);
        let va_end = va_base.saturating_add(va_size);
        let mut buf = Vec::new();
        match read_message(conn, &mut buf).map_err(wire)? {
            Message::Hello {
                token: t,
                va_base: b,
                va_size: s,
            } => {
                if !same_token(t, token) {
                    return Err(MigrationError::Refused(
                        "the source presented a wrong token".into(),
                    ));
                }
                if (b, s) != (va_base, va_size) {
                    return Err(Self::bad(format!(
                        "the source's address range {b:#x}+{s:#x} differs from this vGPU's {va_base:#x}+{va_size:#x}"
                    )));
                }
            }
            Message::Error { reason } => return Err(MigrationError::Refused(reason.into())),
            _ => return Err(Self::bad("the stream does not start with a hello")),
        }
        let mut sizes: BTreeMap<u64, u64> = BTreeMap::new();
        let mut functions: BTreeMap<u64, Func> = BTreeMap::new();
        let mut scratch = Vec::new();
        loop {
            match read_message(conn, &mut buf).map_err(wire)? {
                Message::Alloc { addr, size } => {
                    let end = addr
                        .checked_add(size)
                        .ok_or_else(|| Self::bad("allocation overflows"))?;
                    if size == 0 || addr < va_base || end > va_end {
                        return Err(Self::bad(format!(
                            "allocation {addr:#x}+{size:#x} lies outside the vGPU's range {va_base:#x}..{va_end:#x}"
                        )));
                    }
                    if sizes.contains_key(&addr) || sizes.len() >= MAX_ALLOCS {
                        return Err(Self::bad(format!(
                            "allocation {addr:#x} repeated or too many"
                        )));
                    }
                    let placed = require_relocation(&*backend)
                        .and_then(|r| r.alloc_at(addr, size))
                        .map_err(|source| MigrationError::Target {
                            what: format!("placing {size} bytes at {addr:#x}"),
                            source,
                        })?;
                    if let Some(p) = self.pager {
                        if let Err(source) = p.adopt(addr, size, placed.charged) {
                            let _ = backend.free(addr);
                            return Err(MigrationError::Target {
                                what: format!("charging {size} bytes at {addr:#x}"),
                                source,
                            });
                        }
                    }
                    self.placed.insert(addr);
                    sizes.insert(addr, size);
                }
                Message::Free { addr } => {
                    if sizes.remove(&addr).is_none() {
                        return Err(Self::bad(format!("free of unknown allocation {addr:#x}")));
                    }
                    self.placed.remove(&addr);
                    if let Some(p) = self.pager {
                        p.disown(addr);
                    }
                    let _ = backend.free(addr);
                }
                Message::Data {
                    addr,
                    offset,
                    bytes,
                } => {
                    let size = *sizes.get(&addr).ok_or_else(|| {
                        Self::bad(format!("bytes for unknown allocation {addr:#x}"))
                    })?;
                    let end = offset.checked_add(bytes.len() as u64);
                    if end.is_none_or(|e| e > size) {
                        return Err(Self::bad(format!(
                            "bytes at {addr:#x}+{offset:#x} run past the allocation's {size} bytes"
                        )));
                    }
                    scratch.clear();
                    scratch.extend_from_slice(bytes);
                    let slice = VolatileSlice::from(&mut scratch[..]);
                    backend.copy_htod(addr + offset, &slice).map_err(|source| {
                        MigrationError::Target {
                            what: format!("writing {addr:#x}+{offset:#x}"),
                            source,
                        }
                    })?;
                    self.got.bytes += bytes.len() as u64;
                }
                Message::Module {
                    handle,
                    kind,
                    image,
                } => {
                    if handle == 0
                        || self.loaded.contains_key(&handle)
                        || self.loaded.len() >= MAX_MODULES
                    {
                        return Err(Self::bad(format!(
                            "module handle {handle} repeated, zero or too many"
                        )));
                    }
                    let image = match kind {
                        ImageKind::Builtin => Image::Builtin(image.to_vec()),
                        ImageKind::Ptx => Image::Ptx(image.to_vec()),
                        ImageKind::Binary => Image::Binary(image.to_vec()),
                    };
                    let real =
                        backend
                            .modules()
                            .module_load(image.as_module())
                            .map_err(|source| MigrationError::Target {
                                what: format!("loading module {handle}"),
                                source,
                            })?;
                    self.loaded.insert(handle, (real, image));
                }
                Message::Function {
                    handle,
                    module,
                    name,
                } => {
                    let real_module =
                        self.loaded.get(&module).map(|l| l.0).ok_or_else(|| {
                            Self::bad(format!("function of unknown module {module}"))
                        })?;
                    if handle == 0
                        || functions.contains_key(&handle)
                        || self.loaded.contains_key(&handle)
                        || functions.len() >= MAX_FUNCTIONS
                    {
                        return Err(Self::bad(format!(
                            "function handle {handle} repeated, zero or too many"
                        )));
                    }
                    let f =
                        backend
                            .modules()
                            .get_function(real_module, name)
                            .map_err(|source| MigrationError::Target {
                                what: format!("looking up function {handle}"),
                                source,
                            })?;
                    functions.insert(
                        handle,
                        Func {
                            module,
                            name: name.to_vec(),
                            real: f.handle,
                        },
                    );
                }
                Message::Variable {
                    module,
                    addr,
                    size,
                    offset,
                    name,
                    bytes,
                } => {
                    let loaded = &self.loaded;
                    self.got.bytes += crate::globals::receive_var(
                        &*backend,
                        |h| loaded.get(&h).map(|l| l.0),
                        &mut self.vars,
                        &mut scratch,
                        crate::globals::Incoming {
                            module,
                            addr,
                            size,
                            offset,
                            name,
                            bytes,
                        },
                    )?;
                }
                Message::Done { next_handle } => {
                    crate::globals::check_apart(&self.vars, &sizes)?;
                    let highest = self
                        .loaded
                        .keys()
                        .chain(functions.keys())
                        .max()
                        .copied()
                        .unwrap_or(0);
                    if next_handle <= highest {
                        return Err(Self::bad("the next handle is not above every handle sent"));
                    }
                    let epoch = self.m.epoch.load(Ordering::Acquire);
                    let mut allocs = lock(&self.m.allocs);
                    for (addr, size) in &sizes {
                        allocs.insert(
                            *addr,
                            Alloc {
                                size: *size,
                                written: std::sync::Arc::new(epoch.into()),
                                decommitted: Default::default(),
                            },
                        );
                    }
                    drop(allocs);
                    self.got.allocations = sizes.len();
                    self.got.modules = self.loaded.len();
                    self.got.functions = functions.len();
                    self.got.variables = self.vars.len();
                    *lock(&self.m.functions) = functions;
                    self.m.next_handle.fetch_max(next_handle, Ordering::Relaxed);
                    return Ok(());
                }
                Message::Error { reason } => return Err(MigrationError::Refused(reason.into())),
                Message::Hello { .. } | Message::Ack => {
                    return Err(Self::bad("unexpected message in the vGPU stream"))
                }
            }
        }
    }

    /// The received state becomes the vGPU's.
    fn commit(&mut self) {
        let mut modules = lock(&self.m.modules);
        for (h, (real, image)) in std::mem::take(&mut self.loaded) {
            modules.insert(h, Module { image, real });
        }
        drop(modules);
        let vars = self.vars.take();
        if let Some(p) = self.pager {
            for (addr, v) in &vars {
                if let Some(addr) = addr {
                    p.adopt_global(*addr, v.size, v.module);
                }
            }
        }
        self.m.moved_vars(&*self.m.current(), vars);
        self.placed.clear();
        if let Some(p) = self.pager {
            // In place and whole: the pager may evict from it as its broker asks.
            p.settle();
        }
    }

    /// Gives back everything placed or loaded.
    fn undo(&mut self) {
        let backend = self.m.current();
        for (_, (real, _)) in std::mem::take(&mut self.loaded) {
            let _ = backend.modules().module_unload(real);
        }
        for addr in std::mem::take(&mut self.placed) {
            if let Some(p) = self.pager {
                p.disown(addr);
            }
            let _ = backend.free(addr);
        }
        lock(&self.m.allocs).clear();
        lock(&self.m.functions).clear();
    }
}
