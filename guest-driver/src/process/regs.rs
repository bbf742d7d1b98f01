//! The virtio-mmio register file of a vGPU reached over vhost-user, emulated in the
//! process: reads answer from what the handshake learned, writes are recorded, and the
//! status transitions become vhost-user messages (see the module docs of `process`).

use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

use super::{Table, QUEUE_MAX_SIZE, VHOST_USER_F_PROTOCOL_FEATURES};
use crate::spec::{reg, status, MMIO_MAGIC, MMIO_VERSION_MODERN};

/// Vendor id reported for the emulated device ("VGPU" would not fit the style of PCI ids;
/// virtio-mmio leaves it free).
const VENDOR_ID: u32 = 0x5647_5055;

/// What the driver wrote for one queue.
#[derive(Clone, Copy, Debug, Default)]
struct QueueRegs {
    num: u16,
    ready: bool,
    desc: u64,
    driver: u64,
    device: u64,
}

pub(super) struct Registers {
    frontend: Frontend,
    /// Device features offered to the driver (the protocol-features bit removed).
    features: u64,
    config: Vec<u8>,
    kick: Vec<EventFd>,
    call: Vec<EventFd>,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    status: u32,
    queue_sel: u32,
    queues: Vec<QueueRegs>,
    /// Rings handed to the worker (stopped on reset).
    started: Vec<usize>,
}

fn set_half(word: &mut u64, high: bool, value: u32) {
    if high {
        *word = (*word & 0xffff_ffff) | (u64::from(value) << 32);
    } else {
        *word = (*word & !0xffff_ffff) | u64::from(value);
    }
}

impl Registers {
    pub(super) fn new(
        frontend: Frontend,
        features: u64,
        config: Vec<u8>,
        kick: Vec<EventFd>,
        call: Vec<EventFd>,
    ) -> Self {
        let n = kick.len();
        Registers {
            frontend,
            features,
            config,
            kick,
            call,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            status: 0,
            queue_sel: 0,
            queues: vec![QueueRegs::default(); n],
            started: Vec::new(),
        }
    }

    pub(super) fn failed(&self) -> bool {
        self.status & status::DEVICE_NEEDS_RESET != 0
    }

    fn queue(&self) -> Option<&QueueRegs> {
        self.queues.get(self.queue_sel as usize)
    }

    fn queue_mut(&mut self) -> Option<&mut QueueRegs> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    pub(super) fn read32(&self, offset: usize) -> u32 {
        match offset {
            reg::MAGIC => MMIO_MAGIC,
            reg::VERSION => MMIO_VERSION_MODERN,
            reg::DEVICE_ID => vgpu_proto::VIRTIO_ID_VGPU,
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => self.features as u32,
                1 => (self.features >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => self.queue().map_or(0, |_| u32::from(QUEUE_MAX_SIZE)),
            reg::QUEUE_READY => self.queue().map_or(0, |q| u32::from(q.ready)),
            // Completions are polled; no interrupt is ever pending.
            reg::INTERRUPT_STATUS => 0,
            reg::STATUS => self.status,
            reg::CONFIG_GENERATION => 0,
            o if o >= reg::CONFIG => {
                let at = o - reg::CONFIG;
                let mut b = [0u8; 4];
                for (i, byte) in b.iter_mut().enumerate() {
                    *byte = self.config.get(at + i).copied().unwrap_or(0);
                }
                u32::from_le_bytes(b)
            }
            _ => 0,
        }
    }

    pub(super) fn write32(&mut self, offset: usize, value: u32, table: Option<Table>) {
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = value,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            reg::DRIVER_FEATURES => match self.driver_features_sel {
                0 => set_half(&mut self.driver_features, false, value),
                1 => set_half(&mut self.driver_features, true, value),
                _ => {}
            },
            reg::QUEUE_SEL => self.queue_sel = value,
            reg::QUEUE_NUM => {
                if let Some(q) = self.queue_mut() {
                    q.num = value.min(u32::from(QUEUE_MAX_SIZE)) as u16;
                }
            }
            reg::QUEUE_READY => {
                if let Some(q) = self.queue_mut() {
                    q.ready = value != 0;
                }
            }
            reg::QUEUE_DESC_LOW | reg::QUEUE_DESC_HIGH => {
                let high = offset == reg::QUEUE_DESC_HIGH;
                if let Some(q) = self.queue_mut() {
                    set_half(&mut q.desc, high, value);
                }
            }
            reg::QUEUE_DRIVER_LOW | reg::QUEUE_DRIVER_HIGH => {
                let high = offset == reg::QUEUE_DRIVER_HIGH;
                if let Some(q) = self.queue_mut() {
                    set_half(&mut q.driver, high, value);
                }
            }
            reg::QUEUE_DEVICE_LOW | reg::QUEUE_DEVICE_HIGH => {
                let high = offset == reg::QUEUE_DEVICE_HIGH;
                if let Some(q) = self.queue_mut() {
                    set_half(&mut q.device, high, value);
                }
            }
            reg::STATUS => self.write_status(value, table.unwrap_or_default()),
            _ => tracing::debug!(offset, value, "register write ignored"),
        }
    }

