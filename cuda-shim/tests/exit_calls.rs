//! Driver calls from a thread's exit path (`tests/c/exit_calls.c`), after the thread's own
//! locals were destroyed, as the CUDA runtime's and cuBLAS's exit handlers make them: each
//! answers a CUDA result and the program exits normally, never aborted by a panic that
//! cannot unwind, and without a panic message. Skipped, saying so, without a C compiler.

mod common;

use common::c::{compiler, Installed};

#[test]
fn calls_from_a_threads_exit_path_answer_and_never_abort() {
    let Some(cc) = compiler() else { return };
    let installed = Installed::new("vgpu-cuda-exit");
    let exe = installed.build(&cc, "exit_calls", &["-lpthread"]);
    let worker = common::Worker::sim("exit-calls", "64M", 1);
    let out = installed
        .command(&exe)
        .env("VGPU_SOCKET", &worker.socket)
        .env("VGPU_CUDA_LOG", "debug")
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{}: {stdout}{stderr}",
        out.status
    );
    // The calls made after the thread's locals were gone log nothing and panic nowhere.
    assert!(!stderr.contains("panicked"), "{stderr}");
    installed.remove();
}
