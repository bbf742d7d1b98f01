//! The device plugin against a fake kubelet built from the real kubelet protos, over unix
//! sockets in a temp dir, and a real vgpud on sim GPUs: registration per profile,
//! ListAndWatch following vgpud's capacity, GetPreferredAllocation packing, Allocate's
//! answer (CDI device, mounts, envs; the CDI spec valid against the CDI schema), refused
//! allocations leaving nothing behind, the cleanup of a gone pod's vGPU (none while
//! PodResources does not answer), re-registration
//! after a kubelet restart, and every device unhealthy while vgpud is down.

mod common;

use std::time::Duration;

use common::{eventually, AgentProc, FakeKubelet};
use tonic::Streaming;
use vgpu_api::api::{Attach, VgpuCreate};
use vgpu_k8s::proto::deviceplugin as dp;
use vgpu_tests::daemon::{temp_dir, TestDaemon};

const R25: &str = "vgpu.dev/sim-512m-25";
const R10: &str = "vgpu.dev/sim-128m-10";

/// The next ListAndWatch message within 10 s.
async fn next(s: &mut Streaming<dp::ListAndWatchResponse>) -> Vec<dp::Device> {
    match tokio::time::timeout(Duration::from_secs(10), s.message()).await {
        Ok(Ok(Some(m))) => m.devices,
        other => panic!("no ListAndWatch update: {other:?}"),
    }
}

/// Reads updates until one satisfies `ok`.
async fn until(
    s: &mut Streaming<dp::ListAndWatchResponse>,
    what: &str,
    ok: impl Fn(&[dp::Device]) -> bool,
) -> Vec<dp::Device> {
    for _ in 0..50 {
        let d = next(s).await;
        if ok(&d) {
            return d;
        }
    }
    panic!("ListAndWatch never showed {what}");
}

fn ids_on(d: &[dp::Device], gpu: u32) -> Vec<String> {
    d.iter()
        .filter(|x| x.id.starts_with(&format!("gpu{gpu}-")))
        .map(|x| x.id.clone())
        .collect()
}

fn healthy(d: &[dp::Device]) -> usize {
    d.iter().filter(|x| x.health == "Healthy").count()
}

