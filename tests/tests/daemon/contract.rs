//! The REST contract against docs/openapi.json, bad input, concurrency and auth.

use super::*;

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
                    copy_share: Some(0.1),
                    ..VgpuCreate::new(64 << 20, 0.15)
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
