//! `CLUSTER_OCCUPANCY` through the queue: refused on the sim device (no clusters), and on
//! a device whose backend answers, hostile arguments refused before the backend is asked.

use std::sync::Mutex;

use vgpu_backend::{Backend, BackendInfo, Launch, LaunchStats, Modules};

use super::*;

/// The sim backend with an occupancy oracle in place of a GPU driver: it checks the
/// function handle as a backend does (unknown: refused), records every question that
/// reaches it and answers one a test can predict.
struct Oracle {
    sim: SimGpu,
    info: BackendInfo,
    asked: Mutex<Vec<ClusterOccupancyArgs>>,
}

/// What the oracle answers.
fn answer(q: &ClusterOccupancyArgs) -> u64 {
    if q.query == occupancy_query::MAX_CLUSTER_SIZE {
        u64::from(q.shared_bytes >> 10)
    } else {
        1000 / q.cluster_blocks()
    }
}

impl Backend for Oracle {
    fn info(&self) -> &BackendInfo {
        &self.info
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

impl Modules for Oracle {
    fn module_load(&self, image: vgpu_backend::ModuleImage<'_>) -> vgpu_backend::Result<u64> {
        self.sim.modules().module_load(image)
    }
    fn module_unload(&self, module: u64) -> vgpu_backend::Result<()> {
        self.sim.modules().module_unload(module)
    }
    fn get_function(
        &self,
        module: u64,
        name: &[u8],
    ) -> vgpu_backend::Result<vgpu_backend::FunctionInfo> {
        self.sim.modules().get_function(module, name)
    }
    fn param_layout(&self, function: u64) -> vgpu_backend::Result<ParamLayout> {
        self.sim.modules().param_layout(function)
    }
    fn cluster_occupancy(&self, q: &ClusterOccupancyArgs) -> vgpu_backend::Result<u64> {
        self.sim.modules().param_layout(q.function)?;
        self.asked.lock().expect("lock").push(*q);
        Ok(answer(q))
    }
}

/// A GPU whose blocks have at most 99 KiB of shared memory.
const OPTIN: u32 = 99 << 10;

fn oracle() -> Arc<Oracle> {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let mut info = sim.info().clone();
    info.features |= features::CLUSTERS | features::CLUSTER_OCCUPANCY;
    info.attributes.max_shared_per_block_optin = OPTIN;
    Arc::new(Oracle {
        sim,
        info,
        asked: Mutex::new(Vec::new()),
    })
}

fn vgpu_on(backend: Arc<dyn Backend>) -> Vgpu {
    let cfg = DeviceConfig {
        vgpu_id: 7,
        num_queues: 2,
        queue_size: 64,
        memory_share: 32 * MIB,
        compute_share: 600,
        copy_share: 400,
        batch: crate::BatchLimits::default(),
    };
    Vgpu::new(cfg, backend).expect("vgpu")
}

fn active(function: u64, cluster: [u32; 3], shared_bytes: u32) -> ClusterOccupancyArgs {
    ClusterOccupancyArgs {
        function,
        block: [128, 1, 1],
        shared_bytes,
        cluster,
        query: occupancy_query::MAX_ACTIVE_CLUSTERS,
        ..ClusterOccupancyArgs::default()
    }
}

#[test]
fn the_sim_device_does_not_answer_cluster_occupancy() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_eq!(
        h.vgpu.config_space().features & features::CLUSTER_OCCUPANCY,
        0
    );
    let m = h.builtin();
    let f = h.get_function(m, "saxpy")[0];
    assert_eq!(
        h.status(Request::ClusterOccupancy(active(f, [2, 1, 1], 0)), &[]),
        Status::NotSupported
    );
    h.still_works();
}

#[test]
fn the_backend_answers_what_the_guest_asked() {
    let mem = ram();
    let backend = oracle();
    let mut h = Harness::with_vgpu(&mem, vgpu_on(backend.clone()));
    assert_ne!(
        h.vgpu.config_space().features & features::CLUSTER_OCCUPANCY,
        0
    );
    let m = h.builtin();
    let f = h.get_function(m, "saxpy")[0];
    for c in [[1, 1, 1], [2, 1, 1], [2, 2, 1], [8, 1, 1]] {
        let q = active(f, c, 32 << 10);
        let r = h.ok(Request::ClusterOccupancy(q), &[]);
        assert_eq!(r, [answer(&q), 0, 0, 0], "{c:?}");
    }
    // Above the portable size with the function's permission; the largest cluster; the
    // GPU's whole shared memory per block.
    let big = ClusterOccupancyArgs {
        flags: OCCUPANCY_NON_PORTABLE,
        ..active(f, [16, 1, 1], OPTIN)
    };
    assert_eq!(h.ok(Request::ClusterOccupancy(big), &[])[0], 1000 / 16);
    let size = ClusterOccupancyArgs {
        query: occupancy_query::MAX_CLUSTER_SIZE,
        ..active(f, [0, 0, 0], 64 << 10)
    };
    assert_eq!(h.ok(Request::ClusterOccupancy(size), &[])[0], 64);
    let asked = backend.asked.lock().expect("lock").clone();
    assert_eq!(asked.len(), 6);
    assert_eq!(asked[4], big, "the question reaches the backend unchanged");
    assert_eq!(asked[5], size);
}

#[test]
fn hostile_occupancy_questions_never_reach_the_backend() {
    let mem = ram();
    let backend = oracle();
    let mut h = Harness::with_vgpu(&mem, vgpu_on(backend.clone()));
    let m = h.builtin();
    let f = h.get_function(m, "saxpy")[0];
    let good = active(f, [2, 1, 1], 0);
    let bad: [(&str, ClusterOccupancyArgs); 14] = [
        (
            "block 0",
            ClusterOccupancyArgs {
                block: [0, 1, 1],
                ..good
            },
        ),
        (
            "block 2048",
            ClusterOccupancyArgs {
                block: [2048, 1, 1],
                ..good
            },
        ),
        (
            "block overflowing",
            ClusterOccupancyArgs {
                block: [u32::MAX; 3],
                ..good
            },
        ),
        (
            "block z 128",
            ClusterOccupancyArgs {
                block: [1, 1, 128],
                ..good
            },
        ),
        ("cluster 0", active(f, [0, 2, 1], 0)),
        (
            "cluster 65",
            ClusterOccupancyArgs {
                flags: OCCUPANCY_NON_PORTABLE,
                ..active(f, [65, 1, 1], 0)
            },
        ),
        (
            "cluster overflowing",
            ClusterOccupancyArgs {
                flags: OCCUPANCY_NON_PORTABLE,
                ..active(f, [u32::MAX; 3], 0)
            },
        ),
        ("cluster 16 without permission", active(f, [16, 1, 1], 0)),
        ("shared past the GPU", active(f, [2, 1, 1], OPTIN + 1)),
        ("shared huge", active(f, [2, 1, 1], u32::MAX)),
        ("query 7", ClusterOccupancyArgs { query: 7, ..good }),
        (
            "flags",
            ClusterOccupancyArgs {
                flags: 0x10,
                ..good
            },
        ),
        (
            "the function's limit past the GPU",
            ClusterOccupancyArgs {
                max_dynamic_shared: OPTIN + 1,
                ..good
            },
        ),
        (
            "largest cluster with a cluster",
            ClusterOccupancyArgs {
                query: occupancy_query::MAX_CLUSTER_SIZE,
                ..good
            },
        ),
    ];
    for (what, q) in bad {
        assert_eq!(
            h.status(Request::ClusterOccupancy(q), &[]),
            Status::InvalidArgument,
            "{what}"
        );
    }
    assert!(
        backend.asked.lock().expect("lock").is_empty(),
        "nothing reached the backend"
    );
    // A handle the backend does not know: its refusal, not an answer.
    for function in [0, f + 0x100, u64::MAX] {
        let q = ClusterOccupancyArgs { function, ..good };
        assert_eq!(
            h.status(Request::ClusterOccupancy(q), &[]),
            Status::UnknownFunction,
            "{function:#x}"
        );
    }
    // Short arguments, and data descriptors the opcode does not take.
    let mut buf = [0u8; 128];
    let n = Request::ClusterOccupancy(good)
        .encode(99, &mut buf)
        .expect("encodes");
    let (resp, _) = h.send_raw(&buf[..n - 4], &[]);
    assert_eq!(resp.status(), Some(Status::BadLength));
    let extra = h.space(64);
    assert_eq!(
        h.status(Request::ClusterOccupancy(good), &[w(extra, 64)]),
        Status::BadDescriptor
    );
    assert!(backend.asked.lock().expect("lock").is_empty());
    // The queue still answers a good question.
    assert_eq!(h.ok(Request::ClusterOccupancy(good), &[])[0], 500);
    h.still_works();
}
