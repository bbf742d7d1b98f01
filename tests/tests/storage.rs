//! GPU-initiated storage end to end: a namespace file attached to a vGPU through
//! vgpud's REST API, read by the built-in storage kernels (gather, scan-sum, BFS) that a
//! payload guest launches, every result checked by the guest against its own computation;
//! bad input (unknown namespace, offsets past the end, a namespace whose file vanished)
//! gets error statuses; bad specs get 400s naming the field.

use std::path::Path;
use std::time::Duration;

use vgpu_api::api::{StorageAttachment, VgpuCreate, VgpuState, VmCreate, VmState};
use vgpu_api::client::Client;
use vgpu_tests::daemon::TestDaemon;
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;
const DEG_SALT: u64 = 0xD1B5_4A32_D192_ED03;

// The namespace layout the `storage` payload recomputes (see its module documentation).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn round4k(x: u64) -> u64 {
    x.div_ceil(4096) * 4096
}

/// Writes the namespace of (`seed`, `words`, `vertices`) to `path`; returns its size.
fn write_namespace(path: &Path, seed: u64, words: u64, vertices: u64) -> u64 {
    let mut offsets = vec![0u64];
    let mut edges: Vec<u32> = Vec::new();
    for v in 0..vertices {
        let deg = mix((seed ^ DEG_SALT).wrapping_add(v)) % 6;
        for k in 0..deg {
            let u = mix(seed.wrapping_mul(3).wrapping_add(v << 8).wrapping_add(k)) % vertices;
            edges.push(u as u32);
        }
        offsets.push(edges.len() as u64);
    }
    let offsets_base = round4k(words * 8);
    let edges_base = round4k(offsets_base + (vertices + 1) * 8);
    let total = round4k(edges_base + edges.len() as u64 * 4);
    let mut bytes = vec![0u8; total as usize];
    for i in 0..words {
        let w = mix(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i));
        let at = (i * 8) as usize;
        bytes[at..at + 8].copy_from_slice(&w.to_le_bytes());
    }
    for (v, o) in offsets.iter().enumerate() {
        let at = offsets_base as usize + v * 8;
        bytes[at..at + 8].copy_from_slice(&o.to_le_bytes());
    }
    for (k, e) in edges.iter().enumerate() {
        let at = edges_base as usize + k * 4;
        bytes[at..at + 4].copy_from_slice(&e.to_le_bytes());
    }
    std::fs::write(path, &bytes).expect("write namespace file");
    total
}

fn spec(storage: Vec<StorageAttachment>) -> VgpuCreate {
    // A cuda share holds the context's reserve (273 MiB on the H200) and the GPU storage
    // setup (64 MiB of cache lines per namespace) beside the guest's allocations.
    let cuda = std::env::var("VGPU_TEST_BACKEND").is_ok_and(|b| b == "cuda");
    VgpuCreate {
        gpu: Some(0),
        storage,
        ..VgpuCreate::new(if cuda { 1 << 30 } else { 64 * MIB }, 0.5)
    }
}

