//! A VM's life with a vGPU workload, `kill -9` of a vmm, a crashed worker.

use super::*;

#[test]
fn vm_lifecycle_with_a_vgpu_workload() {
    require_kvm!();
    let spec = spec();
    let d = TestDaemon::start("lifecycle", &["--sim-gpus", "1", "--sim-memory", "2G"]);
    let c = &d.client;
    // A standalone vGPU, then a VM on it.
    let v = c
        .create_vgpu(&VgpuCreate {
            gpu: Some(0),
            ..VgpuCreate::new(256 << 20, 0.5)
        })
        .expect("vgpu");
    let mut req = gpu_load("rounds=150 spin_us=5000 check=10", 0, 0.0, 0);
    req.vgpu = None;
    req.vgpu_id = Some(v.id);
    let vm = call(
        c,
        &spec,
        "POST",
        "/v1/vms",
        Some(serde_json::to_value(&req).expect("json")),
        201,
        "Vm",
    );
    let id = u32::try_from(vm["id"].as_u64().expect("id")).expect("u32");
    wait_running(c, id);
    call(c, &spec, "GET", &format!("/v1/vms/{id}"), None, 200, "Vm");
    assert_eq!(c.vgpu(v.id).expect("vgpu").state, VgpuState::Attached);
    // A second VM cannot take the same vGPU.
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        serde_json::to_string(&req).expect("json").as_bytes(),
        409,
        Some("vgpu_id"),
    );
    // Nor can it be deleted under the VM.
    refused(
        c,
        &spec,
        "DELETE",
        &format!("/v1/vgpus/{}", v.id),
        b"",
        409,
        Some("id"),
    );

    // Stats while it runs: the worker reports requests, kernels, memory; utilization > 0.
    let start = Instant::now();
    let stats = loop {
        let s = call(
            c,
            &spec,
            "GET",
            &format!("/v1/vgpus/{}/stats", v.id),
            None,
            200,
            "VgpuStats",
        );
        if s["kernels"].as_u64() > Some(10)
            && s["window_ms"].as_u64() > Some(200)
            && s["compute_utilization"].as_f64() > Some(0.0)
        {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no progress in the stats: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(stats["live"], true);
    assert!(stats["memory_used_bytes"].as_u64() > Some(0), "{stats}");
    assert_eq!(stats["memory_used_bytes"], stats["memory_resident_bytes"]);
    // Its guest memory (the VM's, all of it in the memory table) is charged to the vGPU.
    assert_eq!(
        stats["pinned_host_bytes"],
        json!(req.memory_bytes),
        "{stats}"
    );
    assert_eq!(stats["errors"], 0);
    let u = stats["compute_utilization"].as_f64().unwrap_or(0.0);
    assert!(u > 0.05 && u < 1.5, "compute utilization {u}");
    let m = c.metrics().expect("metrics");
    assert!(
        m.contains(&format!("vgpud_vgpu_live{{vgpu=\"{}\",gpu=\"0\"}} 1", v.id)),
        "{m}"
    );

    // It finishes by itself and verified every checksum.
    let vm = c.wait_vm(id, Duration::from_secs(120)).expect("wait");
    let out = console(c, id);
    assert_eq!(vm.state, VmState::Exited { code: 0 }, "{out}");
    assert!(out.contains("GPU-LOAD OK rounds=150"), "{out}");
    assert!(out.contains("round 150/150 ok"), "{out}");
    let start = Instant::now();
    while c.vgpu(v.id).expect("vgpu").state != VgpuState::Released {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "vGPU not released: {:?}",
            c.vgpu(v.id)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let g = &c.gpus().expect("gpus")[0];
    assert_eq!(
        (g.compute_committed, g.memory_committed_bytes),
        (0.0, 0),
        "{g:?}"
    );
    let s = c.vgpu_stats(v.id).expect("stats after the end");
    assert!(!s.live && s.kernels > 300, "{s:?}");
    // A released vGPU serves no second VM.
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        serde_json::to_string(&req).expect("json").as_bytes(),
        409,
        Some("vgpu_id"),
    );
    refused(
        c,
        &spec,
        "PATCH",
        &format!("/v1/vgpus/{}", v.id),
        br#"{"priority": 1}"#,
        409,
        Some("id"),
    );

    // One call launches a VM with its own vGPU; DELETE stops it (143) and removes both.
    let vm2 = c
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=2000 check=100",
            0,
            0.9,
            512 << 20,
        ))
        .expect("vm2");
    wait_running(c, vm2.id);
    let g2 = vm2.vgpu.expect("inline vgpu");
    let worker = c.vgpu(g2).expect("vgpu").worker_pid.expect("worker");
    let vmm = c.vm(vm2.id).expect("vm").pid.expect("vmm");
    // Its worker maps at most the VM's memory, and charges what the VM's table maps.
    let args = std::fs::read(format!("/proc/{worker}/cmdline")).expect("cmdline");
    let bound = format!("--max-guest-memory\0{}\0", 64u64 << 20);
    assert!(
        args.windows(bound.len()).any(|w| w == bound.as_bytes()),
        "{}",
        String::from_utf8_lossy(&args)
    );
    let start = Instant::now();
    while c.vgpu_stats(g2).expect("stats").pinned_host_bytes != 64 << 20 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            c.vgpu_stats(g2)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = std::process::Command::new(vgpu_tests::bins::binary("vgpuctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["vgpu", "stats", &g2.to_string()])
        .output()
        .expect("vgpuctl");
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains("PINNED HOST") && out.contains("64.0 MiB"),
        "{out}"
    );
    assert_eq!(c.gpus().expect("gpus")[0].compute_committed, 0.9);
    c.delete_vm(vm2.id).expect("delete");
    assert!(!alive(vmm) && !alive(worker), "processes left behind");
    assert_eq!(c.vm(vm2.id).expect_err("gone").status(), Some(404));
    assert_eq!(c.vgpu(g2).expect_err("gone").status(), Some(404));
    assert_eq!(c.gpus().expect("gpus")[0].compute_committed, 0.0);

    // Deleting the finished VM and its vGPU leaves only the daemon's own files.
    c.delete_vm(id).expect("delete vm");
    c.delete_vgpu(v.id).expect("delete vgpu");
    // The background saver may be between writing the state file's temporary copy and
    // renaming it (a save kicked by a process exit): wait for that one save to finish.
    let want = ["vgpud-state.json", "vgpud.lock", "vgpud.log", "vgpud.sock"];
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = files_in(&d.dir);
    left.sort();
    while left != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = files_in(&d.dir);
        left.sort();
    }
    assert_eq!(left, want, "files left behind");
}

