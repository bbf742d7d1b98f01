//! Opening the vGPU a payload was given, with the runtime's clock for timeouts.

use guest_driver::{Error, Stream, StreamOptions, VgpuDevice};

use crate::boot::BootInfo;
use crate::time::timeout_clock_ns;
use crate::virtio::MmioTransport;
use crate::wait::{self, Step, WaitClock};

/// Queue size payloads ask for by default (requests in flight per stream: half of it).
pub const DEFAULT_QUEUE_SIZE: u16 = 64;
/// How long a synchronous request may take before the stream gives up. Built-in `spin`
/// kernels may legitimately run up to 60 s; payloads that use long ones set their own.
pub const DEFAULT_TIMEOUT_NS: u64 = 30_000_000_000;

pub type Gpu = VgpuDevice<MmioTransport>;
pub type GpuStream<const CAP: usize = { guest_driver::vgpu::DEFAULT_STREAM_CAPACITY }> =
    Stream<MmioTransport, CAP>;

/// Stream options with the runtime's TSC clock and wait policy.
pub fn stream_options(queue_size: u16) -> StreamOptions {
    StreamOptions {
        queue_size,
        now_ns: timeout_clock_ns,
        timeout_ns: DEFAULT_TIMEOUT_NS,
        relax,
        wake_after_ns: wait::SPIN_NS,
        learn,
    }
}

/// What every stream of this payload learned of its waits.
static WAITS: WaitClock = WaitClock::new();

/// Between two polls of a wait: spin, or idle this vCPU (docs/payload-abi.md, port 0xF6)
/// until the device's interrupt for the completion (the stream asked for one once the
/// spin was over) or until shortly before the wait's expected end ([`crate::wait`]): a VM
/// waiting on a long kernel leaves the host's CPUs to the work it waits for, and is back
/// in the guest, spinning, when it ends.
fn relax(waited_ns: u64) {
    match WAITS.step(waited_ns) {
        Step::Spin => core::hint::spin_loop(),
        Step::Idle(us) => {
            let t = timeout_clock_ns();
            crate::exit::idle_us(us);
            WAITS.idled(us, timeout_clock_ns().saturating_sub(t));
        }
    }
}

/// A long wait ended: learn its length.
fn learn(waited_ns: u64) {
    WAITS.waited(waited_ns);
}

/// Why the vGPU could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// BootInfo lists fewer virtio-mmio devices.
    NoDevice(usize),
    Driver(Error),
}

impl core::fmt::Display for OpenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            OpenError::NoDevice(i) => write!(
                f,
                "no virtio-mmio device {i} in BootInfo (start the vmm with --vgpu)"
            ),
            OpenError::Driver(e) => write!(f, "vGPU: {e}"),
        }
    }
}

/// Probes the `index`th virtio-mmio device as a vGPU (not yet started: open streams,
/// then call `start`).
pub fn probe(boot: &BootInfo, index: usize) -> Result<Gpu, OpenError> {
    let t = MmioTransport::from_boot(boot, index).ok_or(OpenError::NoDevice(index))?;
    VgpuDevice::probe(t).map_err(OpenError::Driver)
}

/// The common case: the first vGPU with stream 0 open and the device started.
pub fn open_single(boot: &BootInfo) -> Result<(Gpu, GpuStream), OpenError> {
    open_single_with(boot, DEFAULT_QUEUE_SIZE)
}

/// Like [`open_single`], with a stream of `CAP` requests in flight over a queue of
/// `queue_size` descriptors (two per simple request).
pub fn open_single_with<const CAP: usize>(
    boot: &BootInfo,
    queue_size: u16,
) -> Result<(Gpu, GpuStream<CAP>), OpenError> {
    let mut gpu = probe(boot, 0)?;
    let stream = gpu
        .open_stream(0, stream_options(queue_size))
        .map_err(OpenError::Driver)?;
    gpu.start().map_err(OpenError::Driver)?;
    Ok((gpu, stream))
}
