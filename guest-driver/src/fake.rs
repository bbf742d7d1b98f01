//! A model of a virtio-mmio device for the unit tests: registers behind a [`Transport`],
//! and a device side that reads the rings from (host) memory the way a backend would.
//! DMA addresses are host virtual addresses, i.e. an identity map as in payloads.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

use crate::error::{Error, Result};
use crate::spec::{reg, ring, status, MMIO_MAGIC};
use crate::transport::{DmaRegion, Transport};

#[derive(Default, Clone, Debug)]
pub struct FakeQueue {
    pub max: u32,
    pub num: u32,
    pub ready: u32,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
    /// Device-side cursor into the avail ring.
    pub last_avail: u16,
    pub used_idx: u16,
}

/// Runs when the driver writes QueueNotify (a device model serving the queue at once).
pub type NotifyHook = Box<dyn FnMut(&mut FakeDevice, u32)>;

pub struct FakeDevice {
    pub magic: u32,
    pub version: u32,
    pub device_id: u32,
    pub device_features: u64,
    /// Clears FEATURES_OK when the driver sets it.
    pub reject_features: bool,
    pub driver_features: u64,
    dev_sel: u32,
    drv_sel: u32,
    pub status: u32,
    pub status_writes: Vec<u32>,
    queue_sel: u32,
    pub queues: Vec<FakeQueue>,
    pub notifies: Vec<u32>,
    pub config: Vec<u8>,
    pub generation: u32,
    /// Config reads left that bump the generation (a device updating its config).
    pub generation_bumps: u32,
    pub interrupt_status: u32,
    pub acked: u32,
    pub on_notify: Option<NotifyHook>,
}

impl FakeDevice {
    pub fn new(device_features: u64, queue_max: u32) -> Self {
        FakeDevice {
            magic: MMIO_MAGIC,
            version: 2,
            device_id: 0x30,
            device_features,
            reject_features: false,
            driver_features: 0,
            dev_sel: 0,
            drv_sel: 0,
            status: 0,
            status_writes: Vec::new(),
            queue_sel: 0,
            queues: vec![
                FakeQueue {
                    max: queue_max,
                    ..Default::default()
                };
                4
            ],
            notifies: Vec::new(),
            config: (0u8..=255).collect(),
            generation: 0,
            generation_bumps: 0,
            interrupt_status: 0,
            acked: 0,
            on_notify: None,
        }
    }

