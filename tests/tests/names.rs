//! vGPU and VM names and labels through the REST API: set at create, shown in GET and list,
//! changed by PATCH, unique among live vGPUs, validated, carried into /metrics, kept
//! across a vgpud restart.

use std::collections::BTreeMap;
use std::time::Duration;

use vgpu_api::api::{VgpuCreate, VgpuPatch, VmCreate};
use vgpu_tests::daemon::TestDaemon;

fn named(name: &str, labels: &[(&str, &str)]) -> VgpuCreate {
    VgpuCreate {
        gpu: Some(0),
        name: Some(name.into()),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..VgpuCreate::new(16 << 20, 0.1)
    }
}

#[test]
fn names_and_labels_are_shown_changed_checked_and_kept() {
    let mut d = TestDaemon::start("names", &["--sim-gpus", "1"]);
    let c = d.client.clone();
    let a = c
        .create_vgpu(&named("train-a", &[("team", "vision")]))
        .expect("create");
    assert_eq!(a.name.as_deref(), Some("train-a"));
    assert_eq!(a.labels.get("team").map(String::as_str), Some("vision"));
    let listed = c.vgpus().expect("list");
    assert_eq!(listed[0].name.as_deref(), Some("train-a"));

    // Unique among live vGPUs; validated with the field named.
    let e = c.create_vgpu(&named("train-a", &[])).expect_err("taken");
    assert_eq!(e.status(), Some(409), "{e}");
    assert_eq!(e.body().and_then(|b| b.field.as_deref()), Some("name"));
    let e = c.create_vgpu(&named("Train_A", &[])).expect_err("invalid");
    assert_eq!(e.status(), Some(400), "{e}");
    let e = c
        .create_vgpu(&named("ok", &[("bad key", "v")]))
        .expect_err("invalid label");
    assert_eq!(e.body().and_then(|b| b.field.as_deref()), Some("labels"));
    let r = c
        .raw(
            "POST",
            "/v1/vgpus",
            Some(br#"{"memory_bytes": 1048576, "compute_share": 0.1, "labels": [["a", "b"]]}"#),
        )
        .expect("request");
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));

    // Metrics carry the name.
    let m = c.metrics().expect("metrics");
    assert!(
        m.contains(&format!(
            "vgpud_vgpu_live{{vgpu=\"{}\",gpu=\"0\",name=\"train-a\"}}",
            a.id
        )),
        "{m}"
    );

    // PATCH: the name and labels alone, then with a share change.
    let v = c
        .patch_vgpu(
            a.id,
            &VgpuPatch {
                name: Some("train-b".into()),
                labels: Some(BTreeMap::from([("tier".into(), "gold".into())])),
                ..VgpuPatch::default()
            },
        )
        .expect("rename");
    assert_eq!(v.name.as_deref(), Some("train-b"));
    assert_eq!(
        v.labels.keys().map(String::as_str).collect::<Vec<_>>(),
        ["tier"]
    );
    let v = c
        .patch_vgpu(
            a.id,
            &VgpuPatch {
                compute_share: Some(0.2),
                name: Some("train-c".into()),
                ..VgpuPatch::default()
            },
        )
        .expect("rename and grow");
    assert_eq!((v.name.as_deref(), v.compute_share), (Some("train-c"), 0.2));
    let b = c
        .create_vgpu(&named("train-a", &[]))
        .expect("the old name is free");
    let e = c
        .patch_vgpu(
            b.id,
            &VgpuPatch {
                name: Some("train-c".into()),
                ..VgpuPatch::default()
            },
        )
        .expect_err("taken");
    assert_eq!(e.status(), Some(409), "{e}");
    let v = c
        .patch_vgpu(
            b.id,
            &VgpuPatch {
                name: Some(String::new()),
                ..VgpuPatch::default()
            },
        )
        .expect("unname");
    assert_eq!(v.name, None);

    // A restart keeps them.
    assert!(d.stop(), "vgpud stops");
    d.restart(None);
    let c = d.client.clone();
    let back = c.vgpu(a.id).expect("restored");
    assert_eq!(back.name.as_deref(), Some("train-c"));
    assert_eq!(back.labels.get("tier").map(String::as_str), Some("gold"));
}

#[test]
fn vms_take_a_name_and_labels_too() {
    vgpu_tests::require_kvm!();
    let mut d = TestDaemon::start("vm-names", &["--sim-gpus", "1"]);
    let c = d.client.clone();
    let req = |name: &str| VmCreate {
        payload: Some("hello".into()),
        memory_bytes: 64 << 20,
        name: Some(name.into()),
        labels: BTreeMap::from([("env".into(), "test".into())]),
        ..Default::default()
    };
    let e = c.create_vm(&req("Not A Label")).expect_err("invalid");
    assert_eq!(e.status(), Some(400), "{e}");
    assert_eq!(e.body().and_then(|b| b.field.as_deref()), Some("name"));
    let vm = c.create_vm(&req("web-1")).expect("launch");
    assert_eq!(vm.name.as_deref(), Some("web-1"));
    c.wait_vm(vm.id, Duration::from_secs(60)).expect("wait");
    let listed = c.vms().expect("list");
    assert_eq!(
        listed[0].labels.get("env").map(String::as_str),
        Some("test")
    );
    assert!(d.stop(), "vgpud stops");
    d.restart(None);
    let back = d.client.vm(vm.id).expect("kept");
    assert_eq!(back.name.as_deref(), Some("web-1"));
}
