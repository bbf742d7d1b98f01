//! A vgpud restart, planned (SIGTERM) or `kill -9`, keeps what a user configured (issue
//! 10, docs/hostile.md "What a vgpud restart keeps and loses"): vGPU definitions with
//! their ids and PATCHed shares come back ready, VM records come back as stopped by the
//! restart, ids are never reused, and a VM runs on a restored vGPU. What cannot come back
//! (a GPU gone, a storage file gone) is listed with the reason; a damaged state file stops
//! the start until the operator sets it aside.

use std::time::{Duration, Instant};

use vgpu_api::api::{StorageAttachment, Vgpu, VgpuCreate, VgpuPatch, VgpuState, VmCreate, VmState};
use vgpu_api::client::Client;
use vgpu_tests::daemon::{alive, gpu_load, temp_dir, vgpud_command, wait_running, TestDaemon};

const MIB: u64 = 1 << 20;

fn vgpu_spec(gpu: Option<u32>, memory: u64, compute: f64) -> VgpuCreate {
    VgpuCreate {
        gpu,
        memory_bytes: memory,
        compute_share: compute,
        copy_share: None,
        priority: 0,
        oversubscribe: false,
        share_group: None,
        queues: 1,
        storage: Vec::new(),
        name: None,
        labels: Default::default(),
    }
}

/// A VM running `payload` on the existing vGPU `vgpu`.
fn vm_on(payload: &str, arg: &str, vgpu: u32) -> VmCreate {
    VmCreate {
        payload: Some(vgpu_tests::bins::payload(payload).display().to_string()),
        payload_arg: arg.into(),
        kernel: None,
        initrd: None,
        cmdline: None,
        memory_bytes: 64 << 20,
        vcpus: 1,
        vgpu_id: Some(vgpu),
        vgpu: None,
        name: None,
        labels: Default::default(),
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
    let ns = d.dir.join("ns.bin");
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
            },
        )
        .expect("patch");
    assert_eq!((a.compute_share, a.copy_share, a.priority), (0.5, 0.4, 3));
    vec![a, b, auto]
}

/// The definitions came back ready with the same ids and specs, each with a new worker.
fn check_restored(c: &Client, before: &[Vgpu]) {
    for v in before {
        let now = c.vgpu(v.id).expect("restored vGPU");
        assert_eq!(definition(&now), definition(v), "vGPU {} changed", v.id);
        assert_eq!(now.state, VgpuState::Ready, "vGPU {}", v.id);
        let pid = now.worker_pid.expect("a worker");
        assert!(alive(pid), "vGPU {}'s worker is not running", v.id);
        assert_ne!(Some(pid), v.worker_pid, "vGPU {} kept an old worker", v.id);
    }
}

#[test]
fn kill9_restart_keeps_vgpus_patched_shares_and_vm_records() {
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
        vms = vec![(inline, None), (on_mine, Some(mine))];
    } else {
        eprintln!("SKIPPED (VM part): /dev/kvm is not available on this machine");
    }
    let gpus_before = d.client.gpus().expect("gpus");

    // kill -9, and start again at once: the restore waits for the old workers to let go
    // of their sockets.
    let kids = d.kill9();
    d.restart(None);
    let c = &d.client;
    check_restored(c, &before);
    wait_until(
        "the old daemon's children gone",
        Duration::from_secs(10),
        || kids.iter().all(|k| !alive(*k)),
    );

    let mut max_id = before.iter().map(|v| v.id).max().expect("ids");
    for (vm, mine) in &vms {
        let now = c.vm(vm.id).expect("the VM record is kept");
        match &now.state {
            VmState::Failed { reason } => {
                assert!(reason.contains("vgpud restarted"), "{reason}")
            }
            other => panic!("VM {} is {other:?}, not stopped by the restart", vm.id),
        }
        assert_eq!(now.pid, None);
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
        match mine {
            // Created inline: it went with its VM (released, holds nothing).
            None => {
                assert_eq!(v.state, VgpuState::Released);
                assert!(v.owned_by_vm && v.vm == Some(vm.id), "{v:?}");
                assert_eq!(v.worker_pid, None);
            }
            // Created by the user: it comes back ready for a new VM.
            Some(m) => {
                assert_eq!(definition(&v), definition(m));
                assert_eq!((v.state.clone(), v.vm), (VgpuState::Ready, None));
            }
        }
    }
    // The same GPU commitments, less the inline vGPU.
    let gpus = c.gpus().expect("gpus");
    let inline_compute = if kvm { 0.2 } else { 0.0 };
    assert!((gpus[0].compute_committed - gpus_before[0].compute_committed).abs() < 1e-9);
    assert!(
        (gpus[1].compute_committed - (gpus_before[1].compute_committed - inline_compute)).abs()
            < 1e-9,
        "{gpus:?}"
    );
    assert_eq!(
        gpus[0].memory_committed_bytes,
        gpus_before[0].memory_committed_bytes
    );

    // A new vGPU gets a fresh id, never one handed out before.
    let fresh = c
        .create_vgpu(&vgpu_spec(Some(1), 32 * MIB, 0.05))
        .expect("new vGPU");
    assert_eq!(fresh.id, max_id + 1, "ids are not reused");

    if kvm {
        // A VM runs on a restored vGPU.
        runs_on(c, before[0].id);
        // The old VM records delete; the one on a created vGPU leaves that vGPU alone.
        for (vm, mine) in &vms {
            c.delete_vm(vm.id).expect("delete the old VM record");
            assert_eq!(c.vm(vm.id).expect_err("gone").status(), Some(404));
            let g = vm.vgpu.expect("vgpu");
            match mine {
                None => assert_eq!(c.vgpu(g).expect_err("went with its VM").status(), Some(404)),
                Some(_) => {
                    let v = c.vgpu(g).expect("still there");
                    assert_eq!(v.state, VgpuState::Ready);
                    assert!(v.worker_pid.is_some_and(alive));
                }
            }
        }
        // The VM that ran after the restart is a new id too.
        let vms_now = c.vms().expect("vms");
        assert!(vms_now
            .iter()
            .all(|v| vms.iter().all(|(old, _)| old.id != v.id)));
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
        vm
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
    check_restored(c, &before);
    assert_eq!(c.vgpu(gone.id).expect_err("deleted").status(), Some(404));
    if let Some(vm) = vm {
        let now = c.vm(vm.id).expect("the VM record is kept");
        assert!(
            matches!(&now.state, VmState::Failed { reason } if reason.contains("vgpud restarted")),
            "{now:?}"
        );
        assert!(now.uptime_ms > 0, "{now:?}");
        // Its console is kept with the record.
        assert!(
            console(c, vm.id).contains("gpu-load:"),
            "{}",
            console(c, vm.id)
        );
        runs_on(c, before[2].id);
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
fn what_cannot_come_back_is_listed_with_the_reason() {
    let mut d = TestDaemon::start(
        "restart-unusable",
        &["--sim-gpus", "2", "--sim-memory", "1G"],
    );
    let c = &d.client;
    let ns = d.dir.join("ns.bin");
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
    std::fs::rename(&ns, d.dir.join("ns.moved")).expect("move the file away");
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
    std::fs::rename(d.dir.join("ns.moved"), &ns).expect("move the file back");
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
            },
        )
        .expect("patch saves");
    assert!(state.is_file(), "saved");
    d.kill9();
    d.restart(None);
    let back = d.client.vgpu(id).expect("came back");
    assert_eq!(back.compute_share, 0.5);
}
