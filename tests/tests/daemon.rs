//! End to end through vgpud: the REST contract against docs/openapi.json, bad input, auth,
//! a VM's life with a vGPU workload, `kill -9` of a vmm (its vGPU freed within a second
//! while a neighbour keeps running and verifying), a crashed worker reported.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vgpu_api::api::{Gpu, VgpuCreate, VgpuState, VmState};
use vgpu_api::client::{Client, ClientError, Endpoint};
use vgpu_tests::daemon::{
    alive, children, conforms, files_in, gpu_load, temp_dir, vgpud_command, wait_running,
    TestDaemon,
};
use vgpu_tests::require_kvm;

fn spec() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("docs/openapi.json"))
        .expect("spec is JSON")
}

/// GET/POST/... returning raw JSON, checked against schema `schema` of the spec.
fn call(
    c: &Client,
    spec: &Value,
    method: &str,
    path: &str,
    body: Option<Value>,
    status: u16,
    schema: &str,
) -> Value {
    let body = body.map(|b| serde_json::to_vec(&b).expect("encode"));
    let r = c.raw(method, path, body.as_deref()).expect("request");
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, status, "{method} {path}: {text}");
    if schema.is_empty() {
        return Value::Null;
    }
    let v: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
    let items: Vec<&Value> = match schema.strip_prefix('[') {
        Some(_) => v.as_array().expect("an array").iter().collect(),
        None => vec![&v],
    };
    let name = schema.trim_matches(|c| c == '[' || c == ']');
    for item in items {
        let errs = conforms(spec, name, item);
        assert!(
            errs.is_empty(),
            "{method} {path}: answer does not match schema {name}: {errs:?}\n{text}"
        );
    }
    v
}

/// An error answer: status, the JSON error body, the field it names.
fn refused(
    c: &Client,
    spec: &Value,
    method: &str,
    path: &str,
    body: &[u8],
    status: u16,
    field: Option<&str>,
) -> String {
    let r = c
        .raw(
            method,
            path,
            if body.is_empty() { None } else { Some(body) },
        )
        .expect("request");
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(
        r.status,
        status,
        "{method} {path} {}: {text}",
        String::from_utf8_lossy(body)
    );
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("error body is not JSON: {text}"));
    assert!(conforms(spec, "ErrorBody", &v).is_empty(), "{text}");
    assert_eq!(v["field"].as_str(), field, "{method} {path}: {text}");
    v["error"].as_str().unwrap_or_default().to_owned()
}

fn state_snapshot(c: &Client) -> (Vec<Gpu>, String, String) {
    (
        c.gpus().expect("gpus"),
        serde_json::to_string(&c.vgpus().expect("vgpus")).expect("json"),
        serde_json::to_string(&c.vms().expect("vms")).expect("json"),
    )
}

