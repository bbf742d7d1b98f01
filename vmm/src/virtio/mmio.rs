//! The virtio-mmio transport, version 2 (virtio 1.x, 4.2.2): the register state machine
//! in front of any `VirtioDevice`. The guest drives it with 32-bit accesses; anything else
//! is refused and logged, never trusted.

use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::status::*;
use super::{Interrupt, QueueConfig, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::devices::bus::BusDevice;

mod state;
pub use state::TransportRestoreError;

pub const MAGIC: u32 = 0x7472_6976; // "virt"
pub const VERSION: u32 = 2;
pub const VENDOR_ID: u32 = 0x5550_4756; // "VGPU"

pub mod reg {
    pub const MAGIC: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const SHM_SEL: u64 = 0x0ac;
    pub const SHM_LEN_LOW: u64 = 0x0b0;
    pub const SHM_LEN_HIGH: u64 = 0x0b4;
    pub const SHM_BASE_LOW: u64 = 0x0b8;
    pub const SHM_BASE_HIGH: u64 = 0x0bc;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    pub const CONFIG: u64 = 0x100;
}

#[derive(Clone, Copy, Debug, Default)]
struct QueueState {
    max: u16,
    size: u16,
    ready: bool,
    desc: u64,
    driver: u64,
    device: u64,
}

/// A virtio device on the MMIO bus.
pub struct MmioTransport<D: VirtioDevice> {
    device: D,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    queues: Vec<QueueState>,
    active: bool,
}

impl<D: VirtioDevice> MmioTransport<D> {
    pub fn new(device: D, mem: GuestMemoryMmap, interrupt: Arc<Interrupt>) -> Self {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max| QueueState {
                max,
                ..Default::default()
            })
            .collect();
        Self {
            device,
            mem,
            interrupt,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            queues,
            active: false,
        }
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    pub fn status(&self) -> u32 {
        self.status
            | if self.device.needs_reset() {
                DEVICE_NEEDS_RESET
            } else {
                0
            }
    }

    fn selected(&mut self) -> Option<&mut QueueState> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue registers are the driver's only between FEATURES_OK and DRIVER_OK.
    fn queue_writable(&self) -> bool {
        self.status & FEATURES_OK != 0 && self.status & DRIVER_OK == 0
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        match offset {
            reg::MAGIC => MAGIC,
            reg::VERSION => VERSION,
            reg::DEVICE_ID => self.device.device_type(),
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => self.selected().map_or(0, |q| u32::from(q.max)),
            reg::QUEUE_READY => self.selected().map_or(0, |q| u32::from(q.ready)),
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.status(),
            // No shared memory regions: a length of all ones says "absent".
            reg::SHM_LEN_LOW | reg::SHM_LEN_HIGH => u32::MAX,
            reg::SHM_BASE_LOW | reg::SHM_BASE_HIGH => u32::MAX,
            reg::CONFIG_GENERATION => self.device.config_generation(),
            _ => {
                tracing::debug!(
                    offset,
                    "virtio-mmio read of an unknown or write-only register"
                );
                0
            }
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        let queue_ok = self.queue_writable();
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = v,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            reg::DRIVER_FEATURES => {
                if self.status & (FEATURES_OK | DRIVER_OK) != 0 || self.status & DRIVER == 0 {
                    tracing::debug!("driver features written outside feature negotiation");
                    return;
                }
                match self.driver_features_sel {
                    0 => {
                        self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(v)
                    }
                    1 => {
                        self.driver_features =
                            (self.driver_features & 0xffff_ffff) | (u64::from(v) << 32)
                    }
                    _ => {}
                }
            }
            reg::QUEUE_SEL => self.queue_sel = v,
            reg::QUEUE_NUM if queue_ok => {
                if let Some(q) = self.selected() {
                    q.size = u16::try_from(v).unwrap_or(0);
                }
            }
            reg::QUEUE_READY if queue_ok => {
                if let Some(q) = self.selected() {
                    q.ready = v == 1;
                }
            }
            reg::QUEUE_DESC_LOW if queue_ok => self.set_addr(|q| &mut q.desc, v, false),
            reg::QUEUE_DESC_HIGH if queue_ok => self.set_addr(|q| &mut q.desc, v, true),
            reg::QUEUE_DRIVER_LOW if queue_ok => self.set_addr(|q| &mut q.driver, v, false),
            reg::QUEUE_DRIVER_HIGH if queue_ok => self.set_addr(|q| &mut q.driver, v, true),
            reg::QUEUE_DEVICE_LOW if queue_ok => self.set_addr(|q| &mut q.device, v, false),
            reg::QUEUE_DEVICE_HIGH if queue_ok => self.set_addr(|q| &mut q.device, v, true),
            // Notifications normally go to the ioeventfd and never reach here; one that
            // does (no ioeventfd, or before activation) has nothing to wake.
            reg::QUEUE_NOTIFY => tracing::trace!(queue = v, "queue notify through the vmm"),
            reg::INTERRUPT_ACK => self.interrupt.ack(v),
            reg::STATUS => self.set_status(v),
            reg::SHM_SEL => {}
            _ => tracing::debug!(
                offset,
                v,
                "virtio-mmio write ignored (unknown register or wrong state)"
            ),
        }
    }

    fn set_addr(&mut self, field: impl Fn(&mut QueueState) -> &mut u64, v: u32, high: bool) {
        if let Some(q) = self.selected() {
            let f = field(q);
            *f = if high {
                (*f & 0xffff_ffff) | (u64::from(v) << 32)
            } else {
                (*f & !0xffff_ffff) | u64::from(v)
            };
        }
    }

    fn set_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        let old = self.status;
        // The driver may only add bits, in the order the spec gives (3.1.1).
        if v & old != old {
            tracing::debug!(old, v, "driver cleared status bits without a reset");
            return;
        }
        let added = v & !old;
        if added & FAILED != 0 {
            self.status |= FAILED;
            return;
        }
        if added & DRIVER != 0 && old & ACKNOWLEDGE == 0 && v & ACKNOWLEDGE == 0 {
            return;
        }
        if added & FEATURES_OK != 0 && (v & DRIVER == 0 || !self.features_acceptable()) {
            // Leaving FEATURES_OK clear tells the driver the set is refused.
            tracing::debug!(features = self.driver_features, "driver features refused");
            self.status = v & !(FEATURES_OK | DRIVER_OK);
            return;
        }
        if added & DRIVER_OK != 0 {
            if v & FEATURES_OK == 0 {
                return;
            }
            self.status = v;
            self.activate();
            return;
        }
        self.status = v;
    }

    fn features_acceptable(&self) -> bool {
        self.driver_features & !self.device.features() == 0
            && self.driver_features & VIRTIO_F_VERSION_1 != 0
    }

    fn activate(&mut self) {
        let mut configs = Vec::new();
        for (i, q) in self.queues.iter().enumerate() {
            if !q.ready {
                continue;
            }
            match self.validate_queue(i as u16, q) {
                Some(c) => configs.push(c),
                None => {
                    tracing::warn!(
                        queue = i,
                        "guest configured an invalid virtqueue; device needs reset"
                    );
                    self.status |= DEVICE_NEEDS_RESET;
                    self.interrupt.signal_config();
                    return;
                }
            }
        }
        match self
            .device
            .activate(&self.mem, self.driver_features, &configs)
        {
            Ok(()) => self.active = true,
            Err(e) => {
                tracing::warn!("device activation failed: {e}");
                self.status |= DEVICE_NEEDS_RESET;
                self.interrupt.signal_config();
            }
        }
    }

    /// A queue is usable when its size is a power of two within the maximum and its three
    /// rings lie in guest memory, aligned as the split-ring layout requires.
    fn validate_queue(&self, index: u16, q: &QueueState) -> Option<QueueConfig> {
        let n = u64::from(q.size);
        if q.size == 0 || q.size > q.max || !q.size.is_power_of_two() {
            return None;
        }
        let rings = [
            (q.desc, 16 * n, 16),
            (q.driver, 6 + 2 * n, 2),
            (q.device, 6 + 8 * n, 4),
        ];
        for (addr, len, align) in rings {
            if addr % align != 0 || !self.mem.check_range(GuestAddress(addr), len as usize) {
                return None;
            }
        }
        Some(QueueConfig {
            index,
            size: q.size,
            desc: q.desc,
            driver: q.driver,
            device: q.device,
        })
    }

    fn reset(&mut self) {
        if self.active {
            self.device.reset();
            self.active = false;
        }
        self.status = 0;
        self.driver_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        for q in &mut self.queues {
            *q = QueueState {
                max: q.max,
                ..Default::default()
            };
        }
        self.interrupt.ack(u32::MAX);
    }
}

