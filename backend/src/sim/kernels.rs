//! The built-in kernels on CPU threads. Device memory is viewed only through atomics
//! (relaxed loads and stores), so a guest racing two streams on the same bytes gets
//! unspecified values, never undefined behaviour in the worker.

use std::ops::Range;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_proto::builtin::{self, KernelSig, FNV_OFFSET, FNV_PRIME};
use vgpu_proto::ArgValue;

use super::memory::{Allocation, DeviceMemory, Word};
use super::pacing;
use crate::args::{check_args, f32_arg, int, ptr, word};
use crate::error::{BackendError, Result};

/// Elements below which a kernel runs on the calling thread only.
const PAR_MIN: usize = 1 << 16;
/// `reduce_sum` block size (documented in the protocol).
const REDUCE_BLOCK: usize = 65536;

/// Where a kernel runs.
pub struct Ctx<'a> {
    /// The vGPU's memory.
    pub mem: &'a DeviceMemory,
    /// Threads a kernel may use.
    pub threads: usize,
    /// Compute-rate factor.
    pub speed: f64,
    /// The vGPU's storage namespaces, for the storage kernels.
    pub storage: Option<&'a crate::storage::StorageSet>,
    /// Namespaces whose cache is charged to the vGPU's ledger, and the bytes each is.
    pub storage_charged: &'a std::sync::Mutex<std::collections::BTreeMap<u64, u64>>,
}

/// An element count as usize.
fn count(sig: &KernelSig, what: &str, v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| {
        BackendError::InvalidArgument(format!("{}: {what} = {v} is too large", sig.name))
    })
}

/// A pointer argument resolved to its allocation, with the extent it covers.
pub(super) struct Mapped {
    alloc: Arc<Allocation>,
    off: u64,
    count: u64,
}

impl Mapped {
    pub(super) fn new<T: Word>(mem: &DeviceMemory, addr: u64, count: u64) -> Result<Self> {
        let len = count.checked_mul(T::SIZE).ok_or(BackendError::BadPointer {
            addr,
            len: u64::MAX,
        })?;
        let (alloc, off) = mem.resolve(addr, len)?;
        if addr % T::SIZE != 0 {
            return Err(BackendError::Misaligned {
                addr,
                align: T::SIZE,
            });
        }
        Ok(Self { alloc, off, count })
    }

    pub(super) fn words<T: Word>(&self) -> Result<&[T]> {
        self.alloc.words::<T>(self.off, self.count)
    }
}

fn load_f32(w: &AtomicU32) -> f32 {
    f32::from_bits(w.load(Relaxed))
}

fn store_f32(w: &AtomicU32, v: f32) {
    w.store(v.to_bits(), Relaxed)
}

/// Runs `f` over `0..units` split into contiguous ranges on up to `threads` threads,
/// each range at least `min_per_thread` units long (small work stays on this thread).
fn par_for(units: usize, min_per_thread: usize, threads: usize, f: impl Fn(Range<usize>) + Sync) {
    let parts = threads.min(units / min_per_thread.max(1)).max(1);
    if parts <= 1 {
        f(0..units);
        return;
    }
    let step = units.div_ceil(parts);
    std::thread::scope(|s| {
        let f = &f;
        for t in 1..parts {
            let r = (t * step).min(units)..((t + 1) * step).min(units);
            s.spawn(move || f(r));
        }
        f(0..step.min(units));
    });
}

