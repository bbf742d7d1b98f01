//! A vgpud started for one test: its own state directory and socket, the project's worker
//! and vmm, stopped (SIGTERM, then SIGKILL) and cleaned up on drop.
//!
//! Its log level is `info` unless `VGPU_DAEMON_LOG` (a `RUST_LOG` filter, e.g.
//! `info,vgpu_scheduler=trace` for every hand-over decision) says otherwise; with
//! `VGPU_DAEMON_LOG_DIR` set, each daemon's log is copied there when it stops, as
//! `<its directory's name>.log`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_api::api::{VgpuCreate, VmCreate, VmState};
use vgpu_api::client::{Client, Endpoint};

/// A running vgpud.
pub struct TestDaemon {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub client: Client,
    pub log: PathBuf,
    /// The options it was started with (a restart uses them again).
    extra: Vec<String>,
    env: Vec<(String, String)>,
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("vgpud-test-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The vgpud command with the project's binaries and payload directory.
pub fn vgpud_command(extra: &[&str]) -> Command {
    // vgpud finds vgpu-worker and vmm next to itself; make sure they are built.
    crate::bins::binary("vgpu-worker");
    crate::bins::binary("vmm");
    let mut cmd = Command::new(crate::bins::binary("vgpud"));
    let filter = std::env::var("VGPU_DAEMON_LOG").unwrap_or_else(|_| "info".into());
    cmd.args(extra).env("RUST_LOG", filter).stdin(Stdio::null());
    cmd
}

impl TestDaemon {
    /// Starts vgpud on a unix socket with `extra` options and waits until it serves.
    pub fn start(tag: &str, extra: &[&str]) -> Self {
        Self::start_with_env(tag, extra, &[])
    }

    /// As [`TestDaemon::start`], with `env` added to vgpud's environment (its workers and
    /// vmms inherit it; e.g. `VGPU_FAULTS_DIR` for fault injection).
    pub fn start_with_env(tag: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_in_with_env(&temp_dir(tag), extra, env)
    }

    /// As [`TestDaemon::start`], in the existing directory `dir` (socket, state, log).
    pub fn start_in(dir: &Path, extra: &[&str]) -> Self {
        Self::start_in_with_env(dir, extra, &[])
    }

    fn start_in_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = dir.to_owned();
        let socket = dir.join("vgpud.sock");
        let log = dir.join("vgpud.log");
        let client = Client::new(Endpoint::Unix(socket.clone()), None);
        let mut d = TestDaemon {
            child: None,
            dir,
            socket,
            client,
            log,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        d.spawn();
        d
    }

    /// Starts vgpud (on this daemon's socket and state directory, with its options; its
    /// log appended to `log`) and waits until it serves.
    fn spawn(&mut self) {
        let payloads = crate::bins::payload("hello");
        let payload_dir = payloads.parent().expect("payload dir").to_owned();
        let sock = self.socket.display().to_string();
        let pdir = payload_dir.display().to_string();
        let mut args = vec!["--socket", sock.as_str(), "--payload-dir", pdir.as_str()];
        args.extend(self.extra.iter().map(String::as_str));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let child = vgpud_command(&args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("cannot start vgpud");
        self.child = Some(child);
        self.wait_serving();
    }

    /// Starts vgpud again on the same socket and state directory after it stopped or was
    /// killed, with `extra` options instead of the first ones when given.
    pub fn restart(&mut self, extra: Option<&[&str]>) {
        assert!(
            self.child.is_none(),
            "vgpud still runs: stop or kill it first"
        );
        if let Some(extra) = extra {
            self.extra = extra.iter().map(|s| (*s).to_owned()).collect();
        }
        self.spawn();
    }

    /// `kill -9` of vgpud (reaped); returns the children it had.
    pub fn kill9(&mut self) -> Vec<u32> {
        let Some(mut c) = self.child.take() else {
            return Vec::new();
        };
        let kids = children(c.id());
        let _ = c.kill();
        let _ = c.wait();
        kids
    }

    fn wait_serving(&mut self) {
        let start = Instant::now();
        loop {
            if self.client.gpus().is_ok() {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("vgpud exited ({st}) before serving:\n{}", self.log_text());
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "vgpud did not serve within 20 s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// vgpud's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// SIGTERM and wait (at most 10 s, then SIGKILL). Returns whether it exited by itself.
    pub fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        let pid = libc::pid_t::try_from(c.id()).unwrap_or(0);
        // SAFETY: kill(2) on the pid of our own child, which we have not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        false
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            // A failing test (often on a loaded CI box) shows what the daemon, its workers
            // and vmms logged, before the directory goes.
            print_log_tails(&self.dir, 60);
        }
        if let (Some(keep), Some(name)) = (
            std::env::var_os("VGPU_DAEMON_LOG_DIR"),
            self.dir.file_name(),
        ) {
            let to = Path::new(&keep).join(name).with_extension("log");
            if let Err(e) = std::fs::copy(&self.log, &to) {
                eprintln!("cannot keep vgpud's log as {}: {e}", to.display());
            }
        }
        // VMs and workers outlive vgpud (a restart adopts them): end the test's own.
        kill_leftovers(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Most earlier warnings, errors and panics printed per log before its tail.
const EARLIER_NOTABLE: usize = 40;

/// Whether a log line is worth showing even outside the tail: a panic, or a warning or
/// error of `tracing`.
fn notable(line: &str) -> bool {
    line.contains("panicked") || line.contains(" ERROR ") || line.contains(" WARN ")
}

/// The last `lines` lines of every log file under `dir` (vgpud's, its workers', its
/// vmms'), to stderr, each after the warnings, errors and panics that came before its
/// tail (the first of them: what went wrong first is often long before the end).
fn print_log_tails(dir: &Path, lines: usize) {
    let mut logs = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                logs.push(p);
            }
        }
    }
    logs.sort();
    for p in logs {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let cut = all.len().saturating_sub(lines);
        let earlier: Vec<&str> = all[..cut]
            .iter()
            .copied()
            .filter(|l| notable(l))
            .take(EARLIER_NOTABLE)
            .collect();
        if !earlier.is_empty() {
            eprintln!(
                "---- {} (warnings, errors and panics before the tail)\n{}",
                p.display(),
                earlier.join("\n")
            );
        }
        let tail = &all[cut..];
        eprintln!(
            "---- {} (last {} lines)\n{}",
            p.display(),
            tail.len(),
            tail.join("\n")
        );
    }
}

/// The processes working in `dir` or holding a file in it (a test's vmms and workers,
/// which outlive vgpud): their pids.
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let inside = |link: &Path| std::fs::read_link(link).is_ok_and(|t| t.starts_with(dir));
    procs
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            let base = PathBuf::from(format!("/proc/{pid}"));
            inside(&base.join("cwd"))
                || std::fs::read_dir(base.join("fd"))
                    .map(|fds| fds.filter_map(Result::ok).any(|f| inside(&f.path())))
                    .unwrap_or(false)
        })
        .collect()
}

/// SIGKILLs every process [`processes_in`] `dir` and waits (at most 5 s) until they are
/// gone.
pub fn kill_leftovers(dir: &Path) {
    let pids = processes_in(dir);
    for pid in &pids {
        if let Ok(p) = libc::pid_t::try_from(*pid) {
            // SAFETY: kill(2) takes a pid and a signal; a pid that went away meanwhile
            // yields ESRCH.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
    let start = Instant::now();
    while pids.iter().any(|p| alive(*p)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` still exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .map(str::trim_start)
            .is_some_and(|r| r.starts_with('Z')),
        Err(_) => false,
    }
}

/// Direct children of `pid`, whichever of its threads forked them (vgpud forks on its
/// blocking pool).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut kids: Vec<u32> = tasks
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|s| s.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    kids.sort_unstable();
    kids.dedup();
    kids
}

/// Files left in `dir` (names).
pub fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Checks `value` against schema `name` of the OpenAPI document `spec`: every property
/// the value has is declared, every required one is present, and each has the declared
/// JSON type (recursing into `$ref`s, arrays and `oneOf`s). Returns what does not conform.
pub fn conforms(spec: &serde_json::Value, name: &str, value: &serde_json::Value) -> Vec<String> {
    let mut errs = Vec::new();
    let schema = &spec["components"]["schemas"][name];
    if schema.is_null() {
        errs.push(format!("no schema {name} in the spec"));
        return errs;
    }
    check(spec, schema, value, name, &mut errs);
    errs
}

fn resolve<'a>(spec: &'a serde_json::Value, s: &'a serde_json::Value) -> &'a serde_json::Value {
    match s.get("$ref").and_then(|r| r.as_str()) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or("");
            &spec["components"]["schemas"][name]
        }
        None => s,
    }
}

fn check(
    spec: &serde_json::Value,
    schema: &serde_json::Value,
    v: &serde_json::Value,
    at: &str,
    errs: &mut Vec<String>,
) {
    use serde_json::Value;
    let schema = resolve(spec, schema);
    if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
        let ok = alts.iter().any(|alt| {
            let mut e = Vec::new();
            check(spec, alt, v, at, &mut e);
            e.is_empty()
        });
        if !ok {
            errs.push(format!("{at}: {v} matches none of oneOf"));
        }
        return;
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return,
    };
    let fits = types.iter().any(|t| match *t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    });
    if !fits {
        errs.push(format!("{at}: {v} is not {types:?}"));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(v) {
            errs.push(format!("{at}: {v} is not one of {allowed:?}"));
        }
    }
    if let (Some(props), Some(obj)) = (
        schema.get("properties").and_then(Value::as_object),
        v.as_object(),
    ) {
        for (k, val) in obj {
            match props.get(k) {
                Some(p) => check(spec, p, val, &format!("{at}.{k}"), errs),
                None => errs.push(format!("{at}.{k} is not in the spec")),
            }
        }
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(r) = r.as_str() {
                if !obj.contains_key(r) {
                    errs.push(format!("{at}.{r} is required by the spec but missing"));
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            check(spec, items, x, &format!("{at}[{i}]"), errs);
        }
    }
}

/// A VM (64 MiB, one vCPU) running `payload` with `arg` on the existing vGPU `vgpu`.
pub fn vm_on(payload: &str, arg: &str, vgpu: u32) -> VmCreate {
    VmCreate {
        payload: Some(crate::bins::payload(payload).display().to_string()),
        payload_arg: arg.into(),
        memory_bytes: 64 << 20,
        vgpu_id: Some(vgpu),
        ..Default::default()
    }
}

/// A VM running the gpu-load payload with an inline vGPU.
pub fn gpu_load(arg: &str, gpu: u32, compute: f64, memory: u64) -> VmCreate {
    VmCreate {
        payload: Some(crate::bins::payload("gpu-load").display().to_string()),
        payload_arg: arg.into(),
        memory_bytes: 64 << 20,
        vgpu: Some(VgpuCreate {
            gpu: Some(gpu),
            ..VgpuCreate::new(memory, compute)
        }),
        ..Default::default()
    }
}

/// Waits until VM `id` runs (its vGPU connected); panics with its console otherwise.
pub fn wait_running(c: &Client, id: u32) {
    let start = Instant::now();
    loop {
        let vm = c.vm(id).expect("vm");
        match vm.state {
            VmState::Running => return,
            VmState::Starting if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            other => panic!(
                "VM {id} did not start: {other:?}\n{}",
                String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default())
            ),
        }
    }
}

/// The idle pool workers vgpud reports in `/metrics` (`vgpud_gpu_worker_pool_idle`): of
/// GPU `gpu`, or of every GPU summed when `None`. `None` when `/metrics` cannot be read
/// or has no such line.
pub fn pool_idle(c: &Client, gpu: Option<u32>) -> Option<u64> {
    let text = c.metrics().ok()?;
    let prefix = match gpu {
        Some(g) => format!("vgpud_gpu_worker_pool_idle{{gpu=\"{g}\"}}"),
        None => "vgpud_gpu_worker_pool_idle{".to_string(),
    };
    let values: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::notable;

    #[test]
    fn warnings_errors_and_panics_are_notable_and_the_rest_is_not() {
        for line in [
            "2026-12-03T08:14:00.597223Z  WARN vgpu_grant::client: no grant from the scheduler for 10 s",
            "2026-12-03T08:14:20.571131Z ERROR virtio_queue::queue: Iterator error",
            "thread 'sched-gpu0' panicked at scheduler/src/state.rs:1:1:",
        ] {
            assert!(notable(line), "{line}");
        }
        for line in [
            "2026-12-03T08:13:51.392821Z  INFO vgpud::daemon::admission: vGPU admitted vgpu=41",
            "gpu-load: round 5/80 ok checksum=0xfe9133fcbe573d97",
        ] {
            assert!(!notable(line), "{line}");
        }
    }
}