#[test]
fn rest_contract_bad_input_and_concurrency() {
    let spec = spec();
    let d = TestDaemon::start("contract", &["--sim-gpus", "2", "--sim-memory", "4G"]);
    let c = &d.client;

    // The served spec is the committed one.
    let served = c.checked("GET", "/v1/openapi.json", None).expect("spec");
    assert_eq!(
        serde_json::from_slice::<Value>(&served.body).expect("json"),
        spec
    );

    let gpus = call(c, &spec, "GET", "/v1/gpus", None, 200, "[Gpu]");
    assert_eq!(gpus.as_array().map(Vec::len), Some(2));
    assert_eq!(gpus[0]["memory_bytes"], json!(4u64 << 30));
    call(c, &spec, "GET", "/v1/vgpus", None, 200, "[Vgpu]");
    call(c, &spec, "GET", "/v1/vms", None, 200, "[Vm]");

    let v = call(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        Some(
            json!({"gpu": 0, "memory_bytes": 1u64 << 30, "compute_share": 0.6, "copy_share": 0.5, "priority": 2, "share_group": "g1", "queues": 2}),
        ),
        201,
        "Vgpu",
    );
    let id = v["id"].as_u64().expect("id");
    assert_eq!(v["state"]["kind"], "ready");
    assert!(
        Path::new(v["socket"].as_str().expect("socket")).exists(),
        "worker socket bound"
    );
    call(
        c,
        &spec,
        "GET",
        &format!("/v1/vgpus/{id}"),
        None,
        200,
        "Vgpu",
    );
    let s = call(
        c,
        &spec,
        "GET",
        &format!("/v1/vgpus/{id}/stats"),
        None,
        200,
        "VgpuStats",
    );
    assert_eq!(s["live"], true);
    assert_eq!(s["memory_share_bytes"], json!(1u64 << 30));
    let p = call(
        c,
        &spec,
        "PATCH",
        &format!("/v1/vgpus/{id}"),
        Some(json!({"compute_share": 0.7, "priority": 5})),
        200,
        "Vgpu",
    );
    assert_eq!(
        (
            p["compute_share"].as_f64(),
            p["copy_share"].as_f64(),
            p["priority"].as_i64()
        ),
        (Some(0.7), Some(0.5), Some(5))
    );
    // The worker took the change (its own report, over the control channel).
    let s = call(
        c,
        &spec,
        "GET",
        &format!("/v1/vgpus/{id}/stats"),
        None,
        200,
        "VgpuStats",
    );
    assert_eq!(
        (s["compute_share"].as_f64(), s["priority"].as_i64()),
        (Some(0.7), Some(5))
    );
    let g = c.gpus().expect("gpus");
    assert_eq!(
        (g[0].compute_committed, g[0].memory_committed_bytes),
        (0.7, 1 << 30)
    );

    let before = state_snapshot(c);
    let vg = format!("/v1/vgpus/{id}");
    // Malformed JSON, empty body, trailing garbage.
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 1"#,
        400,
        None,
    );
    refused(c, &spec, "POST", "/v1/vgpus", b"", 400, None);
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 1024, "compute_share": 0.1} {}"#,
        400,
        None,
    );
    // Unknown, missing and mistyped fields, named.
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 1024, "compute_share": 0.1, "colour": "red"}"#,
        400,
        Some("colour"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"compute_share": 0.1}"#,
        400,
        Some("memory_bytes"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": "lots", "compute_share": 0.1}"#,
        400,
        Some("memory_bytes"),
    );
    refused(
        c,
        &spec,
        "PATCH",
        &vg,
        br#"{"memory_bytes": 1}"#,
        400,
        Some("memory_bytes"),
    );
    // Values out of range.
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 1024, "compute_share": 1.5}"#,
        400,
        Some("compute_share"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 0, "compute_share": 0.1}"#,
        400,
        Some("memory_bytes"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 1024, "compute_share": 0.1, "queues": 0}"#,
        400,
        Some("queues"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 1024, "compute_share": 0.1, "share_group": "a b"}"#,
        400,
        Some("share_group"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"gpu": 9, "memory_bytes": 1024, "compute_share": 0.1}"#,
        400,
        Some("gpu"),
    );
    // Memory beyond the GPU, shares past 100%.
    let e = refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"gpu": 0, "memory_bytes": 8589934592, "compute_share": 0.1}"#,
        400,
        Some("memory_bytes"),
    );
    assert!(e.contains("more than GPU 0 has"), "{e}");
    let e = refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"gpu": 0, "memory_bytes": 1024, "compute_share": 0.4}"#,
        409,
        Some("compute_share"),
    );
    assert!(e.contains("at most 30.0% is left"), "{e}");
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"gpu": 0, "memory_bytes": 1024, "compute_share": 0.1, "copy_share": 0.6}"#,
        409,
        Some("copy_share"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"gpu": 0, "memory_bytes": 3758096384, "compute_share": 0.1}"#,
        409,
        Some("memory_bytes"),
    );
    refused(
        c,
        &spec,
        "PATCH",
        &vg,
        br#"{"compute_share": 1.01}"#,
        400,
        Some("compute_share"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus",
        br#"{"memory_bytes": 1099511627776000, "compute_share": 0.1, "oversubscribe": true}"#,
        400,
        Some("memory_bytes"),
    );
    // Unknown and malformed ids.
    refused(c, &spec, "GET", "/v1/vgpus/999", b"", 404, Some("id"));
    refused(
        c,
        &spec,
        "PATCH",
        "/v1/vgpus/999",
        br#"{"priority": 1}"#,
        404,
        Some("id"),
    );
    refused(c, &spec, "DELETE", "/v1/vgpus/999", b"", 404, Some("id"));
    refused(c, &spec, "GET", "/v1/vgpus/999/stats", b"", 404, Some("id"));
    refused(c, &spec, "GET", "/v1/vgpus/abc", b"", 400, Some("id"));
    refused(c, &spec, "GET", "/v1/vms/999", b"", 404, Some("id"));
    refused(c, &spec, "DELETE", "/v1/vms/999", b"", 404, Some("id"));
    refused(c, &spec, "GET", "/v1/vms/999/console", b"", 404, Some("id"));
    refused(c, &spec, "GET", "/v1/nothing", b"", 404, Some("path"));
    // VMs: missing payload file, relative path, Linux guests, bad sizes, conflicting vGPU.
    let e = refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"payload": "/nonexistent/payload.elf"}"#,
        400,
        Some("payload"),
    );
    assert!(e.contains("/nonexistent/payload.elf"), "{e}");
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"payload": "no-such-payload"}"#,
        400,
        Some("payload"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"payload": "rel/path"}"#,
        400,
        Some("payload"),
    );
    refused(c, &spec, "POST", "/v1/vms", br#"{}"#, 400, Some("payload"));
    let e = refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"kernel": "/boot/vmlinuz", "initrd": "/boot/initrd", "cmdline": "console=ttyS0"}"#,
        501,
        Some("kernel"),
    );
    assert!(e.contains("payload guests only"), "{e}");
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"payload": "hello", "vcpus": 0}"#,
        400,
        Some("vcpus"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"payload": "hello", "memory_bytes": 1000}"#,
        400,
        Some("memory_bytes"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"payload": "hello", "vgpu_id": 999}"#,
        400,
        Some("vgpu_id"),
    );
    refused(c, &spec, "POST", "/v1/vms", br#"{"payload": "hello", "vgpu_id": 1, "vgpu": {"memory_bytes": 1024, "compute_share": 0.1}}"#, 400, Some("vgpu"));
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms",
        br#"{"payload": "hello", "vgpu": {"gpu": 0, "memory_bytes": 1024, "compute_share": 0.5}}"#,
        409,
        Some("vgpu.compute_share"),
    );
    refused(c, &spec, "POST", "/v1/vms", br#"{"payload": "hello", "vgpu": {"memory_bytes": 1024, "compute_share": 0.1, "extra": 1}}"#, 400, Some("vgpu.extra"));
    // A migration request with a bad mode.
    refused(
        c,
        &spec,
        "POST",
        &format!("{vg}/migrate"),
        br#"{"target_gpu": 1, "mode": "warp"}"#,
        400,
        Some("mode"),
    );
    refused(
        c,
        &spec,
        "POST",
        &format!("{vg}/migrate"),
        br#"{"target": 1}"#,
        400,
        Some("target"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vgpus/999/migrate",
        b"",
        404,
        Some("id"),
    );
    refused(
        c,
        &spec,
        "POST",
        "/v1/vms/999/migrate",
        b"",
        404,
        Some("id"),
    );
    // None of that changed anything.
    assert_eq!(
        state_snapshot(c),
        before,
        "a refused request changed the state"
    );

    // Concurrent admission on GPU 1: 10 clients ask for 15% each; exactly 6 fit.
    let shared = Arc::new(c.clone());
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let c = shared.clone();
            std::thread::spawn(move || {
                c.create_vgpu(&VgpuCreate {
                    gpu: Some(1),
                    memory_bytes: 64 << 20,
                    compute_share: 0.15,
                    copy_share: Some(0.1),
                    priority: 0,
                    oversubscribe: false,
                    share_group: None,
                    queues: 1,
                    storage: Vec::new(),
                    name: None,
                    labels: Default::default(),
                    kernel_deadline_ms: None,
                    attach: Default::default(),
                    owner_uid: None,
                    owner_gid: None,
                })
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 6, "{results:?}");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.status(), Some(409), "{r}");
    }
    let g1 = &c.gpus().expect("gpus")[1];
    assert!((g1.compute_committed - 0.9).abs() < 1e-9, "{g1:?}");
    assert_eq!(g1.vgpus.len(), 6);

    // Deleting vGPUs frees their shares and stops their workers.
    for v in c.vgpus().expect("vgpus") {
        let pid = v.worker_pid.expect("worker runs");
        c.delete_vgpu(v.id).expect("delete");
        assert!(!alive(pid), "worker {pid} of vGPU {} still runs", v.id);
        assert!(
            !Path::new(&v.socket).exists(),
            "socket of vGPU {} left behind",
            v.id
        );
    }
    let g = c.gpus().expect("gpus");
    assert!(
        g.iter()
            .all(|g| g.compute_committed == 0.0 && g.memory_committed_bytes == 0),
        "{g:?}"
    );

    // Metrics in Prometheus text format.
    let m = c.metrics().expect("metrics");
    assert!(
        m.contains("vgpud_gpu_memory_bytes{gpu=\"0\"} 4294967296"),
        "{m}"
    );
    assert!(
        m.contains("# TYPE vgpud_vgpu_compute_utilization_ratio gauge"),
        "{m}"
    );

    // A second daemon on the same socket is refused and the first keeps serving.
    let sock = d.socket.display().to_string();
    let out = vgpud_command(&["--socket", &sock])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("second vgpud");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second daemon started: {err}");
    assert!(err.contains("already running"), "{err}");
    assert!(c.gpus().is_ok(), "the first daemon stopped serving");
    assert!(d.socket.exists());
}

