//! Device memory end to end: oversubscription with swapping across worker
//! processes, shared device memory between VMs of one share group, and the refusals.

use std::time::Duration;

use vgpu_api::api::{MigrateRequest, VgpuCreate, VmCreate, VmState};
use vgpu_api::client::{Client, ClientError};
use vgpu_tests::daemon::TestDaemon;
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

fn vm(
    payload: &str,
    arg: &str,
    memory: u64,
    oversubscribe: bool,
    group: Option<&str>,
    priority: i32,
) -> VmCreate {
    VmCreate {
        payload: Some(vgpu_tests::bins::payload(payload).display().to_string()),
        payload_arg: arg.into(),
        memory_bytes: 64 << 20,
        vgpu: Some(VgpuCreate {
            gpu: Some(0),
            priority,
            oversubscribe,
            share_group: group.map(str::to_string),
            ..VgpuCreate::new(memory, 0.2)
        }),
        ..Default::default()
    }
}

/// vgpud's GPU arguments: simulated GPUs of 256 MiB, or with `VGPU_TEST_BACKEND=cuda`
/// the real GPUs of the GPU machine (ci/gpu/suite.sh, step shm). `None`: skip the test.
fn gpu_args(gpus: &'static str) -> Option<Vec<&'static str>> {
    vgpu_tests::gpus::daemon_args(&["--sim-gpus", gpus, "--sim-memory", "256M"])
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

fn finish(c: &Client, id: u32, expect: &str) -> String {
    let done = c.wait_vm(id, Duration::from_secs(240)).expect("wait");
    let out = console(c, id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "VM {id}:\n{out}");
    assert!(out.contains(expect), "VM {id}:\n{out}");
    out
}

#[test]
fn three_vms_oversubscribe_a_gpu_twice_and_lose_no_byte() {
    require_kvm!();
    // 96 MiB GPU (86.4 MiB after the 10% swap area); three vGPUs of 65 MiB each fill
    // them with 4 x 16 MiB buffers: 192 MiB of data, twice the GPU.
    let d = TestDaemon::start(
        "memory-oversub",
        &["--sim-gpus", "1", "--sim-memory", "96M"],
    );
    let c = &d.client;
    let ids: Vec<u32> = (0..3)
        .map(|i| {
            c.create_vm(&vm(
                "memcheck",
                &format!("buffers=4 size_mib=16 rounds=3 seed={}", i + 1),
                65 * MIB,
                true,
                None,
                0,
            ))
            .expect("vm")
            .id
        })
        .collect();
    let g = &c.gpus().expect("gpus")[0];
    assert_eq!(
        g.memory_committed_bytes, 0,
        "oversubscribed shares are not reserved"
    );
    assert!(
        g.swap_area_bytes > 0 && g.oversubscribed_pool_bytes < 96 * MIB,
        "{g:?}"
    );
    let vgpus: Vec<u32> = ids
        .iter()
        .map(|id| c.vm(*id).expect("vm").vgpu.expect("vgpu"))
        .collect();
    let mut swapped = 0;
    for (id, v) in ids.iter().zip(&vgpus) {
        // Stats while it is still there (its worker ends with the VM).
        let s = c.vgpu_stats(*v).expect("stats");
        swapped += s.swap_out_bytes;
        let done = c.wait_vm(*id, Duration::from_secs(240)).expect("wait");
        if done.state != (VmState::Exited { code: 0 }) {
            eprintln!("daemon log:\n{}", d.log_text());
        }
        finish(c, *id, "MEMCHECK OK buffers=4 rounds=3");
    }
    let out: String = ids.iter().map(|id| console(c, *id)).collect();
    eprintln!("{out}");
    assert!(
        swapped > 0 || d.log_text().contains("evicted"),
        "memory was swapped: {swapped}"
    );
    let g = &c.gpus().expect("gpus")[0];
    assert_eq!(
        g.oversubscribed_resident_bytes, 0,
        "everything freed: {g:?}"
    );
}

#[test]
fn a_hard_share_is_a_hard_limit() {
    require_kvm!();
    let d = TestDaemon::start("memory-hard", &["--sim-gpus", "1", "--sim-memory", "256M"]);
    let c = &d.client;
    // 16 MiB share, asks for 4 x 8 MiB: the third allocation fails cleanly.
    let a = c
        .create_vm(&vm(
            "memcheck",
            "buffers=4 size_mib=8 rounds=1",
            16 * MIB,
            false,
            None,
            0,
        ))
        .expect("vm");
    let done = c.wait_vm(a.id, Duration::from_secs(60)).expect("wait");
    let out = console(c, a.id);
    assert_eq!(done.state, VmState::Exited { code: 4 }, "{out}");
    assert!(
        out.contains("ALLOC buffer") && out.contains("OUT_OF_MEMORY"),
        "{out}"
    );
    // A vGPU too big for the GPU is refused at admission.
    let e = c
        .create_vm(&vm("memcheck", "", 512 * MIB, true, None, 0))
        .expect_err("bigger than the GPU");
    assert!(e.to_string().contains("memory_bytes"), "{e}");
}

#[test]
fn shm_pipeline_between_two_vms_and_an_intruder_is_refused() {
    require_kvm!();
    let Some(args) = gpu_args("1") else { return };
    let d = TestDaemon::start("memory-shm", &args);
    let c = &d.client;
    let arg = |role: &str| format!("role={role} key=0x5eed size_mib=4 items=12");
    let producer = c
        .create_vm(&vm(
            "shm-pipe",
            &arg("producer"),
            vgpu_tests::gpus::share(32 * MIB),
            false,
            Some("pipe"),
            0,
        ))
        .expect("producer");
    let consumer = c
        .create_vm(&vm(
            "shm-pipe",
            &arg("consumer"),
            vgpu_tests::gpus::share(32 * MIB),
            false,
            Some("pipe"),
            0,
        ))
        .expect("consumer");
    let intruder = c
        .create_vm(&vm(
            "shm-pipe",
            &arg("intruder"),
            vgpu_tests::gpus::share(32 * MIB),
            false,
            Some("other"),
            0,
        ))
        .expect("intruder");
    let loner = c
        .create_vm(&vm(
            "shm-pipe",
            &arg("intruder"),
            vgpu_tests::gpus::share(32 * MIB),
            false,
            None,
            0,
        ))
        .expect("no group");
    finish(c, intruder.id, "SHM-PIPE OK role=intruder refused");
    finish(c, loner.id, "SHM-PIPE OK role=intruder refused");
    let done = c
        .wait_vm(consumer.id, Duration::from_secs(240))
        .expect("wait");
    if done.state != (VmState::Exited { code: 0 }) {
        for e in std::fs::read_dir(&d.dir).expect("dir").flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                eprintln!(
                    "== {}\n{}",
                    e.path().display(),
                    std::fs::read_to_string(e.path()).unwrap_or_default()
                );
            }
        }
    }
    finish(c, consumer.id, "SHM-PIPE OK role=consumer items=12");
    finish(c, producer.id, "SHM-PIPE OK role=producer items=12");
    // RMID'd by the consumer, freed at the producer's detach.
    let objects = c.shm().expect("shm");
    assert!(objects.is_empty(), "{objects:?}");
    assert_eq!(c.gpus().expect("gpus")[0].memory_shared_bytes, 0);
}

