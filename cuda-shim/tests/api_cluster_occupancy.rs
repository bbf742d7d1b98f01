//! Cluster occupancy through the library on a vGPU that answers it (`CLUSTER_OCCUPANCY`):
//! the library over the Linux transport to vgpu-device in this process, whose backend is
//! the sim GPU with an occupancy oracle in place of a GPU's driver (it answers what a test
//! can predict and records every question). `cuOccupancyMaxActiveClusters`,
//! `cuOccupancyMaxPotentialClusterSize` and the cluster table's slots 9 and 10 ask the
//! device once per function and shape, carry the function's non-portable permission and
//! cluster, answer what never runs without asking, estimate where the device turns a
//! function down, and pass the device's refusal on. `gpu_cluster_occupancy` compares the
//! answers with a real driver's. One test per file: the library is one per process.

mod common;

use std::ffi::{c_int, c_uint};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::cuda::*;
use common::physmem::*;
use vgpu_backend::{
    Backend, BackendError, BackendInfo, FunctionInfo, Launch, LaunchStats, ModuleImage, Modules,
    ParamLayout, SimConfig, SimGpu,
};
use vgpu_proto::{features, occupancy_query, ClusterOccupancyArgs, OCCUPANCY_NON_PORTABLE};

/// Blocks of this many threads the oracle does not answer for (as a GPU's worker does not
/// for its storage kernels).
const TURNED_DOWN: u32 = 96;
/// Blocks of this many threads the oracle refuses (as a driver refuses values).
const REFUSED: u32 = 160;

/// The sim backend with an occupancy oracle in place of a GPU's driver.
struct Oracle {
    sim: SimGpu,
    info: BackendInfo,
    asked: Mutex<Vec<ClusterOccupancyArgs>>,
}

/// What the oracle answers (never what the library would estimate).
fn answer(q: &ClusterOccupancyArgs) -> u64 {
    if q.query == occupancy_query::MAX_CLUSTER_SIZE {
        if q.flags & OCCUPANCY_NON_PORTABLE != 0 {
            13
        } else {
            7
        }
    } else {
        700 + 10 * q.cluster_blocks() + u64::from(q.shared_bytes >> 10)
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
    fn function_attributes(
        &self,
        function: u64,
    ) -> vgpu_backend::Result<vgpu_proto::FunctionAttributes> {
        self.sim.modules().function_attributes(function)
    }
    fn cluster_occupancy(&self, q: &ClusterOccupancyArgs) -> vgpu_backend::Result<u64> {
        // The handle is the device's function (unknown: refused, as a backend does).
        self.sim.modules().param_layout(q.function)?;
        self.asked.lock().expect("lock").push(*q);
        match q.block[0] {
            TURNED_DOWN => Err(BackendError::NotSupported("not this function".into())),
            REFUSED => Err(BackendError::InvalidArgument("refused".into())),
            _ => Ok(answer(q)),
        }
    }
}

const CLUSTER_PROTOTYPE: [u8; 16] = [
    0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca,
];

struct Library<'a> {
    cu: &'a Cuda,
    func: Ptr,
    table: *const usize,
}

impl Library<'_> {
    /// `cuOccupancyMaxActiveClusters` (`active`) or `cuOccupancyMaxPotentialClusterSize`;
    /// `cluster` None: the configuration names none.
    fn ask(&self, active: bool, block: u32, shared: u32, cluster: Option<[u32; 3]>) -> (R, c_int) {
        let mut value = [0u32; 16];
        value[..3].copy_from_slice(&cluster.unwrap_or([1, 1, 1]));
        let attr = LaunchAttribute {
            id: 4,
            pad: [0; 4],
            value,
        };
        let cfg = LaunchConfig {
            grid: cluster.unwrap_or([1, 1, 1]),
            block: [block, 1, 1],
            shared,
            stream: null_mut(),
            attrs: &attr,
            num_attrs: u32::from(cluster.is_some()),
        };
        let (rc, n) = self.cu.cluster_occupancy(self.func, active, &cfg);
        (rc, n)
    }

    fn active(&self, block: u32, shared: u32, cluster: [u32; 3]) -> (R, c_int) {
        self.ask(true, block, shared, Some(cluster))
    }

    /// Slot 10 (`Some(size)`: clusters of `size` blocks) or 9 of the cluster table.
    fn slot(&self, block: u32, shared: usize, size: Option<u32>) -> (R, c_int) {
        type MaxSize = unsafe extern "C" fn(Ptr, c_int, usize, *mut c_int) -> R;
        type Active = unsafe extern "C" fn(Ptr, c_int, usize, c_int, *mut c_int) -> R;
        let mut n: c_int = -1;
        // SAFETY: the table holds 17 words (checked at set-up); slots 9 and 10 have these
        // C signatures; `n` lives on this frame.
        let rc = unsafe {
            match size {
                Some(size) => {
                    let f: Active = std::mem::transmute_copy(&self.table.add(10).read());
                    f(self.func, block as c_int, shared, size as c_int, &mut n)
                }
                None => {
                    let f: MaxSize = std::mem::transmute_copy(&self.table.add(9).read());
                    f(self.func, block as c_int, shared, &mut n)
                }
            }
        };
        (rc, n)
    }

    fn set(&self, attr: c_int, value: c_int) -> R {
        let cu = self.cu;
        call!(
            cu,
            "cuFuncSetAttribute",
            fn(Ptr, c_int, c_int),
            self.func,
            attr,
            value
        )
    }
}

