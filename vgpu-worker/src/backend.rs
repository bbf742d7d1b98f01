//! The vGPU's backend stack, bottom up: a GPU (simulated, or an NVIDIA GPU through CUDA)
//! that also serves the vGPU's storage namespaces; the migratable layer that can move the
//! vGPU to another GPU; the pager of an oversubscribed vGPU (vgpud decides what stays
//! resident); fault injection when the environment asks for it.

use std::sync::Arc;

use vgpu_api::control::TargetGpu;
use vgpu_backend::pager::Pager;
use vgpu_backend::storage::{NamespaceSpec, StorageSet};
use vgpu_backend::{Backend, BackendError, CudaConfig, CudaGpu, SimConfig, SimGpu};
use vgpu_migration::Migratable;

use crate::error::WorkerError;
use crate::memlink::{Asker, ControlBroker};

/// The backends a worker can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The simulated GPU (CPU threads, host memory).
    Sim,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
}

/// The GPU the vGPU starts on.
#[derive(Clone, Debug)]
pub struct GpuSpec {
    pub kind: BackendKind,
    /// CUDA device ordinal (cuda).
    pub ordinal: i32,
    /// The vGPU's memory share: the pager's limit, and a cuda GPU's allocation limit.
    pub memory: u64,
    /// The CUDA context's stack, heap and printf FIFO (cuda): what they reserve is charged
    /// to `memory`.
    pub cuda_limits: vgpu_backend::cuda::ContextLimits,
    /// Memory of the simulated GPU; None: `memory`.
    pub sim_memory: Option<u64>,
    pub sim_copy_bw: u64,
    pub sim_speed: f64,
    pub sim_threads: usize,
}

/// The assembled stack and the layers the control loop talks to.
pub struct Stack {
    /// What the device serves the guest from (the top of the stack).
    pub backend: Arc<dyn Backend>,
    /// The layer a migration swaps the GPU under.
    pub migratable: Arc<Migratable>,
    /// The pager, for an oversubscribed vGPU.
    pub pager: Option<Arc<Pager>>,
}

/// The CUDA context limits of this worker's vGPU (`--cuda-stack`, `--cuda-heap`,
/// `--cuda-printf-fifo`), set once by [`gpu`]: a migration target on cuda takes the same.
static CUDA_LIMITS: std::sync::OnceLock<vgpu_backend::cuda::ContextLimits> =
    std::sync::OnceLock::new();

/// The vGPU's storage namespaces from `--storage`, or None when there are none.
pub fn storage_set(specs: &[NamespaceSpec]) -> Result<Option<Arc<StorageSet>>, WorkerError> {
    if specs.is_empty() {
        return Ok(None);
    }
    let set = StorageSet::new(specs.to_vec())?;
    for s in specs {
        tracing::info!(namespace = s.id, path = %s.path.display(), read_only = s.read_only,
            "storage namespace attached (opened on the guest's STORAGE_ATTACH)");
    }
    Ok(Some(Arc::new(set)))
}

/// A simulated GPU serving `storage`.
fn sim_gpu(
    cfg: SimConfig,
    storage: Option<&Arc<StorageSet>>,
) -> Result<Arc<dyn Backend>, BackendError> {
    let sim = SimGpu::new(cfg)?;
    Ok(Arc::new(match storage {
        Some(set) => sim.with_storage(set.clone()),
        None => sim,
    }))
}

/// An NVIDIA GPU serving `storage`.
fn cuda_gpu(
    cfg: CudaConfig,
    storage: Option<&Arc<StorageSet>>,
) -> Result<Arc<dyn Backend>, BackendError> {
    let gpu = CudaGpu::new(cfg)?;
    Ok(Arc::new(match storage {
        Some(set) => gpu.with_storage(set.clone()),
        None => gpu,
    }))
}

/// The GPU at the bottom of the stack (what a pool worker builds before it has a vGPU:
/// the context, the reserved address space, the built-in kernels).
pub fn gpu(
    spec: &GpuSpec,
    storage: Option<&Arc<StorageSet>>,
) -> Result<Arc<dyn Backend>, WorkerError> {
    let limits = *CUDA_LIMITS.get_or_init(|| spec.cuda_limits);
    Ok(match spec.kind {
        BackendKind::Sim => sim_gpu(
            SimConfig {
                memory: spec.sim_memory.unwrap_or(spec.memory),
                copy_bandwidth: spec.sim_copy_bw,
                speed: spec.sim_speed,
                threads: spec.sim_threads,
                ..SimConfig::default()
            },
            storage,
        )?,
        BackendKind::Cuda => cuda_gpu(
            CudaConfig {
                ordinal: spec.ordinal,
                memory: spec.memory,
                limits,
                ..CudaConfig::default()
            },
            storage,
        )?,
    })
}

/// The stack over `gpu`: the migratable layer, the pager of an oversubscribed vGPU
/// (`broker`), fault injection when the environment asks for it.
pub fn assemble(
    gpu: Arc<dyn Backend>,
    spec: &GpuSpec,
    broker: Option<Arc<Asker>>,
    vgpu_id: u32,
) -> Stack {
    let migratable = Arc::new(Migratable::new(gpu));
    let inner: Arc<dyn Backend> = migratable.clone();
    let pager = broker.map(|a| {
        Arc::new(Pager::new(
            inner.clone(),
            Arc::new(ControlBroker(a)),
            spec.memory,
        ))
    });
    let backend: Arc<dyn Backend> = match &pager {
        Some(p) => p.clone(),
        None => inner,
    };
    // Fault injection (tests, soak): only when VGPU_FAULTS_DIR is set.
    let backend = vgpu_backend::faults::from_env(backend, vgpu_id);
    Stack {
        backend,
        migratable,
        pager,
    }
}

/// Builds a migration target's GPU: a cuda target is sized by the vGPU's memory share
/// `memory` and takes the vGPU's context limits; both serve the vGPU's `storage` too.
pub fn target(
    t: &TargetGpu,
    memory: u64,
    storage: Option<&Arc<StorageSet>>,
) -> Result<Arc<dyn Backend>, String> {
    let b = match t.cuda_ordinal {
        None => sim_gpu(
            SimConfig {
                memory: t.sim_memory,
                copy_bandwidth: t.sim_copy_bw,
                speed: t.sim_speed,
                threads: t.sim_threads,
                ..SimConfig::default()
            },
            storage,
        ),
        Some(ordinal) => cuda_gpu(
            CudaConfig {
                ordinal,
                memory,
                migration_target: true,
                limits: CUDA_LIMITS.get().copied().unwrap_or_default(),
                ..CudaConfig::default()
            },
            storage,
        ),
    }
    .map_err(|e| e.to_string())?;
    Ok(vgpu_backend::faults::target(b))
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_hard_limit_exit_status_is_the_one_vgpud_knows() {
        assert_eq!(
            vgpu_backend::cuda::EXIT_KERNEL_HARD_LIMIT,
            vgpu_api::control::EXIT_KERNEL_HARD_LIMIT
        );
    }
}