#[test]
fn kill9_of_a_vmm_frees_its_vgpu_within_a_second_and_the_neighbour_keeps_verifying() {
    require_kvm!();
    let d = TestDaemon::start("kill9", &["--sim-gpus", "1", "--sim-memory", "2G"]);
    let c = &d.client;
    let neighbour = c
        .create_vm(&gpu_load(
            "rounds=400 spin_us=5000 check=20",
            0,
            0.4,
            256 << 20,
        ))
        .expect("neighbour");
    let victim = c
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=5000 check=50",
            0,
            0.5,
            512 << 20,
        ))
        .expect("victim");
    wait_running(c, neighbour.id);
    wait_running(c, victim.id);
    let vg = victim.vgpu.expect("victim vgpu");
    let worker = c.vgpu(vg).expect("vgpu").worker_pid.expect("worker");
    // Let both make progress.
    let start = Instant::now();
    while c.vgpu_stats(vg).expect("stats").kernels < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "victim makes no progress"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let g = &c.gpus().expect("gpus")[0];
    assert!(
        (g.compute_committed - 0.9).abs() < 1e-9 && g.memory_committed_bytes == 768 << 20,
        "{g:?}"
    );

    let pid = c.vm(victim.id).expect("vm").pid.expect("vmm pid");
    let t0 = Instant::now();
    let pid = libc::pid_t::try_from(pid).expect("pid");
    // SAFETY: kill(2) with a pid the daemon reported for a process it started.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill -9 {pid}");
    loop {
        let g = &c.gpus().expect("gpus")[0];
        if (g.compute_committed - 0.4).abs() < 1e-9 && g.memory_committed_bytes == 256 << 20 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "shares not freed within 1 s: {g:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let freed = t0.elapsed();
    eprintln!(
        "kill -9 of the vmm: vGPU shares free after {} ms",
        freed.as_millis()
    );
    assert!(!alive(worker), "the victim's worker still runs");
    // The vmm's exit is reaped independently of the worker's; both within the second.
    while c.vm(victim.id).expect("vm").state.is_live() {
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the victim's death not seen within 1 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    match c.vm(victim.id).expect("vm").state {
        VmState::Failed { reason } => assert!(reason.contains("signal 9"), "{reason}"),
        other => panic!("victim state {other:?}"),
    }
    assert_eq!(c.vgpu(vg).expect("vgpu").state, VgpuState::Released);
    // The freed share is admissible again at once.
    let again = c
        .create_vgpu(&VgpuCreate {
            gpu: Some(0),
            ..VgpuCreate::new(512 << 20, 0.6)
        })
        .expect("the freed share is free");
    c.delete_vgpu(again.id).expect("delete");

    // The neighbour never noticed: it runs to its end and every checksum matched.
    assert_eq!(c.vm(neighbour.id).expect("vm").state, VmState::Running);
    let done = c
        .wait_vm(neighbour.id, Duration::from_secs(180))
        .expect("wait");
    let out = console(c, neighbour.id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(out.contains("GPU-LOAD OK rounds=400"), "{out}");
    assert_eq!(
        c.vgpu_stats(done.vgpu.expect("vgpu"))
            .expect("stats")
            .errors,
        0
    );
}

#[test]
fn a_crashed_worker_is_reported_not_respawned() {
    require_kvm!();
    let mut d = TestDaemon::start("crash", &["--sim-gpus", "1", "--sim-memory", "1G"]);
    let c = d.client.clone();
    let vm = c
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=5000 check=50",
            0,
            0.5,
            128 << 20,
        ))
        .expect("vm");
    wait_running(&c, vm.id);
    let g = vm.vgpu.expect("vgpu");
    let worker = c.vgpu(g).expect("vgpu").worker_pid.expect("worker");
    let vmm = c.vm(vm.id).expect("vm").pid.expect("vmm");
    // SAFETY: kill(2) with a pid the daemon reported for a process it started.
    unsafe { libc::kill(libc::pid_t::try_from(worker).expect("pid"), libc::SIGKILL) };
    let t0 = Instant::now();
    let reason = loop {
        if let VgpuState::Failed { reason } = c.vgpu(g).expect("vgpu").state {
            break reason;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "crash not reported within 1 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(reason.contains("signal 9"), "{reason}");
    let v = c.wait_vm(vm.id, Duration::from_secs(5)).expect("vm");
    match &v.state {
        VmState::Failed { reason } => assert!(reason.contains(&format!("vGPU {g}")), "{reason}"),
        other => panic!("VM state {other:?}"),
    }
    // The daemon stops the vmm of a VM whose vGPU died.
    while c.vm(vm.id).expect("vm").pid.is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the VM of a crashed vGPU still runs"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!alive(vmm), "the VM of a crashed vGPU still runs");
    let after = c.vgpu(g).expect("vgpu");
    assert_eq!(after.worker_pid, None, "the worker was respawned");
    assert_eq!(c.gpus().expect("gpus")[0].compute_committed, 0.0);

    // Shutting the daemon down with a VM running leaves the VM and its worker running
    // (the next vgpud adopts them: restart.rs) and removes the API socket.
    let busy = c
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=5000 check=50",
            0,
            0.5,
            128 << 20,
        ))
        .expect("vm");
    wait_running(&c, busy.id);
    let kids = children(d.pid());
    assert!(
        kids.len() >= 2,
        "vmm and worker are vgpud's children: {kids:?}"
    );
    assert!(d.stop(), "vgpud did not stop on SIGTERM");
    for k in &kids {
        assert!(alive(*k), "child {k} did not outlive vgpud");
    }
    assert!(!d.socket.exists(), "the API socket is left behind");
    vgpu_tests::daemon::kill_leftovers(&d.dir);
    for k in kids {
        assert!(!alive(k), "child {k} still runs");
    }
}