/// Runs built-in kernel `sig` to completion; returns its device time.
pub fn run(ctx: &Ctx<'_>, sig: &'static KernelSig, args: &[ArgValue]) -> Result<Duration> {
    check_args(sig, args)?;
    // The allocations its pointers reach stay the kernel's until it ends, its modeled time
    // included: one freed meanwhile goes (and its addresses are handed out again) only
    // then, as on a GPU, where memory a running kernel uses is not reused under it.
    let _held: Vec<_> = args
        .iter()
        .filter_map(|a| match a {
            ArgValue::Ptr { addr, .. } => ctx.mem.resolve(*addr, 1).ok().map(|(alloc, _)| alloc),
            _ => None,
        })
        .collect();
    if builtin::is_storage(sig) {
        // I/O-bound: they take the time their reads take, no modeled floor.
        return super::storage_kernels::run(ctx, sig, args);
    }
    let start = Instant::now();
    let work = match sig.name {
        n if n == builtin::VECTOR_ADD.name => vector_add(ctx, sig, args)?,
        n if n == builtin::SAXPY.name => saxpy(ctx, sig, args)?,
        n if n == builtin::FILL.name => fill(ctx, sig, args)?,
        n if n == builtin::REDUCE_SUM.name => reduce_sum(ctx, sig, args)?,
        n if n == builtin::MATMUL.name => matmul(ctx, sig, args)?,
        n if n == builtin::GATHER.name => gather(ctx, sig, args)?,
        n if n == builtin::CHECKSUM.name => checksum(ctx, sig, args)?,
        n if n == builtin::SPIN.name => {
            let us = int(args, 0);
            if us > builtin::MAX_SPIN_US {
                return Err(BackendError::InvalidArgument(format!(
                    "spin: duration_us = {us} is above the limit of {} µs; split the burst",
                    builtin::MAX_SPIN_US
                )));
            }
            let dur =
                Duration::try_from_secs_f64(us as f64 / 1e6 / ctx.speed).unwrap_or(Duration::MAX);
            // The cap is on the time it runs: a slower device may not stretch it past it.
            if dur > Duration::from_micros(builtin::MAX_SPIN_US) {
                return Err(BackendError::InvalidArgument(format!(
                    "spin: duration_us = {us} runs {dur:?} on this device (speed {}), above the \
                     limit of {} µs; split the burst",
                    ctx.speed,
                    builtin::MAX_SPIN_US
                )));
            }
            let end = start.checked_add(dur).ok_or_else(|| {
                BackendError::InvalidArgument(format!("spin: duration_us = {us} is too long"))
            })?;
            pacing::spin_until(end);
            return Ok(start.elapsed());
        }
        other => return Err(BackendError::UnknownFunction(other.to_string())),
    };
    // The modeled time of the work is a floor: a kernel never finishes faster than the
    // simulated device computes, however fast the host is.
    if let Some(end) = start.checked_add(pacing::work_time(work, ctx.speed)) {
        pacing::wait_until(end);
    }
    Ok(start.elapsed())
}

fn vector_add(ctx: &Ctx<'_>, sig: &KernelSig, args: &[ArgValue]) -> Result<u64> {
    let n = int(args, 3);
    let (a, b, c) = (
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 0), n)?,
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 1), n)?,
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 2), n)?,
    );
    let (a, b, c) = (
        a.words::<AtomicU32>()?,
        b.words::<AtomicU32>()?,
        c.words::<AtomicU32>()?,
    );
    par_for(count(sig, "n", n)?, PAR_MIN, ctx.threads, |r| {
        for ((a, b), c) in a[r.clone()].iter().zip(&b[r.clone()]).zip(&c[r]) {
            store_f32(c, load_f32(a) + load_f32(b));
        }
    });
    Ok(n)
}

fn saxpy(ctx: &Ctx<'_>, sig: &KernelSig, args: &[ArgValue]) -> Result<u64> {
    let alpha = f32_arg(args, 0);
    let n = int(args, 3);
    let (x, y) = (
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 1), n)?,
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 2), n)?,
    );
    let (x, y) = (x.words::<AtomicU32>()?, y.words::<AtomicU32>()?);
    par_for(count(sig, "n", n)?, PAR_MIN, ctx.threads, |r| {
        for (x, y) in x[r.clone()].iter().zip(&y[r]) {
            store_f32(y, alpha * load_f32(x) + load_f32(y));
        }
    });
    Ok(n.saturating_mul(2))
}

fn fill(ctx: &Ctx<'_>, sig: &KernelSig, args: &[ArgValue]) -> Result<u64> {
    let value = word(args, 1);
    let n = int(args, 2);
    let dst = Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 0), n)?;
    let dst = dst.words::<AtomicU32>()?;
    par_for(count(sig, "n", n)?, PAR_MIN, ctx.threads, |r| {
        dst[r].iter().for_each(|w| w.store(value, Relaxed))
    });
    Ok(n)
}

fn reduce_sum(ctx: &Ctx<'_>, sig: &KernelSig, args: &[ArgValue]) -> Result<u64> {
    let n = int(args, 2);
    let x = Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 0), n)?;
    let out = Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 1), 1)?;
    let (x, out) = (x.words::<AtomicU32>()?, out.words::<AtomicU32>()?);
    let n_us = count(sig, "n", n)?;
    let blocks = n_us.div_ceil(REDUCE_BLOCK);
    let sums: Vec<AtomicU64> = (0..blocks).map(|_| AtomicU64::new(0)).collect();
    // Parallel over blocks; each block is summed in order, so the result does not depend
    // on the thread count.
    par_for(blocks, PAR_MIN.div_ceil(REDUCE_BLOCK), ctx.threads, |r| {
        for b in r {
            let lo = b * REDUCE_BLOCK;
            let hi = (lo + REDUCE_BLOCK).min(n_us);
            let s = x[lo..hi]
                .iter()
                .fold(0.0f64, |acc, w| acc + f64::from(load_f32(w)));
            sums[b].store(s.to_bits(), Relaxed);
        }
    });
    let total = sums
        .iter()
        .fold(0.0f64, |acc, s| acc + f64::from_bits(s.load(Relaxed)));
    if let Some(o) = out.first() {
        store_f32(o, total as f32);
    }
    Ok(n)
}

