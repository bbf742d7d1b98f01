//! A `vgpu-worker` serving one vhost-user socket, started for a test and killed when
//! dropped: the one worker helper of the end-to-end tests and of vgpu-cuda's tests.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bins::binary;

pub struct Worker {
    child: Child,
    pub socket: PathBuf,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Worker {
    /// Starts `vgpu-worker --backend <backend>` with `memory` and `queues` plus `extra`
    /// arguments, and waits for its socket. `Err` carries the worker's output when it
    /// exited instead (no GPU, say).
    pub fn start(
        backend: &str,
        name: &str,
        memory: &str,
        queues: u16,
        extra: &[&str],
    ) -> Result<Self, String> {
        let socket =
            std::env::temp_dir().join(format!("vgpu-test-{}-{name}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(binary("vgpu-worker"))
            .args(["--backend", backend, "--vgpu-id", "1"])
            .args(["--memory", memory, "--queues", &queues.to_string()])
            .args(extra)
            .arg("--socket")
            .arg(&socket)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start vgpu-worker: {e}"))?;
        let mut w = Worker { child, socket };
        let start = Instant::now();
        while !w.socket.exists() {
            if let Ok(Some(status)) = w.child.try_wait() {
                return Err(format!(
                    "the worker exited with {status}: {}",
                    w.output().trim()
                ));
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "the worker did not bind {} in 60 s",
                    w.socket.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(w)
    }

    /// A sim worker (`--backend sim`) with `memory` and `queues`; panics with the worker's
    /// output when it does not start (a test that needs one cannot go on without it).
    pub fn sim(name: &str, memory: &str, queues: u16) -> Self {
        Self::start("sim", name, memory, queues, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The `--vgpu` argument for a vmm.
    pub fn vgpu_arg(&self) -> String {
        vgpu_arg(&self.socket)
    }

    /// Everything the worker printed on stderr (stops it first).
    pub fn output(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut s = String::new();
        if let Some(e) = self.child.stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

pub fn vgpu_arg(socket: &Path) -> String {
    format!("socket={}", socket.display())
}
