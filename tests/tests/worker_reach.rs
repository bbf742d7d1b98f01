//! What a compromised worker reaches (docs/hostile.md, "A compromised worker"): each test
//! is an attack a guest that took its worker over would make, played by a stand-in
//! preloaded into every worker (`worker_reach/compromised.c`, compiled here with `cc`,
//! LD_PRELOAD in vgpud's environment). It acts once the worker's seccomp filter is on and
//! writes what happened, step by step, to a file the test reads.
//!
//! - the filter: io_uring, a fork, clone3, tgkill of another process, prctl
//!   (PR_SET_DUMPABLE) are refused or kill the worker; threads still start;
//! - nothing a worker starts outlives it (run without a filter, so only the seal holds);
//! - a pool worker's left-behind child never reaches the tenant of the next worker in its
//!   slot (same uid): it cannot take over that tenant's vhost-user socket;
//! - a process vGPU's left-behind child cannot turn the socket's hand-over onto a root
//!   file;
//! - a process vGPU whose worker died under a process gets a fresh worker.
//!
//! Runs as root (per-worker uids); skipped otherwise, or without a C compiler.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vgpu_api::api::{Attach, VgpuCreate, VgpuState};
use vgpu_api::client::Client;
use vgpu_tests::daemon::{alive, TestDaemon};

const MIB: u64 = 1 << 20;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The stand-in library, compiled once per test binary (None without `cc`).
fn standin() -> Option<&'static Path> {
    static LIB: OnceLock<Option<PathBuf>> = OnceLock::new();
    LIB.get_or_init(|| {
        // One library per version of the source, kept for the next run; readable by
        // every worker uid.
        let source = include_str!("worker_reach/compromised.c");
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(source, &mut h);
        let tag = std::hash::Hasher::finish(&h);
        let dir = std::env::temp_dir().join("vgpu-standin-lib");
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).ok()?;
        let lib = dir.join(format!("compromised-{tag:016x}.so"));
        if lib.exists() {
            return Some(lib);
        }
        let tmp = dir.join(format!("compromised-{}.so.tmp", std::process::id()));
        let src = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/worker_reach/compromised.c"
        );
        let ok = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&tmp)
            .arg(src)
            .arg("-lpthread")
            .status()
            .is_ok_and(|s| s.success());
        (ok && std::fs::rename(&tmp, &lib).is_ok()).then_some(lib)
    })
    .as_deref()
}

/// The stand-in's output directory, removed when the test passes (kept for a look when
/// it fails).
struct Out(PathBuf);

impl std::ops::Deref for Out {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A daemon whose workers carry the stand-in with `plan`, and the stand-in's output
/// directory (writable by every worker uid). None when the test cannot run here.
fn start(tag: &str, extra: &[&str], plan: &str) -> Option<(TestDaemon, Out)> {
    if !root() {
        eprintln!("SKIPPED: not root, so workers share vgpud's uid");
        return None;
    }
    let Some(lib) = standin() else {
        eprintln!("SKIPPED: no C compiler (cc) to build the compromised-worker stand-in");
        return None;
    };
    let out = std::env::temp_dir().join(format!("vgpu-standin-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("stand-in output dir");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let mut args = vec!["--sim-gpus", "1", "--sim-memory", "1G"];
    args.extend_from_slice(extra);
    let lib = lib.display().to_string();
    let dir = out.display().to_string();
    let d = TestDaemon::start_with_env(
        tag,
        &args,
        &[
            ("LD_PRELOAD", lib.as_str()),
            ("STANDIN_OUT", dir.as_str()),
            ("STANDIN_PLAN", plan),
        ],
    );
    Some((d, Out(out)))
}

fn spec(attach: Attach, owner: Option<u32>) -> VgpuCreate {
    VgpuCreate {
        gpu: Some(0),
        memory_bytes: 32 * MIB,
        compute_share: 0.1,
        copy_share: None,
        priority: 0,
        oversubscribe: false,
        share_group: None,
        queues: 1,
        storage: Vec::new(),
        name: None,
        labels: Default::default(),
        kernel_deadline_ms: None,
        attach,
        owner_uid: owner,
        owner_gid: owner,
    }
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the stand-in in vGPU `id`'s worker wrote.
fn report(out: &Path, id: u32) -> String {
    std::fs::read_to_string(out.join(format!("{id}.txt"))).unwrap_or_default()
}

/// Creates vGPU `id` (its worker may be killed before the create answers).
fn create(c: &Client, s: &VgpuCreate, id: u32) {
    match c.create_vgpu(s) {
        Ok(v) => assert_eq!(v.id, id),
        Err(e) => eprintln!("vGPU {id}: create answered {e}"),
    }
}

/// Waits until the stand-in in vGPU `id`'s worker is done or the worker is gone.
fn settled(c: &Client, out: &Path, id: u32) -> VgpuState {
    let mut last = None;
    wait_until(
        &format!("vGPU {id}'s stand-in"),
        Duration::from_secs(15),
        || {
            let st = c.vgpu(id).expect("vgpu").state;
            let done = report(out, id).contains("done\n");
            let over = done || matches!(st, VgpuState::Failed { .. });
            last = Some(st);
            over
        },
    );
    last.expect("a state")
}

fn killed_by_filter(state: &VgpuState) -> bool {
    matches!(state, VgpuState::Failed { reason }
        if reason.contains("seccomp") && reason.contains("SIGSYS"))
}

/// Processes in session `sid` (a worker starts one; its filter has no `setsid` to leave
/// it), other than `sid` itself.
fn session_members(sid: u32) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != sid)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
                rest.split_whitespace().nth(3) == Some(sid.to_string().as_str())
            })
        })
        .collect()
}

