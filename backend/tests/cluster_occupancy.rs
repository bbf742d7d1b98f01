//! Thread block cluster occupancy on a CUDA GPU with clusters: what the cuda backend
//! answers for a guest PTX function (`Modules::cluster_occupancy`) is what the driver's
//! own `cuOccupancyMaxActiveClusters`/`cuOccupancyMaxPotentialClusterSize` answer for the
//! same kernel loaded in the same process, a built-in kernel is answered too, and
//! questions the backend must not answer (unknown handles, storage kernels, values the
//! driver refuses) are refused without losing the context. Skipped without a GPU
//! (`VGPU_REQUIRE_CUDA=1` turns the skip into a failure) and on a GPU without clusters
//! (compute capability below 9.0). The sim backend does not answer.

use std::ffi::{c_int, CString};

use cudarc::driver::sys;
use vgpu_backend::{Backend, BackendError, CudaConfig, CudaGpu, ModuleImage, SimConfig, SimGpu};
use vgpu_proto::{features, occupancy_query, ClusterOccupancyArgs, OCCUPANCY_NON_PORTABLE};

const MIB: u64 = 1 << 20;

/// A kernel with 4 KiB of static shared memory that uses dynamic shared memory too.
const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64

.extern .shared .align 16 .b8 dyn[];
.shared .align 4 .b8 tile[4096];

.visible .entry occupancy_probe(.param .u64 dst)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [dst];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, %tid.x;
    and.b32 %r2, %r1, 1023;
    mul.wide.u32 %rd3, %r2, 4;
    mov.u64 %rd4, tile;
    add.s64 %rd4, %rd4, %rd3;
    st.shared.u32 [%rd4], %r1;
    st.shared.u32 [dyn], %r1;
    bar.sync 0;
    ld.shared.u32 %r3, [%rd4];
    add.s64 %rd2, %rd2, %rd3;
    st.global.u32 [%rd2], %r3;
    ret;
}
";

/// The cuda backend, or why there is none (a skip, unless `VGPU_REQUIRE_CUDA` is set).
fn cuda() -> Option<CudaGpu> {
    let why = match CudaGpu::probe() {
        Ok(_) => {
            let reserve = CudaGpu::context_reserve_of(0, &Default::default())
                .expect("context reserve")
                .total()
                .expect("reserve fits u64");
            return Some(
                CudaGpu::new(CudaConfig {
                    memory: 256 * MIB + reserve,
                    va_size: 4 << 30,
                    ..CudaConfig::default()
                })
                .expect("cuda backend"),
            );
        }
        Err(why) => why,
    };
    assert!(
        std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
        "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
    );
    eprintln!("SKIPPED (cuda): {why}");
    None
}

/// The same kernel loaded by this test in device 0's primary context (the backend's),
/// allowed `shared` bytes of dynamic shared memory.
fn driver_function(shared: u32) -> sys::CUfunction {
    let mut dev: sys::CUdevice = 0;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let mut func: sys::CUfunction = std::ptr::null_mut();
    let ptx = CString::new(PTX).expect("no NUL");
    let name = CString::new("occupancy_probe").expect("no NUL");
    use sys::CUresult::CUDA_SUCCESS as OK;
    // SAFETY: each call writes one value into a local of this frame; the PTX and the name
    // are NUL-terminated and outlive the calls.
    unsafe {
        assert_eq!(sys::cuDeviceGet(&mut dev, 0), OK);
        assert_eq!(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), OK);
        assert_eq!(sys::cuCtxSetCurrent(ctx), OK);
        assert_eq!(sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()), OK);
        assert_eq!(
            sys::cuModuleGetFunction(&mut func, module, name.as_ptr()),
            OK
        );
        assert_eq!(
            sys::cuFuncSetAttribute(
                func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared as c_int,
            ),
            OK
        );
    }
    func
}

/// The driver's answer for `func` to the question `q` asks (a grid of one cluster).
fn driver_answer(func: sys::CUfunction, q: &ClusterOccupancyArgs) -> u64 {
    // SAFETY: an all-zero attribute is a valid value of this plain C union.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    let cluster = if q.query == occupancy_query::MAX_ACTIVE_CLUSTERS {
        q.cluster
    } else {
        [1, 1, 1]
    };
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
    let mut n: c_int = -1;
    // SAFETY: `config` and its attribute live on this frame; writes one int.
    let rc = unsafe {
        if q.query == occupancy_query::MAX_ACTIVE_CLUSTERS {
            sys::cuOccupancyMaxActiveClusters(&mut n, func, &config)
        } else {
            sys::cuOccupancyMaxPotentialClusterSize(&mut n, func, &config)
        }
    };
    assert_eq!(
        rc,
        sys::CUresult::CUDA_SUCCESS,
        "the driver's answer to {q:?}"
    );
    u64::try_from(n).expect("a count")
}

/// The dynamic shared memory the test allows its functions (the driver's, and the
/// backend's through the question, as the library passes the program's limit).
const MOST_SHARED: u32 = 200 << 10;

fn question(function: u64, block: u32, shared: u32, cluster: [u32; 3]) -> ClusterOccupancyArgs {
    ClusterOccupancyArgs {
        function,
        block: [block, 1, 1],
        shared_bytes: shared,
        cluster,
        query: occupancy_query::MAX_ACTIVE_CLUSTERS,
        max_dynamic_shared: MOST_SHARED,
        ..ClusterOccupancyArgs::default()
    }
}

