//! The driver side of a split virtqueue: descriptor allocation, publishing chains, the
//! notification decision, and reaping used entries without trusting what the device wrote.

use core::sync::atomic::{fence, Ordering};

use crate::error::{Error, Result};
use crate::ring::{Layout, Ring};
use crate::spec::ring::{
    AVAIL_F_NO_INTERRUPT, DESC_F_NEXT, DESC_F_WRITE, MAX_QUEUE_SIZE, USED_F_NO_NOTIFY,
};
use crate::transport::{DmaRegion, Transport};

/// Default compile-time bound on a queue's size; it sizes the driver's private
/// per-descriptor bookkeeping, so no allocator is needed.
pub const DEFAULT_CAPACITY: usize = 256;

/// Ring memory alignment asked of the transport: a page, as vhost-user backends map it.
pub const RING_ALIGN: usize = 4096;

/// One buffer of a chain, by device address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub addr: u64,
    pub len: u32,
    /// Device-writable (the device fills it) rather than device-readable.
    pub writable: bool,
}

impl Buffer {
    pub fn readable(addr: u64, len: u32) -> Self {
        Buffer {
            addr,
            len,
            writable: false,
        }
    }

    pub fn writable(addr: u64, len: u32) -> Self {
        Buffer {
            addr,
            len,
            writable: true,
        }
    }
}

/// Names an outstanding chain: the index of its head descriptor, below the queue size,
/// so callers can use it to index their own per-request state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(u16);

impl Token {
    pub fn index(self) -> u16 {
        self.0
    }
}

/// A chain the device finished with, and how many bytes it says it wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Used {
    pub token: Token,
    pub len: u32,
}

/// Driver-private state of a head descriptor; never shared with the device.
#[derive(Clone, Copy, Debug)]
struct Slot {
    chain_len: u16,
    writable: u32,
    in_flight: bool,
}

impl Slot {
    const FREE: Slot = Slot {
        chain_len: 0,
        writable: 0,
        in_flight: false,
    };
}

/// A split virtqueue of up to `CAP` entries in caller-provided DMA memory.
pub struct SplitQueue<const CAP: usize = DEFAULT_CAPACITY> {
    mem: DmaRegion,
    ring: Ring,
    size: u16,
    event_idx: bool,
    interrupts: bool,
    /// used_event as last written (EVENT_IDX).
    used_event: u16,
    /// Free list and chain links, mirrored here so the device cannot redirect them.
    next: [u16; CAP],
    slots: [Slot; CAP],
    free_head: u16,
    num_free: u16,
    /// Next avail index to fill; runs ahead of `published` until `publish`.
    avail_idx: u16,
    /// avail.idx as last written to the ring.
    published: u16,
    /// Next used index to reap.
    last_used: u16,
}

// SAFETY: the queue exclusively owns its DMA region (DmaRegion::new's contract) and holds
// no thread-affine state, so moving it to another thread is sound.
unsafe impl<const CAP: usize> Send for SplitQueue<CAP> {}

impl<const CAP: usize> SplitQueue<CAP> {
    /// Bytes of DMA memory a queue of `size` entries needs.
    pub const fn memory_size(size: u16) -> usize {
        Layout::new(size).total
    }

    /// Lays a queue of `size` entries (a power of two, at most CAP) over `mem`, which must
    /// be at least [`Self::memory_size`] bytes and 16-byte aligned at both addresses.
    pub fn new(mem: DmaRegion, size: u16) -> Result<Self> {
        if size == 0 || !size.is_power_of_two() || usize::from(size) > CAP || size > MAX_QUEUE_SIZE
        {
            return Err(Error::BadQueueSize(size));
        }
        if mem.len() < Self::memory_size(size)
            || mem.phys() % 16 != 0
            || (mem.virt().as_ptr() as usize) % 16 != 0
        {
            return Err(Error::BadQueueMemory);
        }
        // SAFETY: DmaRegion guarantees virt is valid and unaliased for mem.len() bytes,
        // which covers the layout (checked above); alignment checked above; size is a
        // non-zero power of two. The queue keeps `mem` alive as long as `ring`.
        let ring = unsafe { Ring::new(mem.virt(), size) };
        ring.zero();
        let mut next = [0u16; CAP];
        for (i, n) in next.iter_mut().enumerate().take(usize::from(size)) {
            // i + 1 <= size <= 32768 fits in u16.
            *n = (i + 1) as u16;
        }
        Ok(SplitQueue {
            mem,
            ring,
            size,
            event_idx: false,
            interrupts: true,
            used_event: 0,
            next,
            slots: [Slot::FREE; CAP],
            free_head: 0,
            num_free: size,
            avail_idx: 0,
            published: 0,
            last_used: 0,
        })
    }