#[test]
fn calls_outside_the_filter_are_refused_or_kill_the_worker_and_threads_still_start() {
    let plan = "2=uring;3=fork;4=clone3;5=tgkill;6=prctl";
    let Some((d, out)) = start("filter", &[], plan) else {
        return;
    };
    let c = &d.client;
    // A TCP service on loopback, as vgpud's REST API may be.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp");
    tcp.set_nonblocking(true).expect("nonblocking");
    let port = tcp.local_addr().expect("addr").port();
    std::fs::write(out.join("port"), port.to_string()).expect("port");
    let neighbour = c.create_vgpu(&spec(Attach::Vm, None)).expect("neighbour");
    let npid = neighbour.worker_pid.expect("neighbour's worker");
    std::fs::write(out.join("target"), npid.to_string()).expect("target");
    for id in 2..=6 {
        create(c, &spec(Attach::Vm, None), id);
    }
    // io_uring: refused at setup, so none of its operations run; the worker lives.
    let st = settled(c, &out, 2);
    let r = report(&out, 2);
    assert!(r.contains("io_uring_setup: refused"), "{r}");
    assert!(!r.contains("ALLOWED"), "{r}");
    assert_eq!(st, VgpuState::Ready, "{r}");
    assert!(tcp.accept().is_err(), "a worker reached a TCP service: {r}");
    assert!(!d.dir.join("workers/2/planted-link").exists(), "{r}");
    assert!(!d.dir.join("workers/2/planted-dir").exists(), "{r}");
    // A fork, a tgkill of the neighbour's worker, prctl(PR_SET_DUMPABLE): killed.
    for (id, step) in [
        (3, "trying fork"),
        (5, "trying tgkill"),
        (6, "trying prctl"),
    ] {
        let st = settled(c, &out, id);
        let r = report(&out, id);
        assert!(killed_by_filter(&st), "vGPU {id}: {st:?}\n{r}");
        let last = r.lines().last().unwrap_or_default();
        assert!(
            last.starts_with(step),
            "vGPU {id}: the last step is {last:?}: {r}"
        );
        assert!(!r.contains("ALLOWED"), "vGPU {id}: {r}");
    }
    // clone3 is refused with ENOSYS (its flags are out of the filter's sight) and glibc
    // falls back to clone for a thread, which the filter checks and lets through.
    let st = settled(c, &out, 4);
    let r = report(&out, 4);
    assert!(
        r.contains("clone3: refused (Function not implemented)"),
        "{r}"
    );
    assert!(r.contains("pthread_create after the filter: ran"), "{r}");
    assert_eq!(st, VgpuState::Ready, "{r}");
    // The neighbour and vgpud never noticed.
    assert!(alive(npid), "the neighbour's worker was killed");
    assert!(alive(d.pid()), "vgpud was killed");
    assert_eq!(c.vgpu(1).expect("neighbour").state, VgpuState::Ready);
}

#[test]
fn nothing_a_worker_starts_outlives_it() {
    // Without a filter, so that the fork happens and only the seal stands in the way.
    let Some((d, out)) = start("seal", &["--worker-seccomp", "off"], "1=outlive") else {
        return;
    };
    let c = &d.client;
    create(c, &spec(Attach::Vm, None), 1);
    wait_until("the stand-in forked", Duration::from_secs(10), || {
        report(&out, 1).contains("child pid")
    });
    let worker = c.vgpu(1).expect("vgpu").worker_pid.expect("worker");
    assert!(
        !session_members(worker).is_empty(),
        "the child: {}",
        report(&out, 1)
    );
    c.delete_vgpu(1).expect("delete");
    wait_until("the worker exited", Duration::from_secs(5), || {
        !alive(worker)
    });
    // Once its worker is gone, nothing it started runs.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        session_members(worker),
        Vec::<u32>::new(),
        "{}",
        report(&out, 1)
    );
    std::thread::sleep(Duration::from_millis(200));
    let r = report(&out, 1);
    assert!(!r.contains("REACHED"), "{r}");
}

