//! NVIDIA's CUDA runtime (libcudart 12 and 13, shared and static, from PyPI: fetched by
//! `ci/fetch-cudart.sh` into target/cudart/) over this library installed as libcuda.so.1,
//! against a sim worker: `tests/c/cudart.c`, built with `cc` against the runtime's
//! cuda_runtime_api.h, checks device properties, the vGPU's memory share, allocations,
//! copies, pinned memory, streams, events, the per-thread default stream, an allocation
//! beyond the share, the private tables and `cuGetProcAddress` with bad input; and, run
//! again with a fat binary registered before main as nvcc's code does, that the runtime
//! starts with no context current and the sim vGPU refuses the kernel with the documented
//! error at its launch (lazy loading, the default) or at the start
//! (`CUDA_MODULE_LOADING=EAGER`). Skipped, saying so, where the runtime was not
//! fetched or no C compiler is present.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const SHARE: &str = "256M";
const SHARE_BYTES: u64 = 256 << 20;

/// Where ci/fetch-cudart.sh put the runtimes.
fn cudart_dir() -> PathBuf {
    match std::env::var_os("VGPU_CUDART_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/cudart"),
    }
}

/// Builds the test program against runtime `version`'s headers, linked to its shared or
/// static libcudart, with `defines`.
fn build(cc: &str, runtime: &Path, exe: &Path, link_static: bool, defines: &[&str]) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cudart.c");
    let lib = runtime.join("lib");
    let mut cmd = Command::new(cc);
    cmd.args(["-std=c11", "-Wall", "-Werror"])
        .args(defines)
        .arg("-I")
        .arg(runtime.join("include"))
        .arg(&source)
        .arg("-o")
        .arg(exe);
    if link_static {
        cmd.arg(lib.join("libcudart_static.a"))
            .args(["-ldl", "-lpthread", "-lrt"]);
    } else {
        let so = std::fs::read_dir(&lib)
            .expect("runtime lib directory")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("libcudart.so."))
            .expect("a libcudart.so.N in the runtime");
        cmd.arg("-L")
            .arg(&lib)
            .arg(format!("-l:{so}"))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-ldl");
    }
    let out = cmd.output().expect("run cc");
    assert!(
        out.status.success(),
        "cc {}: {}",
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `exe` on the library against a fresh sim worker (with `VGPU_TEST_FATBIN` when
/// `fatbin`: the program registers a fat binary before main; with
/// `CUDA_MODULE_LOADING=EAGER` when `eager`); asserts it printed "ok".
fn run(exe: &Path, libdir: &Path, name: &str, fatbin: bool, eager: bool) {
    let worker = common::Worker::sim(name, SHARE, 4);
    let mut cmd = Command::new(exe);
    if fatbin {
        cmd.env("VGPU_TEST_FATBIN", "1");
    }
    if eager {
        cmd.env("CUDA_MODULE_LOADING", "EAGER");
    } else {
        cmd.env_remove("CUDA_MODULE_LOADING");
    }
    let out = cmd
        .arg(SHARE_BYTES.to_string())
        .env("VGPU_SOCKET", &worker.socket)
        .env("LD_LIBRARY_PATH", libdir)
        .env("VGPU_CUDA_LOG", "warn")
        .output()
        .expect("run the runtime program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.lines().last() == Some("ok"),
        "{name}: {}\n{stdout}{stderr}",
        out.status
    );
    // Nothing the runtime asks for at start-up is left unanswered.
    assert!(
        !stderr.contains("internal error"),
        "{name}: the library caught a panic:\n{stderr}"
    );
}

#[test]
fn nvidia_cuda_runtime_programs_run_on_the_library() {
    let Some(cc) = common::c::compiler() else {
        return;
    };
    let dir = cudart_dir();
    let runtimes: Vec<(String, PathBuf)> = ["12", "13"]
        .iter()
        .map(|v| (v.to_string(), dir.join(v)))
        .filter(|(_, p)| p.join("include/cuda_runtime_api.h").is_file())
        .collect();
    if runtimes.is_empty() {
        eprintln!(
            "skipped: NVIDIA's CUDA runtime is not in {} (run ci/fetch-cudart.sh)",
            dir.display()
        );
        return;
    }
    let installed = common::c::Installed::new("vgpu-cudart");
    let (prefix, libdir) = (&installed.prefix, &installed.lib);
    for (version, runtime) in &runtimes {
        for (kind, link_static, defines) in [
            ("shared", false, &[][..]),
            ("static", true, &[][..]),
            (
                "per-thread",
                false,
                &["-DCUDA_API_PER_THREAD_DEFAULT_STREAM=1"][..],
            ),
        ] {
            let name = format!("cudart{version}-{kind}");
            let exe = prefix.join(&name);
            build(&cc, runtime, &exe, link_static, defines);
            run(&exe, libdir, &name, false, false);
            run(&exe, libdir, &format!("{name}-eager"), false, true);
            run(&exe, libdir, &format!("{name}-fatbin"), true, false);
            run(&exe, libdir, &format!("{name}-fatbin-eager"), true, true);
        }
    }
    installed.remove();
}