    fn write_status(&mut self, value: u32, table: Table) {
        if value == 0 {
            self.reset();
            return;
        }
        let fresh = value & !self.status;
        let mut value = value;
        if fresh & status::FEATURES_OK != 0 && self.driver_features & !self.features != 0 {
            tracing::warn!(
                driver = format_args!("{:#x}", self.driver_features),
                device = format_args!("{:#x}", self.features),
                "the driver accepted features the device does not offer"
            );
            value &= !status::FEATURES_OK;
        }
        if fresh & status::DRIVER_OK != 0 {
            if let Err(e) = self.activate(&table) {
                tracing::warn!("the worker refused the device setup: {e}");
                value |= status::DEVICE_NEEDS_RESET;
            }
        }
        self.status = value;
    }

    /// Stops every started ring; the worker keeps its memory table until the next one.
    fn reset(&mut self) {
        for q in std::mem::take(&mut self.started) {
            if let Err(e) = self.frontend.get_vring_base(q) {
                tracing::debug!(queue = q, "stopping the ring failed: {e}");
            }
        }
        self.status = 0;
        self.driver_features = 0;
        self.queues.fill(QueueRegs::default());
    }

    /// DRIVER_OK: features, memory table and every ready ring to the worker.
    fn activate(&mut self, table: &Table) -> Result<(), vhost::Error> {
        self.frontend
            .set_features(self.driver_features | VHOST_USER_F_PROTOCOL_FEATURES)?;
        self.frontend.set_mem_table(&table.regions)?;
        for (i, q) in self.queues.clone().into_iter().enumerate() {
            if !q.ready {
                continue;
            }
            let hva = |gpa| table.hva(gpa).ok_or(vhost::Error::InvalidGuestMemory);
            self.frontend.set_vring_num(i, q.num)?;
            let config = VringConfigData {
                queue_max_size: QUEUE_MAX_SIZE,
                queue_size: q.num,
                flags: 0,
                desc_table_addr: hva(q.desc)?,
                used_ring_addr: hva(q.device)?,
                avail_ring_addr: hva(q.driver)?,
                log_addr: None,
            };
            self.frontend.set_vring_addr(i, &config)?;
            self.frontend.set_vring_base(i, 0)?;
            self.frontend.set_vring_call(i, &self.call[i])?;
            self.frontend.set_vring_kick(i, &self.kick[i])?;
            // With protocol features, rings start disabled (vhost-user spec).
            self.frontend.set_vring_enable(i, true)?;
            self.started.push(i);
        }
        Ok(())
    }

    /// The pool grew: sends the new table if the worker already has one.
    pub(super) fn update_memory(&mut self, table: Table) {
        if self.status & status::DRIVER_OK == 0 {
            return;
        }
        if let Err(e) = self.frontend.set_mem_table(&table.regions) {
            tracing::warn!("the worker refused the grown memory table: {e}");
            self.status |= status::DEVICE_NEEDS_RESET;
        }
    }
}
