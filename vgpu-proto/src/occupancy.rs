//! `CLUSTER_OCCUPANCY` (since 1.6, `features::CLUSTER_OCCUPANCY`): a function's thread
//! block cluster occupancy answered by the GPU's driver (`cuOccupancyMaxActiveClusters`,
//! `cuOccupancyMaxPotentialClusterSize`), which knows how the GPU's SMs are grouped into
//! the GPCs a cluster must fit in.

use core::fmt;

use crate::launch::{MAX_SHARED_BYTES, MAX_THREADS_PER_BLOCK};
use crate::wire::wire_struct;

/// [`ClusterOccupancyArgs::query`] values.
pub mod occupancy_query {
    /// How many clusters of `cluster` blocks run at once on the whole GPU
    /// (`cuOccupancyMaxActiveClusters`).
    pub const MAX_ACTIVE_CLUSTERS: u32 = 0;
    /// The most blocks one cluster of this function may have and still run
    /// (`cuOccupancyMaxPotentialClusterSize`); `cluster` is all zero.
    pub const MAX_CLUSTER_SIZE: u32 = 1;
}

/// [`ClusterOccupancyArgs::flags`] bit: the function may launch clusters above the
/// portable 8 blocks (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED` set by the
/// program).
pub const OCCUPANCY_NON_PORTABLE: u32 = 1;

/// Most blocks in a cluster a function that does not allow non-portable sizes may have.
pub const PORTABLE_CLUSTER_BLOCKS: u32 = 8;

/// Most blocks in a cluster a `MAX_ACTIVE_CLUSTERS` question may name: more than a launch
/// may have (`MAX_CLUSTER_BLOCKS`). The driver answers how many clusters of up to a whole
/// GPC fit at once (on an H200, 2 of 17 and of 18 blocks, none of 19), and cuBLASLt reads
/// the sizes of the GPU's GPCs from those answers before it shapes its GEMMs' clusters.
pub const MAX_OCCUPANCY_CLUSTER_BLOCKS: u32 = 64;

wire_struct! {
    /// `CLUSTER_OCCUPANCY`: result[0] = the answer (clusters for `MAX_ACTIVE_CLUSTERS`,
    /// blocks for `MAX_CLUSTER_SIZE`). No data descriptors.
    pub struct ClusterOccupancyArgs, size 48 {
        /// Function handle from `GET_FUNCTION`.
        pub function: u64,
        /// Block size in threads (each >= 1, product <= `MAX_THREADS_PER_BLOCK`).
        pub block: [u32; 3],
        /// Dynamic shared memory per block in bytes (<= `MAX_SHARED_BYTES`).
        pub shared_bytes: u32,
        /// The cluster in blocks (each >= 1, at most `MAX_OCCUPANCY_CLUSTER_BLOCKS` blocks, at most
        /// `PORTABLE_CLUSTER_BLOCKS` without `OCCUPANCY_NON_PORTABLE`) for
        /// `MAX_ACTIVE_CLUSTERS`; all zero for `MAX_CLUSTER_SIZE`.
        pub cluster: [u32; 3],
        /// An [`occupancy_query`] value.
        pub query: u32,
        /// 0 or `OCCUPANCY_NON_PORTABLE`.
        pub flags: u32,
        /// The function's dynamic shared memory limit as the program set it
        /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, <= `MAX_SHARED_BYTES`): the
        /// device's function is allowed at least this much before the driver is asked, as
        /// the program's is.
        pub max_dynamic_shared: u32,
    }
}

