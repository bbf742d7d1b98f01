//! `CLUSTER_OCCUPANCY` on the GPU: the driver's own `cuOccupancyMaxActiveClusters` and
//! `cuOccupancyMaxPotentialClusterSize` for the vGPU's function, which know how the GPU's
//! SMs are grouped into the GPCs a cluster must fit in (an estimate from the SM count
//! alone is far off on a Hopper GPU, whose GPCs differ in size).

use cudarc::driver::sys::{self, CUresult};
use vgpu_proto::{occupancy_query, ClusterOccupancyArgs, PORTABLE_CLUSTER_BLOCKS};

use super::driver::{check, CuError};
use super::modules::{func_attribute, Func, Kernel};
use super::{CudaGpu, DEFAULT_SHARED};
use crate::error::{BackendError, Result};
use crate::sync::lock;

impl CudaGpu {
    /// [`crate::Modules::cluster_occupancy`]: the function allowed the dynamic shared
    /// memory the question names (as a launch raises it) and, when the program allowed
    /// it, non-portable cluster sizes; then the driver asked.
    pub(super) fn occupancy(&self, q: &ClusterOccupancyArgs) -> Result<u64> {
        if self.info.features & vgpu_proto::features::CLUSTER_OCCUPANCY == 0 {
            return Err(BackendError::NotSupported(format!(
                "{} has no thread block clusters (compute capability 9.0 or higher has)",
                self.info.name
            )));
        }
        q.check()
            .map_err(|e| BackendError::InvalidArgument(e.to_string()))?;
        self.enter()?;
        // The Kernel keeps a guest function's module loaded while the driver looks at it.
        let kernel = self.modules.kernel(q.function)?;
        let (func, shared_limit) = match &kernel {
            Kernel::Builtin(_, index) => (
                self.builtins.kernels.get(*index).copied().ok_or_else(|| {
                    BackendError::UnknownFunction(format!("handle {:#x}", q.function))
                })?,
                None,
            ),
            Kernel::Ptx(_, f) => (f.func, Some(&f.shared_limit)),
            Kernel::Storage(_) => {
                return Err(BackendError::NotSupported(
                    "storage kernels run alone, not in clusters".into(),
                ))
            }
        };
        self.prepare(func, q, shared_limit)
            .map_err(|e| self.occupancy_err(e))?;
        let n = ask(func, q).map_err(|e| self.occupancy_err(e))?;
        let n = u64::try_from(n).unwrap_or(0);
        drop(kernel);
        Ok(match q.query {
            // A function that does not allow non-portable sizes launches at most the
            // portable 8 blocks, whatever an earlier launch allowed the GPU's function.
            occupancy_query::MAX_CLUSTER_SIZE if !q.non_portable() => {
                n.min(u64::from(PORTABLE_CLUSTER_BLOCKS))
            }
            _ => n,
        })
    }

    /// Raises `func`'s dynamic shared memory limit to the question's and to the one the
    /// program set on its function, as the program's function has it (never lowers it: a
    /// launch may need more), and allows non-portable cluster sizes when the program did
    /// (never disallows them: a launch of a larger cluster allowed them itself).
    fn prepare(
        &self,
        func: Func,
        q: &ClusterOccupancyArgs,
        shared_limit: Option<&std::sync::Arc<std::sync::atomic::AtomicU32>>,
    ) -> std::result::Result<(), CuError> {
        use std::sync::atomic::Ordering;
        use sys::CUfunction_attribute as A;
        let _g = lock(&self.attr_lock);
        let want = q.shared_bytes.max(q.max_dynamic_shared);
        if want > DEFAULT_SHARED {
            let now = func_attribute(
                func,
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                "cuFuncGetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            )?;
            if now < want {
                // `check` bounded it to MAX_SHARED_BYTES, the device to the GPU's limit.
                let v = i32::try_from(want).unwrap_or(i32::MAX);
                check(
                    // SAFETY: sets an attribute of a live function (its module is held).
                    unsafe {
                        sys::cuFuncSetAttribute(
                            func.0,
                            A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            v,
                        )
                    },
                    "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                )?;
                if let Some(l) = shared_limit {
                    l.fetch_max(want, Ordering::AcqRel);
                }
            }
        }
        if q.non_portable() {
            check(
                // SAFETY: sets an attribute of a live function (its module is held).
                unsafe {
                    sys::cuFuncSetAttribute(
                        func.0,
                        A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    )
                },
                "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)",
            )?;
        }
        Ok(())
    }

    /// A driver error as the guest sees it: the driver refusing the question's values is
    /// the guest's invalid argument, anything else the device's.
    fn occupancy_err(&self, e: CuError) -> BackendError {
        match e.code {
            CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_INVALID_CLUSTER_SIZE => {
                BackendError::InvalidArgument(format!(
                    "the GPU's driver refused the occupancy question ({}): check the block, shared memory and cluster against the function's limits",
                    e.name()
                ))
            }
            _ => self.cuda_err(e),
        }
    }
}

/// The driver's answer for `func` (bound context, attributes prepared).
fn ask(func: Func, q: &ClusterOccupancyArgs) -> std::result::Result<i32, CuError> {
    // SAFETY: an all-zero attribute is a valid value of this plain C union.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    let active = q.query == occupancy_query::MAX_ACTIVE_CLUSTERS;
    // A grid of one cluster (a whole number of clusters); the largest-cluster question
    // names clusters of one block, which the driver ignores for it.
    let cluster = if active { q.cluster } else { [1, 1, 1] };
    attr.value.clusterDim.x = cluster[0];
    attr.value.clusterDim.y = cluster[1];
    attr.value.clusterDim.z = cluster[2];
    let config = sys::CUlaunchConfig {
        gridDimX: cluster[0],
        gridDimY: cluster[1],
        gridDimZ: cluster[2],
        blockDimX: q.block[0],
        blockDimY: q.block[1],
        blockDimZ: q.block[2],
        sharedMemBytes: q.shared_bytes,
        hStream: std::ptr::null_mut(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut n: std::ffi::c_int = 0;
    if active {
        check(
            // SAFETY: `func` is a live function of a held module in the bound context;
            // `config` and its one attribute live on this frame; writes one int into `n`.
            unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, func.0, &config) },
            "cuOccupancyMaxActiveClusters",
        )?;
    } else {
        check(
            // SAFETY: as above.
            unsafe { sys::cuOccupancyMaxPotentialClusterSize(&mut n, func.0, &config) },
            "cuOccupancyMaxPotentialClusterSize",
        )?;
    }
    Ok(n)
}