#[test]
fn a_dying_vm_leaves_the_shared_object_to_the_others() {
    require_kvm!();
    let Some(args) = gpu_args("2") else { return };
    let d = TestDaemon::start("memory-shm-kill", &args);
    let c = &d.client;
    let arg = |role: &str| format!("role={role} key=0x77 size_mib=2 items=100000");
    let producer = c
        .create_vm(&vm(
            "shm-pipe",
            &arg("producer"),
            vgpu_tests::gpus::share(32 * MIB),
            false,
            Some("g"),
            0,
        ))
        .expect("producer");
    let consumer = c
        .create_vm(&vm(
            "shm-pipe",
            &arg("consumer"),
            vgpu_tests::gpus::share(32 * MIB),
            false,
            Some("g"),
            0,
        ))
        .expect("consumer");
    // Wait until both are attached.
    let start = std::time::Instant::now();
    loop {
        let o = c.shm().expect("shm");
        if o.first().is_some_and(|o| o.attachments == 2) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never attached: {o:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A mapper is pinned to the object's GPU: the move is refused, naming the object.
    let shmid = c.shm().expect("shm")[0].id;
    let vgpu = c.vm(consumer.id).expect("vm").vgpu.expect("vgpu");
    let req = MigrateRequest {
        target_gpu: None,
        mode: None,
        max_downtime_ms: None,
    };
    match c.migrate_vgpu(vgpu, &req) {
        Err(ClientError::Api {
            status: 409, body, ..
        }) => assert!(
            body.error.contains("shared device memory")
                && body.error.contains(&format!("objects {shmid}")),
            "{body:?}"
        ),
        other => panic!("expected 409, got {other:?}"),
    }
    let pid = c.vm(producer.id).expect("vm").pid.expect("pid");
    // SAFETY: kill(2) on a process this test's daemon started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let start = std::time::Instant::now();
    loop {
        let o = c.shm().expect("shm");
        if o.first().is_some_and(|o| o.attachments == 1) {
            assert!(!o[0].removed, "the consumer still holds it");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "attachment not dropped: {o:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.vm(consumer.id).expect("vm").state, VmState::Running);
    c.delete_vm(consumer.id).expect("delete");
    let start = std::time::Instant::now();
    while !c.shm().expect("shm").is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "object not freed with its group"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