#[test]
fn tcp_needs_a_token() {
    let dir = temp_dir("tcp");
    let out = vgpud_command(&[
        "--listen",
        "127.0.0.1:1",
        "--state-dir",
        &dir.display().to_string(),
    ])
    .stderr(Stdio::piped())
    .output()
    .expect("vgpud");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--token-file"),
        "{err}"
    );
    let out = vgpud_command(&[
        "--listen",
        "0.0.0.0:1",
        "--state-dir",
        &dir.display().to_string(),
    ])
    .stderr(Stdio::piped())
    .output()
    .expect("vgpud");
    assert!(
        !out.status.success(),
        "a non-loopback address without a token was accepted"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret-token-0123456789\n").expect("token");
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod 600");
    let addr = format!("127.0.0.1:{port}");
    let mut child = vgpud_command(&[
        "--listen",
        &addr,
        "--token-file",
        &token_file.display().to_string(),
        "--state-dir",
        &dir.join("state").display().to_string(),
    ])
    .stderr(Stdio::null())
    .spawn()
    .expect("vgpud");
    let good = Client::new(
        Endpoint::Tcp(addr.clone()),
        Some("s3cret-token-0123456789".into()),
    );
    let start = Instant::now();
    while good.gpus().is_err() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let gpus = good.gpus();
    let bad = Client::new(Endpoint::Tcp(addr.clone()), Some("wrong".into())).gpus();
    let none = Client::new(Endpoint::Tcp(addr), None).gpus();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(gpus.is_ok(), "{gpus:?}");
    for r in [bad, none] {
        match r {
            Err(ClientError::Api { status: 401, body }) => {
                assert_eq!(body.field.as_deref(), Some("authorization"))
            }
            other => panic!("expected 401, got {other:?}"),
        }
    }
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).expect("console")).into_owned()
}

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
            attach: Default::default(),
            owner_uid: None,
            owner_gid: None,
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
            memory_bytes: 512 << 20,
            compute_share: 0.6,
            copy_share: None,
            priority: 0,
            oversubscribe: false,
            share_group: None,
            queues: 1,
            storage: Vec::new(),
            name: None,
            labels: Default::default(),
            kernel_deadline_ms: None,
            attach: Default::default(),
            owner_uid: None,
            owner_gid: None,
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

