//! Thread block cluster occupancy end to end on a CUDA GPU with clusters: the library
//! (`dlopen`ed, entry points through `cuGetProcAddress_v2`) against `vgpu-worker --backend
//! cuda`, compared with what the GPU's own driver, loaded in this test process through
//! cudarc, answers for the same PTX kernel and shapes: `cuOccupancyMaxActiveClusters`
//! for clusters of 1, 2, 4 and 8 blocks (and 2 x 2, and 16 to 32 once non-portable sizes
//! are allowed) at several dynamic shared memory sizes and two block sizes,
//! `cuOccupancyMaxPotentialClusterSize`, and the cluster table's slots 9 and 10 (what
//! cuBLASLt asks) beside the public calls. Skipped (saying why) where the cuda worker
//! cannot start or the GPU has no clusters; `VGPU_REQUIRE_CUDA=1` turns the first skip
//! into a failure. `VGPU_CUDA_LIBRARY` names a prebuilt library to load instead of the
//! workspace's. One test per file: the library is one per process.

mod common;

use std::ffi::{c_int, c_uint, c_void, CString};
use std::ptr::null_mut;

use common::cuda::*;
use cudarc::driver::sys;

const CLUSTER_LAUNCH: c_int = 120;
const MAX_DYNAMIC_SHARED: c_int = 8;
const NON_PORTABLE: c_int = 14;
const CLUSTER_DIMENSION: c_uint = 4;

/// A kernel with 4 KiB of static shared memory that uses its dynamic shared memory too.
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

/// The most dynamic shared memory the test sets on the function (both sides).
const MOST_SHARED: u32 = 200 << 10;
const SHARED: [u32; 4] = [0, 48 << 10, 100 << 10, MOST_SHARED];
const BLOCKS: [u32; 2] = [128, 384];

/// One question's answer: the count, or the error code.
type Answer = Result<c_int, u32>;

/// The GPU's own driver, in this process, for the same kernel.
struct Native {
    func: sys::CUfunction,
}

impl Native {
    /// Loads the kernel in device 0's primary context and allows it `MOST_SHARED`.
    fn load() -> Native {
        let mut dev: sys::CUdevice = 0;
        let mut ctx: sys::CUcontext = null_mut();
        let mut module: sys::CUmodule = null_mut();
        let mut func: sys::CUfunction = null_mut();
        let ptx = CString::new(PTX).expect("no NUL");
        let name = CString::new("occupancy_probe").expect("no NUL");
        use sys::CUresult::CUDA_SUCCESS as OK_;
        // SAFETY: each call writes one value into a local of this frame; the PTX and the
        // name are NUL-terminated and outlive the calls.
        unsafe {
            assert_eq!(sys::cuInit(0), OK_);
            assert_eq!(sys::cuDeviceGet(&mut dev, 0), OK_);
            assert_eq!(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), OK_);
            assert_eq!(sys::cuCtxSetCurrent(ctx), OK_);
            assert_eq!(sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()), OK_);
            assert_eq!(
                sys::cuModuleGetFunction(&mut func, module, name.as_ptr()),
                OK_
            );
            assert_eq!(
                sys::cuFuncSetAttribute(
                    func,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    MOST_SHARED as c_int,
                ),
                OK_
            );
        }
        Native { func }
    }

    fn non_portable(&self) {
        // SAFETY: sets an attribute of the live function loaded above.
        let rc = unsafe {
            sys::cuFuncSetAttribute(
                self.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )
        };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    }

    /// `cuOccupancyMaxActiveClusters` (`active`) or `cuOccupancyMaxPotentialClusterSize`
    /// for blocks of `block` threads with `shared` bytes, in clusters of `cluster` (a grid
    /// of one cluster, as CUTLASS asks).
    fn ask(&self, active: bool, block: u32, shared: u32, cluster: [u32; 3]) -> Answer {
        // SAFETY: an all-zero attribute is a valid value of this plain C union.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim.x = cluster[0];
        attr.value.clusterDim.y = cluster[1];
        attr.value.clusterDim.z = cluster[2];
        let config = sys::CUlaunchConfig {
            gridDimX: cluster[0],
            gridDimY: cluster[1],
            gridDimZ: cluster[2],
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            hStream: null_mut(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut n: c_int = -1;
        // SAFETY: `config` and its attribute live on this frame; writes one int.
        let rc = unsafe {
            if active {
                sys::cuOccupancyMaxActiveClusters(&mut n, self.func, &config)
            } else {
                sys::cuOccupancyMaxPotentialClusterSize(&mut n, self.func, &config)
            }
        };
        if rc == sys::CUresult::CUDA_SUCCESS {
            Ok(n)
        } else {
            Err(rc as u32)
        }
    }
}

/// The same questions through the vGPU library.
struct Vgpu<'a> {
    cu: &'a Cuda,
    func: Ptr,
    table: *const usize,
}