    fn sel(&mut self) -> Option<&mut FakeQueue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn read(&mut self, off: usize) -> u32 {
        match off {
            reg::MAGIC => self.magic,
            reg::VERSION => self.version,
            reg::DEVICE_ID => self.device_id,
            reg::VENDOR_ID => 0x5547_5056,
            reg::DEVICE_FEATURES => match self.dev_sel {
                0 => self.device_features as u32,
                1 => (self.device_features >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => self.sel().map_or(0, |q| q.max),
            reg::QUEUE_READY => self.sel().map_or(0, |q| q.ready),
            reg::INTERRUPT_STATUS => self.interrupt_status,
            reg::STATUS => self.status,
            reg::CONFIG_GENERATION => self.generation,
            o if o >= reg::CONFIG => {
                if self.generation_bumps > 0 {
                    self.generation_bumps -= 1;
                    self.generation += 1;
                }
                let i = o - reg::CONFIG;
                let b = |k: usize| u32::from(self.config.get(i + k).copied().unwrap_or(0));
                b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24
            }
            _ => 0,
        }
    }

    fn write(&mut self, off: usize, v: u32) {
        let set_half = |cur: u64, sel: u32, v: u32| match sel {
            0 => (cur & !0xffff_ffff) | u64::from(v),
            1 => (cur & 0xffff_ffff) | (u64::from(v) << 32),
            _ => cur,
        };
        match off {
            reg::DEVICE_FEATURES_SEL => self.dev_sel = v,
            reg::DRIVER_FEATURES_SEL => self.drv_sel = v,
            reg::DRIVER_FEATURES => {
                self.driver_features = set_half(self.driver_features, self.drv_sel, v)
            }
            reg::QUEUE_SEL => self.queue_sel = v,
            reg::QUEUE_NUM => self.sel().into_iter().for_each(|q| q.num = v),
            reg::QUEUE_READY => self.sel().into_iter().for_each(|q| q.ready = v),
            reg::QUEUE_DESC_LOW | reg::QUEUE_DESC_HIGH => {
                let half = u32::from(off == reg::QUEUE_DESC_HIGH);
                self.sel()
                    .into_iter()
                    .for_each(|q| q.desc = set_half(q.desc, half, v))
            }
            reg::QUEUE_DRIVER_LOW | reg::QUEUE_DRIVER_HIGH => {
                let half = u32::from(off == reg::QUEUE_DRIVER_HIGH);
                self.sel()
                    .into_iter()
                    .for_each(|q| q.driver = set_half(q.driver, half, v))
            }
            reg::QUEUE_DEVICE_LOW | reg::QUEUE_DEVICE_HIGH => {
                let half = u32::from(off == reg::QUEUE_DEVICE_HIGH);
                self.sel()
                    .into_iter()
                    .for_each(|q| q.device = set_half(q.device, half, v))
            }
            reg::QUEUE_NOTIFY => {
                self.notifies.push(v);
                if let Some(mut hook) = self.on_notify.take() {
                    hook(self, v);
                    self.on_notify = Some(hook);
                }
            }
            reg::INTERRUPT_ACK => {
                self.acked |= v;
                self.interrupt_status &= !v;
            }
            reg::STATUS => {
                self.status_writes.push(v);
                if v == 0 {
                    self.status = 0;
                    self.driver_features = 0;
                    for q in &mut self.queues {
                        *q = FakeQueue {
                            max: q.max,
                            ..Default::default()
                        };
                    }
                } else if v & status::FEATURES_OK != 0 && self.reject_features {
                    self.status = v & !status::FEATURES_OK;
                } else {
                    self.status = v;
                }
            }
            _ => {}
        }
    }
}

fn rd<T: Copy>(addr: u64) -> T {
    // SAFETY: test-only; addr comes from queue registers the driver under test programmed
    // with addresses of live, suitably aligned ring memory or test buffers.
    unsafe { std::ptr::read_volatile(addr as *const T) }
}

fn wr<T: Copy>(addr: u64, v: T) {
    // SAFETY: as for rd.
    unsafe { std::ptr::write_volatile(addr as *mut T, v) }
}

/// Bytes of guest memory, as the device reads them.
pub fn read_bytes(addr: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| rd::<u8>(addr + i)).collect()
}

/// Writes guest memory, as the device does.
pub fn write_bytes(addr: u64, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        wr(addr + i as u64, *b);
    }
}

/// One descriptor as the device sees it.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

impl FakeDevice {
    fn queue(&self, q: usize) -> FakeQueue {
        self.queues[q].clone()
    }

    pub fn desc(&self, q: usize, i: u16) -> Desc {
        let base = self.queue(q).desc + 16 * u64::from(i);
        Desc {
            addr: rd(base),
            len: rd(base + 8),
            flags: rd(base + 12),
            next: rd(base + 14),
        }
    }

    /// The chain starting at `head`.
    pub fn chain(&self, q: usize, head: u16) -> Vec<Desc> {
        let mut out = vec![self.desc(q, head)];
        while out.last().is_some_and(|d| d.flags & ring::DESC_F_NEXT != 0) {
            let next = out.last().map_or(0, |d| d.next);
            out.push(self.desc(q, next));
        }
        out
    }

    pub fn avail_idx(&self, q: usize) -> u16 {
        rd(self.queue(q).driver + 2)
    }

    pub fn avail_flags(&self, q: usize) -> u16 {
        rd(self.queue(q).driver)
    }

    pub fn used_event(&self, q: usize) -> u16 {
        let fq = self.queue(q);
        rd(fq.driver + 4 + 2 * u64::from(fq.num))
    }

    pub fn set_avail_event(&self, q: usize, v: u16) {
        let fq = self.queue(q);
        wr(fq.device + 4 + 8 * u64::from(fq.num), v);
    }

    pub fn set_used_flags(&self, q: usize, v: u16) {
        wr(self.queue(q).device, v);
    }

