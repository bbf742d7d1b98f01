//! Every guest-created object bounded, read-only mappings enforced (docs/hostile.md,
//! "Bounds"): the real vgpud, workers and payload guests under KVM on the sim backend.

use std::time::{Duration, Instant};

use vgpu_api::api::{VgpuCreate, VmCreate, VmState};
use vgpu_api::client::Client;
use vgpu_tests::daemon::TestDaemon;
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

fn vm(arg: &str, group: Option<&str>) -> VmCreate {
    VmCreate {
        payload: Some(vgpu_tests::bins::payload("hostile").display().to_string()),
        payload_arg: arg.into(),
        memory_bytes: 64 << 20,
        vgpu: Some(VgpuCreate {
            gpu: Some(0),
            share_group: group.map(str::to_string),
            ..VgpuCreate::new(vgpu_tests::gpus::share(32 * MIB), 0.2)
        }),
        ..Default::default()
    }
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

fn finish(d: &TestDaemon, id: u32, expect: &str) -> String {
    let c = &d.client;
    let done = c.wait_vm(id, Duration::from_secs(240)).expect("wait");
    let out = console(c, id);
    if done.state != (VmState::Exited { code: 0 }) || !out.contains(expect) {
        eprintln!("daemon log:\n{}", d.log_text());
    }
    assert_eq!(done.state, VmState::Exited { code: 0 }, "VM {id}:\n{out}");
    assert!(out.contains(expect), "VM {id}:\n{out}");
    out
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn a_shm_flood_is_bounded_and_the_neighbour_and_rest_carry_on() {
    require_kvm!();
    let d = TestDaemon::start(
        "bounds-flood",
        &[
            "--sim-gpus",
            "1",
            "--sim-memory",
            "512M",
            "--shm-objects-per-vgpu",
            "64",
        ],
    );
    let c = &d.client;
    let fds_before = open_fds(d.pid());
    let flood = c
        .create_vm(&vm("mode=shm-flood attempts=4096 secs=4", Some("g")))
        .expect("flooder");
    let neighbour = c
        .create_vm(&vm("mode=shm-neighbour rounds=40 size=65536", Some("g")))
        .expect("neighbour");
    let flood_vgpu = c.vm(flood.id).expect("vm").vgpu.expect("vgpu");
    // REST keeps answering while the flood runs, and the flooder never holds more than
    // its bound.
    let (mut worst, mut most, mut peak_fds) = (Duration::ZERO, 0usize, 0usize);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(240) {
        let t = Instant::now();
        let objects = c.shm().expect("GET /v1/shm during the flood");
        c.vgpus().expect("GET /v1/vgpus during the flood");
        worst = worst.max(t.elapsed());
        most = most.max(
            objects
                .iter()
                .filter(|o| o.creator_vgpu == flood_vgpu)
                .count(),
        );
        peak_fds = peak_fds.max(open_fds(d.pid()));
        let done = |id| c.vm(id).is_ok_and(|v| !v.state.is_live());
        if done(flood.id) && done(neighbour.id) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = finish(&d, flood.id, "SHM-FLOOD OK");
    eprintln!("{out}");
    assert!(out.contains("bound=64"), "{out}");
    eprintln!("{}", finish(&d, neighbour.id, "SHM-NEIGHBOUR OK rounds=40"));
    eprintln!(
        "REST worst {worst:?}, flooder's objects at most {most}, vgpud fds {fds_before} -> peak {peak_fds}"
    );
    assert!(
        worst < Duration::from_secs(2),
        "REST answered within 2 s: {worst:?}"
    );
    assert!(most <= 64, "{most} objects of the flooder at once");
    assert!(
        peak_fds < fds_before + 64 + 64,
        "vgpud descriptors {fds_before} -> {peak_fds}"
    );
    // Both VMs gone: no vGPU of the group is left, so every object is freed.
    let t = Instant::now();
    while !c.shm().expect("shm").is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.shm().expect("shm").len(), 0, "objects freed");
    assert!(!d.log_text().contains("panicked"), "{}", d.log_text());
}

#[test]
fn writes_into_a_read_only_mapping_are_refused_and_the_worker_lives() {
    require_kvm!();
    // VGPU_TEST_BACKEND=cuda: on the real GPU (ci/gpu/suite.sh, step shm).
    let Some(args) = vgpu_tests::gpus::daemon_args(&["--sim-gpus", "1", "--sim-memory", "256M"])
    else {
        return;
    };
    let d = TestDaemon::start("bounds-readonly", &args);
    let c = &d.client;
    let v = c
        .create_vm(&vm("mode=readonly key=0x0dd", Some("ro")))
        .expect("vm");
    let out = finish(&d, v.id, "READONLY OK");
    eprintln!("{out}");
    assert_eq!(
        out.matches("BAD_DEVICE_POINTER").count(),
        6,
        "HtoD, HtoD inside, memset, DtoD, WRITE and READ_WRITE kernel pointers:\n{out}"
    );
}

#[test]
fn event_and_module_tables_are_bounded() {
    require_kvm!();
    let d = TestDaemon::start(
        "bounds-objects",
        &["--sim-gpus", "1", "--sim-memory", "256M"],
    );
    let c = &d.client;
    let v = c.create_vm(&vm("mode=objects", None)).expect("vm");
    let out = finish(&d, v.id, "OBJECTS OK events=4096 modules=4096");
    eprintln!("{out}");
}