impl Vgpu<'_> {
    fn ask(&self, active: bool, block: u32, shared: u32, cluster: [u32; 3]) -> Answer {
        let mut value = [0u32; 16];
        value[..3].copy_from_slice(&cluster);
        let attr = LaunchAttribute {
            id: CLUSTER_DIMENSION,
            pad: [0; 4],
            value,
        };
        let cfg = LaunchConfig {
            grid: cluster,
            block: [block, 1, 1],
            shared,
            stream: null_mut(),
            attrs: &attr,
            num_attrs: 1,
        };
        let (rc, n) = self.cu.cluster_occupancy(self.func, active, &cfg);
        if rc == OK {
            Ok(n)
        } else {
            Err(rc)
        }
    }

    /// Slot 10 (`active`: clusters of `size` blocks) or 9 (the largest cluster) of the
    /// cluster table, as cuBLASLt calls them.
    fn slot(&self, active: bool, block: u32, shared: u32, size: u32) -> Answer {
        type MaxSize = unsafe extern "C" fn(Ptr, c_int, usize, *mut c_int) -> R;
        type Active = unsafe extern "C" fn(Ptr, c_int, usize, c_int, *mut c_int) -> R;
        let mut n: c_int = -1;
        // SAFETY: the table holds 17 words (checked at set-up); slots 9 and 10 have these
        // C signatures; `n` lives on this frame.
        let rc = unsafe {
            if active {
                let f: Active = std::mem::transmute_copy(&self.table.add(10).read());
                f(
                    self.func,
                    block as c_int,
                    shared as usize,
                    size as c_int,
                    &mut n,
                )
            } else {
                let f: MaxSize = std::mem::transmute_copy(&self.table.add(9).read());
                f(self.func, block as c_int, shared as usize, &mut n)
            }
        };
        if rc == OK {
            Ok(n)
        } else {
            Err(rc)
        }
    }
}

/// Whether the vGPU's answer `got` is the driver's `want`: the same count, or, where the
/// driver refuses the question (a cluster its GPCs cannot hold, say), a refusal too or none.
fn agrees(got: Answer, want: Answer) -> bool {
    match want {
        Ok(_) => got == want,
        Err(_) => matches!(got, Err(_) | Ok(0)),
    }
}

/// Compares every shape for `clusters`; returns how many answers the driver gave (not
/// refusals).
fn compare(native: &Native, vgpu: &Vgpu<'_>, clusters: &[[u32; 3]], what: &str) -> usize {
    let mut answered = 0;
    for &block in &BLOCKS {
        for &shared in &SHARED {
            for &cluster in clusters {
                let want = native.ask(true, block, shared, cluster);
                let got = vgpu.ask(true, block, shared, cluster);
                eprintln!(
                    "{what}: block {block}, shared {} KiB, cluster {cluster:?}: driver {want:?}, vGPU {got:?}",
                    shared >> 10
                );
                let at = format!("block {block}, shared {shared}, cluster {cluster:?}");
                assert!(
                    agrees(got, want),
                    "active clusters, {at}: {got:?}, driver {want:?}"
                );
                // Asked again: the library's kept answer, the same.
                assert_eq!(vgpu.ask(true, block, shared, cluster), got, "again, {at}");
                if cluster[1] == 1 && cluster[2] == 1 {
                    assert_eq!(
                        vgpu.slot(true, block, shared, cluster[0]),
                        got,
                        "cluster table slot 10, {at}"
                    );
                }
                answered += usize::from(want.is_ok());
            }
            let want = native.ask(false, block, shared, [1, 1, 1]);
            let got = vgpu.ask(false, block, shared, [1, 1, 1]);
            eprintln!(
                "{what}: block {block}, shared {} KiB: largest cluster: driver {want:?}, vGPU {got:?}",
                shared >> 10
            );
            let at = format!("block {block}, shared {shared}");
            assert!(
                agrees(got, want),
                "largest cluster, {at}: {got:?}, driver {want:?}"
            );
            assert_eq!(
                vgpu.slot(false, block, shared, 0),
                got,
                "cluster table slot 9, {at}"
            );
            answered += usize::from(want.is_ok());
        }
    }
    answered
}

