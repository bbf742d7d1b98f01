//! Running a vmm with a deadline and collecting what it printed.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished VM left behind.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Starts `vmm` with `args`; stdout and stderr piped.
pub fn spawn_vmm(args: &[&str]) -> Child {
    Command::new(crate::bins::binary("vmm"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start vmm")
}

/// Waits for `child` at most `deadline`, killing it after; collects its output.
pub fn finish(mut child: Child, deadline: Duration) -> Outcome {
    let start = Instant::now();
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.code(),
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    Outcome {
        code,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
        elapsed: start.elapsed(),
    }
}

/// Runs a payload to its end.
pub fn run_payload(payload: &Path, extra: &[&str], deadline: Duration) -> Outcome {
    let p = payload.to_string_lossy().into_owned();
    let mut args = vec!["--payload", p.as_str()];
    args.extend_from_slice(extra);
    finish(spawn_vmm(&args), deadline)
}
