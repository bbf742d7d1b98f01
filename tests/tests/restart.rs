//! A vgpud restart, planned (SIGTERM) or `kill -9`, keeps what a user configured and
//! never touches a running guest (docs/api.md, "Restarts"): running VMs and their workers
//! are adopted and compute on with their checksums right, vGPU definitions with their ids
//! and PATCHed shares come back, ids are never reused, and a VM runs on a restored vGPU.
//! What cannot come back (a GPU gone, a storage file gone, a worker that died while no
//! vgpud ran) is listed with the reason; a damaged state file stops the start until the
//! operator sets it aside.

use std::time::{Duration, Instant};

use vgpu_api::api::{StorageAttachment, Vgpu, VgpuCreate, VgpuPatch, VgpuState, VmState};
use vgpu_api::client::Client;
use vgpu_tests::daemon::{
    alive, gpu_load, temp_dir, vgpud_command, vm_on, wait_running, TestDaemon,
};

const MIB: u64 = 1 << 20;

fn vgpu_spec(gpu: Option<u32>, memory: u64, compute: f64) -> VgpuCreate {
    VgpuCreate {
        gpu,
        ..VgpuCreate::new(memory, compute)
    }
}

/// What a restart must keep of a vGPU: everything but its state, VM and worker.
fn definition(v: &Vgpu) -> Vgpu {
    Vgpu {
        state: VgpuState::Ready,
        vm: None,
        worker_pid: None,
        ..v.clone()
    }
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

/// A short gpu-load run on restored vGPU `vgpu` finishes with every checksum right.
fn runs_on(c: &Client, vgpu: u32) {
    let vm = c
        .create_vm(&vm_on("gpu-load", "rounds=20 spin_us=500 check=5", vgpu))
        .expect("a VM on a restored vGPU");
    let done = c.wait_vm(vm.id, Duration::from_secs(240)).expect("wait");
    let out = console(c, vm.id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
    assert!(out.contains("GPU-LOAD OK rounds=20"), "{out}");
}

/// The vGPUs a test creates before the restart: on GPU 0 with a share group and queues,
/// oversubscribed on GPU 1 with a storage namespace, placed automatically; then the
/// first one's shares and priority PATCHed.
fn create_definitions(d: &TestDaemon) -> Vec<Vgpu> {
    let c = &d.client;
    // Outside the state directory (0700, vgpud's): the worker opens it as its own user.
    let ns = vgpu_tests::daemon::temp_dir("restart-files").join("ns.bin");
    std::fs::write(&ns, vec![7u8; 4096]).expect("namespace file");
    let a = c
        .create_vgpu(&VgpuCreate {
            queues: 2,
            priority: 1,
            share_group: Some("team-a".into()),
            ..vgpu_spec(Some(0), 256 * MIB, 0.3)
        })
        .expect("vGPU a");
    let b = c
        .create_vgpu(&VgpuCreate {
            copy_share: Some(0.1),
            oversubscribe: true,
            storage: vec![StorageAttachment {
                namespace: 1,
                path: ns.display().to_string(),
                read_only: true,
            }],
            ..vgpu_spec(Some(1), 128 * MIB, 0.2)
        })
        .expect("vGPU b");
    let auto = c
        .create_vgpu(&vgpu_spec(None, 64 * MIB, 0.1))
        .expect("vGPU placed automatically");
    let a = c
        .patch_vgpu(
            a.id,
            &VgpuPatch {
                compute_share: Some(0.5),
                copy_share: Some(0.4),
                priority: Some(3),
                name: None,
                labels: None,
                kernel_deadline_ms: None,
            },
        )
        .expect("patch");
    assert_eq!((a.compute_share, a.copy_share, a.priority), (0.5, 0.4, 3));
    vec![a, b, auto]
}

/// The definitions came back ready with the same ids and specs, their workers adopted.
fn check_restored(c: &Client, before: &[Vgpu]) {
    for v in before {
        let now = c.vgpu(v.id).expect("restored vGPU");
        assert_eq!(definition(&now), definition(v), "vGPU {} changed", v.id);
        assert_eq!(now.state, VgpuState::Ready, "vGPU {}", v.id);
        let pid = now.worker_pid.expect("a worker");
        assert!(alive(pid), "vGPU {}'s worker is not running", v.id);
        assert_eq!(
            Some(pid),
            v.worker_pid,
            "vGPU {}'s worker was not adopted",
            v.id
        );
    }
}

/// VM `vm`'s console file, read directly (also while no vgpud runs).
fn console_file(d: &TestDaemon, vm: u32) -> String {
    std::fs::read_to_string(d.dir.join(format!("vm-{vm}.log"))).unwrap_or_default()
}

/// The rounds gpu-load verified so far (each `ok` line compares the device's checksum with
/// the one the guest expects).
fn verified(out: &str) -> usize {
    out.matches(" ok checksum=").count()
}

#[test]
fn kill9_restart_keeps_vgpus_patched_shares_and_running_vms() {
    let mut d = TestDaemon::start("restart-kill9", &["--sim-gpus", "2", "--sim-memory", "1G"]);
    let before = create_definitions(&d);
    let kvm = vgpu_tests::bins::have_kvm();
    // With KVM: a VM on a vGPU of its own (created inline) and one on a vGPU created first.
    let mut vms = Vec::new();
    if kvm {
        let c = &d.client;
        let inline = c
            .create_vm(&gpu_load(
                "rounds=100000 spin_us=2000 check=50",
                1,
                0.2,
                64 * MIB,
            ))
            .expect("vm with an inline vGPU");
        let mine = c
            .create_vgpu(&vgpu_spec(Some(0), 64 * MIB, 0.1))
            .expect("vGPU for a VM");
        let on_mine = c
            .create_vm(&vm_on(
                "gpu-load",
                "rounds=100000 spin_us=2000 check=50",
                mine.id,
            ))
            .expect("vm on a created vGPU");
        wait_running(c, inline.id);
        wait_running(c, on_mine.id);
        let procs = |vm: &vgpu_api::api::Vm| {
            let g = vm.vgpu.expect("a vGPU");
            (
                c.vm(vm.id).expect("vm").pid.expect("vmm"),
                c.vgpu(g).expect("vgpu").worker_pid.expect("worker"),
            )
        };
        vms = vec![
            (inline.clone(), None, procs(&inline)),
            (on_mine.clone(), Some(mine), procs(&on_mine)),
        ];
    } else {
        eprintln!("SKIPPED (VM part): /dev/kvm is not available on this machine");
    }
    let gpus_before = d.client.gpus().expect("gpus");

    // kill -9, and start again at once: every process is adopted.
    let kids = d.kill9();
    assert!(kids.iter().all(|k| alive(*k)), "children died with vgpud");
    d.restart(None);
    let c = &d.client;
    check_restored(c, &before);

    let mut max_id = before.iter().map(|v| v.id).max().expect("ids");
    for (vm, mine, (vmm, worker)) in &vms {
        let now = c.vm(vm.id).expect("the VM is kept");
        assert_eq!(now.state, VmState::Running, "{now:?}");
        assert_eq!(now.pid, Some(*vmm), "the same vmm");
        assert_eq!(
            (
                &now.payload,
                &now.payload_arg,
                now.memory_bytes,
                now.vcpus,
                now.vgpu
            ),
            (
                &vm.payload,
                &vm.payload_arg,
                vm.memory_bytes,
                vm.vcpus,
                vm.vgpu
            ),
            "the VM's spec"
        );
        let g = vm.vgpu.expect("a vGPU");
        max_id = max_id.max(g);
        let v = c.vgpu(g).expect("its vGPU");
        assert_eq!((v.state.clone(), v.vm), (VgpuState::Attached, Some(vm.id)));
        assert_eq!(v.worker_pid, Some(*worker), "the same worker");
        if let Some(m) = mine {
            assert_eq!(definition(&v), definition(m));
        }
    }
    // The same GPU commitments.
    let gpus = c.gpus().expect("gpus");
    for (now, was) in gpus.iter().zip(&gpus_before) {
        assert!(
            (now.compute_committed - was.compute_committed).abs() < 1e-9,
            "{gpus:?}"
        );
        assert_eq!(now.memory_committed_bytes, was.memory_committed_bytes);
    }

    // A new vGPU gets a fresh id, never one handed out before.
    let fresh = c
        .create_vgpu(&vgpu_spec(Some(1), 32 * MIB, 0.05))
        .expect("new vGPU");
    assert_eq!(fresh.id, max_id + 1, "ids are not reused");

    if kvm {
        // A VM runs on a restored vGPU.
        runs_on(c, before[0].id);
        // The new vgpud stops the adopted VMs; an inline vGPU goes with its VM, a created
        // one stays as a record.
        for (vm, mine, (vmm, worker)) in &vms {
            c.delete_vm(vm.id).expect("delete the adopted VM");
            assert!(!alive(*vmm) && !alive(*worker), "processes left behind");
            assert_eq!(c.vm(vm.id).expect_err("gone").status(), Some(404));
            let g = vm.vgpu.expect("vgpu");
            match mine {
                None => assert_eq!(c.vgpu(g).expect_err("went with its VM").status(), Some(404)),
                Some(_) => {
                    let v = c.vgpu(g).expect("still there");
                    assert_eq!(v.state, VgpuState::Released);
                }
            }
        }
    }
}

#[test]
fn graceful_restart_keeps_them_too() {
    let mut d = TestDaemon::start("restart-term", &["--sim-gpus", "2", "--sim-memory", "1G"]);
    let before = create_definitions(&d);
    let kvm = vgpu_tests::bins::have_kvm();
    let vm = kvm.then(|| {
        let vm = d
            .client
            .create_vm(&vm_on(
                "gpu-load",
                "rounds=100000 spin_us=2000 check=50",
                before[2].id,
            ))
            .expect("vm");
        wait_running(&d.client, vm.id);
        wait_until(
            "the guest writes its console",
            Duration::from_secs(60),
            || console(&d.client, vm.id).contains("gpu-load:"),
        );
        let vmm = d.client.vm(vm.id).expect("vm").pid.expect("vmm");
        (vm, vmm)
    });
    // Deleted before the stop: stays deleted.
    let gone = d
        .client
        .create_vgpu(&vgpu_spec(Some(1), 32 * MIB, 0.05))
        .expect("vGPU");
    d.client.delete_vgpu(gone.id).expect("delete");
    assert!(d.stop(), "vgpud did not stop on SIGTERM");
    assert!(d.dir.join("vgpud-state.json").is_file(), "no state file");
    d.restart(None);
    let c = &d.client;
    let free = if kvm { &before[..2] } else { &before[..] };
    check_restored(c, free);
    assert_eq!(c.vgpu(gone.id).expect_err("deleted").status(), Some(404));
    if let Some((vm, vmm)) = vm {
        let now = c.vm(vm.id).expect("the VM is kept");
        assert_eq!((now.state.clone(), now.pid), (VmState::Running, Some(vmm)));
        assert!(now.uptime_ms > 0, "{now:?}");
        let v = c.vgpu(before[2].id).expect("its vGPU");
        assert_eq!(
            (v.state, v.worker_pid),
            (VgpuState::Attached, before[2].worker_pid)
        );
        // Its console goes on in the same file.
        let seen = verified(&console(c, vm.id));
        wait_until(
            "the guest verifies more rounds",
            Duration::from_secs(120),
            || verified(&console(c, vm.id)) > seen,
        );
        c.delete_vm(vm.id).expect("stop the adopted VM");
        assert!(!alive(vmm));
    }
    let fresh = c
        .create_vgpu(&vgpu_spec(Some(0), 32 * MIB, 0.05))
        .expect("new vGPU");
    assert!(
        fresh.id > gone.id,
        "ids are not reused: {} after {}",
        fresh.id,
        gone.id
    );
}

#[test]
fn a_vm_computes_on_across_kill9_and_graceful_restarts_of_vgpud() {
    if !vgpu_tests::bins::have_kvm() {
        eprintln!("SKIPPED: /dev/kvm is not available on this machine");
        return;
    }
    let mut d = TestDaemon::start("restart-adopt", &["--sim-gpus", "1", "--sim-memory", "1G"]);
    let vm = d
        .client
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=2000 check=20",
            0,
            0.5,
            64 * MIB,
        ))
        .expect("vm");
    wait_running(&d.client, vm.id);
    let g = vm.vgpu.expect("inline vGPU");
    let vmm = d.client.vm(vm.id).expect("vm").pid.expect("vmm");
    let worker = d.client.vgpu(g).expect("vgpu").worker_pid.expect("worker");
    wait_until(
        "the guest verifies a round",
        Duration::from_secs(120),
        || verified(&console_file(&d, vm.id)) >= 1,
    );
    for how in ["kill -9", "SIGTERM"] {
        if how == "kill -9" {
            d.kill9();
        } else {
            assert!(d.stop(), "vgpud did not stop on SIGTERM");
        }
        assert!(
            alive(vmm) && alive(worker),
            "{how} of vgpud took the VM down"
        );
        // No vgpud: the guest computes on, its rounds still verified.
        let seen = verified(&console_file(&d, vm.id));
        wait_until(
            "the guest verifies rounds without vgpud",
            Duration::from_secs(120),
            || verified(&console_file(&d, vm.id)) > seen,
        );
        d.restart(None);
        let c = &d.client;
        let now = c.vm(vm.id).expect("vm");
        assert_eq!(
            (now.state.clone(), now.pid),
            (VmState::Running, Some(vmm)),
            "after {how}"
        );
        let v = c.vgpu(g).expect("vgpu");
        assert_eq!(
            (v.state.clone(), v.worker_pid),
            (VgpuState::Attached, Some(worker)),
            "after {how}"
        );
        // Its stats come from the running worker again, and it holds its share.
        wait_until("live stats", Duration::from_secs(20), || {
            c.vgpu_stats(g).is_ok_and(|s| s.live && s.requests > 0)
        });
        let gpu = &c.gpus().expect("gpus")[0];
        assert!((gpu.compute_committed - 0.5).abs() < 1e-9, "{gpu:?}");
        assert_eq!(gpu.vgpus, vec![g]);
        // Scheduled again: more rounds verified.
        let seen = verified(&console(c, vm.id));
        wait_until(
            "the guest verifies rounds",
            Duration::from_secs(120),
            || verified(&console(c, vm.id)) > seen,
        );
    }
    let out = console(&d.client, vm.id);
    assert!(!out.contains("FAIL"), "{out}");
    // The new vgpud stops it and frees its GPU.
    d.client.delete_vm(vm.id).expect("stop the adopted VM");
    assert!(!alive(vmm) && !alive(worker), "processes left behind");
    assert_eq!(d.client.gpus().expect("gpus")[0].compute_committed, 0.0);
    assert!(
        d.log_text().contains("worker adopted") && d.log_text().contains("vmm adopted"),
        "{}",
        d.log_text()
    );
}

