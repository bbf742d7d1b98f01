//! cudarc, a real CUDA binding, on the library: it finds "libcuda.so" on the library
//! path, resolves its entry points by their versioned names, and runs its context, stream,
//! event-tracking and copy paths unchanged; the built-in module and launch go through
//! its raw driver calls (its `load_module` needs the nvrtc feature). The test runs itself
//! again as a child process, because the loader reads `LD_LIBRARY_PATH` only at start.

mod common;

use std::ffi::{c_void, CString};
use std::process::Command;

use cudarc::driver::{result, CudaContext, DevicePtr};

const CHILD: &str = "VGPU_CUDA_CUDARC_CHILD";

fn child() {
    let ctx = CudaContext::new(0).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let n = 10_000usize;
    let ha: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let a = stream.clone_htod(&ha).expect("a");
    let b = stream.clone_htod(&hb).expect("b");
    let c = stream.alloc_zeros::<f32>(n).expect("c");
    let image = CString::new("vgpu:builtin").expect("image");
    // SAFETY: a NUL-terminated image name; the module outlives the launch below.
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }.expect("module");
    // SAFETY: a live module.
    let f = unsafe { result::module::get_function(module, CString::new("vector_add").unwrap()) }
        .expect("function");
    let (pa, _ga) = a.device_ptr(&stream);
    let (pb, _gb) = b.device_ptr(&stream);
    let (pc, _gc) = c.device_ptr(&stream);
    let (mut pa, mut pb, mut pc, mut n64) = (pa, pb, pc, n as u64);
    let mut params: [*mut c_void; 4] = [
        (&mut pa as *mut u64).cast(),
        (&mut pb as *mut u64).cast(),
        (&mut pc as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    // SAFETY: vector_add's four parameters, each pointing to a live value.
    unsafe {
        result::launch_kernel(
            f,
            (40, 1, 1),
            (256, 1, 1),
            0,
            stream.cu_stream(),
            &mut params,
        )
    }
    .expect("launch");
    drop((_ga, _gb, _gc));
    let out = stream.clone_dtoh(&c).expect("dtov");
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, 1.5 * i as f32, "element {i}");
    }
    stream.synchronize().expect("sync");
    let (free, total) = result::mem_get_info().expect("mem info");
    assert!(free < total);
    println!("cudarc ok");
}

#[test]
fn cudarc_runs_on_the_library() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let lib = common::library();
    let dir = std::env::temp_dir().join(format!("vgpu-cudarc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::os::unix::fs::symlink(&lib, dir.join("libcuda.so")).expect("link");
    let worker = common::Worker::sim("cudarc", "256M", 4);
    let out = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "cudarc_runs_on_the_library",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("VGPU_SOCKET", &worker.socket)
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("cudarc ok"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
