//! One vGPU stream: a virtqueue of the device. Requests are enqueued (header and response in
//! a driver-owned slot, data in caller buffers), made visible with one doorbell per batch
//! ([`Stream::submit`]), and completed by polling the used ring. The device completes a
//! queue's requests in order; the driver does not rely on it.

use vgpu_proto::{DeviceInfo, Opcode, Request, Response, Status};

use crate::error::{Error, Result};
use crate::queue::{Buffer, SplitQueue};
use crate::spec::reg;
use crate::transport::{DmaRegion, Transport};

use super::slots::{Slots, HEADER_MAX, INFO_OFF, RESPONSE_OFF, SCRATCH_MAX, SCRATCH_OFF};

/// Most data descriptors one request may carry.
pub const MAX_DATA_BUFFERS: usize = 8;
/// Default bound on a stream's queue size (descriptors) and in-flight requests.
pub const DEFAULT_STREAM_CAPACITY: usize = 64;
/// Polls between clock reads while waiting: reading the clock is cheap, not free.
const CLOCK_STRIDE: u32 = 256;

/// How a stream is set up and how long synchronous calls wait.
#[derive(Clone, Copy, Debug)]
pub struct StreamOptions {
    /// Largest queue size to use (the device and the stream's capacity may lower it).
    pub queue_size: u16,
    /// A monotonic clock in nanoseconds (payloads: the TSC; Linux: CLOCK_MONOTONIC).
    pub now_ns: fn() -> u64,
    /// How long a synchronous call waits for its completion before the stream gives up
    /// and resets the device (so no late DMA can land in a buffer the caller reuses).
    pub timeout_ns: u64,
    /// Called between polls of the used ring with how long the wait has lasted (ns), so
    /// the guest can back off (a payload asks the vmm to idle its vCPU; Linux would yield).
    pub relax: fn(waited_ns: u64),
    /// After waiting this long (ns) the stream asks the device to interrupt at its next
    /// completion (and polls once more), so a `relax` that sleeps until an interrupt
    /// wakes it (a payload's idle port) returns as soon as the completion lands; the
    /// interrupts are suppressed again when the wait ends. `u64::MAX`: never (the stream
    /// only polls).
    pub wake_after_ns: u64,
    /// Told, once its completion is in, how long (ns) a wait lasted that went on past
    /// `wake_after_ns`: a `relax` that idles learns from it when such waits end, so that
    /// it comes back in time to spin through the end of the next one (the payload
    /// runtime). [`no_learning`] where nothing learns.
    pub learn: fn(waited_ns: u64),
}

/// A `relax` that only spins.
pub fn spin_relax(_waited_ns: u64) {
    core::hint::spin_loop();
}

/// A `learn` for a `relax` that learns nothing.
pub fn no_learning(_waited_ns: u64) {}

/// Names an outstanding request on its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    slot: u16,
    id: u64,
}

