//! Modern (version 2) virtio-mmio device driver: probing, the initialisation sequence of
//! virtio 1.x 3.1.1, feature negotiation, queue activation, config space, interrupts.

use crate::error::{Error, Result};
use crate::queue::SplitQueue;
use crate::spec::{feature, interrupt, reg, status, MMIO_MAGIC, MMIO_VERSION_MODERN, MMIO_WINDOW};
use crate::transport::Transport;

/// Status reads while waiting for a reset to complete. Each read is a VM exit (~10 µs on
/// our nested KVM), so this is seconds of patience, not a busy loop forever.
const RESET_POLLS: u32 = 100_000;
/// Tries at a consistent config snapshot before giving up on a device that keeps changing it.
const CONFIG_RETRIES: u32 = 64;

pub struct VirtioMmio<T: Transport> {
    transport: T,
    device_id: u32,
    features: u64,
}

impl<T: Transport> VirtioMmio<T> {
    /// Checks that a modern virtio-mmio device sits behind `transport`.
    pub fn probe(transport: T) -> Result<Self> {
        let magic = transport.read32(reg::MAGIC);
        if magic != MMIO_MAGIC {
            return Err(Error::BadMagic(magic));
        }
        let version = transport.read32(reg::VERSION);
        if version != MMIO_VERSION_MODERN {
            return Err(Error::UnsupportedVersion(version));
        }
        let device_id = transport.read32(reg::DEVICE_ID);
        if device_id == 0 {
            return Err(Error::NoDevice);
        }
        Ok(VirtioMmio {
            transport,
            device_id,
            features: 0,
        })
    }

    /// As [`Self::probe`], and the device must be of kind `device_id`.
    pub fn probe_id(transport: T, device_id: u32) -> Result<Self> {
        let dev = Self::probe(transport)?;
        if dev.device_id != device_id {
            return Err(Error::WrongDevice {
                expected: device_id,
                found: dev.device_id,
            });
        }
        Ok(dev)
    }

    pub fn transport(&self) -> &T {
        &self.transport
    }

    pub fn device_id(&self) -> u32 {
        self.device_id
    }

    pub fn vendor_id(&self) -> u32 {
        self.transport.read32(reg::VENDOR_ID)
    }

    /// Features agreed with the device (0 before [`Self::negotiate`]).
    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn status(&self) -> u32 {
        self.transport.read32(reg::STATUS)
    }

    fn add_status(&self, bits: u32) {
        let cur = self.status();
        self.transport.write32(reg::STATUS, cur | bits);
    }

    /// Whether the device reported an unrecoverable error.
    pub fn needs_reset(&self) -> bool {
        self.status() & status::DEVICE_NEEDS_RESET != 0
    }

    /// Tells the device the driver gave up on it.
    pub fn set_failed(&self) {
        self.add_status(status::FAILED);
    }

    /// Resets the device and waits until it reports status 0 (all queues then stopped).
    pub fn reset(&mut self) -> Result<()> {
        self.transport.write32(reg::STATUS, 0);
        self.features = 0;
        for _ in 0..RESET_POLLS {
            if self.status() == 0 {
                return Ok(());
            }
            core::hint::spin_loop();
        }
        Err(Error::Timeout)
    }

    /// The first half of initialisation: reset, ACKNOWLEDGE, DRIVER, then feature
    /// negotiation. VERSION_1 is always required. Accepts what the device offers out of
    /// `required | optional`; fails (and marks the device FAILED) when a required feature
    /// is missing or the device refuses FEATURES_OK. Returns the accepted set.
    pub fn negotiate(&mut self, required: u64, optional: u64) -> Result<u64> {
        self.reset()?;
        self.add_status(status::ACKNOWLEDGE);
        self.add_status(status::DRIVER);
        let required = required | feature::VERSION_1;
        let offered = self.device_features();
        let missing = required & !offered;
        if missing != 0 {
            self.set_failed();
            return Err(Error::MissingFeatures(missing));
        }
        let accepted = offered & (required | optional);
        self.transport.write32(reg::DRIVER_FEATURES_SEL, 0);
        self.transport
            .write32(reg::DRIVER_FEATURES, accepted as u32);
        self.transport.write32(reg::DRIVER_FEATURES_SEL, 1);
        self.transport
            .write32(reg::DRIVER_FEATURES, (accepted >> 32) as u32);
        self.add_status(status::FEATURES_OK);
        if self.status() & status::FEATURES_OK == 0 {
            self.set_failed();
            return Err(Error::FeaturesRejected);
        }
        self.features = accepted;
        Ok(accepted)
    }

    /// The 64 feature bits the device offers.
    pub fn device_features(&self) -> u64 {
        self.transport.write32(reg::DEVICE_FEATURES_SEL, 0);
        let low = self.transport.read32(reg::DEVICE_FEATURES);
        self.transport.write32(reg::DEVICE_FEATURES_SEL, 1);
        let high = self.transport.read32(reg::DEVICE_FEATURES);
        (u64::from(high) << 32) | u64::from(low)
    }

    /// The largest size the device allows for queue `index` (0: no such queue).
    pub fn queue_max_size(&self, index: u16) -> u16 {
        self.transport.write32(reg::QUEUE_SEL, u32::from(index));
        // The spec caps split queues at 32768; clamp rather than trust a wider value.
        self.transport
            .read32(reg::QUEUE_NUM_MAX)
            .min(u32::from(crate::spec::ring::MAX_QUEUE_SIZE)) as u16
    }

