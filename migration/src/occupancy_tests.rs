//! Cluster occupancy through the migration layer: asked of the backend serving now, for
//! its own handle of the function, before and after a move.

use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::{
    Backend, BackendError, BackendInfo, FunctionInfo, Launch, LaunchStats, ModuleImage, Modules,
    ParamLayout, SimConfig, SimGpu,
};
use vgpu_proto::{occupancy_query, ClusterOccupancyArgs};

use crate::{Migratable, MigrateOptions, Mode};

const MIB: u64 = 1 << 20;

/// A sim GPU whose occupancy answer is the function handle it was asked about (its own),
/// plus `tag`, so a test sees which backend answered for which handle.
struct Answering {
    sim: SimGpu,
    tag: u64,
}

impl Backend for Answering {
    fn info(&self) -> &BackendInfo {
        self.sim.info()
    }
    fn launch(&self, launches: &[Launch<'_>]) -> Vec<vgpu_backend::Result<LaunchStats>> {
        self.sim.launch(launches)
    }
    fn modules(&self) -> &dyn Modules {
        self
    }
    vgpu_backend::forward_backend!(sim:
        memory_usage, alloc, free, check_range, copy_htod, copy_dtoh, copy_dtod, memset,
        synchronize, paging, relocation, shared_memory, host_memory, virtual_memory
    );
}

impl Modules for Answering {
    fn module_load(&self, image: ModuleImage<'_>) -> vgpu_backend::Result<u64> {
        self.sim.modules().module_load(image)
    }
    fn module_unload(&self, module: u64) -> vgpu_backend::Result<()> {
        self.sim.modules().module_unload(module)
    }
    fn get_function(&self, module: u64, name: &[u8]) -> vgpu_backend::Result<FunctionInfo> {
        self.sim.modules().get_function(module, name)
    }
    fn param_layout(&self, function: u64) -> vgpu_backend::Result<ParamLayout> {
        self.sim.modules().param_layout(function)
    }
    fn cluster_occupancy(&self, q: &ClusterOccupancyArgs) -> vgpu_backend::Result<u64> {
        self.sim.modules().param_layout(q.function)?;
        Ok(self.tag + q.function)
    }
}

fn answering(tag: u64) -> Arc<Answering> {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    Arc::new(Answering { sim, tag })
}

#[test]
fn occupancy_is_asked_of_the_backend_serving_now_for_its_handle() {
    let source = answering(1 << 40);
    let m = Migratable::new(source.clone());
    let module = m
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin");
    // A second module first on the target, so its handles differ from the source's.
    let target = answering(2 << 40);
    target
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin");
    let f = m.modules().get_function(module, b"saxpy").expect("saxpy");
    let q = ClusterOccupancyArgs {
        function: f.handle,
        block: [128, 1, 1],
        cluster: [2, 1, 1],
        query: occupancy_query::MAX_ACTIVE_CLUSTERS,
        ..ClusterOccupancyArgs::default()
    };
    let real = |b: &Answering| {
        let modules = b.sim.modules();
        // The backend's own handle: the one its module table gives saxpy.
        (1..=8u64)
            .filter_map(|m| modules.get_function(m, b"saxpy").ok())
            .last()
            .expect("saxpy on the backend")
            .handle
    };
    assert_eq!(
        m.modules().cluster_occupancy(&q).expect("answered"),
        (1 << 40) + real(&source)
    );
    m.migrate(
        target.clone(),
        &MigrateOptions {
            mode: Mode::StopCopy,
            max_downtime: Duration::from_millis(5),
            max_rounds: 6,
        },
        |_| {},
    )
    .expect("migrates");
    let after = m.modules().cluster_occupancy(&q).expect("answered");
    assert_eq!(
        after,
        (2 << 40) + real(&target),
        "the target's answer, for its handle"
    );
    assert_ne!(real(&target), real(&source));
    // A handle the layer never gave out: refused before any backend is asked.
    let unknown = ClusterOccupancyArgs {
        function: f.handle + 1000,
        ..q
    };
    assert!(matches!(
        m.modules().cluster_occupancy(&unknown),
        Err(BackendError::UnknownFunction(_))
    ));
}