#[test]
fn a_worker_that_died_while_vgpud_was_down_fails_its_vm_with_the_reason() {
    if !vgpu_tests::bins::have_kvm() {
        eprintln!("SKIPPED: /dev/kvm is not available on this machine");
        return;
    }
    let mut d = TestDaemon::start("restart-lost", &["--sim-gpus", "1", "--sim-memory", "1G"]);
    let c = &d.client;
    let vm = c
        .create_vm(&gpu_load(
            "rounds=100000 spin_us=2000 check=50",
            0,
            0.5,
            64 * MIB,
        ))
        .expect("vm");
    wait_running(c, vm.id);
    let g = vm.vgpu.expect("inline vGPU");
    let vmm = c.vm(vm.id).expect("vm").pid.expect("vmm");
    let worker = c.vgpu(g).expect("vgpu").worker_pid.expect("worker");
    d.kill9();
    // The vmm is held still (a guest whose GPU went away may end by itself meanwhile, and
    // then the VM reads as ended with its vmm instead), and its worker is killed.
    let signal = |pid: u32, sig: i32| {
        let pid = libc::pid_t::try_from(pid).expect("pid");
        // SAFETY: kill(2) on a pid this test just read from the API.
        unsafe { libc::kill(pid, sig) };
    };
    signal(vmm, libc::SIGSTOP);
    signal(worker, libc::SIGKILL);
    wait_until("the worker gone", Duration::from_secs(5), || !alive(worker));
    d.restart(None);
    let c = &d.client;
    let now = c.vm(vm.id).expect("the VM record is kept");
    match &now.state {
        VmState::Failed { reason } => assert!(
            reason.contains(&format!("vGPU {g}")) && reason.contains("while vgpud was down"),
            "{reason}"
        ),
        other => panic!("VM {} is {other:?}", vm.id),
    }
    assert_eq!(now.pid, None);
    wait_until("its vmm stopped", Duration::from_secs(5), || !alive(vmm));
    match c.vgpu(g).expect("its vGPU").state {
        VgpuState::Failed { reason } => {
            assert!(
                reason.contains("worker exited while vgpud was down"),
                "{reason}"
            )
        }
        other => panic!("vGPU {g} is {other:?}"),
    }
    assert_eq!(c.gpus().expect("gpus")[0].compute_committed, 0.0);
}