#[test]
fn a_pool_workers_left_behind_child_never_reaches_the_next_tenant_of_its_slot() {
    // vGPU 1 takes pool slot 0's worker and forks a child that is to wait for the next
    // worker of slot 0 (the same uid), open its directory while it is still dumpable and
    // put a listener of its own where that worker's tenant connects.
    let Some((d, out)) = start("slot", &["--worker-pool", "1"], "1=next-tenant") else {
        return;
    };
    let c = &d.client;
    let idle = || vgpu_tests::daemon::pool_idle(c, Some(0)).unwrap_or(0);
    wait_until("the pool is full", Duration::from_secs(10), || idle() == 1);
    create(c, &spec(Attach::Vm, None), 1);
    wait_until("the stand-in forked", Duration::from_secs(10), || {
        report(&out, 1).contains("fork")
    });
    let _ = c.delete_vgpu(1);
    wait_until("the pool is full again", Duration::from_secs(10), || {
        idle() == 1
    });
    // vGPU 2 takes the idle worker; the pool starts the next one in the free slot 0.
    create(c, &spec(Attach::Vm, None), 2);
    wait_until("the pool refilled", Duration::from_secs(10), || idle() == 1);
    create(c, &spec(Attach::Vm, None), 3);
    let v3 = c.vgpu(3).expect("vGPU 3");
    assert_eq!(v3.state, VgpuState::Ready);
    // Give the child its time.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) && !report(&out, 1).contains("listening") {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The next tenant connects: whoever listens is vGPU 3's worker or vgpud, nobody else.
    let s = UnixStream::connect(&v3.socket).expect("connect to vGPU 3's socket");
    let peer = peer_pid(&s);
    let ours = [v3.worker_pid.unwrap_or(0), d.pid()];
    let r = report(&out, 1);
    assert!(
        ours.contains(&peer),
        "vGPU 3's socket is served by process {peer}, not its worker or vgpud: {r}"
    );
    assert!(!r.contains("REACHED"), "{r}");
    drop(s);
}

/// The process that listens on the socket `s` is connected to.
fn peer_pid(s: &UnixStream) -> u32 {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a valid ucred.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "SO_PEERCRED");
    u32::try_from(cred.pid).unwrap_or(0)
}

/// A process connects to process vGPU `id`'s socket and hangs up; true once the vGPU
/// has a fresh worker for the next one.
fn one_process(c: &Client, id: u32) -> bool {
    let v = c.vgpu(id).expect("vgpu");
    let Ok(mut s) = UnixStream::connect(&v.socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut b = [0u8; 1];
    let _ = s.read(&mut b);
    drop(s);
    let old = v.worker_pid;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let v = c.vgpu(id).expect("vgpu");
        if v.state == VgpuState::Ready && v.worker_pid.is_some() && v.worker_pid != old {
            return true;
        }
        if matches!(v.state, VgpuState::Failed { .. }) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_process_vgpus_left_behind_child_cannot_turn_the_hand_over_onto_a_root_file() {
    // The worker of process vGPU 1 forks a child; each time a process hangs up and the
    // vGPU gets a fresh worker (the same uid), the child swaps that worker's socket for a
    // symlink to a root-only file just before vgpud hands the socket over.
    let Some((d, out)) = start("handover", &[], "1=handover") else {
        return;
    };
    let c = &d.client;
    let secret = out.join("root-file");
    std::fs::write(&secret, "root only\n").expect("root file");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let tenant = 4242;
    create(c, &spec(Attach::Process, Some(tenant)), 1);
    wait_until("the stand-in forked", Duration::from_secs(10), || {
        report(&out, 1).contains("fork")
            || matches!(c.vgpu(1).map(|v| v.state), Ok(VgpuState::Failed { .. }))
    });
    for _ in 0..3 {
        if !one_process(c, 1) {
            break;
        }
    }
    let m = std::fs::metadata(&secret).expect("root file");
    let r = report(&out, 1);
    assert_eq!(
        (m.uid(), m.mode() & 0o777),
        (0, 0o600),
        "the root file was handed to the tenant: {r}"
    );
    assert!(!r.contains("REACHED"), "{r}");
    let _ = d;
}

#[test]
fn a_process_vgpus_worker_that_died_under_a_process_gives_way_to_a_fresh_one() {
    let Some((d, _out)) = start("fresh", &[], "") else {
        return;
    };
    let c = &d.client;
    let (uid, gid) = (0, 0);
    let mut s = spec(Attach::Process, Some(uid));
    s.owner_gid = Some(gid);
    create(c, &s, 1);
    let v = c.vgpu(1).expect("vgpu");
    let first = v.worker_pid.expect("worker");
    let conn = UnixStream::connect(&v.socket).expect("connect");
    wait_until("attached", Duration::from_secs(5), || {
        c.vgpu(1).expect("vgpu").state == VgpuState::Attached
    });
    // The worker dies under its process (as it would on a crash).
    // SAFETY: kill with a pid and a signal number.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    drop(conn);
    wait_until("a fresh worker", Duration::from_secs(10), || {
        let v = c.vgpu(1).expect("vgpu");
        v.state == VgpuState::Ready && v.worker_pid.is_some_and(|p| p != first)
    });
    // The next process is served.
    assert!(one_process(c, 1), "{:?}", c.vgpu(1).expect("vgpu").state);
}
