//! What `vgpu-guest` runs, over any [`Transport`]: device info, a checked `vector_add`, and
//! a copy benchmark (host to device and back through DMA memory, checked).

use std::sync::OnceLock;
use std::time::Instant;

use vgpu_proto::{Access, DeviceInfo, KernelArg};

use crate::error::{Error, Result};
use crate::transport::{DmaRegion, Transport};
use crate::vgpu::{launch_1d, Stream, StreamOptions, VgpuDevice};

/// How long one request may take before the stream gives up.
pub const TIMEOUT_NS: u64 = 30_000_000_000;

/// Nanoseconds since the first call: the stream's clock.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Waiting for the device: spin briefly, then yield the CPU.
fn relax(waited_ns: u64) {
    if waited_ns < 50_000 {
        core::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Stream options for a Linux process.
pub fn stream_options(queue_size: u16) -> StreamOptions {
    StreamOptions {
        queue_size,
        now_ns,
        timeout_ns: TIMEOUT_NS,
        relax,
        wake_after_ns: u64::MAX,
        learn: crate::vgpu::no_learning,
    }
}

/// Probes the vGPU behind `t`, opens stream 0 and starts the device.
pub fn open<T: Transport + Clone>(t: T) -> Result<(VgpuDevice<T>, Stream<T>)> {
    let mut gpu = VgpuDevice::probe(t)?;
    let s = gpu.open_stream(0, stream_options(64))?;
    gpu.start()?;
    Ok((gpu, s))
}

/// What the self-test measured.
#[derive(Clone, Debug)]
pub struct Report {
    pub info: DeviceInfo,
    pub vecadd_elements: usize,
    pub vecadd_device_ns: u64,
    pub copy_bytes: usize,
    pub htod_mb_s: f64,
    pub dtoh_mb_s: f64,
}

/// A DMA buffer freed on drop.
struct Buf<'t, T: Transport> {
    t: &'t T,
    region: Option<DmaRegion>,
}

impl<'t, T: Transport> Buf<'t, T> {
    fn new(t: &'t T, len: usize) -> Result<Self> {
        Ok(Buf {
            t,
            region: Some(t.dma_alloc(len, 4096)?),
        })
    }
    fn region(&mut self) -> Result<&mut DmaRegion> {
        self.region.as_mut().ok_or(Error::OutOfDmaMemory)
    }
}

impl<T: Transport> Drop for Buf<'_, T> {
    fn drop(&mut self) {
        if let Some(r) = self.region.take() {
            // SAFETY: every request using the buffer completed (the synchronous calls below
            // return only then, or after the stream reset the device).
            unsafe { self.t.dma_free(r) }
        }
    }
}

fn mb_s(bytes: usize, ns: u64) -> f64 {
    bytes as f64 * 1000.0 / ns.max(1) as f64
}