    /// Heads the driver published since the last call.
    pub fn take_avail(&mut self, q: usize) -> Vec<u16> {
        let fq = self.queue(q);
        let end = self.avail_idx(q);
        let mut heads = Vec::new();
        let mut i = fq.last_avail;
        while i != end {
            let slot = u64::from(i) % u64::from(fq.num);
            heads.push(rd(fq.driver + 4 + 2 * slot));
            i = i.wrapping_add(1);
        }
        self.queues[q].last_avail = end;
        heads
    }

    /// Appends a used entry verbatim (the test decides whether it is sane).
    pub fn push_used(&mut self, q: usize, id: u32, len: u32) {
        let fq = self.queue(q);
        let slot = u64::from(fq.used_idx) % u64::from(fq.num);
        let elem = fq.device + 4 + 8 * slot;
        wr(elem, id);
        wr(elem + 4, len);
        let idx = fq.used_idx.wrapping_add(1);
        wr(fq.device + 2, idx);
        self.queues[q].used_idx = idx;
        self.interrupt_status |= 1;
    }

    /// The echo backend: copies each chain's readable bytes into its writable buffers.
    /// Returns the number of chains completed.
    pub fn echo(&mut self, q: usize) -> usize {
        let heads = self.take_avail(q);
        for &head in &heads {
            let chain = self.chain(q, head);
            let mut data = Vec::new();
            for d in chain.iter().filter(|d| d.flags & ring::DESC_F_WRITE == 0) {
                for k in 0..u64::from(d.len) {
                    data.push(rd::<u8>(d.addr + k));
                }
            }
            let mut written = 0usize;
            for d in chain.iter().filter(|d| d.flags & ring::DESC_F_WRITE != 0) {
                for k in 0..d.len as usize {
                    if let Some(&b) = data.get(written) {
                        wr(d.addr + k as u64, b);
                        written += 1;
                    }
                }
            }
            self.push_used(q, u32::from(head), written as u32);
        }
        heads.len()
    }
}

/// Registers of a shared [`FakeDevice`], and DMA memory from the host heap.
#[derive(Clone)]
pub struct FakeTransport {
    pub dev: Rc<RefCell<FakeDevice>>,
    allocs: Rc<RefCell<Vec<(usize, Layout)>>>,
}

impl FakeTransport {
    pub fn new(dev: FakeDevice) -> Self {
        FakeTransport {
            dev: Rc::new(RefCell::new(dev)),
            allocs: Rc::default(),
        }
    }

    pub fn live_allocations(&self) -> usize {
        self.allocs.borrow().len()
    }
}

impl Transport for FakeTransport {
    fn read8(&self, offset: usize) -> u8 {
        self.dev.borrow_mut().read(offset) as u8
    }
    fn read16(&self, offset: usize) -> u16 {
        self.dev.borrow_mut().read(offset) as u16
    }
    fn read32(&self, offset: usize) -> u32 {
        self.dev.borrow_mut().read(offset)
    }
    fn write8(&self, offset: usize, value: u8) {
        self.dev.borrow_mut().write(offset, value.into())
    }
    fn write16(&self, offset: usize, value: u16) {
        self.dev.borrow_mut().write(offset, value.into())
    }
    fn write32(&self, offset: usize, value: u32) {
        self.dev.borrow_mut().write(offset, value)
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Result<DmaRegion> {
        let layout =
            Layout::from_size_align(len.max(1), align).map_err(|_| Error::OutOfDmaMemory)?;
        // SAFETY: layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(Error::OutOfDmaMemory)?;
        self.allocs
            .borrow_mut()
            .push((ptr.as_ptr() as usize, layout));
        // SAFETY: freshly allocated, len bytes, owned by the region until dma_free; the
        // "device" addresses host memory directly.
        Ok(unsafe { DmaRegion::new(ptr, ptr.as_ptr() as u64, len) })
    }

    unsafe fn dma_free(&self, region: DmaRegion) {
        let addr = region.virt().as_ptr() as usize;
        let mut allocs = self.allocs.borrow_mut();
        if let Some(pos) = allocs.iter().position(|&(a, _)| a == addr) {
            let (_, layout) = allocs.swap_remove(pos);
            // SAFETY: addr was returned by alloc_zeroed with this layout and is freed once,
            // since its record is removed here.
            unsafe { dealloc(addr as *mut u8, layout) }
        }
    }

    fn virt_to_phys(&self, ptr: *const u8) -> Result<u64> {
        Ok(ptr as u64)
    }
}
