//! Built-in storage kernels, run by host threads standing in for GPU warps: each thread
//! takes warps of [`WARP`] lanes from a shared counter, as thread blocks take work on a
//! GPU. They take a `&StorageArray` exactly as the CUDA versions will.

use crate::array::{Element, StorageArray, WARP};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Run `body(warp_index)` for warps 0..n over `threads` threads; the first error stops
/// the others and is returned.
fn launch<F>(threads: usize, n: usize, body: F) -> Result<()>
where
    F: Fn(usize) -> Result<()> + Sync,
{
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first_err: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let w = next.fetch_add(1, Ordering::Relaxed);
                if w >= n {
                    break;
                }
                if let Err(e) = body(w) {
                    stop.store(true, Ordering::Relaxed);
                    if let Ok(mut g) = first_err.lock() {
                        g.get_or_insert(e);
                    }
                    break;
                }
            });
        }
    });
    match first_err.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

/// `out[i] = a[idx[i]]`: random gather, the BaM microbenchmark's access pattern.
pub fn gather<T: Element>(a: &StorageArray<T>, idx: &[u64], threads: usize) -> Result<Vec<T>> {
    let mut result = vec![T::default(); idx.len()];
    let chunks: Vec<Mutex<&mut [T]>> = result.chunks_mut(WARP).map(Mutex::new).collect();
    launch(threads, chunks.len(), |w| {
        let lanes = &idx[w * WARP..((w + 1) * WARP).min(idx.len())];
        let mut g = chunks[w]
            .lock()
            .map_err(|_| Error::InvalidArgument("gather output lock poisoned".into()))?;
        a.warp_get(lanes, &mut g)
    })?;
    drop(chunks);
    Ok(result)
}

/// Wrapping sum of all elements (as u64) by a sequential, coalesced scan.
pub fn scan_sum<T: Element>(a: &StorageArray<T>, threads: usize) -> Result<u64> {
    let total = AtomicU64::new(0);
    // Each task covers 32 warps' worth of consecutive elements.
    let per_task = (WARP * 32) as u64;
    let n = a.len().div_ceil(per_task) as usize;
    launch(threads, n, |w| {
        let start = w as u64 * per_task;
        let end = (start + per_task).min(a.len());
        let mut buf = [T::default(); WARP];
        let mut sum = 0u64;
        let mut i = start;
        while i < end {
            let k = ((end - i) as usize).min(WARP);
            a.read_range(i, &mut buf[..k])?;
            sum = buf[..k].iter().fold(sum, |s, v| s.wrapping_add(v.to_u64()));
            i += k as u64;
        }
        total.fetch_add(sum, Ordering::Relaxed);
        Ok(())
    })?;
    Ok(total.into_inner())
}

/// A graph in compressed sparse row form kept on storage: `offsets` has n+1 entries,
/// the neighbours of v are `edges[offsets[v]..offsets[v+1]]`.
pub struct CsrGraph {
    pub offsets: StorageArray<u64>,
    pub edges: StorageArray<u32>,
}

impl CsrGraph {
    pub fn vertices(&self) -> u64 {
        self.offsets.len().saturating_sub(1)
    }
}

/// Level-synchronous BFS from `source`; `levels[v]` is the hop count, `u32::MAX` if
/// unreachable.
pub fn bfs(g: &CsrGraph, source: u32, threads: usize) -> Result<Vec<u32>> {
    let n = g.vertices();
    if source as u64 >= n {
        return Err(Error::InvalidArgument(format!(
            "source {source} not below {n} vertices"
        )));
    }
    let levels: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(u32::MAX)).collect();
    levels[source as usize].store(0, Ordering::Relaxed);
    let mut frontier = vec![source];
    let mut level = 0u32;
    while !frontier.is_empty() {
        let next: Mutex<Vec<u32>> = Mutex::new(Vec::new());
        let warps = frontier.len().div_ceil(WARP);
        launch(threads, warps, |w| {
            let vs = &frontier[w * WARP..((w + 1) * WARP).min(frontier.len())];
            let mut idx = [0u64; 2 * WARP];
            for (k, &v) in vs.iter().enumerate() {
                idx[2 * k] = v as u64;
                idx[2 * k + 1] = v as u64 + 1;
            }
            let mut bounds = [0u64; 2 * WARP];
            g.offsets.warp_get(&idx[..2 * vs.len()], &mut bounds)?;
            let mut found = Vec::new();
            let mut nbrs = [0u32; WARP];
            for k in 0..vs.len() {
                let (mut lo, hi) = (bounds[2 * k], bounds[2 * k + 1]);
                if hi < lo || hi > g.edges.len() {
                    return Err(Error::InvalidArgument(format!(
                        "vertex {}: edge range {lo}..{hi} outside {} edges",
                        vs[k],
                        g.edges.len()
                    )));
                }
                while lo < hi {
                    let m = ((hi - lo) as usize).min(WARP);
                    g.edges.read_range(lo, &mut nbrs[..m])?;
                    for &u in &nbrs[..m] {
                        let slot = levels.get(u as usize).ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "edge to vertex {u} outside {n} vertices"
                            ))
                        })?;
                        if slot
                            .compare_exchange(
                                u32::MAX,
                                level + 1,
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            found.push(u);
                        }
                    }
                    lo += m as u64;
                }
            }
            if !found.is_empty() {
                next.lock()
                    .map_err(|_| Error::InvalidArgument("frontier lock poisoned".into()))?
                    .extend(found);
            }
            Ok(())
        })?;
        frontier = next
            .into_inner()
            .map_err(|_| Error::InvalidArgument("frontier lock poisoned".into()))?;
        level += 1;
    }
    Ok(levels.into_iter().map(AtomicU32::into_inner).collect())
}

/// The same BFS in memory, the reference the storage version must equal.
pub fn bfs_in_memory(offsets: &[u64], edges: &[u32], source: u32) -> Vec<u32> {
    let n = offsets.len().saturating_sub(1);
    let mut levels = vec![u32::MAX; n];
    let mut q = std::collections::VecDeque::new();
    if (source as usize) < n {
        levels[source as usize] = 0;
        q.push_back(source);
    }
    while let Some(v) = q.pop_front() {
        let (lo, hi) = (
            offsets[v as usize] as usize,
            offsets[v as usize + 1] as usize,
        );
        for &u in &edges[lo..hi] {
            if levels[u as usize] == u32::MAX {
                levels[u as usize] = levels[v as usize] + 1;
                q.push_back(u);
            }
        }
    }
    levels
}
