//! Whole-VM migration between two vgpud daemons on one machine (each with its own GPUs,
//! state directory and socket): a gpu-load VM computing through its vGPU moves from one
//! daemon to the other and back, several times, and ends with the checksum of a VM that
//! never moved; a VM keeping state in a module variable of its vGPU moves there and back
//! with the variable intact; an oversubscribed vGPU with pieces swapped out moves and back with every
//! byte; a full destination refuses (409, nothing moved); a destination killed mid-move
//! leaves the VM running at the source; a wrong token is refused (401).
//!
//! `VGPU_TEST_BACKEND=cuda` runs it on the GPU machine (both daemons share GPU 0 with
//! small shares).

use std::time::{Duration, Instant};

use vgpu_api::api::{Migration, MigrationDestination, VgpuState, VmMigrateRequest, VmState};
use vgpu_api::client::{Client, Endpoint};
use vgpu_tests::daemon::{gpu_load, wait_running, TestDaemon};
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

fn on_cuda() -> bool {
    std::env::var("VGPU_TEST_BACKEND").is_ok_and(|b| b == "cuda")
}

fn gpus() -> Vec<&'static str> {
    if on_cuda() {
        vec!["--backend", "cuda"]
    } else {
        // A worker pool as on cuda (where it is on by default): a vGPU arriving from
        // another daemon must get a receiving worker, not a pool worker.
        vec![
            "--sim-gpus",
            "1",
            "--sim-memory",
            "512M",
            "--worker-pool",
            "1",
        ]
    }
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

fn last_checksum(out: &str) -> String {
    out.lines()
        .rev()
        .find_map(|l| l.strip_prefix("GPU-LOAD OK "))
        .unwrap_or_default()
        .to_string()
}

fn to_socket(d: &TestDaemon) -> VmMigrateRequest {
    VmMigrateRequest {
        destination: MigrationDestination {
            socket: Some(d.socket.display().to_string()),
            url: None,
            token: None,
        },
        downtime_ms: Some(100),
        mode: None,
    }
}

/// Moves VM `id` from `from` as `req` says; the VM's id at the destination.
fn move_vm(from: &Client, id: u32, req: &VmMigrateRequest) -> (u32, Migration) {
    let m = from.migrate_vm_to(id, req).expect("migrate");
    let host = m.host.clone().expect("a whole-VM move");
    let remote = host.remote_vm.expect("the destination's VM");
    let done = from
        .wait_migration(m.id, Duration::from_secs(120), |_| {})
        .expect("wait");
    assert_eq!(done.state, "completed", "{done:?}");
    (remote, done)
}