/// Runs the self-test: `n` elements of vector_add and a `copy_bytes` copy each way
/// (`iters` times). Fails on the first wrong element or byte.
pub fn run<T: Transport + Clone>(
    s: &mut Stream<T>,
    t: &T,
    n: usize,
    copy_bytes: usize,
    iters: u32,
) -> core::result::Result<Report, String> {
    let e = |what: &'static str| move |e: Error| format!("{what}: {e}");
    let info = s.get_info().map_err(e("GET_INFO"))?;
    let bytes = 4 * n;
    let mut a = Buf::new(t, bytes).map_err(e("DMA a"))?;
    let mut b = Buf::new(t, bytes).map_err(e("DMA b"))?;
    let mut c = Buf::new(t, bytes).map_err(e("DMA c"))?;
    for (i, (wa, wb)) in a
        .region()
        .map_err(e("DMA a"))?
        .as_mut_slice()
        .chunks_exact_mut(4)
        .zip(
            b.region()
                .map_err(e("DMA b"))?
                .as_mut_slice()
                .chunks_exact_mut(4),
        )
        .enumerate()
    {
        wa.copy_from_slice(&((i % 1000) as f32).to_le_bytes());
        wb.copy_from_slice(&((i * 7 % 1000) as f32).to_le_bytes());
    }
    let da = s.alloc(bytes as u64).map_err(e("ALLOC a"))?;
    let db = s.alloc(bytes as u64).map_err(e("ALLOC b"))?;
    let dc = s.alloc(bytes as u64).map_err(e("ALLOC c"))?;
    s.memcpy_htod(da, a.region().map_err(e("DMA a"))?.as_slice())
        .map_err(e("MEMCPY_HTOD a"))?;
    s.memcpy_htod(db, b.region().map_err(e("DMA b"))?.as_slice())
        .map_err(e("MEMCPY_HTOD b"))?;
    s.memset(dc, u32::MAX, n as u64, 4).map_err(e("MEMSET c"))?;
    let module = s.load_builtin().map_err(e("MODULE_LOAD builtin"))?;
    let f = s
        .get_function(module, "vector_add")
        .map_err(e("GET_FUNCTION vector_add"))?;
    let args = [
        KernelArg::ptr(da, Access::Read),
        KernelArg::ptr(db, Access::Read),
        KernelArg::ptr(dc, Access::Write),
        KernelArg::u64(n as u64),
    ];
    let device_ns = s
        .launch(&launch_1d(f.handle, n as u64, 256), &args)
        .map_err(e("LAUNCH vector_add"))?;
    s.memcpy_dtoh(c.region().map_err(e("DMA c"))?.as_mut_slice(), dc)
        .map_err(e("MEMCPY_DTOH c"))?;
    for (i, w) in c
        .region()
        .map_err(e("DMA c"))?
        .as_slice()
        .chunks_exact(4)
        .enumerate()
    {
        let got = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        let want = ((i % 1000) + (i * 7 % 1000)) as f32;
        if got != want {
            return Err(format!("vector_add: c[{i}] = {got}, want {want}"));
        }
    }
    s.unload_module(module).map_err(e("MODULE_UNLOAD"))?;
    for d in [da, db, dc] {
        s.free(d).map_err(e("FREE"))?;
    }

    // Copy benchmark: one buffer up and back, `iters` times each way, then checked.
    let mut h = Buf::new(t, copy_bytes).map_err(e("DMA copy buffer"))?;
    for (i, x) in h
        .region()
        .map_err(e("DMA copy buffer"))?
        .as_mut_slice()
        .iter_mut()
        .enumerate()
    {
        *x = (i % 251) as u8;
    }
    let d = s.alloc(copy_bytes as u64).map_err(e("ALLOC copy"))?;
    let t0 = now_ns();
    for _ in 0..iters {
        s.memcpy_htod(d, h.region().map_err(e("DMA"))?.as_slice())
            .map_err(e("MEMCPY_HTOD copy"))?;
    }
    let htod_ns = now_ns() - t0;
    h.region().map_err(e("DMA"))?.as_mut_slice().fill(0);
    let t0 = now_ns();
    for _ in 0..iters {
        s.memcpy_dtoh(h.region().map_err(e("DMA"))?.as_mut_slice(), d)
            .map_err(e("MEMCPY_DTOH copy"))?;
    }
    let dtoh_ns = now_ns() - t0;
    if let Some(i) = h
        .region()
        .map_err(e("DMA"))?
        .as_slice()
        .iter()
        .enumerate()
        .position(|(i, &x)| x != (i % 251) as u8)
    {
        return Err(format!("copy: byte {i} came back wrong"));
    }
    s.free(d).map_err(e("FREE copy"))?;
    let moved = copy_bytes * iters as usize;
    Ok(Report {
        info,
        vecadd_elements: n,
        vecadd_device_ns: device_ns,
        copy_bytes,
        htod_mb_s: mb_s(moved, htod_ns),
        dtoh_mb_s: mb_s(moved, dtoh_ns),
    })
}