fn att(namespace: u32, path: &Path) -> StorageAttachment {
    StorageAttachment {
        namespace,
        path: path.display().to_string(),
        read_only: true,
    }
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

#[test]
fn a_guest_runs_storage_kernels_on_an_attached_namespace() {
    require_kvm!();
    // VGPU_TEST_BACKEND=cuda runs it on the GPU machine: GPU threads enqueue the reads.
    let cuda = std::env::var("VGPU_TEST_BACKEND").is_ok_and(|b| b == "cuda");
    let args: &[&str] = if cuda {
        &["--backend", "cuda"]
    } else {
        &["--sim-gpus", "1", "--sim-memory", "256M"]
    };
    let d = TestDaemon::start("storage", args);
    let c = &d.client;
    let (seed, words, vertices) = (7u64, 1u64 << 18, 20_000u64);
    // Namespace files live outside vgpud's state directory (0700, vgpud's own): the worker
    // opens them as its own user.
    let files = vgpu_tests::daemon::temp_dir("storage-files");
    let data = files.join("ns1.bin");
    let size = write_namespace(&data, seed, words, vertices);
    let gone = files.join("ns2.bin");
    std::fs::write(&gone, vec![1u8; 8192]).expect("write");

    // The vGPU with two namespaces; shown as given.
    let v = c
        .create_vgpu(&spec(vec![att(1, &data), att(2, &gone)]))
        .expect("create vGPU");
    assert_eq!(v.state, VgpuState::Ready);
    let shown = c.vgpu(v.id).expect("get vGPU").storage;
    assert_eq!(shown, vec![att(1, &data), att(2, &gone)]);
    // Namespace 2's file vanishes after the operator attached it: the guest's attach
    // fails with DEVICE_ERROR; namespace 1 is unaffected.
    std::fs::remove_file(&gone).expect("rm");

    let vm = c
        .create_vm(&VmCreate {
            payload: Some(vgpu_tests::bins::payload("storage").display().to_string()),
            payload_arg: format!("seed={seed} words={words} vertices={vertices} missing=2"),
            memory_bytes: 64 * MIB,
            vgpu_id: Some(v.id),
            ..Default::default()
        })
        .expect("vm");
    let done = c.wait_vm(vm.id, Duration::from_secs(120)).expect("wait");
    let out = console(c, vm.id);
    assert_eq!(done.state, VmState::Exited { code: 0 }, "console:\n{out}");
    eprintln!("{out}");
    assert!(out.contains("STORAGE OK"), "console:\n{out}");
    assert!(out.contains("bad_input=9"), "console:\n{out}");
    assert!(
        out.contains(&format!("namespace 1: handle 1 {size} bytes")),
        "console:\n{out}"
    );
    // Every bad input was answered; the worker survived them all and ended cleanly.
    let stats = c.vgpu_stats(v.id).expect("stats");
    assert!(stats.errors >= 9, "{stats:?}");
    assert!(stats.kernels >= 7, "{stats:?}");
}

#[test]
fn bad_storage_specs_name_their_field() {
    let d = TestDaemon::start("storage-bad", &["--sim-gpus", "1", "--sim-memory", "256M"]);
    let c = &d.client;
    let files = vgpu_tests::daemon::temp_dir("storage-files");
    let good = files.join("good.bin");
    std::fs::write(&good, vec![0u8; 4096]).expect("write");
    let empty = files.join("empty.bin");
    std::fs::write(&empty, b"").expect("write");
    let missing = d.dir.join("missing.bin");
    for (storage, field, says) in [
        (vec![att(1, &missing)], "storage[0].path", "No such file"),
        (
            vec![att(1, &good), att(1, &good)],
            "storage[1].namespace",
            "twice",
        ),
        (vec![att(0, &good)], "storage[0].namespace", "1..=65535"),
        (vec![att(1, &empty)], "storage[0].path", "512-byte block"),
        (vec![att(1, &d.dir)], "storage[0].path", "regular file"),
    ] {
        let e = c.create_vgpu(&spec(storage)).expect_err("invalid spec");
        assert_eq!(e.status(), Some(400), "{e}");
        let body = e.body().expect("error body");
        assert_eq!(body.field.as_deref(), Some(field), "{e}");
        assert!(body.error.contains(says), "{e}");
    }
    // The same inside a VM's inline vGPU.
    let e = c
        .create_vm(&VmCreate {
            payload: Some(vgpu_tests::bins::payload("hello").display().to_string()),
            memory_bytes: 64 * MIB,
            vgpu: Some(spec(vec![att(3, &missing)])),
            ..Default::default()
        })
        .expect_err("invalid inline spec");
    assert_eq!(
        e.body().and_then(|b| b.field.as_deref()),
        Some("vgpu.storage[0].path"),
        "{e}"
    );
    // Unknown fields are refused too.
    let r = c
        .raw(
            "POST",
            "/v1/vgpus",
            Some(br#"{"memory_bytes": 1048576, "compute_share": 0.1, "storage": [{"namespace": 1, "path": "/x", "mode": "ro"}]}"#),
        )
        .expect("raw");
    assert_eq!(r.status, 400);
    assert!(c.vgpus().expect("list").is_empty(), "nothing was created");
}