    /// Allocates the ring memory from the transport and lays a queue over it.
    pub fn allocate<T: Transport>(transport: &T, size: u16) -> Result<Self> {
        if size == 0 || usize::from(size) > CAP {
            return Err(Error::BadQueueSize(size));
        }
        let mem = transport.dma_alloc(Self::memory_size(size), RING_ALIGN)?;
        Self::new(mem, size)
    }

    /// Gives back the ring memory (to free it once the device's queue is reset).
    pub fn into_region(self) -> DmaRegion {
        self.mem
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// Device address of the descriptor table (QueueDesc).
    pub fn desc_addr(&self) -> u64 {
        self.mem.phys()
    }

    /// Device address of the driver (available) ring (QueueDriver).
    pub fn driver_addr(&self) -> u64 {
        self.mem.phys() + self.ring.layout().avail as u64
    }

    /// Device address of the device (used) ring (QueueDevice).
    pub fn device_addr(&self) -> u64 {
        self.mem.phys() + self.ring.layout().used as u64
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    /// Chains added and not yet reaped.
    pub fn outstanding(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.last_used)
    }

    /// Whether VIRTIO_F_RING_EVENT_IDX was negotiated; set by the device driver when it
    /// activates the queue.
    pub(crate) fn set_event_idx(&mut self, on: bool) {
        self.event_idx = on;
        self.apply_interrupt_suppression();
    }

    /// Asks the device for (or spares it) used-buffer interrupts. Polling drivers turn
    /// them off so the device skips the irqfd write per completion.
    pub fn set_interrupts(&mut self, on: bool) {
        self.interrupts = on;
        self.apply_interrupt_suppression();
    }

    fn apply_interrupt_suppression(&mut self) {
        if self.event_idx {
            // With EVENT_IDX, flags must stay 0 (virtio 1.x, 2.7.7.1); used_event says when
            // to interrupt instead. Half the index space ahead is never reached while fewer
            // than `size` chains are outstanding, and pop_used keeps pushing it ahead.
            self.ring.set_avail_flags(0);
            self.write_used_event();
        } else {
            let flags = if self.interrupts {
                0
            } else {
                AVAIL_F_NO_INTERRUPT
            };
            self.ring.set_avail_flags(flags);
        }
    }

    fn write_used_event(&mut self) {
        self.used_event = self.used_event_target();
        self.ring.set_used_event(self.used_event);
    }

    /// With interrupts off, whether used_event is less than a quarter of the index space
    /// ahead of the next used index, and due to be pushed ahead again. Until then it is
    /// left alone: the device reads it after every completion, and a line the driver
    /// writes for each request would move between the two sides' cores each time. A
    /// quarter of the index space is still far more than the `size` chains that can be
    /// outstanding, so the device's index never reaches it.
    fn used_event_near(&self) -> bool {
        self.used_event.wrapping_sub(self.last_used) < 0x4000
    }

    fn used_event_target(&self) -> u16 {
        if self.interrupts {
            self.last_used
        } else {
            self.last_used.wrapping_add(0x8000)
        }
    }

    /// Puts a chain on the driver ring (not yet visible to the device: see
    /// [`Self::publish`]). Readable buffers must precede writable ones.
    pub fn add(&mut self, buffers: &[Buffer]) -> Result<Token> {
        let n = buffers.len();
        if n == 0 {
            return Err(Error::EmptyChain);
        }
        if n > usize::from(self.num_free) {
            return Err(Error::QueueFull);
        }
        let mut writable: u32 = 0;
        let mut seen_writable = false;
        for b in buffers {
            if b.writable {
                seen_writable = true;
                writable = writable.checked_add(b.len).ok_or(Error::BufferTooLarge)?;
            } else if seen_writable {
                return Err(Error::BadChainOrder);
            }
        }

        let head = self.free_head;
        let mut idx = head;
        for (i, b) in buffers.iter().enumerate() {
            let last = i + 1 == n;
            let link = self.next[usize::from(idx)];
            let mut flags = if b.writable { DESC_F_WRITE } else { 0 };
            if !last {
                flags |= DESC_F_NEXT;
            }
            self.ring
                .write_desc(idx, b.addr, b.len, flags, if last { 0 } else { link });
            if !last {
                idx = link;
            }
        }
        self.free_head = self.next[usize::from(idx)];
        // n <= num_free <= size, so it fits in u16.
        self.num_free -= n as u16;
        self.slots[usize::from(head)] = Slot {
            chain_len: n as u16,
            writable,
            in_flight: true,
        };
        self.ring.set_avail_entry(self.avail_idx, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Ok(Token(head))
    }

    /// Makes every added chain visible to the device and says whether it must be notified
    /// (honouring VRING_USED_F_NO_NOTIFY or, with EVENT_IDX, avail_event). Call once per
    /// batch: one doorbell for many chains.
    pub fn publish(&mut self) -> bool {
        let old = self.published;
        let new = self.avail_idx;
        if old == new {
            return false;
        }
        // Descriptors and ring entries must be visible before the index that exposes them.
        fence(Ordering::Release);
        self.ring.set_avail_idx(new);
        self.published = new;
        // The index store must be visible before we read the device's suppression state,
        // or we could miss a device that just re-enabled notifications (store-load order,
        // a full fence even on x86).
        fence(Ordering::SeqCst);
        if self.event_idx {
            need_event(self.ring.avail_event(), new, old)
        } else {
            self.ring.used_flags() & USED_F_NO_NOTIFY == 0
        }
    }

    /// Takes for writing the lines the next [`Self::add`] is likely to write (the head of
    /// the free list and the next available entry): the device read them last.
    pub fn prefetch_next_add(&self) {
        self.ring.prefetch_post(self.free_head, self.avail_idx);
    }

    /// Whether the device has used entries not yet reaped (cheap: one ring read); when it
    /// has, the next entry's line is asked for, since reaping reads it next.
    pub fn has_used(&self) -> bool {
        let more = self.ring.used_idx() != self.last_used;
        if more {
            self.ring.prefetch_used_entry(self.last_used);
        }
        more
    }

    /// Reaps one used entry, if any. Entries may complete out of order. A used id that is
    /// not an outstanding head, or a used index that runs ahead of what was published, is
    /// reported as an error and never followed.
    pub fn pop_used(&mut self) -> Result<Option<Used>> {
        let device_idx = self.ring.used_idx();
        if device_idx == self.last_used {
            return Ok(None);
        }
        if device_idx.wrapping_sub(self.last_used) > self.published.wrapping_sub(self.last_used) {
            return Err(Error::BadUsedIndex {
                last_seen: self.last_used,
                device: device_idx,
            });
        }
        // The entry must be read after the index that announced it.
        fence(Ordering::Acquire);
        let (id, len) = self.ring.used_entry(self.last_used);
        // Consumed whatever it holds: a bogus entry must not wedge the queue forever.
        self.last_used = self.last_used.wrapping_add(1);
        if self.event_idx && (self.interrupts || self.used_event_near()) {
            self.write_used_event();
        }

        let head = u16::try_from(id)
            .ok()
            .filter(|&h| h < self.size && self.slots[usize::from(h)].in_flight)
            .ok_or(Error::BadUsedId(id))?;
        let slot = self.slots[usize::from(head)];
        self.free_chain(head, slot.chain_len);
        if len > slot.writable {
            return Err(Error::UsedLenTooLarge {
                token: head,
                len,
                writable: slot.writable,
            });
        }
        Ok(Some(Used {
            token: Token(head),
            len,
        }))
    }

    /// Returns a chain's descriptors to the free list, following the private links.
    fn free_chain(&mut self, head: u16, chain_len: u16) {
        self.slots[usize::from(head)] = Slot::FREE;
        let mut tail = head;
        for _ in 1..chain_len {
            tail = self.next[usize::from(tail)];
        }
        self.next[usize::from(tail)] = self.free_head;
        self.free_head = head;
        self.num_free += chain_len;
    }
}

/// vring_need_event (virtio 1.x, 2.7.10): whether `new - old` newly published entries
/// cross the device's `event` index.
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}
