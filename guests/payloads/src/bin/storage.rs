//! GPU-initiated storage from a guest: attaches storage namespace 1, runs the
//! built-in storage kernels (gather, scan-sum, BFS) on it and compares every result with
//! its own in-memory computation of the same data, then checks that bad input gets error
//! statuses and that the device keeps working after them.
//!
//! The namespace holds, from a `seed` (the host test writes the same bytes):
//! - at byte 0, `words` u64 values `word(seed, i)`;
//! - at byte `offsets_base` = `words * 8` rounded up to 4 KiB, the `vertices + 1` u64
//!   offsets of a CSR graph: vertex v has `mix(seed ^ DEG_SALT + v) % 6` neighbours,
//!   neighbour k of v is `mix(seed * 3 + (v << 8) + k) % vertices`;
//! - at byte `edges_base` = the end of the offsets rounded up to 4 KiB, the u32 edges;
//! - zeros up to the next 4 KiB.
//!
//! Arguments: `seed=<s>` (default 1), `words=<w>` (default 262144), `vertices=<n>`
//! (default 20000), `missing=<id>`: a namespace the operator attached whose file is gone
//! (its attach must fail with DEVICE_ERROR). The last line is
//! `STORAGE OK gather=<n> scan=0x... bfs_reached=<r> bfs_depth=<d> bad_input=<k>` and exit 0;
//! otherwise a diagnostic and 2 bad argument, 3 no vGPU, 4 driver/device error,
//! 6 mismatch, 7 a bad input that was not refused as it should be.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::vec;
use alloc::vec::Vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::{features, Access, KernelArg, Status};
use guest_driver::Error;
use payload_rt::vgpu::{open_single, GpuStream};
use payload_rt::{println, Args, BootInfo};

payload_rt::entry!(main);

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_MISMATCH: u8 = 6;
const EXIT_NOT_REFUSED: u8 = 7;

const DEG_SALT: u64 = 0xD1B5_4A32_D192_ED03;
/// Lanes per gather.
const GATHER_N: usize = 4096;

struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("storage: FAIL {what}");
    Failure(code)
}

fn driver(what: &'static str) -> impl Fn(Error) -> Failure {
    move |e| fail(EXIT_DRIVER, format_args!("{what}: {e}"))
}

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    match run(boot, Args::new(args)) {
        Ok(()) => 0,
        Err(Failure(code)) => code,
    }
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn word(seed: u64, i: u64) -> u64 {
    mix(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i))
}

fn round4k(x: u64) -> u64 {
    x.div_ceil(4096) * 4096
}

/// The CSR graph of `seed`.
fn graph(seed: u64, n: u64) -> (Vec<u64>, Vec<u32>) {
    let mut offsets = Vec::with_capacity(n as usize + 1);
    let mut edges = Vec::new();
    offsets.push(0);
    for v in 0..n {
        let deg = mix((seed ^ DEG_SALT).wrapping_add(v)) % 6;
        for k in 0..deg {
            let u = mix(seed.wrapping_mul(3).wrapping_add(v << 8).wrapping_add(k)) % n;
            edges.push(u as u32);
        }
        offsets.push(edges.len() as u64);
    }
    (offsets, edges)
}

fn bfs(offsets: &[u64], edges: &[u32], source: u32) -> Vec<u32> {
    let n = offsets.len() - 1;
    let mut levels = vec![u32::MAX; n];
    let mut q = VecDeque::new();
    levels[source as usize] = 0;
    q.push_back(source);
    while let Some(v) = q.pop_front() {
        let (lo, hi) = (
            offsets[v as usize] as usize,
            offsets[v as usize + 1] as usize,
        );
        for &u in &edges[lo..hi] {
            if levels[u as usize] == u32::MAX {
                levels[u as usize] = levels[v as usize] + 1;
                q.push_back(u);
            }
        }
    }
    levels
}

fn le64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

