//! Thread block cluster occupancy (`cuOccupancyMaxActiveClusters`,
//! `cuOccupancyMaxPotentialClusterSize` and the cluster table's slots 9 and 10).
//!
//! How many clusters run at once depends on how the GPU groups its SMs into the GPCs a
//! cluster must fit in, which only the GPU's driver knows: a vGPU that announces
//! `features::CLUSTER_OCCUPANCY` (a cuda vGPU with clusters) answers each question with
//! its driver (`CLUSTER_OCCUPANCY`), and the library keeps the answers per function and
//! shape, so a program probing in a loop pays one round trip per shape. The question
//! waits on its queue without the driver's lock (a queue busy with kernels does not hold
//! up the program's other threads). Elsewhere the library estimates: the blocks that fit
//! every SM, each SM taken as able to join any cluster. docs/cuda-api.md describes both.

use std::collections::HashMap;
use std::ffi::c_int;

use vgpu_proto::{
    features, occupancy_query, ClusterOccupancyArgs, MAX_CLUSTER_BLOCKS,
    MAX_OCCUPANCY_CLUSTER_BLOCKS, OCCUPANCY_NON_PORTABLE, PORTABLE_CLUSTER_BLOCKS,
};

use crate::driver::{self, Driver, Res, SharedQueue};
use crate::transport::AnyTransport;
use crate::types::{res, CUfunction};

/// Most answers kept; past it the cache starts over (a program probing without end must
/// not grow the library without end).
const MAX_ANSWERS: usize = 4096;

/// One question as the library keeps its answer: the function, block, dynamic shared
/// memory, cluster (all zero for the largest-cluster question), whether non-portable sizes
/// are allowed, the function's dynamic shared memory limit, and the question.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Question {
    function: u64,
    block: [u32; 3],
    shared: u32,
    cluster: [u32; 3],
    non_portable: bool,
    max_dynamic_shared: u32,
    query: u32,
}

/// The device's answers so far.
#[derive(Default)]
pub struct Answers(HashMap<Question, u64>);

impl Answers {
    fn keep(&mut self, q: Question, n: u64) {
        if self.0.len() >= MAX_ANSWERS {
            self.0.clear();
        }
        self.0.insert(q, n);
    }
}

/// An answer the library has, or the question the device answers first
/// ([`Pending::answer`], without the driver's lock).
pub(crate) enum Pending {
    Known(u64),
    Ask {
        question: Question,
        args: ClusterOccupancyArgs,
        queue: SharedQueue,
        t: AnyTransport,
        /// The library's estimate, for a device that turns the question down.
        estimate: u64,
    },
}

impl Pending {
    /// The answer: the device asked on its queue with only the queue's lock held, and the
    /// answer kept.
    pub(crate) fn answer(self) -> Res<u64> {
        let (question, args, queue, t, estimate) = match self {
            Pending::Known(n) => return Ok(n),
            Pending::Ask {
                question,
                args,
                queue,
                t,
                estimate,
            } => (question, args, queue, t, estimate),
        };
        let got = driver::lock(&queue).call(&t, |s| s.cluster_occupancy(&args));
        match got {
            Ok(n) => {
                tracing::debug!(?args, answer = n, "cluster occupancy from the device");
                // Kept when the driver is still there (the answer stands either way).
                let _ = driver::with(|d| {
                    d.occupancy.keep(question, n);
                    Ok(())
                });
                Ok(n)
            }
            // A function the device cannot answer for (its storage kernels): estimated.
            Err(res::NOT_SUPPORTED) => Ok(estimate),
            // A worker that takes questions only up to the largest cluster a launch may
            // have: none of a larger one runs.
            Err(res::INVALID_VALUE)
                if product(question.cluster) > u64::from(MAX_CLUSTER_BLOCKS) =>
            {
                Ok(0)
            }
            Err(e) => {
                tracing::debug!(code = e, ?args, "cluster occupancy refused by the device");
                Err(e)
            }
        }
    }
}

fn product(a: [u32; 3]) -> u64 {
    a.iter().fold(1u64, |p, &x| p.saturating_mul(u64::from(x)))
}

/// Whether blocks of `block` threads with `shared` bytes of dynamic shared memory can run
/// `f` at all on this device (threads, dimensions and shared memory within its limits).
fn launchable(d: &Driver, f: CUfunction, block: [u32; 3], shared: u64) -> Res<bool> {
    let g = &d.attributes;
    let func = super::func::lookup(d, f)?;
    let max_threads = match func.attrs.map_or(0, |a| a.max_threads_per_block) {
        0 => g.max_threads_per_block,
        m => m.min(g.max_threads_per_block),
    };
    let fixed = func.attrs.map_or(0, |a| a.static_shared_bytes);
    let optin = g
        .max_shared_per_block_optin
        .min(vgpu_proto::MAX_SHARED_BYTES);
    Ok(product(block) <= u64::from(max_threads)
        && block
            .iter()
            .zip(g.max_block_dim)
            .all(|(&b, max)| max == 0 || b <= max)
        && shared.saturating_add(u64::from(fixed)) <= u64::from(optin))
}

