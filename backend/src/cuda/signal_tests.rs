//! A lone kernel's (and a batch of one run's) end read from its lane's host word
//! (`signal.rs`), on a real GPU: the word holds each launch's value once it is answered, a
//! kernel longer than the wait's spin is seen through the word or the stream after the
//! spin, and what a kernel wrote is there for the next request. Skipped where no GPU is.

use std::time::{Duration, Instant};

use vgpu_proto::{Access, ArgValue};
use vm_memory::VolatileSlice;

use super::{CudaConfig, CudaGpu};
use crate::{Backend, Launch, LaunchConfig, LaunchOne, ModuleImage};

const PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .entry nop()
{
    ret;
}
.visible .entry store(.param .u64 p, .param .u64 v)
{
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [p];
    ld.param.u64 %rd2, [v];
    cvta.to.global.u64 %rd1, %rd1;
    st.global.u64 [%rd1], %rd2;
    ret;
}
.visible .entry spin(.param .u64 ns)
{
    .reg .b64 %rd<5>;
    .reg .pred %p;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
LOOP:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p, %rd4, %rd3;
    @%p bra LOOP;
    ret;
}
"#;

const ONE: LaunchConfig = LaunchConfig {
    grid: [1, 1, 1],
    block: [1, 1, 1],
    shared_bytes: 0,
};

/// One backend at a time: two in one process would ask the driver for the same
/// address range for their vGPU address spaces.
fn one_gpu() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A backend on the GPU with [`PTX`] loaded, and its `nop`, `store` and `spin`; None
/// (and why, printed) where there is no GPU.
fn gpu_with_kernels() -> Option<(CudaGpu, [u64; 3])> {
    if let Err(why) = CudaGpu::probe() {
        eprintln!("skipped: no CUDA GPU ({why})");
        return None;
    }
    let gpu = CudaGpu::new(CudaConfig::default()).expect("CUDA GPU");
    let m = gpu
        .modules()
        .module_load(ModuleImage::Ptx(PTX.as_bytes()))
        .expect("PTX module");
    let f = |name: &[u8]| {
        gpu.modules()
            .get_function(m, name)
            .expect("function")
            .handle
    };
    let kernels = [f(b"nop"), f(b"store"), f(b"spin")];
    Some((gpu, kernels))
}

/// The lane's word: writes asked for, the value last asked for and the value the GPU last
/// wrote.
fn word(gpu: &CudaGpu) -> Option<(u64, u32, u32)> {
    gpu.enter().expect("context");
    let lane = gpu.lanes.take().expect("a lane");
    lane.signal.as_ref().map(|s| s.seen())
}

#[test]
fn a_lone_kernel_s_end_is_read_from_its_lane_s_host_word() {
    let _one = one_gpu();
    let Some((gpu, [nop, store, spin])) = gpu_with_kernels() else {
        return;
    };

    for _ in 0..3 {
        gpu.launch_one(nop, &ONE, &[]).expect("a null kernel");
    }
    let (writes, asked, written) = word(&gpu).expect("the lane has a host word on this GPU");
    assert!(
        writes >= 3,
        "{writes} writes asked for after three lone kernels"
    );
    assert_eq!(
        written, asked,
        "every write asked for has landed once answered"
    );

    // Longer than the wait's spin on the word: the stream is asked too from then on.
    let t = Instant::now();
    let ran = gpu
        .launch_one(spin, &ONE, &[ArgValue::U64(200_000)])
        .expect("a 200 us kernel");
    assert!(
        t.elapsed() >= Duration::from_micros(200),
        "{:?}",
        t.elapsed()
    );
    assert!(ran.device_ns >= 200_000, "{ran:?}");
    assert_eq!(word(&gpu).map(|(_, a, w)| a == w), Some(true));

    // What the kernel wrote is there for the next request.
    let a = gpu.alloc(4096).expect("alloc").addr;
    for v in [7u64, 0x1234_5678_9abc_def0, 42] {
        gpu.launch_one(
            store,
            &ONE,
            &[
                ArgValue::Ptr {
                    addr: a,
                    access: Access::Write,
                },
                ArgValue::U64(v),
            ],
        )
        .expect("store");
        let mut buf = [0u8; 8];
        gpu.copy_dtoh(a, &VolatileSlice::from(&mut buf[..]))
            .expect("read back");
        assert_eq!(u64::from_le_bytes(buf), v);
    }
}

/// A batch of one function's kernels records no event: its end is read from the word
/// written after its last kernel, for short kernels and for a batch that outlasts the
/// wait's spin, and every kernel's writes are there when the batch is answered.
#[test]
fn a_batch_of_one_run_s_end_is_read_from_its_lane_s_host_word() {
    let _one = one_gpu();
    let Some((gpu, [nop, store, spin])) = gpu_with_kernels() else {
        return;
    };
    let launch = |function, args| Launch {
        function,
        config: ONE,
        cluster: crate::NO_CLUSTER,
        args,
        blob: &[],
    };

    let (before, _, _) = word(&gpu).expect("the lane has a host word on this GPU");
    let nops: Vec<Launch<'_>> = (0..32).map(|_| launch(nop, &[][..])).collect();
    let results = gpu.launch(&nops);
    assert_eq!(results.len(), 32);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let (writes, asked, written) = word(&gpu).expect("host word");
    assert_eq!(writes, before + 1, "one write for the batch's one run");
    assert_eq!(
        written, asked,
        "the batch was answered once its write landed"
    );

    // Four 100 us kernels: longer than the wait's spin on the word.
    let long = [ArgValue::U64(100_000)];
    let spins: Vec<Launch<'_>> = (0..4).map(|_| launch(spin, &long[..])).collect();
    let t = Instant::now();
    let results = gpu.launch(&spins);
    assert!(
        t.elapsed() >= Duration::from_micros(400),
        "{:?}",
        t.elapsed()
    );
    let total: u64 = results
        .iter()
        .map(|r| r.as_ref().expect("spin").device_ns)
        .sum();
    assert!(
        total >= 400_000,
        "the run's time {total} ns, its kernels 400 us"
    );
    assert_eq!(word(&gpu).map(|(_, a, w)| a == w), Some(true));

    // Every kernel's write is there when the batch is answered.
    let a = gpu.alloc(4096).expect("alloc").addr;
    let args: Vec<[ArgValue; 2]> = (0..16u64)
        .map(|i| {
            [
                ArgValue::Ptr {
                    addr: a + 8 * i,
                    access: Access::Write,
                },
                ArgValue::U64(1000 + i),
            ]
        })
        .collect();
    let stores: Vec<Launch<'_>> = args.iter().map(|a| launch(store, &a[..])).collect();
    assert!(gpu.launch(&stores).iter().all(Result::is_ok));
    let mut buf = [0u8; 128];
    gpu.copy_dtoh(a, &VolatileSlice::from(&mut buf[..]))
        .expect("read back");
    for (i, v) in buf.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(v.try_into().expect("8 bytes"));
        assert_eq!(v, 1000 + i as u64, "store {i}");
    }
}
