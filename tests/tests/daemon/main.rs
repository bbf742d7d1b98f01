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

mod cli;
mod contract;
mod lifecycle;

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

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).expect("console")).into_owned()
}