fn matmul(ctx: &Ctx<'_>, sig: &KernelSig, args: &[ArgValue]) -> Result<u64> {
    let (m, n, k) = (int(args, 3), int(args, 4), int(args, 5));
    let too_big = || BackendError::InvalidArgument(format!("matmul: {m} x {n} x {k} overflows"));
    let (mk, kn, mn) = (
        m.checked_mul(k).ok_or_else(too_big)?,
        k.checked_mul(n).ok_or_else(too_big)?,
        m.checked_mul(n).ok_or_else(too_big)?,
    );
    let work = mn.checked_mul(k).ok_or_else(too_big)?;
    let (a, b, c) = (
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 0), mk)?,
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 1), kn)?,
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 2), mn)?,
    );
    let (a, b, c) = (
        a.words::<AtomicU32>()?,
        b.words::<AtomicU32>()?,
        c.words::<AtomicU32>()?,
    );
    let (m, n, k) = (
        count(sig, "m", m)?,
        count(sig, "n", n)?,
        count(sig, "k", k)?,
    );
    // Rows in parallel; each thread gets enough rows to amortise its start.
    let min_rows = PAR_MIN.div_ceil(n.saturating_mul(k).max(1));
    par_for(m, min_rows, ctx.threads, |rows| {
        let mut acc = vec![0.0f32; n];
        for i in rows {
            acc.iter_mut().for_each(|v| *v = 0.0);
            for l in 0..k {
                let a_il = load_f32(&a[i * k + l]);
                for (acc, b) in acc.iter_mut().zip(&b[l * n..(l + 1) * n]) {
                    *acc += a_il * load_f32(b);
                }
            }
            for (c, v) in c[i * n..(i + 1) * n].iter().zip(&acc) {
                store_f32(c, *v);
            }
        }
    });
    Ok(work)
}

fn gather(ctx: &Ctx<'_>, sig: &KernelSig, args: &[ArgValue]) -> Result<u64> {
    let (n, src_len) = (int(args, 3), int(args, 4));
    let (src, idx, dst) = (
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 0), src_len)?,
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 1), n)?,
        Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 2), n)?,
    );
    let (src, idx, dst) = (
        src.words::<AtomicU32>()?,
        idx.words::<AtomicU32>()?,
        dst.words::<AtomicU32>()?,
    );
    let faulted = AtomicBool::new(false);
    let fault_at = AtomicUsize::new(usize::MAX);
    par_for(count(sig, "n", n)?, PAR_MIN, ctx.threads, |r| {
        for i in r {
            if faulted.load(Relaxed) {
                return;
            }
            let j = idx[i].load(Relaxed) as usize;
            match src.get(j) {
                Some(v) => dst[i].store(v.load(Relaxed), Relaxed),
                None => {
                    fault_at.fetch_min(i, Relaxed);
                    faulted.store(true, Relaxed);
                    return;
                }
            }
        }
    });
    if faulted.load(Relaxed) {
        let i = fault_at.load(Relaxed);
        return Err(BackendError::KernelFault(format!(
            "gather: idx[{i}] = {} is past src_len = {src_len}",
            idx.get(i).map(|w| w.load(Relaxed)).unwrap_or(0)
        )));
    }
    Ok(n)
}

fn checksum(ctx: &Ctx<'_>, sig: &KernelSig, args: &[ArgValue]) -> Result<u64> {
    let n = int(args, 1);
    let data_addr = ptr(args, 0);
    let data = Mapped::new::<AtomicU8>(ctx.mem, data_addr, n)?;
    let out = Mapped::new::<AtomicU64>(ctx.mem, ptr(args, 2), 1)?;
    let n_us = count(sig, "n_bytes", n)?;
    // Head bytes up to 8-byte alignment, then 64-bit words, then tail bytes: the same
    // byte order as a plain byte loop.
    let head = ((8 - (data_addr % 8)) % 8).min(n) as usize;
    let body_words = (n_us - head) / 8;
    let tail = n_us - head - body_words * 8;
    let mut h = FNV_OFFSET;
    let mix = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
    let bytes = data.words::<AtomicU8>()?;
    for b in &bytes[..head] {
        h = mix(h, b.load(Relaxed));
    }
    let words = match body_words {
        0 => &[][..],
        n => data
            .alloc
            .words::<AtomicU64>(data.off + head as u64, n as u64)?,
    };
    for w in words {
        for b in w.load(Relaxed).to_le_bytes() {
            h = mix(h, b);
        }
    }
    for b in &bytes[n_us - tail..] {
        h = mix(h, b.load(Relaxed));
    }
    if let Some(o) = out.words::<AtomicU64>()?.first() {
        o.store(h, Relaxed);
    }
    Ok(n)
}
