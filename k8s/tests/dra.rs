//! The DRA driver against a fake kubelet (plugin registration and the DRA v1 gRPC API from
//! the real protos) and a fake API server: registration through the plugin registry, the
//! ResourceSlices it publishes (resource.k8s.io/v1, checked field by field against
//! k8s-openapi's v1 types), NodePrepareResources creating the vGPU the claim's
//! configuration asks for and answering its CDI device (the spec valid against the CDI
//! schema, a container computing with its edits), retries and agent restarts answering
//! the same vGPU, refused claims leaving nothing, NodeUnprepareResources deleting it.

mod common;

use std::time::Duration;

use common::{eventually, AgentProc, FakeApi, FakeKubelet};
use k8s_openapi::api::resource::v1::ResourceSlice;
use vgpu_api::api::{Attach, VgpuCreate};
use vgpu_k8s::grpc;
use vgpu_k8s::proto::dra as pb;
use vgpu_k8s::proto::pluginregistration as reg;
use vgpu_tests::daemon::{temp_dir, TestDaemon};

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// A ResourceClaim allocated `device` of this node's pool, with `parameters` as its opaque
/// configuration.
fn claim(name: &str, uid: &str, device: &str, parameters: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dev"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "vgpu.dev", "pool": "node-a", "device": device}],
            "config": [{"source": "FromClaim", "requests": ["gpu"],
                        "opaque": {"driver": "vgpu.dev", "parameters": parameters}}]
        }}}
    })
}