fn expect(q: ClusterOccupancyArgs) -> (R, c_int) {
    (OK, answer(&q) as c_int)
}

fn active_q(block: u32, shared: u32, cluster: [u32; 3], flags: u32) -> ClusterOccupancyArgs {
    ClusterOccupancyArgs {
        block: [block, 1, 1],
        shared_bytes: shared,
        cluster,
        query: occupancy_query::MAX_ACTIVE_CLUSTERS,
        flags,
        // The driver's default limit, as the library keeps it for a function that did not
        // set one (the sim's kernels have no static shared memory).
        max_dynamic_shared: 48 << 10,
        ..ClusterOccupancyArgs::default()
    }
}

#[test]
fn the_library_asks_the_device_once_per_shape() {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let mut info = sim.info().clone();
    info.features |= features::CLUSTERS | features::CLUSTER_OCCUPANCY;
    let oracle = Arc::new(Oracle {
        sim,
        info,
        asked: Mutex::new(Vec::new()),
    });
    let mem = physical_memory("occupancy");
    let stop = Arc::new(AtomicBool::new(false));
    let device = serve(mem.0.clone(), stop.clone(), oracle.clone());
    use_linux_transport(&mem.0);
    let cu = Cuda::load();
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    cu.primary_context(0);
    let mut v: c_int = -1;
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut v,
            120,
            0
        ),
        OK
    );
    assert_eq!(v, 1, "the vGPU launches clusters");
    let module = cu.builtin_module();
    let func = cu.function(module, c"vector_add");
    let mut table: *const std::ffi::c_void = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuGetExportTable",
            fn(*mut *const std::ffi::c_void, *const [u8; 16]),
            &mut table,
            &CLUSTER_PROTOTYPE
        ),
        OK
    );
    let table: *const usize = table.cast();
    // SAFETY: slot 0 is the table's size.
    assert_eq!(unsafe { table.read() }, 17 * 8);
    let lib = Library {
        cu: &cu,
        func,
        table,
    };
    let asked = || oracle.asked.lock().expect("lock").clone();

    // The device's answer, asked once: again, and through slot 10, from the library.
    let first = active_q(128, 0, [2, 1, 1], 0);
    assert_eq!(lib.active(128, 0, [2, 1, 1]), expect(first));
    for _ in 0..10 {
        assert_eq!(lib.active(128, 0, [2, 1, 1]), expect(first));
    }
    assert_eq!(lib.slot(128, 0, Some(2)), expect(first));
    let got = asked();
    assert_eq!(got.len(), 1, "one round trip for one shape: {got:?}");
    assert_ne!(got[0].function, 0, "the device's handle of the function");
    assert_eq!(
        ClusterOccupancyArgs {
            function: 0,
            ..got[0]
        },
        first
    );
    // Another shape is another question.
    for (block, shared, cluster) in [
        (128, 1024, [2, 1, 1]),
        (256, 0, [2, 2, 1]),
        (128, 0, [8, 1, 1]),
    ] {
        let q = active_q(block, shared, cluster, 0);
        assert_eq!(lib.active(block, shared, cluster), expect(q));
        assert_eq!(
            ClusterOccupancyArgs {
                function: 0,
                ..*asked().last().expect("asked")
            },
            q
        );
    }
    assert_eq!(asked().len(), 4);
    // The function's dynamic shared memory limit travels too, and is part of the shape.
    assert_eq!(lib.set(8, 64 << 10), OK);
    let q = ClusterOccupancyArgs {
        max_dynamic_shared: 64 << 10,
        ..active_q(128, 0, [2, 1, 1], 0)
    };
    assert_eq!(lib.active(128, 0, [2, 1, 1]), expect(q));
    assert_eq!(
        ClusterOccupancyArgs {
            function: 0,
            ..*asked().last().expect("asked")
        },
        q
    );
    assert_eq!(lib.set(8, 48 << 10), OK);
    assert_eq!(lib.active(128, 0, [2, 1, 1]), expect(first));
    assert_eq!(asked().len(), 5, "the first shape's answer kept");

    // What never runs is none, without asking: a cluster above the portable size for a
    // function that did not allow more (16 and 17 blocks here), shared memory or threads past
    // what a block can have.
    assert_eq!(lib.active(128, 0, [16, 1, 1]), (OK, 0));
    assert_eq!(lib.active(128, 0, [17, 1, 1]), (OK, 0));
    assert_eq!(lib.slot(128, 0, Some(17)), (OK, 0));
    assert_eq!(lib.active(128, 300 << 10, [2, 1, 1]), (OK, 0));
    assert_eq!(lib.active(2048, 0, [2, 1, 1]), (OK, 0));
    assert_eq!(lib.slot(128, usize::MAX, Some(2)), (OK, 0));
    assert_eq!(lib.active(128, 0, [0, 1, 1]).0, INVALID_VALUE);
    assert_eq!(lib.active(0, 0, [2, 1, 1]).0, INVALID_VALUE);
    assert_eq!(asked().len(), 5, "none of these reached the device");

    // The function's permission travels with the question, and is part of its shape.
    assert_eq!(lib.set(14, 1), OK);
    let q = active_q(128, 0, [16, 1, 1], OCCUPANCY_NON_PORTABLE);
    assert_eq!(lib.active(128, 0, [16, 1, 1]), expect(q));
    let q = active_q(128, 0, [2, 1, 1], OCCUPANCY_NON_PORTABLE);
    assert_eq!(lib.active(128, 0, [2, 1, 1]), expect(q));
    assert_eq!(asked().len(), 7);
    // The largest cluster: the device's, through the public call and slot 9 alike.
    assert_eq!(lib.ask(false, 128, 0, None), (OK, 13));
    assert_eq!(lib.slot(128, 0, None), (OK, 13));
    assert_eq!(lib.set(14, 0), OK);
    assert_eq!(lib.ask(false, 128, 0, Some([4, 1, 1])), (OK, 7));
    assert_eq!(asked().len(), 9);
    let last = *asked().last().expect("asked");
    assert_eq!(
        (last.query, last.cluster, last.flags),
        (occupancy_query::MAX_CLUSTER_SIZE, [0; 3], 0)
    );

    // A cluster set on the function: the largest is that one, and a configuration that
    // names none asks for it.
    for (attr, value) in [(11, 2), (12, 2), (13, 1)] {
        assert_eq!(lib.set(attr, value), OK);
    }
    assert_eq!(lib.ask(false, 128, 0, None), (OK, 4));
    let q = active_q(128, 0, [2, 2, 1], 0);
    assert_eq!(lib.ask(true, 128, 0, None), expect(q));
    assert_eq!(asked().len(), 10);

    // A function the device turns down is estimated; the device's refusal is the call's.
    let per_sm = cu.blocks_per_sm(func, TURNED_DOWN as c_int, 0);
    let sms = cu.device_attribute(16);
    assert!(per_sm > 0);
    assert_eq!(
        lib.active(TURNED_DOWN, 0, [2, 1, 1]),
        (OK, per_sm * sms / 2)
    );
    assert_eq!(lib.active(REFUSED, 0, [2, 1, 1]).0, INVALID_VALUE);
    assert_eq!(asked().len(), 12);
    // Neither was kept: asked again.
    assert_eq!(lib.active(REFUSED, 0, [2, 1, 1]).0, INVALID_VALUE);
    assert_eq!(asked().len(), 13);

    // Past the largest cluster a launch may have, up to whole GPCs: the device's answer
    // (cuBLASLt reads the sizes of the GPU's GPCs from clusters of up to 32 blocks);
    // past that, none without asking. A worker that takes questions only up to the
    // largest launch refuses a larger one: none runs.
    assert_eq!(lib.set(14, 1), OK);
    let q = active_q(128, 0, [17, 1, 1], OCCUPANCY_NON_PORTABLE);
    assert_eq!(lib.active(128, 0, [17, 1, 1]), expect(q));
    let q = active_q(128, 0, [32, 1, 1], OCCUPANCY_NON_PORTABLE);
    assert_eq!(lib.slot(128, 0, Some(32)), expect(q));
    assert_eq!(asked().len(), 15);
    assert_eq!(lib.active(128, 0, [65, 1, 1]), (OK, 0));
    assert_eq!(lib.slot(128, 0, Some(65)), (OK, 0));
    assert_eq!(asked().len(), 15);
    assert_eq!(lib.active(REFUSED, 0, [17, 1, 1]), (OK, 0));
    assert_eq!(lib.active(REFUSED, 0, [16, 1, 1]).0, INVALID_VALUE);
    assert_eq!(asked().len(), 17);
    // And the queue goes on answering.
    assert_eq!(lib.active(128, 0, [2, 1, 1]), expect(first));

    assert_eq!(call!(cu, "cuModuleUnload", fn(Ptr), module), OK);
    stop.store(true, Ordering::SeqCst);
    device.join().expect("device thread");
}