impl Ticket {
    /// The request id carried in its header and echoed in its response.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// Data the driver supplies from the request's own slot.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SlotData<'a> {
    None,
    /// Readable bytes copied into the slot (module and function names).
    Readable(&'a [u8]),
    /// The slot's writable `DeviceInfo` area (`GET_INFO`, `GET_ATTRIBUTES`,
    /// `ENCODE_TENSOR_MAP`).
    Info,
    /// Readable bytes (a function name), then the slot's writable `ParamLayout` area
    /// (`GET_FUNCTION_LAYOUT`).
    NameThenLayout(&'a [u8]),
}

/// Where a `ParamLayout` answer lands in a slot: past the longest name in the scratch area.
const LAYOUT_OFF: usize = SCRATCH_OFF + vgpu_proto::MAX_SYMBOL_LEN as usize;
/// `GET_FUNCTION_LAYOUT`'s answer: the layout, then the function's attributes.
const LAYOUT_ANSWER: usize = vgpu_proto::ParamLayout::SIZE + vgpu_proto::FunctionAttributes::SIZE;
const _: () = assert!(LAYOUT_OFF + LAYOUT_ANSWER <= SCRATCH_OFF + SCRATCH_MAX);

#[derive(Clone, Copy, Debug)]
enum Slot {
    Free,
    /// `raw`: a chain built by the caller, completed with its used length only.
    Pending {
        id: u64,
        opcode: u32,
        raw: bool,
    },
    Done {
        id: u64,
        outcome: Result<[u64; 4]>,
    },
}

pub struct Stream<T: Transport, const CAP: usize = DEFAULT_STREAM_CAPACITY> {
    transport: T,
    index: u16,
    queue: SplitQueue<CAP>,
    slots: Slots,
    state: [Slot; CAP],
    free: [u16; CAP],
    nfree: u16,
    /// Head descriptor (token index) -> slot.
    slot_of_head: [u16; CAP],
    next_id: u64,
    opts: StreamOptions,
    broken: bool,
}

impl<T: Transport, const CAP: usize> Stream<T, CAP> {
    pub(crate) fn new(
        transport: T,
        index: u16,
        queue: SplitQueue<CAP>,
        slots: Slots,
        opts: StreamOptions,
    ) -> Self {
        let n = slots.count().min(CAP as u16);
        let mut free = [0u16; CAP];
        for (i, f) in free.iter_mut().enumerate().take(usize::from(n)) {
            // Lowest slot on top of the stack: i counts down.
            *f = n - 1 - i as u16;
        }
        Stream {
            transport,
            index,
            queue,
            slots,
            state: [Slot::Free; CAP],
            free,
            nfree: n,
            slot_of_head: [0; CAP],
            next_id: 1,
            opts,
            broken: false,
        }
    }

    /// The queue index (the device's stream number).
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Requests that can be outstanding at once (further enqueues fail with QueueFull).
    pub fn capacity(&self) -> u16 {
        self.slots.count().min(CAP as u16)
    }

    /// Requests enqueued and not yet waited for.
    pub fn outstanding(&self) -> u16 {
        self.capacity() - self.nfree
    }

    pub fn queue_size(&self) -> u16 {
        self.queue.size()
    }

    fn take_slot(&mut self) -> Result<u16> {
        if self.broken {
            return Err(Error::Broken);
        }
        if self.nfree == 0 {
            return Err(Error::QueueFull);
        }
        self.nfree -= 1;
        Ok(self.free[usize::from(self.nfree)])
    }

    fn release_slot(&mut self, slot: u16) {
        self.state[usize::from(slot)] = Slot::Free;
        self.free[usize::from(self.nfree)] = slot;
        self.nfree += 1;
    }

    /// Builds the chain [header, data..., response] for a request whose header `encode`
    /// writes into the slot, and puts it on the queue (not yet published).
    fn push(
        &mut self,
        opcode: u32,
        encode: impl FnOnce(u64, &mut [u8]) -> Option<usize>,
        data: &[Buffer],
        own: SlotData,
    ) -> Result<Ticket> {
        if data.len() + usize::from(!matches!(own, SlotData::None)) > MAX_DATA_BUFFERS {
            return Err(Error::TooManyBuffers);
        }
        let slot = self.take_slot()?;
        let id = self.next_id;
        match self.fill_and_add(slot, id, encode, data, own) {
            Ok(head) => {
                self.next_id = self.next_id.wrapping_add(1).max(1);
                self.slot_of_head[usize::from(head)] = slot;
                self.state[usize::from(slot)] = Slot::Pending {
                    id,
                    opcode,
                    raw: false,
                };
                Ok(Ticket { slot, id })
            }
            Err(e) => {
                self.release_slot(slot);
                Err(e)
            }
        }
    }

    fn fill_and_add(
        &mut self,
        slot: u16,
        id: u64,
        encode: impl FnOnce(u64, &mut [u8]) -> Option<usize>,
        data: &[Buffer],
        own: SlotData,
    ) -> Result<u16> {
        let header_len = encode(id, self.slots.header_mut(slot)?)
            .filter(|&n| n <= HEADER_MAX)
            .ok_or(Error::RequestTooLarge)?;
        self.slots.clear(slot, RESPONSE_OFF, Response::SIZE)?;
        let mut chain = [Buffer::readable(0, 0); MAX_DATA_BUFFERS + 2];
        let mut n = 0;
        chain[n] = Buffer::readable(self.slots.phys(slot, 0)?, header_len as u32);
        n += 1;
        match own {
            SlotData::None => {}
            SlotData::Readable(bytes) => {
                let area = self.slots.scratch_mut(slot)?;
                area.get_mut(..bytes.len())
                    .ok_or(Error::RequestTooLarge)?
                    .copy_from_slice(bytes);
                chain[n] =
                    Buffer::readable(self.slots.phys(slot, SCRATCH_OFF)?, bytes.len() as u32);
                n += 1;
            }
            SlotData::NameThenLayout(bytes) => {
                if bytes.len() > LAYOUT_OFF - SCRATCH_OFF {
                    return Err(Error::RequestTooLarge);
                }
                let area = self.slots.scratch_mut(slot)?;
                area.get_mut(..bytes.len())
                    .ok_or(Error::RequestTooLarge)?
                    .copy_from_slice(bytes);
                chain[n] =
                    Buffer::readable(self.slots.phys(slot, SCRATCH_OFF)?, bytes.len() as u32);
                n += 1;
                // Room for the function's attributes after the layout: a device that
                // reports them writes them there (since 1.3), an older one leaves it.
                self.slots.clear(slot, LAYOUT_OFF, LAYOUT_ANSWER)?;
                chain[n] =
                    Buffer::writable(self.slots.phys(slot, LAYOUT_OFF)?, LAYOUT_ANSWER as u32);
                n += 1;
            }
            SlotData::Info => {
                self.slots.clear(slot, INFO_OFF, DeviceInfo::SIZE)?;
                chain[n] =
                    Buffer::writable(self.slots.phys(slot, INFO_OFF)?, DeviceInfo::SIZE as u32);
                n += 1;
            }
        }
        for b in data {
            chain[n] = *b;
            n += 1;
        }
        chain[n] = Buffer::writable(self.slots.phys(slot, RESPONSE_OFF)?, Response::SIZE as u32);
        n += 1;
        Ok(self.queue.add(&chain[..n])?.index())
    }

    /// Enqueues a request whose data (if any) the driver supplies or that has none.
    pub fn enqueue(&mut self, req: &Request) -> Result<Ticket> {
        self.push(
            req.opcode() as u32,
            |id, out| req.encode(id, out).ok(),
            &[],
            SlotData::None,
        )
    }

    /// Enqueues a request with data descriptors between header and response.
    ///
    /// # Safety
    /// Every buffer must be guest memory the caller owns, physically contiguous, and must
    /// stay valid (and, for writable ones, unread and unwritten by the CPU) until the
    /// request completes: the device reads and writes it asynchronously.
    pub unsafe fn enqueue_with_data(&mut self, req: &Request, data: &[Buffer]) -> Result<Ticket> {
        self.push(
            req.opcode() as u32,
            |id, out| req.encode(id, out).ok(),
            data,
            SlotData::None,
        )
    }

    /// Enqueues a request whose data the driver supplies from the request's slot.
    pub(crate) fn enqueue_slot_data(&mut self, req: &Request, own: SlotData) -> Result<Ticket> {
        self.push(
            req.opcode() as u32,
            |id, out| req.encode(id, out).ok(),
            &[],
            own,
        )
    }

    /// Enqueues a request whose header is written by `encode(id, out)` (launches, and
    /// deliberately malformed headers in tests), with a response descriptor appended.
    ///
    /// # Safety
    /// As for [`Self::enqueue_with_data`], for `data`.
    pub unsafe fn enqueue_encoded(
        &mut self,
        opcode: u32,
        encode: impl FnOnce(u64, &mut [u8]) -> Option<usize>,
        data: &[Buffer],
    ) -> Result<Ticket> {
        self.push(opcode, encode, data, SlotData::None)
    }

    /// Enqueues a request whose header descriptor lies in the caller's DMA memory `header`
    /// instead of the slot (a launch whose parameter blob does not fit the slot's header
    /// area): `encode(id, bytes)` writes it there; the response lands in the slot.
    ///
    /// # Safety
    /// `header` must stay allocated, and unwritten by the CPU, until the request
    /// completes: the device reads it asynchronously.
    pub unsafe fn enqueue_with_header(
        &mut self,
        opcode: u32,
        header: &mut DmaRegion,
        encode: impl FnOnce(u64, &mut [u8]) -> Option<usize>,
    ) -> Result<Ticket> {
        let slot = self.take_slot()?;
        let id = self.next_id;
        let added = (|| {
            let len = encode(id, header.as_mut_slice())
                .filter(|&n| n <= header.len())
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(Error::RequestTooLarge)?;
            self.slots.clear(slot, RESPONSE_OFF, Response::SIZE)?;
            let chain = [
                Buffer::readable(header.phys(), len),
                Buffer::writable(self.slots.phys(slot, RESPONSE_OFF)?, Response::SIZE as u32),
            ];
            Ok(self.queue.add(&chain)?.index())
        })();
        match added {
            Ok(head) => {
                self.next_id = self.next_id.wrapping_add(1).max(1);
                self.slot_of_head[usize::from(head)] = slot;
                self.state[usize::from(slot)] = Slot::Pending {
                    id,
                    opcode,
                    raw: false,
                };
                Ok(Ticket { slot, id })
            }
            Err(e) => {
                self.release_slot(slot);
                Err(e)
            }
        }
    }

    /// Puts a caller-built chain on the queue as is (no header, no response added): for
    /// testing how the device handles malformed chains. Its completion is
    /// `[used length, 0, 0, 0]`.
    ///
    /// # Safety
    /// As for [`Self::enqueue_with_data`], for every buffer of the chain.
    pub unsafe fn enqueue_raw_chain(&mut self, chain: &[Buffer]) -> Result<Ticket> {
        let slot = self.take_slot()?;
        let head = match self.queue.add(chain) {
            Ok(t) => t.index(),
            Err(e) => {
                self.release_slot(slot);
                return Err(e);
            }
        };
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.slot_of_head[usize::from(head)] = slot;
        self.state[usize::from(slot)] = Slot::Pending {
            id,
            opcode: 0,
            raw: true,
        };
        Ok(Ticket { slot, id })
    }

    /// Makes everything enqueued visible to the device and rings the doorbell once if the
    /// device wants it. Returns whether it rang.
    pub fn submit(&mut self) -> bool {
        let ring = self.queue.publish();
        if ring {
            self.transport
                .write32(reg::QUEUE_NOTIFY, u32::from(self.index));
        }
        ring
    }

    /// Reaps every completion the device has posted. Returns how many. A device that
    /// corrupts the used ring is reset (see [`Self::wait`]) and the stream is broken.
    pub fn reap(&mut self) -> Result<usize> {
        if self.broken {
            return Err(Error::Broken);
        }
        self.reap_inner().inspect_err(|_| self.stop_device())
    }

    fn reap_inner(&mut self) -> Result<usize> {
        let mut n = 0;
        while let Some(used) = self.queue.pop_used()? {
            n += 1;
            let slot = self.slot_of_head[usize::from(used.token.index())];
            let Slot::Pending { id, opcode, raw } = self.state[usize::from(slot)] else {
                // The queue only returns heads it has outstanding, and each has a pending
                // slot; anything else means the bookkeeping broke, which a device cannot cause.
                return Err(Error::UnknownTicket);
            };
            let outcome = if raw {
                Ok([u64::from(used.len), 0, 0, 0])
            } else {
                self.outcome(slot, id, opcode, used.len)
            };
            self.state[usize::from(slot)] = Slot::Done { id, outcome };
        }
        Ok(n)
    }

    /// Decodes a slot's response, trusting nothing the device wrote.
    fn outcome(&self, slot: u16, id: u64, opcode: u32, used_len: u32) -> Result<[u64; 4]> {
        if (used_len as usize) < Response::SIZE {
            return Err(Error::NoResponse { opcode, used_len });
        }
        let mut bytes = [0u8; Response::SIZE];
        self.slots.read(slot, RESPONSE_OFF, &mut bytes)?;
        let resp = Response::decode(&bytes).map_err(|_| Error::NoResponse { opcode, used_len })?;
        // Id 0 with an error status is the device saying it could not read our header
        // (docs/protocol.md, Response); any other stranger id is a device fault.
        let unreadable_header = resp.id == 0 && resp.status != Status::Ok as u32;
        if resp.id != id && !unreadable_header {
            return Err(Error::ResponseMismatch {
                expected: id,
                found: resp.id,
            });
        }
        match Status::from_u32(resp.status) {
            Some(Status::Ok) => Ok(resp.result),
            Some(status) => Err(Error::Device { opcode, status }),
            None => Err(Error::UnknownStatus {
                opcode,
                code: resp.status,
            }),
        }
    }

    fn check_ticket(&self, t: Ticket) -> Result<()> {
        match self.state.get(usize::from(t.slot)) {
            Some(Slot::Pending { id, .. } | Slot::Done { id, .. }) if *id == t.id => Ok(()),
            _ => Err(Error::UnknownTicket),
        }
    }

    /// The ticket's result if it completed, without waiting; frees it when it has.
    pub fn try_take(&mut self, t: Ticket) -> Result<Option<[u64; 4]>> {
        self.check_ticket(t)?;
        if let Slot::Pending { .. } = self.state[usize::from(t.slot)] {
            // The used entry and this request's response were written by the device's
            // core: ask for both lines before reading either.
            if self.broken {
                return Err(Error::Broken);
            }
            if !self.queue.has_used() {
                return Ok(None);
            }
            self.slots.prefetch(t.slot, RESPONSE_OFF);
            self.reap()?;
        }
        match self.state[usize::from(t.slot)] {
            Slot::Done { outcome, .. } => {
                self.release_slot(t.slot);
                self.prefetch_next(t.slot);
                outcome.map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The next request goes into the slot and the descriptors just freed (the tops of the
    /// free lists): their lines, which the device read last, are taken for writing now,
    /// while the program is still busy with the answer (docs/protocol.md, "Descriptors
    /// and slots").
    fn prefetch_next(&self, slot: u16) {
        self.slots.prefetch_write(slot, 0, 2);
        self.slots.prefetch_write(slot, RESPONSE_OFF, 1);
        self.queue.prefetch_next_add();
    }

    /// Waits for the ticket's completion and returns its result words (or the device's
    /// error status). On timeout, or when the device corrupts its used ring, the device is
    /// reset (requests we can no longer track might otherwise still use caller buffers)
    /// and the stream is broken for good.
    pub fn wait(&mut self, t: Ticket) -> Result<[u64; 4]> {
        self.check_ticket(t)?;
        let mut armed = false;
        let start = (self.opts.now_ns)();
        let r = self.wait_armed(t, start, &mut armed);
        if armed {
            self.queue.set_interrupts(false);
            if r.is_ok() {
                (self.opts.learn)((self.opts.now_ns)().saturating_sub(start));
            }
        }
        r
    }

    /// [`Self::wait`]'s loop from `start`; `armed` tells whether it asked the device for
    /// an interrupt.
    fn wait_armed(&mut self, t: Ticket, start: u64, armed: &mut bool) -> Result<[u64; 4]> {
        let mut polls: u32 = 0;
        let mut waited = 0;
        loop {
            if let Some(result) = self.try_take(t)? {
                return Ok(result);
            }
            polls = polls.wrapping_add(1);
            // Each poll of an armed wait is a sleep of its own: read the clock each time.
            if *armed || polls % CLOCK_STRIDE == 0 {
                waited = (self.opts.now_ns)().saturating_sub(start);
                if waited > self.opts.timeout_ns {
                    self.stop_device();
                    return Err(Error::Timeout);
                }
            }
            if !*armed && waited >= self.opts.wake_after_ns {
                // used_event must be visible before the used ring is read again (virtio
                // 1.x, 2.7.10): a completion after that read then interrupts.
                self.queue.set_interrupts(true);
                core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
                *armed = true;
                continue;
            }
            (self.opts.relax)(waited);
        }
    }

    /// Waits for every outstanding request; returns the first error among them (all are
    /// waited for regardless).
    pub fn wait_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        for slot in 0..self.capacity() {
            let ticket = match self.state[usize::from(slot)] {
                Slot::Pending { id, .. } | Slot::Done { id, .. } => Ticket { slot, id },
                Slot::Free => continue,
            };
            if let Err(e) = self.wait(ticket) {
                if self.broken {
                    return Err(e);
                }
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Enqueues, submits and waits: the synchronous form of a data-less request.
    pub fn call(&mut self, req: &Request) -> Result<[u64; 4]> {
        let t = self.enqueue(req)?;
        self.submit();
        self.wait(t)
    }

    /// A device that stops answering (or corrupts its ring) may still DMA into buffers
    /// the caller is about to reuse; a reset stops it for certain (virtio 1.x, 2.1.2).
    /// The stream is dead after.
    fn stop_device(&mut self) {
        self.transport.write32(reg::STATUS, 0);
        self.broken = true;
    }

    /// Waits for a `GET_INFO` ticket and decodes the `DeviceInfo` the device wrote into
    /// the slot (read before the slot can be reused: we hold `&mut self` throughout).
    /// Waits for a `GET_ATTRIBUTES` and reads its answer from the slot's info area.
    pub(crate) fn wait_attributes(&mut self, t: Ticket) -> Result<vgpu_proto::DeviceAttributes> {
        // The info area holds either answer.
        const _: () = assert!(vgpu_proto::DeviceAttributes::SIZE == DeviceInfo::SIZE);
        let slot = t.slot;
        self.wait(t)?;
        let mut bytes = [0u8; DeviceInfo::SIZE];
        self.slots.read(slot, INFO_OFF, &mut bytes)?;
        vgpu_proto::DeviceAttributes::decode(&bytes).map_err(|_| Error::NoResponse {
            opcode: Opcode::GetAttributes as u32,
            used_len: 0,
        })
    }

    /// Waits for an `ENCODE_TENSOR_MAP` and reads the descriptor from the slot's info area.
    pub(crate) fn wait_tensor_map(
        &mut self,
        t: Ticket,
    ) -> Result<[u8; vgpu_proto::TENSOR_MAP_BYTES]> {
        const _: () = assert!(vgpu_proto::TENSOR_MAP_BYTES <= DeviceInfo::SIZE);
        let slot = t.slot;
        self.wait(t)?;
        let mut bytes = [0u8; vgpu_proto::TENSOR_MAP_BYTES];
        self.slots.read(slot, INFO_OFF, &mut bytes)?;
        Ok(bytes)
    }

    /// Waits for a `GET_FUNCTION_LAYOUT`: its result words and the layout it wrote.
    pub(crate) fn wait_layout(&mut self, t: Ticket) -> Result<([u64; 4], vgpu_proto::ParamLayout)> {
        self.wait_layout_attributes(t)
            .map(|(r, layout, _)| (r, layout))
    }

    /// [`Self::wait_layout`] and the function's attributes, when the device wrote them
    /// (result[3] = their size).
    pub(crate) fn wait_layout_attributes(
        &mut self,
        t: Ticket,
    ) -> Result<(
        [u64; 4],
        vgpu_proto::ParamLayout,
        Option<vgpu_proto::FunctionAttributes>,
    )> {
        let slot = t.slot;
        let r = self.wait(t)?;
        let bad = || Error::NoResponse {
            opcode: Opcode::GetFunctionLayout as u32,
            used_len: 0,
        };
        let mut bytes = [0u8; LAYOUT_ANSWER];
        self.slots.read(slot, LAYOUT_OFF, &mut bytes)?;
        let layout = vgpu_proto::ParamLayout::decode(&bytes).map_err(|_| bad())?;
        let attrs = if r[3] == vgpu_proto::FunctionAttributes::SIZE as u64 {
            let rest = bytes.get(vgpu_proto::ParamLayout::SIZE..).ok_or_else(bad)?;
            Some(vgpu_proto::FunctionAttributes::decode(rest).map_err(|_| bad())?)
        } else {
            None
        };
        Ok((r, layout, attrs))
    }

    pub(crate) fn wait_info(&mut self, t: Ticket) -> Result<DeviceInfo> {
        let slot = t.slot;
        self.wait(t)?;
        let mut bytes = [0u8; DeviceInfo::SIZE];
        self.slots.read(slot, INFO_OFF, &mut bytes)?;
        DeviceInfo::decode(&bytes).map_err(|_| Error::NoResponse {
            opcode: Opcode::GetInfo as u32,
            used_len: 0,
        })
    }

    /// The opcode a ticket was issued for, for error messages.
    pub fn opcode_of(&self, t: Ticket) -> Option<Opcode> {
        match self.state.get(usize::from(t.slot)) {
            Some(Slot::Pending { id, opcode, .. }) if *id == t.id => Opcode::from_u32(*opcode),
            _ => None,
        }
    }

    pub(crate) fn transport(&self) -> &T {
        &self.transport
    }
}