fn kubelet_claim(name: &str, uid: &str) -> pb::Claim {
    pb::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// The slice objects the fake API server holds, by name.
fn slices(api: &FakeApi) -> std::collections::BTreeMap<String, serde_json::Value> {
    api.objects
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|(p, v)| Some((p.strip_prefix(&format!("{SLICES}/"))?.to_owned(), v.clone())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dra_driver_publishes_slices_prepares_claims_idempotently_and_unprepares_them() {
    let d = TestDaemon::start("k8s-dra", &["--sim-gpus", "2", "--sim-memory", "2G"]);
    let dir = temp_dir("k8s-dra-kubelet");
    let k = FakeKubelet::start(&dir);
    let lib = common::install_library(&dir);
    let api = FakeApi::start();
    let config = common::write_config(
        &dir,
        r#"[{"name": "sim-half", "memory": "512M", "compute": 0.5}]"#,
    );
    let mut agent = AgentProc::start(
        &k,
        &d.socket,
        &config,
        &["--no-device-plugin", "--kube-api", &api.url],
    );

    // The kubelet's plugin watcher finds the registration socket and asks what it is.
    let reg_sock = k.registry_dir.join("vgpu.dev-reg.sock");
    eventually("the registration socket", Duration::from_secs(20), || {
        reg_sock.exists().then_some(())
    })
    .await;
    let mut r = reg::registration_client::RegistrationClient::new(
        grpc::connect(&reg_sock).await.expect("connect"),
    );
    let info = r
        .get_info(reg::InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(
        (
            info.r#type.as_str(),
            info.name.as_str(),
            info.supported_versions.clone()
        ),
        ("DRAPlugin", "vgpu.dev", vec!["v1.DRAPlugin".to_owned()])
    );
    assert_eq!(
        std::path::Path::new(&info.endpoint),
        k.dra_dir.join("dra.sock")
    );
    r.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .expect("NotifyRegistrationStatus");
    let mut drv = pb::dra_plugin_client::DraPluginClient::new(
        grpc::connect(std::path::Path::new(&info.endpoint))
            .await
            .expect("connect"),
    );

    // The ResourceSlices: one per GPU, in the node's pool, 2 devices of half a GPU each.
    let api_objects = || slices(&api);
    let published = eventually("two ResourceSlices", Duration::from_secs(20), || {
        let s = api_objects();
        (s.len() == 2).then_some(s)
    })
    .await;
    for (g, (name, s)) in published.iter().enumerate() {
        assert_eq!(name, &format!("node-a-vgpu-dev-gpu-{g}"));
        // resource.k8s.io/v1 as Kubernetes defines it: k8s-openapi's v1 types read it and
        // write it back identically (no unknown or misspelt field, nothing missing).
        let typed: ResourceSlice = serde_json::from_value(s.clone()).expect("a v1 ResourceSlice");
        assert_eq!(&serde_json::to_value(&typed).expect("serialize"), s);
        assert_eq!(
            (s["apiVersion"].as_str(), s["kind"].as_str()),
            (Some("resource.k8s.io/v1"), Some("ResourceSlice"))
        );
        let spec = &s["spec"];
        assert_eq!(
            (spec["driver"].as_str(), spec["nodeName"].as_str()),
            (Some("vgpu.dev"), Some("node-a"))
        );
        assert_eq!(
            spec["pool"],
            serde_json::json!({"name": "node-a", "generation": 1, "resourceSliceCount": 2})
        );
        let set = &spec["sharedCounters"][0];
        assert_eq!(set["name"], format!("gpu-{g}"));
        assert_eq!(set["counters"]["compute"]["value"], "1000");
        let devices = spec["devices"].as_array().expect("devices");
        let names: Vec<&str> = devices.iter().filter_map(|x| x["name"].as_str()).collect();
        assert_eq!(
            names,
            [format!("gpu-{g}-sim-half-0"), format!("gpu-{g}-sim-half-1")]
        );
        for dev in devices {
            assert_eq!(dev["attributes"]["profile"]["string"], "sim-half");
            assert_eq!(dev["attributes"]["gpu"]["int"], g);
            assert_eq!(
                dev["capacity"]["memory"]["value"],
                (512u64 << 20).to_string()
            );
            let c = &dev["consumesCounters"][0];
            assert_eq!(
                (
                    c["counterSet"].as_str(),
                    c["counters"]["compute"]["value"].as_str()
                ),
                (Some(&*format!("gpu-{g}")), Some("500"))
            );
        }
    }

    // A claim asking for 30% and 256M of its half-GPU device.
    let params = serde_json::json!({"apiVersion": "vgpu.dev/v1", "kind": "VgpuConfig", "memory": "256M", "compute": 0.3, "priority": 2});
    api.objects
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            format!("{CLAIMS}/claim-a"),
            claim("claim-a", "uid-a", "gpu-0-sim-half-0", params),
        );
    let prepare = |drv: &mut pb::dra_plugin_client::DraPluginClient<_>, c: pb::Claim| {
        let mut drv = drv.clone();
        async move {
            drv.node_prepare_resources(pb::NodePrepareResourcesRequest {
                claims: vec![c.clone()],
            })
            .await
            .expect("NodePrepareResources")
            .into_inner()
            .claims
            .remove(&c.uid)
            .expect("an answer for the claim")
        }
    };
    let a = prepare(&mut drv, kubelet_claim("claim-a", "uid-a")).await;
    assert_eq!(a.error, "");
    assert_eq!(a.devices.len(), 1);
    let dev = &a.devices[0];
    assert_eq!(
        (dev.pool_name.as_str(), dev.device_name.as_str()),
        ("node-a", "gpu-0-sim-half-0")
    );
    assert_eq!(dev.request_names, ["gpu"]);
    let id: u32 = dev.cdi_device_ids[0]
        .strip_prefix("vgpu.dev/vgpu=vgpu-")
        .and_then(|n| n.parse().ok())
        .expect("a CDI id");
    let v = d.client.vgpu(id).expect("the claim's vGPU");
    assert_eq!(
        (
            v.gpu,
            v.memory_bytes,
            v.compute_share,
            v.copy_share,
            v.priority,
            v.attach
        ),
        (0, 256 << 20, 0.3, 0.3, 2, Attach::Process)
    );
    assert_eq!(
        v.labels.get("vgpu.dev/claim").map(String::as_str),
        Some("uid-a")
    );
    let cp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(k.state_dir.join("dra-checkpoint.json")).expect("checkpoint"),
    )
    .expect("JSON");
    assert_eq!(cp["claims"]["uid-a"]["devices"][0]["vgpu"], id);

    // The container the runtime makes from the CDI spec computes on that vGPU.
    let spec = common::valid_cdi_spec(&k.cdi_dir.join(format!("vgpu.dev-vgpu-{id}.json")));
    if common::can_make_containers() {
        if let Some(program) = common::build_pod_program(&dir, &lib) {
            let (ok, out, err) = common::finish(common::start_container(
                &program,
                &["0.3", "500", "2", "1"],
                &common::cdi_edits(&spec),
            ));
            assert!(ok && out.starts_with("ok"), "{out}{err}");
            assert!(d.client.vgpu_stats(id).expect("stats").kernels > 2);
        }
    } else {
        eprintln!("SKIPPED (the container part): containers need root and `unshare -m`");
    }

    // Retries answer the same vGPU: again; after an agent kill -9; without the checkpoint
    // (the vGPU's labels say whose it is).
    assert_eq!(
        prepare(&mut drv, kubelet_claim("claim-a", "uid-a")).await,
        a
    );
    agent.restart();
    let mut drv = pb::dra_plugin_client::DraPluginClient::new(connect_again(&k).await);
    let again = eventually_prepare(&mut drv, kubelet_claim("claim-a", "uid-a")).await;
    assert_eq!(again, a);
    std::fs::remove_file(k.state_dir.join("dra-checkpoint.json")).expect("remove the checkpoint");
    assert_eq!(
        prepare(&mut drv, kubelet_claim("claim-a", "uid-a")).await,
        a
    );
    assert_eq!(
        d.client.vgpus().expect("vgpus").len(),
        1,
        "still the one vGPU"
    );

    // Refused claims create nothing: a claim recreated under another UID, parameters above
    // the device, a device of no profile, a claim the API server does not have.
    for (name, uid, device, params) in [
        (
            "claim-b",
            "uid-new",
            "gpu-1-sim-half-0",
            serde_json::json!({}),
        ),
        (
            "claim-c",
            "uid-c",
            "gpu-1-sim-half-0",
            serde_json::json!({"compute": 0.9}),
        ),
        ("claim-d", "uid-d", "gpu-1-big-0", serde_json::json!({})),
        (
            "claim-e",
            "uid-e",
            "gpu-1-sim-half-0",
            serde_json::json!({"colour": "red"}),
        ),
    ] {
        api.objects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(format!("{CLAIMS}/{name}"), claim(name, uid, device, params));
    }
    for (name, uid, needle) in [
        ("claim-b", "uid-b", "created again"),
        ("claim-c", "uid-c", "compute 0.9"),
        ("claim-d", "uid-d", "not one this driver publishes"),
        ("claim-e", "uid-e", "colour"),
        ("claim-x", "uid-x", "404"),
        (
            "../../nodes/node-a",
            "uid-y",
            "not a Kubernetes object name",
        ),
    ] {
        let r = prepare(&mut drv, kubelet_claim(name, uid)).await;
        assert!(r.error.contains(needle), "{name}: {r:?}");
        assert!(r.devices.is_empty());
    }
    assert_eq!(
        d.client.vgpus().expect("vgpus").len(),
        1,
        "no vGPU from a refused claim"
    );

    // A VM's vGPU takes half of GPU 1: its slice is published again with one device.
    let other = d
        .client
        .create_vgpu(&VgpuCreate {
            gpu: Some(1),
            memory_bytes: 128 << 20,
            compute_share: 0.5,
            copy_share: None,
            priority: 0,
            oversubscribe: false,
            share_group: None,
            queues: 1,
            storage: Vec::new(),
            name: None,
            labels: Default::default(),
            kernel_deadline_ms: None,
            attach: Attach::Vm,
            owner_uid: None,
            owner_gid: None,
        })
        .expect("another vGPU");
    let s1 = eventually(
        "GPU 1's slice with one device",
        Duration::from_secs(20),
        || {
            let s = api_objects().remove("node-a-vgpu-dev-gpu-1")?;
            (s["spec"]["devices"].as_array()?.len() == 1).then_some(s)
        },
    )
    .await;
    assert_eq!(
        s1["spec"]["sharedCounters"][0]["counters"]["compute"]["value"],
        "500"
    );
    assert!(s1["spec"]["pool"]["generation"].as_i64() > Some(1));
    // GPU 0's slice still offers both devices: the claim's vGPU counts as DRA's own.
    assert_eq!(
        api_objects()["node-a-vgpu-dev-gpu-0"]["spec"]["devices"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    // Unprepare: the vGPU, its spec and its checkpoint entry go; again is fine.
    for _ in 0..2 {
        let u = drv
            .node_unprepare_resources(pb::NodeUnprepareResourcesRequest {
                claims: vec![kubelet_claim("claim-a", "uid-a")],
            })
            .await
            .expect("NodeUnprepareResources")
            .into_inner();
        assert_eq!(u.claims.get("uid-a").map(|c| c.error.as_str()), Some(""));
    }
    assert_eq!(d.client.vgpu(id).expect_err("deleted").status(), Some(404));
    assert!(!k.cdi_dir.join(format!("vgpu.dev-vgpu-{id}.json")).exists());
    let cp = std::fs::read_to_string(k.state_dir.join("dra-checkpoint.json")).expect("checkpoint");
    assert!(!cp.contains("uid-a"), "{cp}");
    d.client
        .delete_vgpu(other.id)
        .expect("delete the VM's vGPU");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A channel to the restarted agent's DRA socket, once it serves it.
async fn connect_again(k: &FakeKubelet) -> tonic::transport::Channel {
    for _ in 0..200 {
        if let Ok(c) = grpc::connect(&k.dra_dir.join("dra.sock")).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the restarted agent does not serve its DRA socket");
}

/// NodePrepareResources, retried while the restarted agent's socket is not served yet.
async fn eventually_prepare(
    drv: &mut pb::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    c: pb::Claim,
) -> pb::NodePrepareResourceResponse {
    for _ in 0..100 {
        if let Ok(r) = drv
            .node_prepare_resources(pb::NodePrepareResourcesRequest {
                claims: vec![c.clone()],
            })
            .await
        {
            if let Some(r) = r.into_inner().claims.remove(&c.uid) {
                return r;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the restarted agent does not prepare claims");
}
