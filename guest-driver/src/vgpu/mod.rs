//! The vGPU on top of virtio: probing and initialising the device (docs/protocol.md,
//! "Device"), one [`Stream`] per virtqueue, and the request API (ops.rs).
//!
//! ```ignore
//! let mut gpu = VgpuDevice::probe(transport)?;
//! let mut s0: Stream<_> = gpu.open_stream(0, opts)?;
//! gpu.start()?;
//! let a = s0.alloc(4096)?;
//! s0.memcpy_htod(a, &data)?;
//! ```

mod ops;
mod slots;
mod stream;

pub use ops::{launch_1d, Function, StorageInfo};
pub use slots::{HEADER_MAX, SLOT_SIZE};
pub use stream::{
    no_learning, spin_relax, Stream, StreamOptions, Ticket, DEFAULT_STREAM_CAPACITY,
    MAX_DATA_BUFFERS,
};
pub use vgpu_proto;

use vgpu_proto::{version_compatible, VgpuConfig, VIRTIO_ID_VGPU};

use crate::error::{Error, Result};
use crate::mmio::VirtioMmio;
use crate::queue::SplitQueue;
use crate::spec::feature;
use crate::transport::Transport;

/// Slot memory alignment: a cache line, so slots never share one.
const SLOT_ALIGN: usize = 64;

/// A vGPU device being set up or running. Streams are opened before [`Self::start`]
/// (virtio requires queues configured before DRIVER_OK) and then live on their own, each
/// with its own clone of the transport to ring its doorbell.
pub struct VgpuDevice<T: Transport + Clone> {
    dev: VirtioMmio<T>,
    config: VgpuConfig,
}

impl<T: Transport + Clone> VgpuDevice<T> {
    /// Checks the device is a vGPU speaking our protocol major, negotiates virtio features
    /// (VERSION_1, EVENT_IDX when offered) and reads the config space.
    pub fn probe(transport: T) -> Result<Self> {
        let mut dev = VirtioMmio::probe_id(transport, VIRTIO_ID_VGPU)?;
        dev.negotiate(0, feature::RING_EVENT_IDX)?;
        let mut bytes = [0u8; VgpuConfig::SIZE];
        dev.read_config(0, &mut bytes)?;
        // Cannot fail: the buffer is exactly SIZE bytes.
        let config = VgpuConfig::decode(&bytes).map_err(|_| Error::ConfigUnstable)?;
        if !version_compatible(config.version) {
            dev.set_failed();
            return Err(Error::IncompatibleDevice {
                version: config.version,
            });
        }
        Ok(VgpuDevice { dev, config })
    }

    /// The config space as read at probe time.
    pub fn config(&self) -> &VgpuConfig {
        &self.config
    }

    pub fn num_queues(&self) -> u16 {
        self.config.num_queues.min(u32::from(u16::MAX)) as u16
    }

    /// The virtio layer, for interrupt status and the like.
    pub fn virtio(&self) -> &VirtioMmio<T> {
        &self.dev
    }

    /// Sets up queue `index` as a stream. Completions are polled, so the queue asks the
    /// device not to interrupt.
    pub fn open_stream<const CAP: usize>(
        &mut self,
        index: u16,
        opts: StreamOptions,
    ) -> Result<Stream<T, CAP>> {
        if index >= self.num_queues() {
            return Err(Error::NoSuchQueue(index));
        }
        let limit = opts.queue_size.min(CAP.min(usize::from(u16::MAX)) as u16);
        let size = self.dev.pick_queue_size(index, limit)?;
        let mut queue = SplitQueue::<CAP>::allocate(self.dev.transport(), size)?;
        queue.set_interrupts(false);
        // Every request is at least two descriptors (header, response): more slots than
        // size / 2 could never be in flight at once.
        let nslots = (size / 2).max(1);
        let mem = self
            .dev
            .transport()
            .dma_alloc(usize::from(nslots) * slots::SLOT_SIZE, SLOT_ALIGN)?;
        let slot_table = slots::Slots::new(mem, nslots)?;
        self.dev.activate_queue(index, &mut queue)?;
        Ok(Stream::new(
            self.dev.transport().clone(),
            index,
            queue,
            slot_table,
            opts,
        ))
    }

    /// DRIVER_OK: the device starts serving the opened streams.
    pub fn start(&mut self) -> Result<()> {
        self.dev.driver_ok()
    }
}

#[cfg(test)]
mod tests;