/// Waits until VM `id` is gone from `c` (the source frees a moved VM).
fn wait_gone(c: &Client, id: u32) {
    let start = Instant::now();
    while c.vm(id).is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "VM {id} is still listed at its source"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_computing_vm_moves_between_daemons_and_back_and_its_result_is_exact() {
    require_kvm!();
    let a = TestDaemon::start("hostmig-a", &gpus());
    let b = TestDaemon::start("hostmig-b", &gpus());
    let arg = "rounds=2500 n=65536 spin_us=2000 check=100";
    let mut vm = gpu_load(arg, 0, 0.2, vgpu_tests::gpus::share(32 * MIB));
    vm.name = Some("mover".into());
    vm.labels.insert("team".into(), "gpu".into());
    let moved = a.client.create_vm(&vm).expect("vm");
    let still = a
        .client
        .create_vm(&gpu_load(arg, 0, 0.2, vgpu_tests::gpus::share(32 * MIB)))
        .expect("reference vm");
    wait_running(&a.client, moved.id);
    wait_running(&a.client, still.id);
    std::thread::sleep(Duration::from_millis(300));
    let daemons = [&a, &b];
    let mut at = 0;
    let mut id = moved.id;
    for i in 0..4 {
        let (from, to) = (daemons[at], daemons[1 - at]);
        let before = console(&from.client, id);
        let here = from.client.vm(id).expect("vm");
        let (vgpu_here, uptime) = (here.vgpu.expect("vgpu"), here.uptime_ms);
        let (remote, m) = move_vm(&from.client, id, &to_socket(to));
        let host = m.host.expect("host");
        eprintln!(
            "HOSTMIG move {i}: downtime {:?} ms, vmm {} B in {} rounds, vGPU {} B (its stop {:?} ms)",
            m.downtime_ms, host.vmm_bytes, host.vmm_rounds, host.vgpu_bytes, host.vgpu_downtime_ms
        );
        assert!(host.vgpu_bytes > 0, "the vGPU's memory moved: {host:?}");
        // Pre-copy: only what was dirtied since the last round (by the vCPUs or by the
        // vGPU's backend, in its dirty log) goes while the VM is stopped.
        assert!(
            host.stop_ram_bytes < vm.memory_bytes / 4,
            "{} of {} bytes of RAM sent while stopped: {host:?}",
            host.stop_ram_bytes,
            vm.memory_bytes
        );
        // The destination's record of the same move.
        let theirs = to
            .client
            .migration(host.remote_migration.expect("remote record"))
            .expect("remote migration");
        let their_host = theirs.host.expect("host");
        assert_eq!(
            (theirs.state.as_str(), their_host.direction.as_str()),
            ("completed", "incoming")
        );
        assert_eq!(theirs.downtime_ms, m.downtime_ms);
        assert_eq!(their_host.vgpu_bytes, host.vgpu_bytes);
        wait_gone(&from.client, id);
        let there = to.client.vm(remote).expect("moved VM");
        assert!(there.uptime_ms >= uptime, "its uptime continues");
        assert_eq!(there.name.as_deref(), Some("mover"));
        assert_eq!(there.labels.get("team").map(String::as_str), Some("gpu"));
        // The console continues the one it had.
        let after = console(&to.client, remote);
        assert!(
            after.starts_with(before.trim_end()),
            "console:\n{before}\n---\n{after}"
        );
        assert!(
            to.client
                .vgpus()
                .expect("vgpus")
                .iter()
                .any(|v| Some(v.id) == there.vgpu),
            "its vGPU is there"
        );
        let start = Instant::now();
        loop {
            let left: Vec<_> = from
                .client
                .vgpus()
                .expect("vgpus")
                .into_iter()
                .filter(|v| v.id == vgpu_here)
                .filter(|v| !matches!(v.state, VgpuState::Released | VgpuState::Failed { .. }))
                .collect();
            if left.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the source still holds {left:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        id = remote;
        at = 1 - at;
        std::thread::sleep(Duration::from_millis(200));
    }
    let end = daemons[at];
    let vm = end
        .client
        .wait_vm(id, Duration::from_secs(240))
        .expect("wait");
    let out = console(&end.client, id);
    assert_eq!(vm.state, VmState::Exited { code: 0 }, "{out}");
    let reference = a
        .client
        .wait_vm(still.id, Duration::from_secs(240))
        .expect("wait");
    assert_eq!(reference.state, VmState::Exited { code: 0 });
    let expected = console(&a.client, still.id);
    assert!(out.contains("GPU-LOAD OK rounds=2500"), "{out}");
    assert_eq!(
        last_checksum(&out),
        last_checksum(&expected),
        "moved vs unmoved"
    );
}

/// The reference run's checksum beside the moved VM's, both finished.
fn assert_same_result(c: &Client, id: u32, reference: &Client, reference_id: u32, rounds: &str) {
    let vm = c.wait_vm(id, Duration::from_secs(240)).expect("wait");
    let out = console(c, id);
    assert_eq!(vm.state, VmState::Exited { code: 0 }, "{out}");
    let r = reference
        .wait_vm(reference_id, Duration::from_secs(240))
        .expect("wait");
    assert_eq!(r.state, VmState::Exited { code: 0 });
    assert!(
        out.contains(&format!("GPU-LOAD OK rounds={rounds}")),
        "{out}"
    );
    assert_eq!(
        last_checksum(&out),
        last_checksum(&console(reference, reference_id)),
        "moved vs unmoved"
    );
}

/// A memcheck VM whose every read-back lands in its own guest pages, zeroed before the
/// run and from then on written only by its vGPU, kept and checked again at the end: it
/// moves pre-copy while reading back (a page the vGPU wrote after the pre-copy sent it,
/// missing from the backend's dirty log, fails the final check: without the backend's
/// marks this test fails), then back stop-and-copy; a mode vgpud does not know is refused
/// naming the field.
#[test]
fn pages_only_the_vgpu_wrote_move_with_the_vm_in_both_modes() {
    require_kvm!();
    let a = TestDaemon::start("hostmig-dtoh-a", &gpus());
    let b = TestDaemon::start("hostmig-dtoh-b", &gpus());
    let mut vm = gpu_load("", 0, 0.2, vgpu_tests::gpus::share(32 * MIB));
    vm.payload = Some(vgpu_tests::bins::payload("memcheck").display().to_string());
    vm.payload_arg = "buffers=1 size_mib=1 rounds=300 pause_ms=20 keep=1".into();
    vm.memory_bytes = 512 * MIB;
    let vm = a.client.create_vm(&vm).expect("vm");
    wait_running(&a.client, vm.id);
    let start = Instant::now();
    while !console(&a.client, vm.id).contains("memcheck: round 3/") {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}",
            console(&a.client, vm.id)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut bad = to_socket(&b);
    bad.mode = Some("stop-copy".into());
    let e = a
        .client
        .migrate_vm_to(vm.id, &bad)
        .expect_err("unknown mode");
    assert_eq!(e.status(), Some(400), "{e}");
    assert!(e.to_string().contains("mode"), "{e}");

    let (there, m) = move_vm(&a.client, vm.id, &to_socket(&b));
    let host = m.host.expect("host");
    assert_eq!(m.mode, "precopy");
    assert!(
        host.stop_ram_bytes < vm.memory_bytes / 4,
        "{} of {} bytes of RAM sent while stopped: {host:?}",
        host.stop_ram_bytes,
        vm.memory_bytes
    );
    wait_gone(&a.client, vm.id);
    std::thread::sleep(Duration::from_millis(300));

    let mut stop = to_socket(&a);
    stop.mode = Some("stop_copy".into());
    let (back, m) = move_vm(&b.client, there, &stop);
    let host = m.host.expect("host");
    eprintln!(
        "HOSTMIG stop-and-copy: downtime {:?} ms, RAM {} B ({} B stopped), vGPU {} B",
        m.downtime_ms, host.vmm_bytes, host.stop_ram_bytes, host.vgpu_bytes
    );
    assert_eq!(m.mode, "stop_copy");
    assert_eq!(host.vmm_rounds, 0, "stop-and-copy has no pre-copy rounds");
    assert!(
        host.stop_ram_bytes > 0 && host.stop_ram_bytes <= host.vmm_bytes,
        "the RAM went while stopped: {host:?}"
    );
    wait_gone(&b.client, there);

    let done = a
        .client
        .wait_vm(back, Duration::from_secs(240))
        .expect("wait");
    let out = console(&a.client, back);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(
        out.contains("MEMCHECK OK") && out.contains("kept="),
        "{out}"
    );
}

/// Whether daemon `c` holds no VM and no vGPU that holds resources.
fn holds_nothing(c: &Client) -> bool {
    c.vms().expect("vms").iter().all(|v| !v.state.is_live())
        && c.vgpus()
            .expect("vgpus")
            .iter()
            .all(|v| matches!(v.state, VgpuState::Released | VgpuState::Failed { .. }))
}

#[test]
fn a_full_destination_refuses_and_nothing_moves() {
    require_kvm!();
    let a = TestDaemon::start("hostmig-full-a", &gpus());
    let b = TestDaemon::start("hostmig-full-b", &gpus());
    // Most of every destination GPU is taken: the VM's 20% compute share does not fit.
    for g in 0..b.client.gpus().expect("gpus").len() {
        let gpu = u32::try_from(g).expect("gpu index");
        let hog = gpu_load("", gpu, 0.9, vgpu_tests::gpus::share(16 * MIB))
            .vgpu
            .expect("vgpu");
        b.client.create_vgpu(&hog).expect("hog");
    }
    let vgpus_b = b.client.vgpus().expect("vgpus");
    let before_b = b.client.vms().expect("vms").len();
    let vm = a
        .client
        .create_vm(&gpu_load(
            "rounds=300 spin_us=1000",
            0,
            0.2,
            vgpu_tests::gpus::share(32 * MIB),
        ))
        .expect("vm");
    wait_running(&a.client, vm.id);
    let e = a
        .client
        .migrate_vm_to(vm.id, &to_socket(&b))
        .expect_err("does not fit");
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(e.to_string().contains("destination"), "{e}");
    assert_eq!(a.client.vm(vm.id).expect("vm").state, VmState::Running);
    assert_eq!(
        b.client.vms().expect("vms").len(),
        before_b,
        "nothing arrived"
    );
    assert_eq!(
        b.client.vgpus().expect("vgpus"),
        vgpus_b,
        "nothing reserved"
    );
    let done = a
        .client
        .wait_vm(vm.id, Duration::from_secs(120))
        .expect("wait");
    assert_eq!(
        done.state,
        VmState::Exited { code: 0 },
        "{}",
        console(&a.client, vm.id)
    );
}

/// Two `gpu-load` VMs with `arg`, running: one to move and one that stays as the reference.
fn vm_and_reference(c: &Client, arg: &str) -> (vgpu_api::api::Vm, vgpu_api::api::Vm) {
    let vm = c
        .create_vm(&gpu_load(arg, 0, 0.2, vgpu_tests::gpus::share(32 * MIB)))
        .expect("vm");
    let reference = c
        .create_vm(&gpu_load(arg, 0, 0.2, vgpu_tests::gpus::share(32 * MIB)))
        .expect("ref");
    wait_running(c, vm.id);
    wait_running(c, reference.id);
    (vm, reference)
}

#[test]
fn a_destination_killed_mid_move_leaves_the_vm_running_at_its_source() {
    require_kvm!();
    let a = TestDaemon::start("hostmig-kill-a", &gpus());
    let mut b = TestDaemon::start("hostmig-kill-b", &gpus());
    let arg = "rounds=1500 n=65536 spin_us=2000 check=100";
    let (vm, reference) = vm_and_reference(&a.client, arg);
    let m = a
        .client
        .migrate_vm_to(vm.id, &to_socket(&b))
        .expect("admitted");
    // The destination daemon and everything it started go at once.
    for pid in b.kill9() {
        // SAFETY: kill takes integers; the pid is the dead daemon's child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let done = a
        .client
        .wait_migration(m.id, Duration::from_secs(120), |_| {})
        .expect("wait");
    assert_eq!(done.state, "failed", "{done:?}");
    eprintln!("HOSTMIG killed destination: {:?}", done.error);
    assert_eq!(a.client.vm(vm.id).expect("vm").state, VmState::Running);
    assert_same_result(&a.client, vm.id, &a.client, reference.id, "1500");
}

/// A vgpud on a loopback TCP port with a bearer token.
struct TcpDaemon {
    child: std::process::Child,
    url: String,
    client: Client,
    token: String,
}

impl Drop for TcpDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `env`: vgpud's environment beside the test's (its options' variables).
fn tcp_daemon(tag: &str, env: &[(&str, &str)]) -> TcpDaemon {
    let dir = vgpu_tests::daemon::temp_dir(tag);
    let token = format!("{tag}-token-0123456789abcdef");
    let token_file = dir.join("token");
    std::fs::write(&token_file, &token).expect("token");
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let payloads = vgpu_tests::bins::payload("hello");
    let pdir = payloads
        .parent()
        .expect("payload dir")
        .display()
        .to_string();
    let mut args = vec![
        "--listen".to_string(),
        addr.clone(),
        "--token-file".into(),
        token_file.display().to_string(),
        "--state-dir".into(),
        dir.join("state").display().to_string(),
        "--payload-dir".into(),
        pdir,
    ];
    args.extend(gpus().iter().map(|s| (*s).to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = std::fs::File::create(dir.join("vgpud.log")).expect("log");
    let child = vgpu_tests::daemon::vgpud_command(&refs)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("vgpud");
    let client = Client::new(Endpoint::Tcp(addr.clone()), Some(token.clone()));
    let start = Instant::now();
    while client.gpus().is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "vgpud on {addr} did not serve"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    TcpDaemon {
        child,
        url: format!("http://{addr}"),
        client,
        token,
    }
}

#[test]
fn over_tcp_a_wrong_token_is_refused_and_the_right_one_moves_the_vm() {
    require_kvm!();
    let a = TestDaemon::start("hostmig-tcp-a", &gpus());
    let b = tcp_daemon("hostmig-tcp-b", &[]);
    let arg = "rounds=1000 n=65536 spin_us=2000 check=100";
    let (vm, reference) = vm_and_reference(&a.client, arg);
    let mut req = VmMigrateRequest {
        destination: MigrationDestination {
            socket: None,
            url: Some(b.url.clone()),
            token: Some("not-the-token".into()),
        },
        downtime_ms: Some(100),
        mode: None,
    };
    let e = a
        .client
        .migrate_vm_to(vm.id, &req)
        .expect_err("wrong token");
    assert_eq!(e.status(), Some(401), "{e}");
    // The field names the destination's token, which vgpuctl calls --to-token-file.
    assert_eq!(
        e.body().and_then(|b| b.field.as_deref()),
        Some("destination.token"),
        "{e}"
    );
    assert_eq!(a.client.vm(vm.id).expect("vm").state, VmState::Running);
    assert!(holds_nothing(&b.client));
    req.destination.token = Some(b.token.clone());
    let (remote, m) = move_vm(&a.client, vm.id, &req);
    eprintln!(
        "HOSTMIG over TCP: downtime {:?} ms, {} B",
        m.downtime_ms, m.bytes
    );
    assert_same_result(&b.client, remote, &a.client, reference.id, "1000");
}

/// `host:port` of a stream address `tcp:HOST:PORT` (HOST empty: loopback).
fn tcp_target(address: &str) -> String {
    let rest = address.strip_prefix("tcp:").expect("a TCP stream address");
    let (host, port) = rest.rsplit_once(':').expect("HOST:PORT");
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    format!("{host}:{port}")
}

/// Another local user finds an admitted move's stream ports (they are in
/// /proc/net/tcp) and connects first, with garbage or nothing: the destination keeps
/// waiting for the source with the token. A source that never comes is cancelled after
/// `--migration-connect-timeout-s`, and the vGPU's shares are released.
#[test]
fn impostors_on_the_stream_ports_do_not_end_a_move_and_a_source_that_never_comes_is_cancelled() {
    require_kvm!();
    use std::io::Write;
    let b = tcp_daemon(
        "hostmig-impostor",
        &[("VGPUD_MIGRATION_CONNECT_TIMEOUT_S", "4")],
    );
    let ask = vgpu_api::api::IncomingVm {
        vm: gpu_load("rounds=10", 0, 0.2, vgpu_tests::gpus::share(32 * MIB)),
        source: "a test posing as the source".into(),
    };
    let body = serde_json::to_vec(&ask).expect("encode");
    let admitted: vgpu_api::api::IncomingAccepted = b
        .client
        .call("POST", "/v1/migrations/incoming", Some(&body))
        .expect("admitted");
    let t0 = Instant::now();
    let mut targets = vec![tcp_target(&admitted.vmm_address)];
    targets.extend(admitted.vgpu_address.as_deref().map(tcp_target));
    let mut held = Vec::new();
    for t in &targets {
        // One says nothing; one sends garbage and hangs up.
        held.push(std::net::TcpStream::connect(t).expect("connect"));
        let mut s = std::net::TcpStream::connect(t).expect("connect");
        let _ = s.write_all(&[0xa5; 256]);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let m = b.client.migration(admitted.migration).expect("record");
    assert_eq!(m.state, "running", "an impostor ended the move: {m:?}");
    // The VM stream's port still takes connections: the vmm waits for its source.
    assert!(
        std::net::TcpStream::connect(&targets[0]).is_ok(),
        "the vmm stopped listening"
    );
    let done = loop {
        let m = b.client.migration(admitted.migration).expect("record");
        if m.state != "running" {
            break m;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the move was never cancelled: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(done.state, "failed", "{done:?}");
    let why = done.error.clone().unwrap_or_default();
    assert!(why.contains("did not connect within 4 s"), "{why}");
    let start = Instant::now();
    while !holds_nothing(&b.client) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the incoming VM's reservation stayed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let gpu = &b.client.gpus().expect("gpus")[0];
    assert_eq!(gpu.compute_committed, 0.0, "{gpu:?}");
    drop(held);
}

#[test]
fn vgpuctl_moves_a_vm_to_another_daemon_and_says_so() {
    require_kvm!();
    let a = TestDaemon::start("hostmig-cli-a", &gpus());
    let b = TestDaemon::start("hostmig-cli-b", &gpus());
    let vm = a
        .client
        .create_vm(&gpu_load(
            "rounds=800 spin_us=2000",
            0,
            0.2,
            vgpu_tests::gpus::share(32 * MIB),
        ))
        .expect("vm");
    wait_running(&a.client, vm.id);
    let vgpuctl = |mode: &str| {
        std::process::Command::new(vgpu_tests::bins::binary("vgpuctl"))
            .arg("--socket")
            .arg(&a.socket)
            .args(["vm", "migrate", &vm.id.to_string(), "--to"])
            .arg(format!("unix:{}", b.socket.display()))
            .args(["--mode", mode])
            .output()
            .expect("vgpuctl")
    };
    // A mode the CLI does not know never reaches the daemon; the error names the flag.
    let bad = vgpuctl("stop-copy");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--mode"));
    let out = vgpuctl("stop_copy");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("moved VM") && text.contains("downtime"),
        "{text}"
    );
    let moves = a.client.migrations().expect("migrations");
    assert_eq!(
        moves.iter().map(|m| m.mode.as_str()).collect::<Vec<_>>(),
        ["stop_copy"]
    );
    wait_gone(&a.client, vm.id);
    let there = b.client.vms().expect("vms");
    assert_eq!(there.len(), 1, "{there:?}");
    let done = b
        .client
        .wait_vm(there[0].id, Duration::from_secs(120))
        .expect("wait");
    assert_eq!(
        done.state,
        VmState::Exited { code: 0 },
        "{}",
        console(&b.client, there[0].id)
    );
}

/// The memcheck line's checksum.
fn memcheck_checksum(out: &str) -> String {
    out.lines()
        .rev()
        .find(|l| l.starts_with("MEMCHECK OK "))
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("checksum=")))
        .unwrap_or_default()
        .to_string()
}

/// Two oversubscribed memcheck VMs whose allocations (64 MiB each) exceed what the small
/// GPU holds for both (pieces of them are swapped out); one moves to the other daemon
/// and back while it checks its buffers, and ends with the checksum of the one that
/// never moved, every byte intact (memcheck compares each against its pattern).
#[test]
fn an_oversubscribed_vgpu_with_swapped_pieces_moves_and_back_and_loses_no_byte() {
    require_kvm!();
    if on_cuda() {
        eprintln!("sim only: the H200's pool is too large to force swapping here");
        return;
    }
    let args = ["--sim-gpus", "1", "--sim-memory", "96M"];
    let a = TestDaemon::start("hostmig-oversub-a", &args);
    let b = TestDaemon::start("hostmig-oversub-b", &args);
    let oversub = |name: &str| {
        let mut vm = gpu_load("", 0, 0.2, 65 * MIB);
        vm.payload = Some(vgpu_tests::bins::payload("memcheck").display().to_string());
        vm.payload_arg = "buffers=4 size_mib=16 rounds=12 pause_ms=300 seed=5".into();
        vm.name = Some(name.into());
        if let Some(g) = vm.vgpu.as_mut() {
            g.oversubscribe = true;
        }
        vm
    };
    let moved = a.client.create_vm(&oversub("mover")).expect("vm");
    let still = a.client.create_vm(&oversub("still")).expect("reference vm");
    wait_running(&a.client, moved.id);
    wait_running(&a.client, still.id);
    let vgpu = a.client.vm(moved.id).expect("vm").vgpu.expect("vgpu");
    // Both fill their buffers: pieces of the mover's go out before it moves.
    let start = Instant::now();
    loop {
        let s = a.client.vgpu_stats(vgpu).expect("stats");
        if s.swap_out_bytes > 0 && console(&a.client, moved.id).contains("round 1/") {
            eprintln!("HOSTMIG oversubscribed: {s:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "nothing of the mover was swapped out: {s:?}\n{}",
            console(&a.client, moved.id)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (there, m) = move_vm(&a.client, moved.id, &to_socket(&b));
    let host = m.host.expect("host");
    eprintln!(
        "HOSTMIG oversubscribed move out: vGPU {} B",
        host.vgpu_bytes
    );
    assert!(
        host.vgpu_bytes >= 64 * MIB,
        "every byte, swapped ones included: {host:?}"
    );
    wait_gone(&a.client, moved.id);
    let at_b = b.client.vm(there).expect("moved VM");
    let rec = b
        .client
        .vgpus()
        .expect("vgpus")
        .into_iter()
        .find(|v| Some(v.id) == at_b.vgpu)
        .expect("its vGPU is there");
    assert!(rec.oversubscribe, "oversubscribed there too: {rec:?}");
    std::thread::sleep(Duration::from_millis(500));
    let (back, m) = move_vm(&b.client, there, &to_socket(&a));
    eprintln!(
        "HOSTMIG oversubscribed move back: vGPU {} B",
        m.host.as_ref().map_or(0, |h| h.vgpu_bytes)
    );
    wait_gone(&b.client, there);
    let done = a
        .client
        .wait_vm(back, Duration::from_secs(240))
        .expect("wait");
    let out = console(&a.client, back);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(out.contains("MEMCHECK OK buffers=4 rounds=12"), "{out}");
    let r = a
        .client
        .wait_vm(still.id, Duration::from_secs(240))
        .expect("wait");
    let expected = console(&a.client, still.id);
    assert_eq!(r.state, VmState::Exited { code: 0 }, "{expected}");
    assert!(!memcheck_checksum(&out).is_empty(), "{out}");
    assert_eq!(
        memcheck_checksum(&out),
        memcheck_checksum(&expected),
        "moved vs unmoved"
    );
}

#[test]
fn a_vms_module_variable_moves_with_it_and_back() {
    require_kvm!();
    let a = TestDaemon::start("hostvar-a", &gpus());
    let b = TestDaemon::start("hostvar-b", &gpus());
    // Every round reads the variable back and writes the next value (`state=1`).
    let arg = "rounds=3000 n=4096 spin_us=2000 check=100 state=1";
    let vm = gpu_load(arg, 0, 0.2, vgpu_tests::gpus::share(32 * MIB));
    let first = a.client.create_vm(&vm).expect("vm").id;
    wait_running(&a.client, first);
    std::thread::sleep(Duration::from_millis(500));
    let (there, _) = move_vm(&a.client, first, &to_socket(&b));
    wait_gone(&a.client, first);
    std::thread::sleep(Duration::from_millis(500));
    let back = VmMigrateRequest {
        mode: Some("stop_copy".into()),
        ..to_socket(&a)
    };
    let (id, _) = move_vm(&b.client, there, &back);
    assert_eq!(
        a.client.vm(id).expect("vm").state,
        VmState::Running,
        "the guest was still computing during both moves; make it run longer: {}",
        console(&a.client, id)
    );
    let done = a
        .client
        .wait_vm(id, Duration::from_secs(240))
        .expect("wait");
    let out = console(&a.client, id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(out.contains("kept its value through every round"), "{out}");
    assert!(out.contains("GPU-LOAD OK rounds=3000"), "{out}");
}