fn cdi_files(k: &FakeKubelet) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&k.cdi_dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_device_plugin_follows_vgpud_allocates_and_survives_kubelet_and_vgpud_restarts() {
    let mut d = TestDaemon::start("k8s-dp", &["--sim-gpus", "2", "--sim-memory", "2G"]);
    let dir = temp_dir("k8s-dp-kubelet");
    let mut k = FakeKubelet::start(&dir);
    common::install_library(&dir);
    let config = common::write_config(
        &dir,
        r#"[{"name": "sim-512m-25", "memory": "512M", "compute": 0.25},
            {"name": "sim-128m-10", "memory": "128M", "compute": "10%", "copy": 0.05}]"#,
    );
    let agent = AgentProc::start(&k, &d.socket, &config, &["--no-dra"]);

    // One registration per profile, each with its own endpoint in the plugin directory.
    let r = k.wait_registered(R25, 1).await;
    assert_eq!(r.version, "v1beta1");
    assert!(r
        .options
        .as_ref()
        .is_some_and(|o| o.get_preferred_allocation_available));
    assert!(k.dp_dir.join(&r.endpoint).exists(), "{r:?}");
    let r10 = k.wait_registered(R10, 1).await;
    assert_ne!(r.endpoint, r10.endpoint);

    // 2 GPUs of 2 GiB: 4 slices of 512M/25% each; 10 of 128M/10% (compute bounds).
    let mut plugin = k.plugin(R25).await;
    let mut watch = plugin
        .list_and_watch(dp::Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    let devs = next(&mut watch).await;
    assert_eq!(
        (
            ids_on(&devs, 0).len(),
            ids_on(&devs, 1).len(),
            healthy(&devs)
        ),
        (4, 4, 8),
        "{devs:?}"
    );
    let mut p10 = k.plugin(R10).await;
    let mut w10 = p10
        .list_and_watch(dp::Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    assert_eq!(next(&mut w10).await.len(), 20);

    // GPU 1's capacity changes under the agent: a VM's vGPU takes half of it.
    let other = d
        .client
        .create_vgpu(&VgpuCreate {
            gpu: Some(1),
            memory_bytes: 256 << 20,
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
    let devs = until(&mut watch, "GPU 1 down to 2 slices", |d| {
        ids_on(d, 1).len() == 2
    })
    .await;
    assert_eq!(ids_on(&devs, 0).len(), 4);

    // The kubelet asks where 2 slices should go: one GPU, the one they fit most tightly.
    let avail: Vec<String> = devs.iter().map(|x| x.id.clone()).collect();
    let pref = plugin
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: avail.clone(),
                must_include_device_i_ds: Vec::new(),
                allocation_size: 2,
            }],
        })
        .await
        .expect("GetPreferredAllocation")
        .into_inner();
    let chosen = pref.container_responses[0].device_i_ds.clone();
    assert_eq!(chosen, ["gpu1-0", "gpu1-1"], "the tightest GPU: {avail:?}");

    // Slices on two GPUs, a device that is not ours, a slice twice: refused, nothing made.
    for bad in [
        vec!["gpu0-0".to_owned(), "gpu1-0".to_owned()],
        vec!["gpu9-x".to_owned()],
        vec!["gpu0-0".to_owned(), "gpu0-0".to_owned()],
    ] {
        let e = plugin
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: bad.clone(),
                }],
            })
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}: {e:?}");
    }
    assert_eq!(
        d.client.vgpus().expect("vgpus").len(),
        1,
        "only the VM's vGPU"
    );
    assert!(cdi_files(&k).is_empty());

    // Allocate: one process vGPU with both slices, and what the container receives.
    k.set_pods(&[("pod-a", R25, chosen.clone())]);
    let a = plugin
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        })
        .await
        .expect("Allocate")
        .into_inner();
    let c = &a.container_responses[0];
    let vgpus = d.client.vgpus().expect("vgpus");
    let v = vgpus
        .iter()
        .find(|v| v.attach == Attach::Process)
        .expect("the pod's vGPU");
    assert_eq!(
        (v.gpu, v.memory_bytes, v.compute_share, v.copy_share),
        (1, 1 << 30, 0.5, 0.5)
    );
    assert_eq!(
        v.labels.get("vgpu.dev/devices").map(String::as_str),
        Some("gpu1:0,1")
    );
    assert_eq!(c.cdi_devices.len(), 1);
    assert_eq!(
        c.cdi_devices[0].name,
        format!("vgpu.dev/vgpu=vgpu-{}", v.id)
    );
    assert_eq!(
        c.envs.get("VGPU_SOCKET").map(String::as_str),
        Some("/var/run/vgpu/vgpu.sock")
    );
    assert_eq!(
        c.envs.get("LD_LIBRARY_PATH").map(String::as_str),
        Some("/usr/local/vgpu/lib")
    );
    let socket_dir = std::path::Path::new(&v.socket)
        .parent()
        .expect("dir")
        .display()
        .to_string();
    let mounts: Vec<(String, String, bool)> = c
        .mounts
        .iter()
        .map(|m| (m.host_path.clone(), m.container_path.clone(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            (socket_dir, "/var/run/vgpu".to_owned(), false),
            (
                dir.join("lib").display().to_string(),
                "/usr/local/vgpu/lib".to_owned(),
                true
            )
        ]
    );
    // The CDI spec says the same, and is valid.
    assert_eq!(cdi_files(&k), [format!("vgpu.dev-vgpu-{}.json", v.id)]);
    let spec = common::valid_cdi_spec(&k.cdi_dir.join(format!("vgpu.dev-vgpu-{}.json", v.id)));
    assert_eq!(spec["kind"], "vgpu.dev/vgpu");
    let mut env: Vec<(String, String)> = c.envs.clone().into_iter().collect();
    env.sort();
    assert_eq!(
        common::cdi_edits(&spec),
        vgpu_k8s::cdi::Edits { mounts, env }
    );
    // GPU 1 still lists 2 devices (the 2 handed out), GPU 0 its 4; the 10% profile shrinks.
    let devs = until(&mut w10, "GPU 1's 10% slices gone", |d| {
        ids_on(d, 1).is_empty()
    })
    .await;
    assert_eq!(ids_on(&devs, 0).len(), 10);

    // The pod is listed: its vGPU stays past the grace time. Gone: the vGPU goes.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(d.client.vgpu(v.id).is_ok(), "a listed pod's vGPU stays");
    // PodResources does not answer: nothing is deleted, whatever it said last.
    k.pod_resources(false);
    k.set_pods(&[]);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(
        d.client.vgpu(v.id).is_ok(),
        "deleted while PodResources did not answer"
    );
    k.pod_resources(true);
    let c2 = d.client.clone();
    let id = v.id;
    eventually(
        "the gone pod's vGPU deleted",
        Duration::from_secs(15),
        || (c2.vgpu(id).err()?.status() == Some(404)).then_some(()),
    )
    .await;
    eventually("its CDI spec gone with it", Duration::from_secs(5), || {
        cdi_files(&k).is_empty().then_some(())
    })
    .await;
    // The same two IDs on GPU 1 now are free slices (no update on this stream); the 10%
    // profile gets GPU 1's half back.
    until(&mut w10, "GPU 1's 10% slices back", |d| {
        ids_on(d, 1).len() == 5
    })
    .await;

    // A kubelet restart: the agent registers again on the new kubelet.sock.
    k.restart();
    k.wait_registered(R25, 2).await;
    k.wait_registered(R10, 2).await;
    let mut plugin = k.plugin(R25).await;
    let mut watch = plugin
        .list_and_watch(dp::Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    assert_eq!(healthy(&next(&mut watch).await), 6);

    // vgpud down: every device unhealthy; an Allocate fails and leaves nothing.
    assert!(d.stop(), "vgpud stops");
    let devs = until(&mut watch, "every device unhealthy", |d| healthy(d) == 0).await;
    assert_eq!(devs.len(), 6);
    let e = plugin
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: vec!["gpu0-0".into()],
            }],
        })
        .await
        .expect_err("no vgpud");
    assert!(e.message().contains("vgpud"), "{e:?}");
    assert!(cdi_files(&k).is_empty());
    d.restart(None);
    until(&mut watch, "healthy again", |d| healthy(d) == 6).await;
    let left: Vec<_> = d
        .client
        .vgpus()
        .expect("vgpus")
        .into_iter()
        .filter(|v| v.attach == Attach::Process)
        .collect();
    assert!(left.is_empty(), "no vGPU leaked: {left:?}");
    d.client
        .delete_vgpu(other.id)
        .expect("delete the VM's vGPU");
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_is_seen_at_once_not_at_the_next_poll() {
    let d = TestDaemon::start("k8s-dp-watch", &["--sim-gpus", "1", "--sim-memory", "1G"]);
    let dir = temp_dir("k8s-dp-watch-kubelet");
    let mut k = FakeKubelet::start(&dir);
    let config = common::write_config(
        &dir,
        r#"[{"name": "sim-512m-25", "memory": "512M", "compute": 0.25}]"#,
    );
    // A poll of a minute: only the directory watch can notice the restart in time.
    let _agent = AgentProc::start(&k, &d.socket, &config, &["--no-dra", "--poll-ms", "60000"]);
    k.wait_registered(R25, 1).await;
    let t = std::time::Instant::now();
    k.restart();
    let r = k.wait_registered(R25, 2).await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "re-registered after {:?}",
        t.elapsed()
    );
    let mut plugin = k.plugin(R25).await;
    let mut watch = plugin
        .list_and_watch(dp::Empty {})
        .await
        .expect("ListAndWatch on the new socket")
        .into_inner();
    assert_eq!(healthy(&next(&mut watch).await), 2, "{r:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