#[test]
fn what_cannot_come_back_is_listed_with_the_reason() {
    let mut d = TestDaemon::start(
        "restart-unusable",
        &["--sim-gpus", "2", "--sim-memory", "1G"],
    );
    let c = &d.client;
    let files = vgpu_tests::daemon::temp_dir("restart-unusable-files");
    let ns = files.join("ns.bin");
    std::fs::write(&ns, vec![1u8; 4096]).expect("namespace file");
    let on_gpu1 = c
        .create_vgpu(&vgpu_spec(Some(1), 64 * MIB, 0.2))
        .expect("vGPU on GPU 1");
    let with_file = c
        .create_vgpu(&VgpuCreate {
            storage: vec![StorageAttachment {
                namespace: 3,
                path: ns.display().to_string(),
                read_only: true,
            }],
            ..vgpu_spec(Some(0), 64 * MIB, 0.2)
        })
        .expect("vGPU with storage");
    let plain = c
        .create_vgpu(&vgpu_spec(Some(0), 64 * MIB, 0.2))
        .expect("vGPU");
    assert!(d.stop());

    // One GPU fewer, the storage file gone: both stay listed as failed with why.
    std::fs::rename(&ns, files.join("ns.moved")).expect("move the file away");
    d.restart(Some(&["--sim-gpus", "1", "--sim-memory", "1G"]));
    let c = &d.client;
    let failed = |id: u32| match c.vgpu(id).expect("still listed").state {
        VgpuState::Failed { reason } => reason,
        other => panic!("vGPU {id} is {other:?}"),
    };
    let why = failed(on_gpu1.id);
    assert!(
        why.contains("not restored") && why.contains("no GPU 1"),
        "{why}"
    );
    let why = failed(with_file.id);
    assert!(
        why.contains("ns.bin") && why.contains("No such file"),
        "{why}"
    );
    assert_eq!(c.vgpu(plain.id).expect("plain").state, VgpuState::Ready);
    assert!(
        d.log_text().contains("vGPU not restored"),
        "the failure is logged"
    );
    // They hold nothing.
    assert!((c.gpus().expect("gpus")[0].compute_committed - 0.2).abs() < 1e-9);

    // Fixed (the GPU and the file are back): the next start brings them back.
    assert!(d.stop());
    std::fs::rename(files.join("ns.moved"), &ns).expect("move the file back");
    d.restart(Some(&["--sim-gpus", "2", "--sim-memory", "1G"]));
    let c = &d.client;
    for v in [&on_gpu1, &with_file, &plain] {
        let now = c.vgpu(v.id).expect("restored");
        assert_eq!(now.state, VgpuState::Ready, "vGPU {}", v.id);
        assert_eq!(definition(&now), definition(v));
    }
    // Or deleted for good.
    c.delete_vgpu(on_gpu1.id).expect("delete");
    assert!(d.stop());
    d.restart(None);
    assert_eq!(
        d.client.vgpu(on_gpu1.id).expect_err("deleted").status(),
        Some(404)
    );
}

