use super::*;
use crate::storage::{NamespaceSpec, StorageSet};
use std::sync::Arc;

/// A namespace file of `words` u64s, word i = i * 3 + 1.
fn file(tag: &str, words: u64) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("vgpu-sim-storage-{}-{tag}", std::process::id()));
    let b: Vec<u8> = (0..words).flat_map(|i| (i * 3 + 1).to_le_bytes()).collect();
    std::fs::write(&p, b).expect("write");
    p
}

fn gpu_on(path: &std::path::Path) -> (SimGpu, Arc<StorageSet>) {
    let set = Arc::new(
        StorageSet::new(vec![NamespaceSpec {
            id: 1,
            path: path.to_owned(),
            read_only: true,
        }])
        .expect("set"),
    );
    (gpu().with_storage(set.clone()), set)
}

#[test]
fn storage_kernels_read_the_namespace() {
    let p = file("read", 4096);
    let (g, set) = gpu_on(&p);
    let gather = builtin_fn(&g, "storage_gather");
    let scan = builtin_fn(&g, "storage_scan_sum");
    let idx = g.alloc(64 * 8).expect("alloc").addr;
    let dst = g.alloc(64 * 8).expect("alloc").addr;
    let out = g.alloc(8).expect("alloc").addr;
    let ix: Vec<u64> = (0..64).map(|i| (i * 61) % 4096).collect();
    put(
        &g,
        idx,
        &ix.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    )
    .expect("idx");
    let args = |ns| {
        [
            ArgValue::U64(ns),
            ArgValue::U64(0),
            r(idx),
            w(dst),
            ArgValue::U32(64),
            ArgValue::U32(8),
        ]
    };
    // Not attached yet: the kernel is refused, nothing hangs.
    let e = g
        .launch_one(gather, &CFG, &args(1))
        .expect_err("not attached");
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert_eq!(set.attach(1).expect("attach").bytes, 4096 * 8);
    g.launch_one(gather, &CFG, &args(1)).expect("gather");
    let got = get(&g, dst, 64 * 8).expect("dst");
    for (k, c) in got.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        assert_eq!(v, ix[k] * 3 + 1, "lane {k}");
    }
    let sum_args = [
        ArgValue::U64(1),
        ArgValue::U64(8),
        ArgValue::U64(100),
        ArgValue::U32(8),
        w(out),
    ];
    g.launch_one(scan, &CFG, &sum_args).expect("scan");
    let want: u64 = (1..101u64).map(|i| i * 3 + 1).sum();
    assert_eq!(get(&g, out, 8).expect("out"), want.to_le_bytes());
    // The storage kernels need their pointers' access modes like any other.
    let mut bad = sum_args;
    bad[4] = r(out);
    let e = g
        .launch_one(scan, &CFG, &bad)
        .expect_err("read-only output");
    assert_eq!(e.status(), Status::BadArgType, "{e}");
    let _ = std::fs::remove_file(p);
}

#[test]
fn a_namespace_truncated_under_a_kernel_gives_a_device_error() {
    let p = file("trunc", 1 << 16);
    let (g, set) = gpu_on(&p);
    set.attach(1).expect("attach");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open")
        .set_len(4096)
        .expect("truncate");
    let scan = builtin_fn(&g, "storage_scan_sum");
    let out = g.alloc(8).expect("alloc").addr;
    let t = Instant::now();
    let e = g
        .launch_one(
            scan,
            &CFG,
            &[
                ArgValue::U64(1),
                ArgValue::U64(0),
                ArgValue::U64(1 << 16),
                ArgValue::U32(8),
                w(out),
            ],
        )
        .expect_err("read error");
    assert_eq!(e.status(), Status::DeviceError, "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "no hang");
    let _ = std::fs::remove_file(p);
}

#[test]
fn without_storage_the_kernels_are_not_supported() {
    let g = gpu();
    let scan = builtin_fn(&g, "storage_scan_sum");
    let out = g.alloc(8).expect("alloc").addr;
    let e = g
        .launch_one(
            scan,
            &CFG,
            &[
                ArgValue::U64(1),
                ArgValue::U64(0),
                ArgValue::U64(1),
                ArgValue::U32(8),
                w(out),
            ],
        )
        .expect_err("no storage");
    assert_eq!(e.status(), Status::NotSupported, "{e}");
}
