//! Pinned host memory the GPU reaches at its host address, end to end on a CUDA GPU: the
//! library (`dlopen`ed, entry points through `cuGetProcAddress_v2`) against `vgpu-worker
//! --backend cuda`, the round of `host_map/mod.rs` with a PTX kernel that writes through
//! the host pointer (what XLA's autotuner does). Skipped (saying why) where the cuda
//! worker cannot start; `VGPU_REQUIRE_CUDA=1` turns the skip into a failure.
//! `VGPU_CUDA_LIBRARY` names a prebuilt library to load instead of the workspace's. One
//! test per file: the library is one per process.

mod common;
mod host_map;

use common::cuda::Cuda;

#[test]
fn cuda_kernels_write_pinned_host_memory_at_its_host_address() {
    let worker = match common::Worker::start("cuda", "gpu-host-map", "1G", 2, &["--gpu", "0"]) {
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
    host_map::exercise(&cu, true);
}