#[test]
fn a_damaged_state_file_stops_the_start_until_set_aside() {
    let dir = temp_dir("restart-damaged");
    let state = dir.join("vgpud-state.json");
    let sock = dir.join("vgpud.sock").display().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec!["--socket", sock.as_str(), "--sim-gpus", "1"];
        args.extend_from_slice(extra);
        vgpud_command(&args)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("vgpud")
    };
    for (content, says) in [
        (&b"{\"version\": 1, \"next_vgpu\": "[..], "damaged"),
        (b"{\"version\": 99}", "format version 99"),
    ] {
        std::fs::write(&state, content).expect("state file");
        let out = run(&[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started on a bad state file: {err}");
        assert!(
            err.contains(says)
                && err.contains(&state.display().to_string())
                && err.contains("move")
                && err.contains("--discard-state"),
            "{err}"
        );
        // Nothing was changed: the file is as it was.
        assert_eq!(std::fs::read(&state).expect("kept"), content);
    }
    // --discard-state sets it aside (not deleted) and starts fresh.
    let mut d = TestDaemon::start_in(&dir, &["--sim-gpus", "1", "--discard-state"]);
    assert!(d.client.vgpus().expect("vgpus").is_empty());
    let aside: Vec<String> = vgpu_tests::daemon::files_in(&dir)
        .into_iter()
        .filter(|f| f.starts_with("vgpud-state.json.discarded-"))
        .collect();
    assert_eq!(aside.len(), 1, "set aside: {aside:?}");
    assert!(d.stop());
}

#[test]
fn a_change_that_cannot_be_saved_is_answered_with_an_error_and_saved_later() {
    let mut d = TestDaemon::start(
        "restart-unsaved",
        &["--sim-gpus", "1", "--sim-memory", "512M"],
    );
    let state = d.dir.join("vgpud-state.json");
    // The state file's path turns into a non-empty directory: the atomic rename fails.
    let _ = std::fs::remove_file(&state);
    std::fs::create_dir_all(state.join("blocker")).expect("mkdir");
    let e = d
        .client
        .create_vgpu(&vgpu_spec(Some(0), 64 * MIB, 0.25))
        .expect_err("the state cannot be saved");
    assert_eq!(e.status(), Some(500), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("was created and is in effect now, but it is not saved"),
        "{msg}"
    );
    assert!(msg.contains("state_file"), "{msg}");
    // In effect: listed and usable.
    let listed = d.client.vgpus().expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    let id = listed[0].id;
    // The directory is fixed; the next change saves everything, the earlier one included.
    std::fs::remove_dir_all(&state).expect("rmdir");
    d.client
        .patch_vgpu(
            id,
            &VgpuPatch {
                compute_share: Some(0.5),
                copy_share: None,
                priority: None,
                name: None,
                labels: None,
                kernel_deadline_ms: None,
            },
        )
        .expect("patch saves");
    assert!(state.is_file(), "saved");
    d.kill9();
    d.restart(None);
    let back = d.client.vgpu(id).expect("came back");
    assert_eq!(back.compute_share, 0.5);
}
