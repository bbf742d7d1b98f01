//! The built-in storage kernels on the sim GPU: `vgpu-storage`'s kernels (host
//! threads standing in for warps, BaM's queue pairs and page cache underneath) over the
//! namespace the `ns` argument names, results stored into device memory through atomics
//! like every sim kernel. Everything a guest passes is checked before the first read:
//! namespace attached, offsets aligned and inside the namespace, gather indices in range.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use vgpu_proto::builtin::{self, KernelSig};
use vgpu_proto::ArgValue;
use vgpu_storage::kernels::{self, CsrGraph};
use vgpu_storage::Element;

use super::kernels::{Ctx, Mapped};
use crate::args::{int, ptr};
use crate::error::{BackendError, Result};
use crate::storage::{array, bad_elem_bytes, check_bfs, error, Opened};

/// Runs storage kernel `sig` (arguments already checked against it); returns its time.
pub(super) fn run(ctx: &Ctx<'_>, sig: &'static KernelSig, args: &[ArgValue]) -> Result<Duration> {
    let Some(set) = ctx.storage else {
        return Err(BackendError::NotSupported(format!(
            "{}: this vGPU has no storage namespaces; the operator attaches them with `storage` in the vGPU's spec",
            sig.name
        )));
    };
    let start = Instant::now();
    let ns = int(args, 0);
    let o = set.get(ns)?;
    charge(ctx, ns, &o)?;
    match sig.name {
        n if n == builtin::STORAGE_GATHER.name => gather(ctx, &o, args)?,
        n if n == builtin::STORAGE_SCAN_SUM.name => scan_sum(ctx, &o, args)?,
        n if n == builtin::STORAGE_BFS.name => bfs(ctx, &o, args)?,
        other => return Err(BackendError::UnknownFunction(other.to_string())),
    }
    Ok(start.elapsed())
}

/// Charges namespace `ns`'s cache lines to the vGPU's ledger on its first use (entry
/// "storage", as the cuda backend charges its GPU setup); refused when they do not fit.
fn charge(ctx: &Ctx<'_>, ns: u64, o: &Opened) -> Result<()> {
    let mut charged = crate::sync::lock(ctx.storage_charged);
    if charged.contains_key(&ns) {
        return Ok(());
    }
    let bytes = o.cache.memory_bytes() as u64;
    ctx.mem
        .ledger()
        .charge_reserve(crate::space::Reserve::Storage, bytes)
        .inspect_err(|e| {
            tracing::info!(namespace = ns, bytes, error = %e,
                "storage cache refused: it does not fit the vGPU's memory share");
        })?;
    charged.insert(ns, bytes);
    tracing::debug!(namespace = ns, bytes, "storage cache charged to the vGPU");
    Ok(())
}

fn usize_of(kernel: &str, what: &str, v: u64) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| BackendError::InvalidArgument(format!("{kernel}: {what} = {v} is too large")))
}

fn gather(ctx: &Ctx<'_>, o: &Opened, args: &[ArgValue]) -> Result<()> {
    let name = builtin::STORAGE_GATHER.name;
    let (base, n, eb) = (int(args, 1), int(args, 4), int(args, 5));
    let idx = Mapped::new::<AtomicU64>(ctx.mem, ptr(args, 2), n)?;
    let idx: Vec<u64> = idx
        .words::<AtomicU64>()?
        .iter()
        .map(|w| w.load(Relaxed))
        .collect();
    usize_of(name, "n", n)?;
    match eb {
        4 => {
            let dst = Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 3), n)?;
            let dst = dst.words::<AtomicU32>()?;
            let out = gather_as::<u32>(ctx, o, base, &idx)?;
            dst.iter().zip(out).for_each(|(d, v)| d.store(v, Relaxed));
        }
        8 => {
            let dst = Mapped::new::<AtomicU64>(ctx.mem, ptr(args, 3), n)?;
            let dst = dst.words::<AtomicU64>()?;
            let out = gather_as::<u64>(ctx, o, base, &idx)?;
            dst.iter().zip(out).for_each(|(d, v)| d.store(v, Relaxed));
        }
        other => return Err(bad_elem_bytes(name, other)),
    }
    Ok(())
}

fn gather_as<T: Element>(ctx: &Ctx<'_>, o: &Opened, base: u64, idx: &[u64]) -> Result<Vec<T>> {
    let name = builtin::STORAGE_GATHER.name;
    let a = array::<T>(name, o, base, None)?;
    if let Some((i, v)) = idx.iter().enumerate().find(|(_, v)| **v >= a.len()) {
        return Err(BackendError::KernelFault(format!(
            "{name}: idx[{i}] = {v} is past the {} elements from byte {base} of the namespace",
            a.len()
        )));
    }
    kernels::gather(&a, idx, ctx.threads).map_err(|e| error(name, e))
}

fn scan_sum(ctx: &Ctx<'_>, o: &Opened, args: &[ArgValue]) -> Result<()> {
    let name = builtin::STORAGE_SCAN_SUM.name;
    let (base, n, eb) = (int(args, 1), int(args, 2), int(args, 3));
    let out = Mapped::new::<AtomicU64>(ctx.mem, ptr(args, 4), 1)?;
    let out = out.words::<AtomicU64>()?;
    let sum = match eb {
        4 => kernels::scan_sum(&array::<u32>(name, o, base, Some(n))?, ctx.threads),
        8 => kernels::scan_sum(&array::<u64>(name, o, base, Some(n))?, ctx.threads),
        other => return Err(bad_elem_bytes(name, other)),
    }
    .map_err(|e| error(name, e))?;
    if let Some(o) = out.first() {
        o.store(sum, Relaxed);
    }
    Ok(())
}

fn bfs(ctx: &Ctx<'_>, o: &Opened, args: &[ArgValue]) -> Result<()> {
    let name = builtin::STORAGE_BFS.name;
    let (offsets_base, edges_base) = (int(args, 1), int(args, 2));
    let (vertices, edges, source) = (int(args, 3), int(args, 4), int(args, 5));
    check_bfs(name, vertices, source)?;
    let levels = Mapped::new::<AtomicU32>(ctx.mem, ptr(args, 6), vertices)?;
    let levels = levels.words::<AtomicU32>()?;
    let g = CsrGraph {
        offsets: array::<u64>(name, o, offsets_base, Some(vertices + 1))?,
        edges: array::<u32>(name, o, edges_base, Some(edges))?,
    };
    let source = u32::try_from(source).map_err(|_| {
        BackendError::InvalidArgument(format!("{name}: source = {source} is too large"))
    })?;
    let got = kernels::bfs(&g, source, ctx.threads).map_err(|e| error(name, e))?;
    levels
        .iter()
        .zip(got)
        .for_each(|(l, v)| l.store(v, Relaxed));
    Ok(())
}
