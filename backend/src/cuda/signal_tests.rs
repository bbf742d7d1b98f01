//! A lone kernel's end read from its lane's host word (`signal.rs`), on a real GPU: the
//! word holds each launch's value once it is answered, a kernel longer than the wait's
//! spin is seen through the word or the stream after the spin, and what a kernel wrote is
//! there for the next request. Skipped where no GPU is.

use std::time::{Duration, Instant};

use vgpu_proto::{Access, ArgValue};
use vm_memory::VolatileSlice;

use super::{CudaConfig, CudaGpu};
use crate::{Backend, LaunchConfig, LaunchOne, ModuleImage};

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

/// The lane's word: writes asked for, the value last asked for and the value the GPU last
/// wrote.
fn word(gpu: &CudaGpu) -> Option<(u64, u32, u32)> {
    gpu.enter().expect("context");
    let lane = gpu.lanes.take().expect("a lane");
    lane.signal.as_ref().map(|s| s.seen())
}

#[test]
fn a_lone_kernel_s_end_is_read_from_its_lane_s_host_word() {
    if let Err(why) = CudaGpu::probe() {
        eprintln!("skipped: no CUDA GPU ({why})");
        return;
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
    let (nop, store, spin) = (f(b"nop"), f(b"store"), f(b"spin"));

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