/// The device's kept answer to `q` for library function `f`, else the question to ask
/// it (`estimate` where it turns the question down); `None` when the device does not
/// answer such questions (the caller estimates).
fn ask(d: &Driver, f: CUfunction, q: Question, estimate: u64) -> Res<Option<Pending>> {
    if d.info.features & features::CLUSTER_OCCUPANCY == 0 {
        return Ok(None);
    }
    if let Some(&n) = d.occupancy.0.get(&q) {
        return Ok(Some(Pending::Known(n)));
    }
    let args = ClusterOccupancyArgs {
        function: super::func::lookup(d, f)?.device,
        block: q.block,
        shared_bytes: q.shared,
        cluster: q.cluster,
        query: q.query,
        flags: if q.non_portable {
            OCCUPANCY_NON_PORTABLE
        } else {
            0
        },
        max_dynamic_shared: q.max_dynamic_shared,
    };
    Ok(Some(Pending::Ask {
        question: q,
        args,
        queue: d.shared_queue(0)?,
        t: d.t.clone(),
        estimate,
    }))
}

/// Clusters of `cluster` blocks of `block` threads with `shared` bytes of dynamic shared
/// memory each that run at once on the whole GPU: the device's driver's answer where it
/// gives one, up to clusters of whole GPCs (larger than a launch may have: cuBLASLt reads
/// the GPCs' sizes from these answers), else the blocks that fit every SM (each SM taken
/// as able to join any cluster) over the cluster's size, and none above the largest
/// cluster a launch may have. None of a cluster larger than `MAX_OCCUPANCY_CLUSTER_BLOCKS`
/// runs, nor above the portable 8 blocks for a function that did not allow non-portable
/// sizes, nor on a vGPU without clusters, nor of blocks that cannot run.
pub(crate) fn active_clusters(
    d: &mut Driver,
    f: CUfunction,
    block: [u32; 3],
    shared: u64,
    cluster: [u32; 3],
) -> Res<Pending> {
    let needs = super::func::occupancy_checks(d, f, 0)?;
    if block.contains(&0) || cluster.contains(&0) {
        return Err(res::INVALID_VALUE);
    }
    let size = product(cluster);
    if size > 1 && d.info.features & features::CLUSTERS == 0 {
        return Ok(Pending::Known(0));
    }
    let non_portable = super::func::lookup(d, f)?.cluster.non_portable;
    // A cluster larger than any GPC: none fit, as the driver answers (cuBLASLt probes
    // clusters up to 32 blocks).
    let most = if non_portable {
        MAX_OCCUPANCY_CLUSTER_BLOCKS
    } else {
        PORTABLE_CLUSTER_BLOCKS
    };
    if size > u64::from(most) || !launchable(d, f, block, shared)? {
        return Ok(Pending::Known(0));
    }
    let per_sm = super::func::blocks_per_sm(&d.attributes, needs, product(block), shared);
    let estimate = if size > u64::from(MAX_CLUSTER_BLOCKS) {
        0
    } else {
        per_sm * u64::from(d.attributes.sm_count.max(1)) / size
    };
    let q = Question {
        function: f as u64,
        block,
        // Bounded by `launchable` (at most the GPU's shared memory per block).
        shared: u32::try_from(shared).unwrap_or(u32::MAX),
        cluster,
        non_portable,
        max_dynamic_shared: max_dynamic_shared(d, f)?,
        query: occupancy_query::MAX_ACTIVE_CLUSTERS,
    };
    Ok(ask(d, f, q, estimate)?.unwrap_or(Pending::Known(estimate)))
}

/// The largest cluster of blocks of `block` threads with `shared` bytes of dynamic shared
/// memory the function may launch in: the cluster the program required of the function
/// (its cluster dimensions) if it set one; else the device's driver's answer where it
/// gives one, else the portable 8 blocks (16 once the program allowed non-portable
/// sizes); one block where clusters do not run, none where such blocks cannot run.
pub(crate) fn potential_cluster_size(
    d: &mut Driver,
    f: CUfunction,
    block: [u32; 3],
    shared: u64,
) -> Res<Pending> {
    super::func::occupancy_checks(d, f, 0)?;
    if block.contains(&0) {
        return Err(res::INVALID_VALUE);
    }
    let settings = super::func::lookup(d, f)?.cluster;
    if d.info.features & features::CLUSTERS == 0 {
        return Ok(Pending::Known(1));
    }
    if !settings.dims.contains(&0) {
        return Ok(Pending::Known(product(settings.dims)));
    }
    if !launchable(d, f, block, shared)? {
        return Ok(Pending::Known(0));
    }
    let estimate = u64::from(if settings.non_portable {
        MAX_CLUSTER_BLOCKS
    } else {
        PORTABLE_CLUSTER_BLOCKS
    });
    let q = Question {
        function: f as u64,
        block,
        shared: u32::try_from(shared).unwrap_or(u32::MAX),
        cluster: [0; 3],
        non_portable: settings.non_portable,
        max_dynamic_shared: max_dynamic_shared(d, f)?,
        query: occupancy_query::MAX_CLUSTER_SIZE,
    };
    Ok(ask(d, f, q, estimate)?.unwrap_or(Pending::Known(estimate)))
}

/// The dynamic shared memory limit the program set on the function (checked against the
/// device's when set).
fn max_dynamic_shared(d: &Driver, f: CUfunction) -> Res<u32> {
    Ok(u32::try_from(super::func::lookup(d, f)?.max_dynamic_shared).unwrap_or(0))
}

/// An answer as the C `int` the calls write.
pub(crate) fn as_int(n: u64) -> c_int {
    n.min(c_int::MAX as u64) as c_int
}
