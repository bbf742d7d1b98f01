//! A PTX kernel that never ends, on a real GPU: the launch is answered `KERNEL_FAULT`
//! naming the hard limit, later requests fail, and the process exits with
//! `EXIT_KERNEL_HARD_LIMIT`. The launch runs in a child process (this test binary, run
//! again), since the process is what ends. Skipped where no GPU is.

use std::time::{Duration, Instant};

use super::{CudaConfig, CudaGpu, EXIT_KERNEL_HARD_LIMIT};
use crate::{Backend, LaunchConfig, LaunchOne, ModuleImage};

const FOREVER_PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .entry forever()
{
LOOP:
    bra.uni LOOP;
}
"#;

const CHILD: &str = "VGPU_HARD_LIMIT_CHILD";
const NAME: &str =
    "cuda::hard_limit_tests::a_kernel_past_the_hard_limit_is_answered_and_the_worker_exits";

#[test]
fn a_kernel_past_the_hard_limit_is_answered_and_the_worker_exits() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    if let Err(why) = CudaGpu::probe() {
        eprintln!("skipped: no CUDA GPU ({why})");
        return;
    }
    let t = Instant::now();
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("child ({:?}): {text}", t.elapsed());
    assert_eq!(out.status.code(), Some(EXIT_KERNEL_HARD_LIMIT), "{text}");
    assert!(text.contains("answered: Err(KernelFault("), "{text}");
    assert!(text.contains("hard limit of 1 s"), "{text}");
    assert!(text.contains("then: Err(Device("), "{text}");
    assert!(!text.contains("still alive"), "{text}");
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
}

fn child() {
    let gpu = CudaGpu::new(CudaConfig::default())
        .expect("CUDA GPU")
        .with_kernel_limit(Duration::from_secs(1));
    let m = gpu
        .modules()
        .module_load(ModuleImage::Ptx(FOREVER_PTX.as_bytes()))
        .expect("PTX module");
    let f = gpu.modules().get_function(m, b"forever").expect("forever");
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
    };
    let t = Instant::now();
    let r = gpu.launch_one(f.handle, &cfg, &[]);
    println!("after {:?} answered: {r:?}", t.elapsed());
    println!("then: {:?}", gpu.alloc(4096).map(|a| a.addr));
    std::thread::sleep(Duration::from_secs(20));
    println!("still alive");
}