    /// The largest power-of-two queue size the device allows for queue `index`, at most
    /// `limit`.
    pub fn pick_queue_size(&self, index: u16, limit: u16) -> Result<u16> {
        let max = self.queue_max_size(index).min(limit);
        if max == 0 {
            return Err(Error::QueueUnavailable(index));
        }
        // Largest power of two <= max.
        Ok(1 << (15 - max.leading_zeros()))
    }

    /// Hands queue `index` to the device: size, ring addresses, QueueReady. Call between
    /// [`Self::negotiate`] and [`Self::driver_ok`].
    pub fn activate_queue<const CAP: usize>(
        &mut self,
        index: u16,
        queue: &mut SplitQueue<CAP>,
    ) -> Result<()> {
        let t = &self.transport;
        t.write32(reg::QUEUE_SEL, u32::from(index));
        if t.read32(reg::QUEUE_READY) != 0 {
            return Err(Error::QueueAlreadyActive(index));
        }
        let max = t.read32(reg::QUEUE_NUM_MAX);
        if max == 0 {
            return Err(Error::QueueUnavailable(index));
        }
        if u32::from(queue.size()) > max {
            return Err(Error::BadQueueSize(queue.size()));
        }
        queue.set_event_idx(self.features & feature::RING_EVENT_IDX != 0);
        t.write32(reg::QUEUE_NUM, u32::from(queue.size()));
        write64(
            t,
            reg::QUEUE_DESC_LOW,
            reg::QUEUE_DESC_HIGH,
            queue.desc_addr(),
        );
        write64(
            t,
            reg::QUEUE_DRIVER_LOW,
            reg::QUEUE_DRIVER_HIGH,
            queue.driver_addr(),
        );
        write64(
            t,
            reg::QUEUE_DEVICE_LOW,
            reg::QUEUE_DEVICE_HIGH,
            queue.device_addr(),
        );
        t.write32(reg::QUEUE_READY, 1);
        Ok(())
    }

    /// Finishes initialisation; the device may process queues from now on.
    pub fn driver_ok(&mut self) -> Result<()> {
        self.add_status(status::DRIVER_OK);
        if self.needs_reset() {
            return Err(Error::DeviceNeedsReset);
        }
        Ok(())
    }

    /// Rings queue `index`'s doorbell.
    pub fn notify(&self, index: u16) {
        self.transport.write32(reg::QUEUE_NOTIFY, u32::from(index));
    }

    /// Publishes what was added to `queue` and rings the doorbell if the device wants it.
    /// Returns whether it rang.
    pub fn kick<const CAP: usize>(&self, index: u16, queue: &mut SplitQueue<CAP>) -> bool {
        let ring = queue.publish();
        if ring {
            self.notify(index);
        }
        ring
    }

    /// Pending interrupt causes (see [`crate::spec::interrupt`]).
    pub fn interrupt_status(&self) -> u32 {
        self.transport.read32(reg::INTERRUPT_STATUS)
    }

    /// Acknowledges interrupt causes so the device can lower the line.
    pub fn ack_interrupt(&self, bits: u32) {
        self.transport.write32(
            reg::INTERRUPT_ACK,
            bits & (interrupt::USED_BUFFER | interrupt::CONFIG_CHANGE),
        );
    }

    pub fn config_generation(&self) -> u32 {
        self.transport.read32(reg::CONFIG_GENERATION)
    }

    /// Reads `buf.len()` bytes of config space from `offset` as one consistent snapshot:
    /// re-read while the config generation changes (virtio 1.x, 2.5.1). Fields are read at
    /// their natural width when `offset` and length allow it.
    pub fn read_config(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let in_range = offset
            .checked_add(buf.len())
            .is_some_and(|end| end <= MMIO_WINDOW - reg::CONFIG);
        if !in_range {
            return Err(Error::ConfigOutOfRange {
                offset,
                len: buf.len(),
            });
        }
        for _ in 0..CONFIG_RETRIES {
            let before = self.config_generation();
            self.read_config_raw(offset, buf);
            if self.config_generation() == before {
                return Ok(());
            }
        }
        Err(Error::ConfigUnstable)
    }

    fn read_config_raw(&self, offset: usize, buf: &mut [u8]) {
        let t = &self.transport;
        let base = reg::CONFIG + offset;
        let mut i = 0;
        while i < buf.len() {
            let at = base + i;
            let left = buf.len() - i;
            if left >= 4 && at % 4 == 0 {
                buf[i..i + 4].copy_from_slice(&t.read32(at).to_le_bytes());
                i += 4;
            } else if left >= 2 && at % 2 == 0 {
                buf[i..i + 2].copy_from_slice(&t.read16(at).to_le_bytes());
                i += 2;
            } else {
                buf[i] = t.read8(at);
                i += 1;
            }
        }
    }

    /// A little-endian u32 config field.
    pub fn config_u32(&self, offset: usize) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read_config(offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A little-endian u64 config field (two 32-bit reads under one generation).
    pub fn config_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read_config(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

fn write64<T: Transport>(t: &T, low: usize, high: usize, value: u64) {
    t.write32(low, value as u32);
    t.write32(high, (value >> 32) as u32);
}