#[test]
fn sim_does_not_answer_cluster_occupancy() {
    let sim = SimGpu::new(SimConfig::default()).expect("sim");
    assert_eq!(sim.info().features & features::CLUSTER_OCCUPANCY, 0);
    let m = sim
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin");
    let f = sim
        .modules()
        .get_function(m, b"saxpy")
        .expect("saxpy")
        .handle;
    assert!(matches!(
        sim.modules()
            .cluster_occupancy(&question(f, 128, 0, [2, 1, 1])),
        Err(BackendError::NotSupported(_))
    ));
}

#[test]
fn cuda_cluster_occupancy_is_the_drivers_answer() {
    let Some(gpu) = cuda() else { return };
    let clusters = gpu.info().features & features::CLUSTERS != 0;
    assert_eq!(
        gpu.info().features & features::CLUSTER_OCCUPANCY != 0,
        clusters,
        "offered exactly where clusters run"
    );
    if !clusters {
        eprintln!("SKIPPED (cuda): the GPU has no thread block clusters");
        return;
    }
    let modules = gpu.modules();
    let m = modules
        .module_load(ModuleImage::Ptx(PTX.as_bytes()))
        .expect("PTX loads");
    let f = modules
        .get_function(m, b"occupancy_probe")
        .expect("function")
        .handle;
    let most = MOST_SHARED;
    let native = driver_function(most);
    for block in [128, 384] {
        for shared in [0, 48 << 10, 100 << 10, most] {
            for cluster in [[1, 1, 1], [2, 1, 1], [4, 1, 1], [8, 1, 1], [2, 2, 1]] {
                let q = question(f, block, shared, cluster);
                let ours = modules.cluster_occupancy(&q).expect("answered");
                let want = driver_answer(native, &q);
                eprintln!(
                    "block {block}, shared {} KiB, cluster {cluster:?}: {ours} (driver {want})",
                    shared >> 10
                );
                assert_eq!(ours, want, "{q:?}");
            }
            let q = ClusterOccupancyArgs {
                query: occupancy_query::MAX_CLUSTER_SIZE,
                ..question(f, block, shared, [0; 3])
            };
            let ours = modules.cluster_occupancy(&q).expect("answered");
            assert_eq!(ours, driver_answer(native, &q).min(8), "{q:?}");
            assert!((1..=8).contains(&ours), "portable: {ours}");
        }
    }
    // Non-portable sizes allowed: clusters of 16, and the largest cluster as the driver
    // answers it for a function that allows them.
    // SAFETY: sets an attribute of the live function loaded above.
    let rc = unsafe {
        sys::cuFuncSetAttribute(
            native,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            1,
        )
    };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    let q = ClusterOccupancyArgs {
        flags: OCCUPANCY_NON_PORTABLE,
        ..question(f, 128, 0, [16, 1, 1])
    };
    assert_eq!(
        modules.cluster_occupancy(&q).expect("answered"),
        driver_answer(native, &q)
    );
    let q = ClusterOccupancyArgs {
        query: occupancy_query::MAX_CLUSTER_SIZE,
        flags: OCCUPANCY_NON_PORTABLE,
        ..question(f, 128, 0, [0; 3])
    };
    assert_eq!(
        modules.cluster_occupancy(&q).expect("answered"),
        driver_answer(native, &q)
    );
    // Without the permission the largest cluster stays portable, whatever the GPU's
    // function now allows.
    let q = ClusterOccupancyArgs { flags: 0, ..q };
    assert!(modules.cluster_occupancy(&q).expect("answered") <= 8);

    // A built-in kernel is answered too.
    let b = modules
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin");
    let saxpy = modules.get_function(b, b"saxpy").expect("saxpy").handle;
    let n = modules
        .cluster_occupancy(&question(saxpy, 256, 0, [2, 1, 1]))
        .expect("answered");
    assert!(n > 0, "clusters of two saxpy blocks run: {n}");

    // Refused, the context kept: unknown handles, a storage kernel, values past the
    // checks, and shared memory the driver refuses (static 4 KiB plus the GPU's whole
    // per-block limit, asked about or as the function's limit).
    for function in [0, f + 0x100, u64::MAX] {
        assert!(matches!(
            modules.cluster_occupancy(&question(function, 128, 0, [2, 1, 1])),
            Err(BackendError::UnknownFunction(_))
        ));
    }
    let gather = modules
        .get_function(b, b"storage_gather")
        .expect("storage kernel")
        .handle;
    assert!(matches!(
        modules.cluster_occupancy(&question(gather, 128, 0, [2, 1, 1])),
        Err(BackendError::NotSupported(_))
    ));
    let optin = gpu.info().attributes.max_shared_per_block_optin;
    for q in [
        question(f, 0, 0, [2, 1, 1]),
        question(f, 128, 0, [17, 1, 1]),
        question(f, 128, 0, [16, 1, 1]),
        question(f, 128, u32::MAX, [2, 1, 1]),
        question(f, 128, optin, [2, 1, 1]),
        ClusterOccupancyArgs {
            max_dynamic_shared: optin,
            ..question(f, 128, 0, [2, 1, 1])
        },
        ClusterOccupancyArgs {
            query: 9,
            ..question(f, 128, 0, [2, 1, 1])
        },
    ] {
        let got = modules.cluster_occupancy(&q);
        assert!(
            matches!(got, Err(BackendError::InvalidArgument(_))),
            "{q:?}: {got:?}"
        );
    }
    let q = question(f, 128, 0, [2, 1, 1]);
    assert_eq!(
        modules.cluster_occupancy(&q).expect("still answered"),
        driver_answer(native, &q)
    );
    modules.module_unload(m).expect("unload");
}