/// Expects `r` to fail with `want`.
fn refused<T>(r: Result<T, Error>, want: Status, what: &str) -> Result<(), Failure> {
    match r {
        Err(Error::Device { status, .. }) if status == want => {
            println!("storage: refused as expected ({want:?}): {what}");
            Ok(())
        }
        Err(e) => Err(fail(
            EXIT_NOT_REFUSED,
            format_args!("{what}: got {e}, want status {want:?}"),
        )),
        Ok(_) => Err(fail(
            EXIT_NOT_REFUSED,
            format_args!("{what}: succeeded, want status {want:?}"),
        )),
    }
}

fn run(boot: &BootInfo, args: Args) -> Result<(), Failure> {
    let num = |key, default| {
        args.number(key, default)
            .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))
    };
    let seed = num("seed", 1)?;
    let words = num("words", 1 << 18)?;
    let vertices = num("vertices", 20_000)?;
    let missing = num("missing", 0)?;
    if !(2..=1 << 24).contains(&words) || !(2..=1 << 22).contains(&vertices) {
        return Err(fail(
            EXIT_BAD_ARGS,
            format_args!("words must be 2..=2^24 and vertices 2..=2^22"),
        ));
    }
    let (offsets, edges) = graph(seed, vertices);
    let offsets_base = round4k(words * 8);
    let edges_base = round4k(offsets_base + (vertices + 1) * 8);
    let total = round4k(edges_base + edges.len() as u64 * 4);

    let (_gpu, mut s) = open_single(boot).map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    let info = s.get_info().map_err(driver("GET_INFO"))?;
    if info.features & features::STORAGE == 0 {
        return Err(fail(
            EXIT_NO_DEVICE,
            format_args!("vGPU {} has no STORAGE feature", info.vgpu_id),
        ));
    }
    let ns = s
        .storage_attach_info(1)
        .map_err(driver("STORAGE_ATTACH 1"))?;
    println!(
        "storage: vGPU {} namespace 1: handle {} {} bytes, {}-byte blocks, read_only={}",
        info.vgpu_id, ns.handle, ns.bytes, ns.block_size, ns.read_only
    );
    if ns.bytes != total {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("namespace holds {} bytes, want {total}", ns.bytes),
        ));
    }
    let h = ns.handle;
    let module = s.load_builtin().map_err(driver("MODULE_LOAD builtin"))?;
    let func = |s: &mut GpuStream, name: &'static str| {
        s.get_function(module, name)
            .map(|f| f.handle)
            .map_err(driver("GET_FUNCTION"))
    };
    let (f_gather, f_scan, f_bfs) = (
        func(&mut s, "storage_gather")?,
        func(&mut s, "storage_scan_sum")?,
        func(&mut s, "storage_bfs")?,
    );
    let didx = s
        .alloc((GATHER_N * 8) as u64)
        .map_err(driver("ALLOC idx"))?;
    let ddst = s
        .alloc((GATHER_N * 8) as u64)
        .map_err(driver("ALLOC dst"))?;
    let dout = s.alloc(8).map_err(driver("ALLOC out"))?;
    let dlevels = s.alloc(vertices * 4).map_err(driver("ALLOC levels"))?;
    let mut host = vec![0u8; GATHER_N * 8];
    let mut got = vec![0u8; GATHER_N * 8];

    // Gather: u64 elements, then u32 elements over the same bytes.
    for (round, eb) in [(0u64, 8u64), (1, 4)] {
        let len = words * 8 / eb;
        let idx: Vec<u64> = (0..GATHER_N as u64)
            .map(|i| mix(seed ^ (round << 40) ^ (i << 1)) % len)
            .collect();
        for (c, v) in host.chunks_mut(8).zip(&idx) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        s.memcpy_htod(didx, &host)
            .map_err(driver("MEMCPY_HTOD idx"))?;
        let gather = |s: &mut GpuStream, ns: u64, base: u64, idx: u64, n: u64, eb: u64| {
            s.launch(
                &launch_1d(f_gather, n, 256),
                &[
                    KernelArg::u64(ns),
                    KernelArg::u64(base),
                    KernelArg::ptr(idx, Access::Read),
                    KernelArg::ptr(ddst, Access::Write),
                    KernelArg::u64(n),
                    KernelArg::u32(eb as u32),
                ],
            )
        };
        gather(&mut s, h, 0, didx, GATHER_N as u64, eb).map_err(driver("LAUNCH storage_gather"))?;
        let out = &mut got[..GATHER_N * eb as usize];
        s.memcpy_dtoh(out, ddst)
            .map_err(driver("MEMCPY_DTOH dst"))?;
        for (i, &j) in idx.iter().enumerate() {
            let want = if eb == 8 {
                word(seed, j)
            } else {
                (word(seed, j / 2) >> (32 * (j % 2))) & 0xffff_ffff
            };
            let e = eb as usize;
            let mut b = [0u8; 8];
            b[..e].copy_from_slice(&out[i * e..(i + 1) * e]);
            if u64::from_le_bytes(b) != want {
                return Err(fail(
                    EXIT_MISMATCH,
                    format_args!(
                        "gather ({eb}-byte) lane {i} index {j}: {:#x}, want {want:#x}",
                        u64::from_le_bytes(b)
                    ),
                ));
            }
        }
        if round == 1 {
            // An index past the namespace faults before any read; the lanes are checked.
            let bad = ns.bytes / eb;
            host[8 * 17..8 * 18].copy_from_slice(&bad.to_le_bytes());
            s.memcpy_htod(didx, &host)
                .map_err(driver("MEMCPY_HTOD idx"))?;
            refused(
                gather(&mut s, h, 0, didx, GATHER_N as u64, eb),
                Status::KernelFault,
                "storage_gather with an index past the namespace",
            )?;
            refused(
                gather(&mut s, h, 0, didx, 4, 3),
                Status::InvalidArgument,
                "storage_gather with elem_bytes 3",
            )?;
            refused(
                gather(&mut s, 99, 0, didx, 4, 8),
                Status::InvalidArgument,
                "storage_gather on a namespace that is not attached",
            )?;
        }
    }
    println!("storage: gather ok ({GATHER_N} lanes, 8- and 4-byte elements)");

    // Scan-sum: the whole data region as u64s and as u32s.
    let scan = |s: &mut GpuStream, base: u64, n: u64, eb: u32| {
        s.launch(
            &launch_1d(f_scan, n, 256),
            &[
                KernelArg::u64(h),
                KernelArg::u64(base),
                KernelArg::u64(n),
                KernelArg::u32(eb),
                KernelArg::ptr(dout, Access::Write),
            ],
        )?;
        let mut b = [0u8; 8];
        s.memcpy_dtoh(&mut b, dout)?;
        Ok::<u64, Error>(le64(&b))
    };
    let want64 = (0..words).fold(0u64, |a, i| a.wrapping_add(word(seed, i)));
    let want32 = (0..words).fold(0u64, |a, i| {
        let w = word(seed, i);
        a.wrapping_add(w & 0xffff_ffff).wrapping_add(w >> 32)
    });
    let got64 = scan(&mut s, 0, words, 8).map_err(driver("storage_scan_sum u64"))?;
    let got32 = scan(&mut s, 0, words * 2, 4).map_err(driver("storage_scan_sum u32"))?;
    if got64 != want64 || got32 != want32 {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("scan sums {got64:#x} / {got32:#x}, want {want64:#x} / {want32:#x}"),
        ));
    }
    // The edges as u32s, read where the graph lies.
    let want_edges = edges
        .iter()
        .fold(0u64, |a, &e| a.wrapping_add(u64::from(e)));
    let got_edges = scan(&mut s, edges_base, edges.len() as u64, 4)
        .map_err(driver("storage_scan_sum edges"))?;
    if got_edges != want_edges {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("edge sum {got_edges:#x}, want {want_edges:#x}"),
        ));
    }
    refused(
        scan(&mut s, ns.bytes - 8, 2, 8),
        Status::InvalidArgument,
        "storage_scan_sum past the end of the namespace",
    )?;
    refused(
        scan(&mut s, u64::MAX - 7, 1, 8),
        Status::InvalidArgument,
        "storage_scan_sum at byte 2^64-8",
    )?;
    println!("storage: scan ok ({words} words)");

    // BFS from two sources.
    let mut depth = 0u32;
    let mut reached = 0usize;
    let mut lv = vec![0u8; vertices as usize * 4];
    let bfs_launch = |s: &mut GpuStream, n: u64, m: u64, src: u64| {
        s.launch(
            &launch_1d(f_bfs, n, 256),
            &[
                KernelArg::u64(h),
                KernelArg::u64(offsets_base),
                KernelArg::u64(edges_base),
                KernelArg::u64(n),
                KernelArg::u64(m),
                KernelArg::u64(src),
                KernelArg::ptr(dlevels, Access::Write),
            ],
        )
    };
    for src in [0u32, (vertices / 2) as u32] {
        bfs_launch(&mut s, vertices, edges.len() as u64, u64::from(src))
            .map_err(driver("LAUNCH storage_bfs"))?;
        s.memcpy_dtoh(&mut lv, dlevels)
            .map_err(driver("MEMCPY_DTOH levels"))?;
        let want = bfs(&offsets, &edges, src);
        for (v, w) in want.iter().enumerate() {
            let g = u32::from_le_bytes([lv[4 * v], lv[4 * v + 1], lv[4 * v + 2], lv[4 * v + 3]]);
            if g != *w {
                return Err(fail(
                    EXIT_MISMATCH,
                    format_args!("bfs from {src}: level of vertex {v} is {g}, want {w}"),
                ));
            }
        }
        reached = reached.max(want.iter().filter(|l| **l != u32::MAX).count());
        depth = depth.max(
            want.iter()
                .filter(|l| **l != u32::MAX)
                .max()
                .copied()
                .unwrap_or(0),
        );
    }
    refused(
        bfs_launch(&mut s, vertices, edges.len() as u64, vertices),
        Status::InvalidArgument,
        "storage_bfs from a source past the vertices",
    )?;
    // Too few edges for the offsets (a malformed graph), from a vertex with two neighbours
    // or more so the first level already reads past them.
    let busy = (0..vertices as usize)
        .find(|&v| offsets[v + 1] - offsets[v] >= 2)
        .unwrap_or(0) as u64;
    refused(
        bfs_launch(&mut s, vertices, 1, busy),
        Status::InvalidArgument,
        "storage_bfs over a graph whose offsets point past its edges",
    )?;
    println!(
        "storage: bfs ok ({vertices} vertices, {} edges)",
        edges.len()
    );

    // Attaching what is not there.
    refused(
        s.storage_attach(99),
        Status::InvalidArgument,
        "STORAGE_ATTACH of namespace 99 (not attached to the vGPU)",
    )?;
    let mut bad = 8;
    if missing != 0 {
        refused(
            s.storage_attach(missing),
            Status::DeviceError,
            "STORAGE_ATTACH of a namespace whose file vanished",
        )?;
        bad += 1;
    }
    // The device still works after every refusal.
    let again = scan(&mut s, 0, words, 8).map_err(driver("storage_scan_sum after errors"))?;
    if again != want64 {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("scan after errors {again:#x}, want {want64:#x}"),
        ));
    }
    for d in [didx, ddst, dout, dlevels] {
        s.free(d).map_err(driver("FREE"))?;
    }
    println!(
        "STORAGE OK gather={} scan={want64:#018x} bfs_reached={reached} bfs_depth={depth} bad_input={bad}",
        2 * GATHER_N
    );
    Ok(())
}
