//! vgpud's REST surface under a hostile client: an object wherever the spec says object,
//! a JSON error body on every error (unknown paths, wrong methods with `Allow`), a body
//! size limit, and a deadline for a body that never comes.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_api::client::Client;
use vgpu_tests::daemon::TestDaemon;

/// An error answer: its status, and its body as JSON with a non-empty `error`.
fn json_error(c: &Client, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Value) {
    let r = c.raw(method, path, body).expect("request");
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        r.content_type.starts_with("application/json"),
        "{method} {path}: {} answered {:?}: {text}",
        r.status,
        r.content_type
    );
    let v: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{method} {path}: {text}"
    );
    (r.status, v)
}

/// Sends `head` (and nothing more) and returns what came back before the daemon closed
/// the connection, and how long that took.
fn raw_exchange(socket: &std::path::Path, head: &str) -> (String, Duration) {
    let mut s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let t0 = Instant::now();
    s.write_all(head.as_bytes()).expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "the daemon kept the connection open ({e}) after {:?}; got {:?}",
                t0.elapsed(),
                String::from_utf8_lossy(&out)
            ),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), t0.elapsed())
}

#[test]
fn arrays_and_scalars_are_refused_where_the_spec_says_object() {
    let d = TestDaemon::start("strict-shape", &["--sim-gpus", "1"]);
    let c = &d.client;
    for (method, path, body, names) in [
        ("POST", "/v1/vgpus", &b"[0,16777216,0.1]"[..], "VgpuCreate"),
        ("POST", "/v1/vgpus", b"42", "VgpuCreate"),
        ("POST", "/v1/vgpus", b"\"x\"", "VgpuCreate"),
        ("PATCH", "/v1/vgpus/1", b"[0.5]", "VgpuPatch"),
        ("POST", "/v1/vms", b"[\"hello\"]", "VmCreate"),
        ("POST", "/v1/vgpus/1/migrate", b"[1]", "MigrateRequest"),
    ] {
        let (status, v) = json_error(c, method, path, Some(body));
        assert_eq!(status, 400, "{method} {path} {v}");
        let e = v["error"].as_str().unwrap_or_default();
        assert!(
            e.contains(names) && e.contains("object"),
            "{method} {path}: {e}"
        );
    }
    let (status, v) = json_error(
        c,
        "POST",
        "/v1/vms",
        Some(br#"{"payload": "hello", "vgpu": [null, 16777216, 0.1]}"#),
    );
    assert_eq!((status, v["field"].as_str()), (400, Some("vgpu")), "{v}");
    assert!(c.vgpus().expect("list").is_empty(), "nothing was created");
}

#[test]
fn every_error_has_a_json_body() {
    let d = TestDaemon::start("strict-errors", &["--sim-gpus", "1"]);
    let c = &d.client;
    let (status, v) = json_error(c, "GET", "/v1/nothing-here", None);
    assert_eq!((status, v["field"].as_str()), (404, Some("path")), "{v}");
    for (method, path, allowed) in [
        ("PUT", "/v1/vgpus", "GET,POST"),
        ("DELETE", "/v1/gpus", "GET,HEAD"),
        ("POST", "/v1/vgpus/1", "GET,HEAD,PATCH,DELETE"),
        ("GET", "/v1/vgpus/1/migrate", "POST"),
    ] {
        let (status, v) = json_error(c, method, path, None);
        assert_eq!((status, v["field"].as_str()), (405, Some("method")), "{v}");
        assert!(
            v["error"].as_str().unwrap_or_default().contains(method),
            "{v}"
        );
        let (head, _) = raw_exchange(
            &d.socket,
            &format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        );
        let lower = head.to_ascii_lowercase();
        assert!(lower.starts_with("http/1.1 405"), "{head}");
        let allow = lower
            .lines()
            .find_map(|l| l.strip_prefix("allow: "))
            .unwrap_or_default()
            .replace(' ', "");
        for m in allowed.split(',') {
            assert!(
                allow.split(',').any(|a| a.eq_ignore_ascii_case(m)),
                "{method} {path}: Allow {allow:?} lacks {m}"
            );
        }
    }
}

#[test]
fn oversized_and_missing_bodies_are_answered_and_closed() {
    let d = TestDaemon::start("strict-size", &["--sim-gpus", "1"]);
    // Announced far past the limit: refused before a byte of it is read.
    let (head, took) = raw_exchange(
        &d.socket,
        "POST /v1/vgpus HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.contains("\"error\""), "{head}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // Sent past the limit without announcing its length (chunked).
    let chunk = vec![b' '; (1 << 20) + 16];
    let mut s = UnixStream::connect(&d.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = "POST /v1/vgpus HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    // The daemon may answer and close before it all went out.
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()))
        .and_then(|()| s.write_all(&chunk))
        .and_then(|()| s.write_all(b"\r\n0\r\n\r\n"));
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    // Announced, never sent: answered 408 and closed after the deadline.
    let (head, took) = raw_exchange(
        &d.socket,
        "POST /v1/vgpus HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(head.contains("\"error\""), "{head}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    // The daemon still serves.
    assert_eq!(d.client.gpus().expect("gpus").len(), 1);
}
