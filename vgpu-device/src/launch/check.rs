//! The device's checks of a LAUNCH: every launch, alone or in a batch, passes them once,
//! when its request is read ([`crate::request`]), and flows on as a [`Checked`] launch.

use vgpu_backend::{Launch, LaunchConfig};
use vgpu_proto::{
    features, ArgError, ArgValue, LaunchRequest, Opcode, MAX_KERNEL_ARGS, MAX_SHARED_BYTES,
    MAX_THREADS_PER_BLOCK,
};

use crate::device::Vgpu;
use crate::error::RequestError;
use crate::lines::touch;

/// A launch that passed the device's checks, ready for the backend.
#[derive(Clone, Debug)]
pub(crate) struct Checked {
    /// The function handle.
    pub function: u64,
    /// The geometry.
    pub config: LaunchConfig,
    /// Thread block cluster in blocks (`NO_CLUSTER` for none).
    pub cluster: [u32; 3],
    /// The typed arguments (the first `count`).
    pub args: [ArgValue; MAX_KERNEL_ARGS as usize],
    /// How many arguments there are.
    pub count: usize,
    /// The request's parameter blob when an argument is a by-value blob, else empty.
    pub blob: Vec<u8>,
    /// The launch's priority rank (hardware slots).
    pub rank: u32,
}

impl Checked {
    /// The arguments.
    pub fn args(&self) -> &[ArgValue] {
        self.args.get(..self.count).unwrap_or(&[])
    }

    /// Asks for the lines [`Checked::launch`] reads (the queue thread wrote them; the
    /// launch runner reads them next, from another core).
    pub fn prefetch(&self) {
        touch((&raw const self.blob).cast());
        touch((&raw const self.function).cast());
        touch((&raw const self.config).cast());
        touch((&raw const self.rank).cast());
    }

    /// The launch as the backend takes it.
    pub fn launch(&self) -> Launch<'_> {
        Launch {
            function: self.function,
            config: self.config,
            cluster: self.cluster,
            args: self.args(),
            blob: &self.blob,
        }
    }
}

impl Vgpu {
    /// The device's checks of a launch: flags, geometry, dependencies, every argument's
    /// kind and the blob arguments against the blob and the function's parameters (the
    /// backend checks the arguments against the function again, and every pointer).
    pub(crate) fn check_launch(&self, l: &LaunchRequest<'_>) -> Result<Checked, RequestError> {
        let op = Opcode::Launch;
        let la = &l.launch;
        let cluster = la
            .cluster()
            .map_err(|e| RequestError::invalid(op, e.to_string()))?;
        if cluster != vgpu_backend::NO_CLUSTER && self.space.features & features::CLUSTERS == 0 {
            return Err(RequestError::NotSupported {
                opcode: op.name(),
                why: "this device runs no thread block clusters (capability bit CLUSTERS is clear); use a cuda vGPU on a GPU of compute capability 9.0 or newer",
            });
        }
        if la.grid.contains(&0) || la.block.contains(&0) {
            return Err(RequestError::invalid(
                op,
                format!(
                    "grid {:?} and block {:?} must be >= 1 in every dimension",
                    la.grid, la.block
                ),
            ));
        }
        // Three u32 factors can overflow u64 (fuzzing found it: a plain product panics in
        // debug builds and wraps in release, where a wrapped count could pass the check).
        let threads = la
            .block
            .iter()
            .try_fold(1u64, |n, v| n.checked_mul(u64::from(*v)))
            .unwrap_or(u64::MAX);
        if threads > MAX_THREADS_PER_BLOCK {
            return Err(RequestError::invalid(
                op,
                format!("block of {threads} threads; at most {MAX_THREADS_PER_BLOCK}"),
            ));
        }
        if la.shared_bytes > MAX_SHARED_BYTES {
            return Err(RequestError::invalid(
                op,
                format!(
                    "{} bytes of shared memory; at most {MAX_SHARED_BYTES}",
                    la.shared_bytes
                ),
            ));
        }
        if l.deps.iter().any(|d| d == 0 || d == la.task_id) {
            return Err(RequestError::invalid(
                op,
                "dependency task ids must be non-zero and not the launch's own task id",
            ));
        }
        let mut c = Checked {
            function: la.function,
            config: LaunchConfig {
                grid: la.grid,
                block: la.block,
                shared_bytes: la.shared_bytes,
            },
            cluster,
            args: [ArgValue::U32(0); MAX_KERNEL_ARGS as usize],
            count: 0,
            blob: Vec::new(),
            rank: la.rank,
        };
        // Bytes of the BLOB arguments together, and the last one's index.
        let (mut blob_total, mut last_blob) = (0u64, None);
        for (slot, (index, arg)) in c.args.iter_mut().zip(l.args.iter().enumerate()) {
            *slot = arg
                .typed()
                .map_err(|err| RequestError::KernelArg { index, err })?;
            if let ArgValue::Blob { offset, len } = *slot {
                if self.space.features & features::PARAM_BLOBS == 0 {
                    return Err(RequestError::NotSupported {
                        opcode: op.name(),
                        why: "this device runs no guest code, so no function takes a by-value parameter over 8 bytes (capability bit PARAM_BLOBS is clear); use a cuda vGPU",
                    });
                }
                l.blob_bytes(offset, len).ok_or(RequestError::KernelArg {
                    index,
                    err: ArgError::BlobOutside {
                        offset: u64::from(offset),
                        len,
                    },
                })?;
                blob_total += u64::from(len);
                last_blob = Some(index);
            }
            c.count += 1;
        }
        if let Some(index) = last_blob {
            if blob_total > u64::from(vgpu_proto::MAX_PARAM_BLOB_BYTES) {
                return Err(RequestError::KernelArg {
                    index,
                    err: ArgError::BlobsTooLarge(blob_total),
                });
            }
        }
        if last_blob.is_some() {
            // Each blob must be exactly its parameter's bytes (where the backend reports the
            // layout; it checks again when it packs the parameters).
            if let Ok(params) = self.backend.modules().param_layout(la.function) {
                for (index, v) in c.args().iter().enumerate() {
                    if let ArgValue::Blob { len, .. } = *v {
                        let param = params.get(index).map_or(0, |(_, size)| size);
                        if param != len {
                            return Err(RequestError::KernelArg {
                                index,
                                err: ArgError::BlobSizeMismatch { len, param },
                            });
                        }
                    }
                }
            }
            c.blob.extend_from_slice(l.blob);
        }
        Ok(c)
    }
}