impl<D: VirtioDevice> BusDevice for MmioTransport<D> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= reg::CONFIG {
            self.device.read_config(offset - reg::CONFIG, data);
            return;
        }
        if data.len() != 4 || offset % 4 != 0 {
            tracing::debug!(
                offset,
                len = data.len(),
                "virtio-mmio register read must be 32-bit aligned"
            );
            data.fill(0);
            return;
        }
        let v = self.read_reg(offset);
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= reg::CONFIG {
            self.device.write_config(offset - reg::CONFIG, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            tracing::debug!(
                offset,
                len = data.len(),
                "virtio-mmio register write must be 32-bit"
            );
            return;
        };
        if offset % 4 != 0 {
            return;
        }
        self.write_reg(offset, u32::from_le_bytes(bytes));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use vmm_sys_util::eventfd::EventFd;

    use super::*;

    #[derive(Default)]
    struct Log {
        activations: Vec<(u64, Vec<QueueConfig>)>,
        resets: usize,
        config: [u8; 8],
    }

    struct FakeDevice(Arc<Mutex<Log>>, bool);

    const FEATURES: u64 = VIRTIO_F_VERSION_1 | (1 << 29) | 1;

    impl VirtioDevice for FakeDevice {
        fn device_type(&self) -> u32 {
            0x5647
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[256, 64]
        }
        fn features(&self) -> u64 {
            FEATURES
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            let log = self.0.lock().unwrap();
            for (i, b) in data.iter_mut().enumerate() {
                *b = log.config.get(offset as usize + i).copied().unwrap_or(0);
            }
        }
        fn write_config(&mut self, offset: u64, data: &[u8]) {
            let mut log = self.0.lock().unwrap();
            for (i, b) in data.iter().enumerate() {
                if let Some(slot) = log.config.get_mut(offset as usize + i) {
                    *slot = *b;
                }
            }
        }
        fn activate(
            &mut self,
            _m: &GuestMemoryMmap,
            f: u64,
            q: &[QueueConfig],
        ) -> Result<(), super::super::ActivateError> {
            if self.1 {
                return Err(super::super::ActivateError::Backend("refused".into()));
            }
            self.0.lock().unwrap().activations.push((f, q.to_vec()));
            Ok(())
        }
        fn reset(&mut self) {
            self.0.lock().unwrap().resets += 1;
        }
    }

    fn transport(fail: bool) -> (MmioTransport<FakeDevice>, Arc<Mutex<Log>>) {
        let log = Arc::new(Mutex::new(Log::default()));
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let irq = Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
        (
            MmioTransport::new(FakeDevice(log.clone(), fail), mem, irq),
            log,
        )
    }

    fn r(t: &mut MmioTransport<FakeDevice>, off: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn w(t: &mut MmioTransport<FakeDevice>, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }

    fn negotiate(t: &mut MmioTransport<FakeDevice>, features: u64) {
        w(t, reg::STATUS, ACKNOWLEDGE);
        w(t, reg::STATUS, ACKNOWLEDGE | DRIVER);
        w(t, reg::DRIVER_FEATURES_SEL, 0);
        w(t, reg::DRIVER_FEATURES, features as u32);
        w(t, reg::DRIVER_FEATURES_SEL, 1);
        w(t, reg::DRIVER_FEATURES, (features >> 32) as u32);
        w(t, reg::STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    }

    fn setup_queue(t: &mut MmioTransport<FakeDevice>, q: u32, size: u32, base: u64) {
        w(t, reg::QUEUE_SEL, q);
        w(t, reg::QUEUE_NUM, size);
        w(t, reg::QUEUE_DESC_LOW, base as u32);
        w(t, reg::QUEUE_DESC_HIGH, (base >> 32) as u32);
        w(t, reg::QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
        w(t, reg::QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
        w(t, reg::QUEUE_READY, 1);
    }

    #[test]
    fn identity_registers() {
        let (mut t, _) = transport(false);
        assert_eq!(r(&mut t, reg::MAGIC), MAGIC);
        assert_eq!(r(&mut t, reg::VERSION), 2);
        assert_eq!(r(&mut t, reg::DEVICE_ID), 0x5647);
        assert_eq!(r(&mut t, reg::VENDOR_ID), VENDOR_ID);
        w(&mut t, reg::DEVICE_FEATURES_SEL, 1);
        assert_eq!(r(&mut t, reg::DEVICE_FEATURES), (FEATURES >> 32) as u32);
        w(&mut t, reg::DEVICE_FEATURES_SEL, 7);
        assert_eq!(r(&mut t, reg::DEVICE_FEATURES), 0);
        assert_eq!(r(&mut t, reg::SHM_LEN_LOW), u32::MAX);
    }

    #[test]
    fn full_sequence_activates_with_ready_queues() {
        let (mut t, log) = transport(false);
        negotiate(&mut t, VIRTIO_F_VERSION_1 | 1);
        assert_eq!(r(&mut t, reg::STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
        w(&mut t, reg::QUEUE_SEL, 0);
        assert_eq!(r(&mut t, reg::QUEUE_NUM_MAX), 256);
        setup_queue(&mut t, 0, 128, 0x10000);
        assert_eq!(r(&mut t, reg::QUEUE_READY), 1);
        w(
            &mut t,
            reg::STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        let log = log.lock().unwrap();
        assert_eq!(log.activations.len(), 1);
        let (f, q) = &log.activations[0];
        assert_eq!(*f, VIRTIO_F_VERSION_1 | 1);
        assert_eq!(
            q,
            &vec![QueueConfig {
                index: 0,
                size: 128,
                desc: 0x10000,
                driver: 0x11000,
                device: 0x12000
            }]
        );
    }

    #[test]
    fn refuses_features_without_version_1_or_unknown_bits() {
        let (mut t, _) = transport(false);
        negotiate(&mut t, 1);
        assert_eq!(r(&mut t, reg::STATUS) & FEATURES_OK, 0);
        let (mut t, _) = transport(false);
        negotiate(&mut t, VIRTIO_F_VERSION_1 | (1 << 40));
        assert_eq!(r(&mut t, reg::STATUS) & FEATURES_OK, 0);
    }

    #[test]
    fn bad_queues_set_needs_reset_not_activate() {
        for (size, base) in [
            (100u32, 0x10000u64),
            (512, 0x10000),
            (64, 0xFFF_F000),
            (64, 0x10001),
        ] {
            let (mut t, log) = transport(false);
            negotiate(&mut t, VIRTIO_F_VERSION_1);
            setup_queue(&mut t, 0, size, base);
            w(
                &mut t,
                reg::STATUS,
                ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
            );
            assert!(
                log.lock().unwrap().activations.is_empty(),
                "size {size} base {base:#x}"
            );
            assert_ne!(r(&mut t, reg::STATUS) & DEVICE_NEEDS_RESET, 0);
            assert_ne!(
                r(&mut t, reg::INTERRUPT_STATUS) & super::super::INT_CONFIG,
                0
            );
        }
    }

    #[test]
    fn backend_failure_sets_needs_reset() {
        let (mut t, _) = transport(true);
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queue(&mut t, 0, 64, 0x10000);
        w(
            &mut t,
            reg::STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        assert_ne!(r(&mut t, reg::STATUS) & DEVICE_NEEDS_RESET, 0);
    }

    #[test]
    fn reset_clears_state_and_resets_an_active_device() {
        let (mut t, log) = transport(false);
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queue(&mut t, 1, 64, 0x20000);
        w(
            &mut t,
            reg::STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        w(&mut t, reg::STATUS, 0);
        assert_eq!(r(&mut t, reg::STATUS), 0);
        w(&mut t, reg::QUEUE_SEL, 1);
        assert_eq!(r(&mut t, reg::QUEUE_READY), 0);
        assert_eq!(log.lock().unwrap().resets, 1);
        // A reset of a device that never started does not reach it.
        w(&mut t, reg::STATUS, 0);
        assert_eq!(log.lock().unwrap().resets, 1);
    }

    #[test]
    fn queue_registers_locked_outside_setup_window() {
        let (mut t, _) = transport(false);
        w(&mut t, reg::QUEUE_SEL, 0);
        w(&mut t, reg::QUEUE_NUM, 64);
        w(&mut t, reg::QUEUE_READY, 1);
        assert_eq!(
            r(&mut t, reg::QUEUE_READY),
            0,
            "queue setup before FEATURES_OK is ignored"
        );
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queue(&mut t, 0, 64, 0x10000);
        w(
            &mut t,
            reg::STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        w(&mut t, reg::QUEUE_READY, 0);
        assert_eq!(
            r(&mut t, reg::QUEUE_READY),
            1,
            "queue setup after DRIVER_OK is ignored"
        );
    }

    #[test]
    fn bad_accesses_are_harmless() {
        let (mut t, _) = transport(false);
        let mut b2 = [0xaau8; 2];
        t.read(reg::MAGIC, &mut b2);
        assert_eq!(b2, [0, 0]);
        t.write(reg::STATUS, &[1]);
        assert_eq!(r(&mut t, reg::STATUS), 0);
        t.write(reg::STATUS + 1, &1u32.to_le_bytes());
        assert_eq!(r(&mut t, 0x3fc), 0);
        w(&mut t, reg::QUEUE_SEL, 99);
        assert_eq!(r(&mut t, reg::QUEUE_NUM_MAX), 0);
        w(&mut t, reg::QUEUE_NUM, 8);
        // Status bits cannot be cleared one by one, and DRIVER_OK needs FEATURES_OK.
        w(&mut t, reg::STATUS, ACKNOWLEDGE | DRIVER);
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        assert_eq!(r(&mut t, reg::STATUS), ACKNOWLEDGE | DRIVER);
        w(&mut t, reg::STATUS, ACKNOWLEDGE | DRIVER | DRIVER_OK);
        assert_eq!(r(&mut t, reg::STATUS), ACKNOWLEDGE | DRIVER);
    }

    #[test]
    fn config_space_goes_to_the_device() {
        let (mut t, log) = transport(false);
        t.write(reg::CONFIG + 2, &[9, 8]);
        let mut b = [0u8; 4];
        t.read(reg::CONFIG, &mut b);
        assert_eq!(b, [0, 0, 9, 8]);
        assert_eq!(log.lock().unwrap().config[3], 8);
    }

    #[test]
    fn interrupt_ack_clears_bits() {
        let (mut t, _) = transport(false);
        t.interrupt.signal_used();
        t.interrupt.signal_config();
        assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), 3);
        w(&mut t, reg::INTERRUPT_ACK, 1);
        assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), 2);
    }
}
