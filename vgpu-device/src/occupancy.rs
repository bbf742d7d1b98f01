//! `CLUSTER_OCCUPANCY` (since 1.6, capability `CLUSTER_OCCUPANCY`): a function's thread
//! block cluster occupancy answered by the backend's GPU driver, after the device checked
//! every field (docs/protocol.md).

use vgpu_proto::{features, ClusterOccupancyArgs, Opcode};

use crate::device::{Outcome, Vgpu};
use crate::error::RequestError;

impl Vgpu {
    /// Checks `a` (the query, flags, block, shared memory and the function's limit against
    /// the device's per-block limit, the cluster's size) before the backend sees it; the backend checks the
    /// function handle. r0 = the answer.
    pub(crate) fn cluster_occupancy(&self, a: &ClusterOccupancyArgs) -> Outcome {
        let op = Opcode::ClusterOccupancy;
        if self.space.features & features::CLUSTER_OCCUPANCY == 0 {
            return Err(RequestError::NotSupported {
                opcode: op.name(),
                why: "this device does not answer cluster occupancy (capability bit CLUSTER_OCCUPANCY is clear: a sim vGPU, or a GPU without thread block clusters)",
            });
        }
        a.check()
            .map_err(|e| RequestError::invalid(op, e.to_string()))?;
        let g = &self.backend.info().attributes;
        let most = g.max_shared_per_block_optin;
        if let Some(s) = [a.shared_bytes, a.max_dynamic_shared]
            .into_iter()
            .find(|&s| most > 0 && s > most)
        {
            return Err(RequestError::invalid(
                op,
                format!(
                    "{s} bytes of dynamic shared memory per block: this GPU gives a block at most {most}"
                ),
            ));
        }
        if a.block
            .iter()
            .zip(g.max_block_dim)
            .any(|(&b, max)| max > 0 && b > max)
        {
            return Err(RequestError::invalid(
                op,
                format!(
                    "block {:?} is larger than this GPU's largest block {:?} in some dimension",
                    a.block, g.max_block_dim
                ),
            ));
        }
        let n = self.backend.modules().cluster_occupancy(a)?;
        Ok([n, 0, 0, 0])
    }
}
