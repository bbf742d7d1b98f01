//! `ENCODE_TENSOR_MAP`: a TMA tensor map descriptor encoded by the backend's GPU driver
//! for a tensor in this vGPU's memory, written into the request's one writable data
//! descriptor (docs/protocol.md).

use vgpu_proto::{features, Opcode, TensorMapArgs};

use crate::chain::{Chain, GuestMem};
use crate::device::{write_answer, Outcome, Vgpu};
use crate::error::RequestError;

impl Vgpu {
    /// Checks `map` (every field as the CUDA driver documents it, and the whole tensor
    /// inside one allocation of this vGPU, before the backend sees anything), has the
    /// backend encode it and writes the 128 bytes. r0 = bytes written.
    pub(crate) fn encode_tensor_map<'m>(
        &self,
        mem: &'m GuestMem,
        chain: &Chain<'m>,
        map: &TensorMapArgs,
    ) -> Outcome {
        let op = Opcode::EncodeTensorMap;
        if self.space.features & features::TENSOR_MAPS == 0 {
            return Err(RequestError::NotSupported {
                opcode: op.name(),
                why: "this device's kernels cannot use TMA tensor maps (capability bit TENSOR_MAPS is clear: a sim vGPU, or a GPU below compute capability 9.0)",
            });
        }
        map.check()
            .map_err(|e| RequestError::invalid(op, e.to_string()))?;
        // The whole tensor inside one allocation of this vGPU: the worker never encodes a
        // foreign address (a tenant could forge a descriptor, but not have ours vouch).
        let extent = map.extent().ok_or(vgpu_backend::BackendError::BadPointer {
            addr: map.global_address,
            len: u64::MAX,
        })?;
        self.backend.check_range(map.global_address, extent)?;
        let bytes = self.backend.modules().encode_tensor_map(map)?;
        write_answer(mem, chain, op, &bytes)
    }
}