#[test]
fn cluster_occupancy_through_the_library_matches_the_driver() {
    let worker =
        match common::Worker::start("cuda", "gpu-cluster-occupancy", "1G", 1, &["--gpu", "0"]) {
            Ok(w) => w,
            Err(why) => {
                assert!(
                    std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                    "VGPU_REQUIRE_CUDA is set but the cuda worker did not start: {why}"
                );
                eprintln!("SKIPPED (cuda): {why}");
                return;
            }
        };
    // SAFETY: set before the library reads the environment, while this test is the only
    // thread that touches it.
    unsafe { std::env::set_var("VGPU_SOCKET", &worker.socket) };
    // The GPU machine's suite passes its prebuilt library (no cargo there to build one).
    let cu = match std::env::var_os("VGPU_CUDA_LIBRARY") {
        Some(path) => Cuda::load_from(std::path::Path::new(&path)),
        None => Cuda::load(),
    };
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    cu.primary_context(0);
    let mut v: c_int = -1;
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut v,
            CLUSTER_LAUNCH,
            0
        ),
        OK
    );
    if v == 0 {
        eprintln!("SKIPPED (cuda): the GPU has no thread block clusters");
        return;
    }
    let ptx = CString::new(PTX).expect("no NUL");
    let mut module: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut module,
            ptx.as_ptr().cast()
        ),
        OK
    );
    let mut func: Ptr = null_mut();
    let name = CString::new("occupancy_probe").expect("no NUL");
    assert_eq!(
        call!(
            cu,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const std::ffi::c_char),
            &mut func,
            module,
            name.as_ptr()
        ),
        OK
    );
    let set = |attr: c_int, value: c_int| {
        call!(
            cu,
            "cuFuncSetAttribute",
            fn(Ptr, c_int, c_int),
            func,
            attr,
            value
        )
    };
    assert_eq!(set(MAX_DYNAMIC_SHARED, MOST_SHARED as c_int), OK);
    const CLUSTER_PROTOTYPE: [u8; 16] = [
        0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b,
        0xca,
    ];
    let mut table: *const c_void = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuGetExportTable",
            fn(*mut *const c_void, *const [u8; 16]),
            &mut table,
            &CLUSTER_PROTOTYPE
        ),
        OK
    );
    let table: *const usize = table.cast();
    assert!(!table.is_null());
    // SAFETY: slot 0 is the table's size.
    assert_eq!(unsafe { table.read() }, 17 * 8);
    let vgpu = Vgpu {
        cu: &cu,
        func,
        table,
    };

    let native = Native::load();
    let portable = compare(
        &native,
        &vgpu,
        &[[1, 1, 1], [2, 1, 1], [4, 1, 1], [8, 1, 1], [2, 2, 1]],
        "portable",
    );
    // Non-portable sizes allowed on both: clusters of 16 too, the larger ones cuBLASLt
    // probes to learn the GPCs' sizes (the driver answers them, up to a whole GPC), and
    // the largest cluster as the driver answers it then.
    native.non_portable();
    assert_eq!(set(NON_PORTABLE, 1), OK);
    let non_portable = compare(
        &native,
        &vgpu,
        &[
            [2, 1, 1],
            [8, 1, 1],
            [16, 1, 1],
            [17, 1, 1],
            [18, 1, 1],
            [19, 1, 1],
            [32, 1, 1],
        ],
        "non-portable",
    );
    // Every portable question has an answer (blocks of 384 threads with 200 KiB fit one
    // to an SM, and clusters of 8 SMs fit the GPU's GPCs).
    assert_eq!(
        portable,
        2 * 4 * (5 + 1),
        "the driver answered every portable question"
    );
    assert!(non_portable > 0);
    // Past what a block can have: the driver's refusal or none, never an answer of more.
    let past = vgpu.ask(true, 128, 300 << 10, [2, 1, 1]);
    assert!(matches!(past, Ok(0) | Err(_)), "{past:?}");
    drop(worker);
}