#[test]
fn vgpuctl_speaks_for_every_endpoint() {
    let d = TestDaemon::start("vgpuctl", &["--sim-gpus", "1", "--sim-memory", "2G"]);
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(vgpu_tests::bins::binary("vgpuctl"))
            .arg("--socket")
            .arg(&d.socket)
            .args(args)
            .output()
            .expect("vgpuctl");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = ctl(&[
        "vgpu",
        "create",
        "--gpu",
        "0",
        "--memory",
        "512M",
        "--compute",
        "25%",
        "--copy",
        "0.2",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("25.0%") && out.contains("20.0%") && out.contains("ready"),
        "{out}"
    );
    let (code, out, _) = ctl(&["--json", "vgpu", "list"]);
    assert_eq!(code, Some(0));
    let list: Vec<vgpu_api::api::Vgpu> =
        serde_json::from_str(&out).expect("--json is the API's JSON");
    assert_eq!(list.len(), 1);
    let id = list[0].id.to_string();
    let (code, out, err) = ctl(&["vgpu", "set", &id, "--compute", "0.5", "--priority", "-1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("50.0%") && out.contains("-1"), "{out}");
    let (code, out, _) = ctl(&["gpus"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("50.0%") && out.contains("512.0 MiB"), "{out}");
    let (code, out, _) = ctl(&["--json", "vgpu", "stats", &id]);
    assert_eq!(code, Some(0));
    let s: vgpu_api::api::VgpuStats = serde_json::from_str(&out).expect("stats JSON");
    assert_eq!(s.compute_share, 0.5);
    let (code, out, _) = ctl(&["top", "--count", "1"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("vgpuctl top") && out.contains("UTIL"), "{out}");
    let (code, out, _) = ctl(&["metrics"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("vgpud_gpu_memory_bytes"), "{out}");
    // Refusals name the field; --json prints the error body.
    let (code, _, err) = ctl(&[
        "--json",
        "vgpu",
        "create",
        "--gpu",
        "0",
        "--memory",
        "1G",
        "--compute",
        "60%",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("\"field\":\"compute_share\"") && err.contains("at most 50.0% is left"),
        "{err}"
    );
    let (code, _, err) = ctl(&["vgpu", "migrate", &id, "--target-gpu", "7"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("there is no GPU 7"), "{err}");
    let (code, _, err) = ctl(&[
        "vm",
        "launch",
        "--payload",
        "/nonexistent.elf",
        "--vgpu",
        &id,
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--payload: "), "{err}");
    let (code, _, err) = ctl(&["vm", "show", "42"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404") && err.contains("no VM 42"), "{err}");
    let (code, out, err) = ctl(&["vgpu", "delete", &id]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("deleted"), "{out}");
    // No daemon: a clear message and exit code 3.
    let out = std::process::Command::new(vgpu_tests::bins::binary("vgpuctl"))
        .args(["--socket", "/nonexistent/vgpud.sock", "gpus"])
        .output()
        .expect("vgpuctl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("vgpud is not running at /nonexistent/vgpud.sock"),
        "{err}"
    );
}

#[test]
fn the_demo_runs_and_cleans_up() {
    require_kvm!();
    let dir = temp_dir("demo");
    let plot = dir.join("u.png");
    for bin in ["vgpud", "vgpu-worker", "vmm"] {
        vgpu_tests::bins::binary(bin);
    }
    // Without CARGO in its environment the demo uses the binaries beside it as they are.
    let out = std::process::Command::new(vgpu_tests::bins::binary("vgpu-demo"))
        .env_remove("CARGO")
        .args([
            "--rounds",
            "60",
            "--spin-us",
            "2000",
            "--max-seconds",
            "60",
            "--plot",
        ])
        .arg(&plot)
        .stdin(Stdio::null())
        .output()
        .expect("vgpu-demo");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{text}\n{err}");
    assert_eq!(text.matches("GPU-LOAD OK rounds=60").count(), 2, "{text}");
    assert!(
        text.contains("0 left-over processes, state directory removed"),
        "{text}"
    );
    let png = std::fs::read(&plot).expect("the plot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "not a plot"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
