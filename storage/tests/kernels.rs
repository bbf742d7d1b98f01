//! Storage kernels give the same answers as the in-memory computation.

mod common;

use common::*;
use vgpu_storage::kernels::{self, CsrGraph};
use vgpu_storage::{Namespace, NamespaceOptions, PageCache, StorageArray};

#[test]
fn random_gather_equals_in_memory() {
    let words = 1u64 << 17; // 1 MiB
    let f = pattern_file("gather", words);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    // A cache smaller than the data, so lines are evicted and refetched.
    let cache = PageCache::new(ns, 4096, 64).unwrap();
    let a: StorageArray<u64> = StorageArray::new(cache.clone(), 0, words).unwrap();
    let mut rng = Rng(42);
    let idx: Vec<u64> = (0..20_000).map(|_| rng.next() % words).collect();
    let got = kernels::gather(&a, &idx, 8).unwrap();
    let want: Vec<u64> = idx.iter().map(|&i| pattern(i)).collect();
    assert_eq!(got, want);
    let st = cache.stats();
    assert!(st.evictions > 0, "{st:?}");
}

#[test]
fn warp_lanes_on_one_line_issue_one_io() {
    let f = pattern_file("coalesce", 1 << 14);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    let cache = PageCache::new(ns, 4096, 16).unwrap();
    let a: StorageArray<u64> = StorageArray::new(cache.clone(), 0, 1 << 14).unwrap();
    // 32 lanes all inside line 3 (512 u64 per line), in scrambled order.
    let idx: Vec<u64> = (0..32).map(|l| 3 * 512 + (l * 37) % 512).collect();
    let mut out = [0u64; 32];
    a.warp_get(&idx, &mut out).unwrap();
    assert_eq!(cache.stats().misses, 1);
    assert_eq!(cache.stats().bytes_read, 4096);
    for (l, &i) in idx.iter().enumerate() {
        assert_eq!(out[l], pattern(i));
    }
}

#[test]
fn scan_sum_equals_in_memory() {
    let words = 1u64 << 16;
    let f = pattern_file("scan", words);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    let cache = PageCache::new(ns, 8192, 32).unwrap();
    // Skip the first 3 words to start mid-line.
    let a: StorageArray<u64> = StorageArray::new(cache, 24, words - 3).unwrap();
    let got = kernels::scan_sum(&a, 4).unwrap();
    let want = (3..words).fold(0u64, |s, i| s.wrapping_add(pattern(i)));
    assert_eq!(got, want);
}

#[test]
fn bfs_on_storage_equals_in_memory() {
    // A random graph: 20k vertices, ~8 out-edges each, plus a chain so most are reachable.
    let n = 20_000u32;
    let mut rng = Rng(9);
    let mut adj: Vec<Vec<u32>> = (0..n).map(|_| Vec::new()).collect();
    for v in 0..n {
        if v + 1 < n && v % 7 != 0 {
            adj[v as usize].push(v + 1);
        }
        for _ in 0..(rng.next() % 9) {
            adj[v as usize].push((rng.next() % n as u64) as u32);
        }
    }
    let mut offsets = vec![0u64];
    let mut edges = Vec::new();
    for l in &adj {
        edges.extend_from_slice(l);
        offsets.push(edges.len() as u64);
    }
    let off_bytes: Vec<u8> = offsets.iter().flat_map(|x| x.to_le_bytes()).collect();
    let pad = (4096 - off_bytes.len() % 4096) % 4096;
    let edge_bytes: Vec<u8> = edges.iter().flat_map(|x| x.to_le_bytes()).collect();
    let tail = vec![0u8; 4096];
    let f = file_with("bfs", &[&off_bytes, &vec![0u8; pad], &edge_bytes, &tail]);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    let cache = PageCache::new(ns, 4096, 128).unwrap();
    let g = CsrGraph {
        offsets: StorageArray::new(cache.clone(), 0, offsets.len() as u64).unwrap(),
        edges: StorageArray::new(cache, (off_bytes.len() + pad) as u64, edges.len() as u64)
            .unwrap(),
    };
    for src in [1u32, 12_345] {
        let got = kernels::bfs(&g, src, 8).unwrap();
        let want = kernels::bfs_in_memory(&offsets, &edges, src);
        assert_eq!(got, want, "source {src}");
        assert!(want.iter().filter(|&&l| l != u32::MAX).count() > 1000);
    }
}