/// Why `CLUSTER_OCCUPANCY` arguments were refused (the device answers
/// `INVALID_ARGUMENT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OccupancyError {
    /// `query` is not an [`occupancy_query`] value.
    Query(u32),
    /// Flag bits other than `OCCUPANCY_NON_PORTABLE`.
    Flags(u32),
    /// A block size of 0, or more than `MAX_THREADS_PER_BLOCK` threads.
    Block([u32; 3]),
    /// More dynamic shared memory (asked about, or as the function's limit) than a block
    /// can have.
    Shared(u32),
    /// A cluster size of 0 or more than `MAX_OCCUPANCY_CLUSTER_BLOCKS` blocks (`MAX_ACTIVE_CLUSTERS`),
    /// or not all zero (`MAX_CLUSTER_SIZE`).
    Cluster([u32; 3]),
    /// A cluster above the portable 8 blocks for a function that does not allow it.
    NotPortable([u32; 3]),
}

impl fmt::Display for OccupancyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OccupancyError::Query(q) => write!(
                f,
                "occupancy query {q} is unknown; use 0 (most active clusters) or 1 (largest cluster)"
            ),
            OccupancyError::Flags(v) => write!(
                f,
                "flags {v:#x}: only bit 0 (non-portable cluster sizes allowed) is defined"
            ),
            OccupancyError::Block(b) => write!(
                f,
                "block {b:?}: each size must be at least 1 and the block at most {MAX_THREADS_PER_BLOCK} threads"
            ),
            OccupancyError::Shared(s) => write!(
                f,
                "{s} bytes of dynamic shared memory per block: at most {MAX_SHARED_BYTES} are possible"
            ),
            OccupancyError::Cluster(c) => write!(
                f,
                "cluster {c:?}: each size must be at least 1 and the cluster at most {MAX_OCCUPANCY_CLUSTER_BLOCKS} blocks (all zero when asking for the largest cluster)"
            ),
            OccupancyError::NotPortable(c) => write!(
                f,
                "cluster {c:?} is above the portable {PORTABLE_CLUSTER_BLOCKS} blocks: allow the function non-portable cluster sizes first"
            ),
        }
    }
}

impl ClusterOccupancyArgs {
    /// Blocks in the cluster (0 for an all-zero cluster; saturating, for any input).
    pub fn cluster_blocks(&self) -> u64 {
        product(self.cluster)
    }

    /// Whether the function allows clusters above the portable 8 blocks.
    pub fn non_portable(&self) -> bool {
        self.flags & OCCUPANCY_NON_PORTABLE != 0
    }

    /// Checks every field against what a launch could be: the function handle is the
    /// backend's to check, and the device's own limits (shared memory per block, the
    /// block's dimensions) the driver's.
    pub fn check(&self) -> Result<(), OccupancyError> {
        if self.flags & !OCCUPANCY_NON_PORTABLE != 0 {
            return Err(OccupancyError::Flags(self.flags));
        }
        let threads = product(self.block);
        if self.block.contains(&0) || threads > MAX_THREADS_PER_BLOCK {
            return Err(OccupancyError::Block(self.block));
        }
        for s in [self.shared_bytes, self.max_dynamic_shared] {
            if s > MAX_SHARED_BYTES {
                return Err(OccupancyError::Shared(s));
            }
        }
        match self.query {
            occupancy_query::MAX_ACTIVE_CLUSTERS => {
                let blocks = self.cluster_blocks();
                if self.cluster.contains(&0) || blocks > u64::from(MAX_OCCUPANCY_CLUSTER_BLOCKS) {
                    return Err(OccupancyError::Cluster(self.cluster));
                }
                if blocks > u64::from(PORTABLE_CLUSTER_BLOCKS) && !self.non_portable() {
                    return Err(OccupancyError::NotPortable(self.cluster));
                }
            }
            occupancy_query::MAX_CLUSTER_SIZE => {
                if self.cluster != [0; 3] {
                    return Err(OccupancyError::Cluster(self.cluster));
                }
            }
            q => return Err(OccupancyError::Query(q)),
        }
        Ok(())
    }
}

/// `a[0] * a[1] * a[2]`, saturating (three u32 can overflow a u64).
fn product(a: [u32; 3]) -> u64 {
    a.iter().fold(1u64, |p, &x| p.saturating_mul(u64::from(x)))
}
