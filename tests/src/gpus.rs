//! Which GPUs an end-to-end test gives vgpud: simulated ones, or with
//! `VGPU_TEST_BACKEND=cuda` the machine's real GPUs (ci/gpu/suite.sh runs them so).

/// Whether the tests run on the real GPUs (`VGPU_TEST_BACKEND=cuda`).
pub fn on_cuda() -> bool {
    std::env::var("VGPU_TEST_BACKEND").is_ok_and(|b| b == "cuda")
}

/// vgpud's GPU arguments: `sim` (simulated GPUs), or `--backend cuda` under
/// `VGPU_TEST_BACKEND=cuda`. `None`: cuda was asked for but this machine cannot run it;
/// the test prints `SKIPPED (cuda): why` and returns (with `VGPU_REQUIRE_CUDA` set it
/// fails instead).
pub fn daemon_args(sim: &[&'static str]) -> Option<Vec<&'static str>> {
    if !on_cuda() {
        return Some(sim.to_vec());
    }
    match vgpu_backend::cuda::CudaGpu::probe() {
        Ok(p) => {
            eprintln!("cuda: vgpud on {} ({} device(s))", p.name, p.devices);
            Some(vec!["--backend", "cuda"])
        }
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
            );
            eprintln!("SKIPPED (cuda): {why}");
            None
        }
    }
}
