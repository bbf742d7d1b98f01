//! Sim backend tests: memory, copies at boundaries, each kernel against a CPU reference,
//! bad pointers, pacing and concurrency.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use vgpu_proto::builtin::{fnv1a64, FNV_OFFSET};
use vgpu_proto::{Access, ArgValue, Status};
use vm_memory::VolatileSlice;

use super::*;
use crate::{LaunchConfig, LaunchOne};

const MIB: u64 = 1 << 20;

fn gpu_with(memory: u64, f: impl FnOnce(&mut SimConfig)) -> SimGpu {
    let mut cfg = SimConfig {
        memory,
        va_size: 1 << 30,
        threads: 2,
        ..SimConfig::default()
    };
    f(&mut cfg);
    SimGpu::new(cfg).expect("sim gpu")
}

fn gpu() -> SimGpu {
    gpu_with(64 * MIB, |_| {})
}

fn put(g: &SimGpu, addr: u64, bytes: &[u8]) -> Result<u64> {
    let mut buf = bytes.to_vec();
    g.copy_htod(addr, &VolatileSlice::from(&mut buf[..]))
}

fn get(g: &SimGpu, addr: u64, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    g.copy_dtoh(addr, &VolatileSlice::from(&mut buf[..]))?;
    Ok(buf)
}

fn put_f32(g: &SimGpu, addr: u64, v: &[f32]) {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    put(g, addr, &b).expect("htod");
}

fn get_f32(g: &SimGpu, addr: u64, n: usize) -> Vec<f32> {
    get(g, addr, n * 4)
        .expect("dtoh")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn put_u32(g: &SimGpu, addr: u64, v: &[u32]) {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    put(g, addr, &b).expect("htod");
}

fn get_u32(g: &SimGpu, addr: u64, n: usize) -> Vec<u32> {
    get(g, addr, n * 4)
        .expect("dtoh")
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn builtin_fn(g: &SimGpu, name: &str) -> u64 {
    let m = g
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin module");
    g.modules()
        .get_function(m, name.as_bytes())
        .expect("function")
        .handle
}

fn r(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Read,
    }
}
fn w(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Write,
    }
}
fn rw(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::ReadWrite,
    }
}

const CFG: LaunchConfig = LaunchConfig {
    grid: [1; 3],
    block: [1; 3],
    shared_bytes: 0,
};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 7.0 - 50.0
        })
        .collect()
}

#[test]
fn alloc_free_double_free_and_reuse() {
    let g = gpu();
    let a = g.alloc(1).expect("alloc");
    assert_eq!(a.charged, 4096);
    assert_eq!(a.addr % (2 * MIB), 0);
    assert!(a.addr >= DEFAULT_VA_BASE && a.addr < DEFAULT_VA_BASE + (1 << 30));
    let b = g.alloc(3 * MIB).expect("alloc");
    assert_ne!(a.addr, b.addr);
    assert_eq!(g.memory_usage().used, 4096 + 3 * MIB);
    assert_eq!(g.memory_usage().allocations, 2);
    // Fresh memory is zero.
    assert!(get(&g, b.addr, 1024).expect("read").iter().all(|x| *x == 0));
    assert!(matches!(
        g.free(b.addr + 8),
        Err(BackendError::NotAllocated { .. })
    ));
    g.free(b.addr).expect("free");
    let e = g.free(b.addr).expect_err("double free");
    assert!(matches!(e, BackendError::NotAllocated { .. }));
    assert_eq!(e.status(), Status::BadDevicePointer);
    assert!(matches!(g.free(0), Err(BackendError::NotAllocated { .. })));
    assert_eq!(g.memory_usage().used, 4096);
    // The freed range is reused, and comes back zeroed.
    let c = g.alloc(3 * MIB).expect("alloc");
    assert_eq!(c.addr, b.addr);
    assert_eq!(
        g.alloc(0).expect_err("zero").status(),
        Status::InvalidArgument
    );
}

#[test]
fn out_of_memory_and_recovery() {
    let g = gpu_with(8 * MIB, |_| {});
    let a = g.alloc(4 * MIB).expect("alloc");
    let _b = g.alloc(4 * MIB).expect("alloc");
    let e = g.alloc(1).expect_err("full");
    assert!(
        matches!(e, BackendError::OutOfMemory { available: 0, .. }),
        "{e}"
    );
    assert_eq!(e.status(), Status::OutOfMemory);
    assert_eq!(
        g.alloc(u64::MAX).expect_err("absurd").status(),
        Status::OutOfMemory
    );
    assert_eq!(
        g.alloc(u64::MAX - 4094).expect_err("overflowing").status(),
        Status::OutOfMemory
    );
    g.free(a.addr).expect("free");
    g.alloc(4 * MIB).expect("room again");
}

#[test]
fn copies_at_allocation_boundaries() {
    let g = gpu();
    let a = g.alloc(2 * MIB).expect("alloc");
    let b = g.alloc(2 * MIB).expect("alloc");
    assert_eq!(b.addr, a.addr + 2 * MIB, "adjacent allocations");
    let full: Vec<u8> = (0..2 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        put(&g, a.addr, &full).expect("exactly the allocation"),
        2 * MIB
    );
    assert_eq!(get(&g, a.addr, full.len()).expect("read back"), full);
    assert_eq!(
        get(&g, a.addr + 2 * MIB - 1, 1).expect("last byte"),
        vec![full[full.len() - 1]]
    );
    // One byte past the end, even though the next allocation is right there.
    assert!(matches!(
        put(&g, a.addr + 1, &full),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(matches!(
        get(&g, a.addr + 2 * MIB - 1, 2),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(matches!(
        get(&g, a.addr - 1, 1),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(matches!(
        get(&g, 0, 1),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(matches!(
        get(&g, u64::MAX, 1),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(matches!(
        g.check_range(a.addr, u64::MAX),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(matches!(
        g.check_range(a.addr + 5, u64::MAX - 4),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(g.check_range(a.addr, 2 * MIB).is_ok());
    // Nothing of the failed copies landed in b.
    assert!(get(&g, b.addr, 16).expect("b").iter().all(|x| *x == 0));
    // Freed memory is unreachable.
    g.free(a.addr).expect("free");
    assert!(matches!(
        get(&g, a.addr, 1),
        Err(BackendError::BadPointer { .. })
    ));
}

#[test]
fn dtod_overlap_and_memset() {
    let g = gpu();
    let a = g.alloc(4096).expect("alloc");
    let src: Vec<u8> = (0..100u8).collect();
    put(&g, a.addr, &src).expect("htod");
    g.copy_dtod(a.addr + 10, a.addr, 100)
        .expect("overlapping dtod");
    let got = get(&g, a.addr, 110).expect("dtoh");
    assert_eq!(&got[10..110], &src[..]);
    assert!(matches!(
        g.copy_dtod(a.addr, a.addr + 4000, 100),
        Err(BackendError::BadPointer { .. })
    ));

    g.memset(a.addr + 1, 0xab, 1, 6).expect("memset8");
    let got = get(&g, a.addr, 8).expect("dtoh");
    assert_eq!(&got[1..7], &[0xab; 6]);
    assert_eq!(got[7], 7, "byte 7 untouched");
    g.memset(a.addr + 2, 0x1234, 2, 3).expect("memset16");
    assert_eq!(
        &get(&g, a.addr + 2, 6).expect("dtoh"),
        &[0x34, 0x12, 0x34, 0x12, 0x34, 0x12]
    );
    g.memset(a.addr + 8, 0xdead_beef, 4, 1000)
        .expect("memset32");
    assert!(get_u32(&g, a.addr + 8, 1000)
        .iter()
        .all(|v| *v == 0xdead_beef));
    assert!(matches!(
        g.memset(a.addr + 2, 1, 4, 1),
        Err(BackendError::Misaligned { .. })
    ));
    assert_eq!(
        g.memset(a.addr, 1, 3, 1).expect_err("width").status(),
        Status::InvalidArgument
    );
    assert!(matches!(
        g.memset(a.addr, 1, 4, 1025),
        Err(BackendError::BadPointer { .. })
    ));
    assert!(matches!(
        g.memset(a.addr, 1, 4, u64::MAX),
        Err(BackendError::BadPointer { .. })
    ));
}

#[test]
fn vector_add_saxpy_fill_match_cpu() {
    let g = gpu();
    let n = 300_000usize; // large enough to run on several threads
    let bytes = (n * 4) as u64;
    let (a, b, c) = (
        g.alloc(bytes).unwrap().addr,
        g.alloc(bytes).unwrap().addr,
        g.alloc(bytes).unwrap().addr,
    );
    let (va, vb) = (data(n, 1), data(n, 2));
    put_f32(&g, a, &va);
    put_f32(&g, b, &vb);
    let f = builtin_fn(&g, "vector_add");
    g.launch_one(f, &CFG, &[r(a), r(b), w(c), ArgValue::U64(n as u64)])
        .expect("vector_add");
    let want: Vec<f32> = va.iter().zip(&vb).map(|(x, y)| x + y).collect();
    assert_eq!(get_f32(&g, c, n), want);

    let f = builtin_fn(&g, "saxpy");
    g.launch_one(
        f,
        &CFG,
        &[ArgValue::F32(1.5), r(a), rw(c), ArgValue::U32(n as u32)],
    )
    .expect("saxpy");
    let want: Vec<f32> = va.iter().zip(&want).map(|(x, y)| 1.5 * x + y).collect();
    assert_eq!(get_f32(&g, c, n), want);

    let f = builtin_fn(&g, "fill");
    g.launch_one(
        f,
        &CFG,
        &[w(c), ArgValue::F32(2.25), ArgValue::U64(n as u64 - 1)],
    )
    .expect("fill");
    let got = get_f32(&g, c, n);
    assert!(got[..n - 1].iter().all(|v| *v == 2.25));
    assert_eq!(got[n - 1], want[n - 1], "fill wrote past n");
}

#[test]
fn reduce_sum_matches_documented_order() {
    let g = gpu();
    let n = 200_001usize;
    let x = g.alloc((n * 4) as u64).unwrap().addr;
    let out = g.alloc(4).unwrap().addr;
    let v = data(n, 3);
    put_f32(&g, x, &v);
    let f = builtin_fn(&g, "reduce_sum");
    g.launch_one(f, &CFG, &[r(x), w(out), ArgValue::U64(n as u64)])
        .expect("reduce_sum");
    let want = v
        .chunks(65536)
        .map(|c| c.iter().fold(0.0f64, |a, x| a + f64::from(*x)))
        .fold(0.0f64, |a, s| a + s) as f32;
    assert_eq!(get_f32(&g, out, 1)[0], want);
    // n = 0 sums to 0.
    g.launch_one(f, &CFG, &[r(x), w(out), ArgValue::U64(0)])
        .expect("empty");
    assert_eq!(get_f32(&g, out, 1)[0], 0.0);
}

#[test]
fn matmul_matches_naive() {
    let g = gpu();
    let (m, n, k) = (37usize, 19usize, 53usize);
    let (a, b, c) = (
        g.alloc((m * k * 4) as u64).unwrap().addr,
        g.alloc((k * n * 4) as u64).unwrap().addr,
        g.alloc((m * n * 4) as u64).unwrap().addr,
    );
    let (va, vb) = (data(m * k, 4), data(k * n, 5));
    put_f32(&g, a, &va);
    put_f32(&g, b, &vb);
    let f = builtin_fn(&g, "matmul");
    let dims = [
        ArgValue::U32(m as u32),
        ArgValue::U32(n as u32),
        ArgValue::U32(k as u32),
    ];
    g.launch_one(f, &CFG, &[r(a), r(b), w(c), dims[0], dims[1], dims[2]])
        .expect("matmul");
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f32;
            for l in 0..k {
                s += va[i * k + l] * vb[l * n + j];
            }
            want[i * n + j] = s;
        }
    }
    assert_eq!(get_f32(&g, c, m * n), want);
    // c too small for m x n.
    let e = g.launch_one(
        f,
        &CFG,
        &[
            r(a),
            r(b),
            w(c),
            ArgValue::U32(m as u32 + 1),
            dims[1],
            dims[2],
        ],
    );
    assert!(matches!(e, Err(BackendError::BadPointer { .. })));
    let e = g.launch_one(
        f,
        &CFG,
        &[
            r(a),
            r(b),
            w(c),
            ArgValue::U64(u64::MAX),
            ArgValue::U64(u64::MAX),
            dims[2],
        ],
    );
    assert_eq!(e.expect_err("overflow").status(), Status::InvalidArgument);
}

#[test]
fn gather_and_its_fault() {
    let g = gpu();
    let src: Vec<u32> = (0..1000).map(|i| i * 3 + 1).collect();
    let idx: Vec<u32> = (0..500).map(|i| (i * 37) % 1000).collect();
    let (s, i, d) = (
        g.alloc(4000).unwrap().addr,
        g.alloc(2000).unwrap().addr,
        g.alloc(2000).unwrap().addr,
    );
    put_u32(&g, s, &src);
    put_u32(&g, i, &idx);
    let f = builtin_fn(&g, "gather");
    g.launch_one(
        f,
        &CFG,
        &[r(s), r(i), w(d), ArgValue::U32(500), ArgValue::U32(1000)],
    )
    .expect("gather");
    let want: Vec<u32> = idx.iter().map(|j| src[*j as usize]).collect();
    assert_eq!(get_u32(&g, d, 500), want);
    // An index past src_len faults in this kernel only.
    put_u32(&g, i + 40, &[1000]);
    let e = g.launch_one(
        f,
        &CFG,
        &[r(s), r(i), w(d), ArgValue::U32(500), ArgValue::U32(1000)],
    );
    assert_eq!(e.expect_err("fault").status(), Status::KernelFault);
    // src_len larger than the source allocation is a bad pointer, found before running.
    let e = g.launch_one(
        f,
        &CFG,
        &[r(s), r(i), w(d), ArgValue::U32(500), ArgValue::U32(1001)],
    );
    assert!(matches!(e, Err(BackendError::BadPointer { .. })));
}

#[test]
fn checksum_is_fnv1a() {
    let g = gpu();
    let a = g.alloc(10_000).unwrap().addr;
    let out = g.alloc(8).unwrap().addr;
    let bytes: Vec<u8> = (0..10_000u32)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 3)) as u8)
        .collect();
    put(&g, a, &bytes).expect("htod");
    let f = builtin_fn(&g, "checksum");
    for (start, len) in [(0usize, 10_000usize), (3, 9_990), (5, 3), (1, 0), (8, 16)] {
        g.launch_one(
            f,
            &CFG,
            &[r(a + start as u64), ArgValue::U64(len as u64), w(out)],
        )
        .expect("checksum");
        let got = u64::from_le_bytes(get(&g, out, 8).unwrap().try_into().unwrap());
        assert_eq!(
            got,
            fnv1a64(FNV_OFFSET, &bytes[start..start + len]),
            "start {start} len {len}"
        );
    }
    // out must be 8-byte aligned.
    let e = g.launch_one(f, &CFG, &[r(a), ArgValue::U64(1), w(out + 4)]);
    assert!(matches!(
        e,
        Err(BackendError::BadPointer { .. }) | Err(BackendError::Misaligned { .. })
    ));
}

#[test]
fn spin_takes_its_time_scaled_by_speed() {
    let g = gpu();
    let f = builtin_fn(&g, "spin");
    let e = g
        .launch_one(f, &CFG, &[ArgValue::U64(u64::MAX)])
        .expect_err("too long");
    assert_eq!(e.status(), Status::InvalidArgument);
    let t = Instant::now();
    let s = g
        .launch_one(f, &CFG, &[ArgValue::U64(20_000)])
        .expect("spin");
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert!(s.device_ns >= 20_000_000);
    let fast = gpu_with(MIB, |c| c.speed = 4.0);
    let f = builtin_fn(&fast, "spin");
    // 200 ms of spin at 4x takes 50 ms; the bound below 200 ms (speed ignored) leaves a
    // loaded 2-core CI machine 150 ms of scheduling slack.
    let s = fast
        .launch_one(f, &CFG, &[ArgValue::U64(200_000)])
        .expect("spin");
    assert!(
        s.device_ns >= 50_000_000 && s.device_ns < 190_000_000,
        "{}",
        s.device_ns
    );
}

#[test]
fn slow_device_stretches_kernels() {
    let g = gpu_with(16 * MIB, |c| c.speed = 0.01);
    let n = 1_000_000u64; // 1e6 units at 1e7/s = 100 ms
    let a = g.alloc(n * 4).unwrap().addr;
    let f = builtin_fn(&g, "fill");
    let s = g
        .launch_one(f, &CFG, &[w(a), ArgValue::U32(1), ArgValue::U64(n)])
        .expect("fill");
    assert!(s.device_ns >= 100_000_000, "{}", s.device_ns);
}

#[test]
fn kernel_argument_checks() {
    let g = gpu();
    let a = g.alloc(4096).unwrap().addr;
    let f = builtin_fn(&g, "vector_add");
    let n = ArgValue::U32(1024);
    let e = g
        .launch_one(f, &CFG, &[r(a), r(a), w(a)])
        .expect_err("count");
    assert!(matches!(
        e,
        BackendError::BadArgCount {
            expected: 4,
            got: 3,
            ..
        }
    ));
    assert_eq!(e.status(), Status::BadArgCount);
    let e = g
        .launch_one(f, &CFG, &[r(a), r(a), ArgValue::U32(0), n])
        .expect_err("type");
    assert_eq!(e.status(), Status::BadArgType);
    // Output declared READ: the kernel writes it, so the launch is refused.
    let e = g
        .launch_one(f, &CFG, &[r(a), r(a), r(a), n])
        .expect_err("access");
    assert_eq!(e.status(), Status::BadArgType);
    // Extent one element past the allocation.
    let e = g
        .launch_one(f, &CFG, &[r(a), r(a), w(a), ArgValue::U32(1025)])
        .expect_err("extent");
    assert_eq!(e.status(), Status::BadDevicePointer);
    // Pointer into no allocation at all, and a misaligned one.
    let e = g
        .launch_one(f, &CFG, &[r(a + 8192), r(a), w(a), ArgValue::U32(1)])
        .expect_err("outside");
    assert_eq!(e.status(), Status::BadDevicePointer);
    let e = g
        .launch_one(f, &CFG, &[r(a + 2), r(a), w(a), ArgValue::U32(1)])
        .expect_err("misaligned");
    assert!(matches!(e, BackendError::Misaligned { align: 4, .. }));
    let e = g
        .launch_one(f, &CFG, &[r(a), r(a), w(a), ArgValue::U64(u64::MAX)])
        .expect_err("overflow");
    assert_eq!(e.status(), Status::BadDevicePointer);
}

#[test]
fn modules_and_functions() {
    let g = gpu();
    assert_eq!(
        g.modules()
            .module_load(ModuleImage::Builtin(b"nope"))
            .expect_err("name")
            .status(),
        Status::UnknownModule
    );
    let e = g
        .modules()
        .module_load(ModuleImage::Ptx(b".version 8.0"))
        .expect_err("ptx");
    assert_eq!(e.status(), Status::NotSupported);
    assert!(e.to_string().contains("builtin"));
    let m = g
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin\0"))
        .expect("NUL-terminated name");
    let fi = g.modules().get_function(m, b"saxpy").expect("saxpy");
    assert_eq!(fi.param_count, 4);
    assert_eq!(
        g.modules()
            .get_function(m, b"nope")
            .expect_err("fn")
            .status(),
        Status::UnknownFunction
    );
    assert_eq!(
        g.modules()
            .get_function(m + 1, b"saxpy")
            .expect_err("module")
            .status(),
        Status::UnknownModule
    );
    assert_eq!(
        g.launch_one(0, &CFG, &[]).expect_err("fn 0").status(),
        Status::UnknownFunction
    );
    assert_eq!(
        g.launch_one(u64::MAX, &CFG, &[])
            .expect_err("fn max")
            .status(),
        Status::UnknownFunction
    );
    g.modules().module_unload(m).expect("unload");
    assert_eq!(
        g.modules().module_unload(m).expect_err("twice").status(),
        Status::UnknownModule
    );
    assert_eq!(
        g.launch_one(fi.handle, &CFG, &[])
            .expect_err("unloaded")
            .status(),
        Status::UnknownFunction
    );
    for _ in 0..crate::module_table::MAX_MODULES {
        g.modules()
            .module_load(ModuleImage::Builtin(b"builtin"))
            .expect("load");
    }
    let e = g
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect_err("full");
    assert_eq!(e.status(), Status::OutOfResources);
}

#[test]
fn copies_are_paced_to_bandwidth() {
    let g = gpu_with(16 * MIB, |c| c.copy_bandwidth = 100_000_000); // 100 MB/s
    let a = g.alloc(8 * MIB).unwrap().addr;
    let mut buf = vec![1u8; (8 * MIB) as usize];
    let t = Instant::now();
    g.copy_htod(a, &VolatileSlice::from(&mut buf[..]))
        .expect("htod");
    let secs = t.elapsed().as_secs_f64();
    // 8 MiB at 100 MB/s = 84 ms (the engine may start up to 0.5 ms early).
    assert!((0.080..0.5).contains(&secs), "{secs}");
}

#[test]
fn memory_is_a_shareable_memfd() {
    let g = gpu();
    let a = g.alloc(8192).unwrap().addr;
    put(&g, a + 4096, b"hello device").expect("htod");
    let (fd, size) = g.export(a).expect("export");
    assert_eq!(size, 8192);
    let mut buf = [0u8; 12];
    // SAFETY: reading into a local buffer from a valid descriptor.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 4096) };
    assert_eq!(n, 12);
    assert_eq!(&buf, b"hello device");
    assert!(g.export(a + 1).is_err());
}

#[test]
fn a_long_kernel_does_not_block_copies_and_sync_waits_for_it() {
    let g = gpu_with(64 * MIB, |c| c.speed = 0.01);
    let n = 2_000_000u64; // fill: 2e6 units at 1e7/s = 200 ms
    let (a, b) = (g.alloc(n * 4).unwrap().addr, g.alloc(4096).unwrap().addr);
    let fill = builtin_fn(&g, "fill");
    std::thread::scope(|s| {
        let t0 = Instant::now();
        let k = s.spawn(|| g.launch_one(fill, &CFG, &[w(a), ArgValue::U32(9), ArgValue::U64(n)]));
        while get_u32(&g, a, 1)[0] != 9 {
            std::thread::yield_now();
        }
        let t = Instant::now();
        put(&g, b, b"meanwhile").expect("copy during kernel");
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "the copy waited for the kernel"
        );
        g.synchronize();
        assert!(
            t0.elapsed() >= Duration::from_millis(200),
            "synchronize returned before the kernel ended"
        );
        k.join().expect("thread").expect("fill");
    });
}

#[test]
fn synchronize_waits_for_the_answer_of_launches_answered_inside_the_call() {
    let g = gpu_with(64 * MIB, |c| c.speed = 0.01);
    let n = 1_000_000u64; // fill: 1e6 units at 1e7/s = 100 ms
    let a = g.alloc(n * 4).unwrap().addr;
    let fill = builtin_fn(&g, "fill");
    let args = [w(a), ArgValue::U32(4), ArgValue::U64(n)];
    let launch = Launch {
        function: fill,
        config: CFG,
        cluster: crate::NO_CLUSTER,
        args: &args,
        blob: &[],
    };
    let answered = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let k = s.spawn(|| {
            g.launch_then(std::slice::from_ref(&launch), &mut |r| {
                assert!(r[0].is_ok());
                // A slow answer: the guest's used ring is contended.
                std::thread::sleep(Duration::from_millis(50));
                answered.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        });
        while get_u32(&g, a, 1)[0] != 4 {
            std::thread::yield_now();
        }
        g.synchronize();
        assert!(
            answered.load(std::sync::atomic::Ordering::SeqCst),
            "synchronize returned before the launch was answered"
        );
        assert!(k.join().expect("thread")[0].is_ok());
    });
}

#[test]
fn free_during_a_kernel_keeps_its_memory_until_it_ends() {
    // fill: 1e5 units at 5e4/s = 2 s of modeled time. The kernel's writes become visible
    // once it computed them (a small part of the 2 s), and it holds the memory until it
    // ends, the rest of the modeled time included: far longer than this thread can be kept
    // off the cores between seeing the write and the free.
    let g = gpu_with(64 * MIB, |c| c.speed = 0.00005);
    let n = 100_000u64;
    let a = g.alloc(n * 4).unwrap().addr;
    let fill = builtin_fn(&g, "fill");
    std::thread::scope(|s| {
        let k = s.spawn(|| g.launch_one(fill, &CFG, &[w(a), ArgValue::U32(9), ArgValue::U64(n)]));
        // Wait until the kernel has written (it then idles out its modeled time).
        while get_u32(&g, a, 1)[0] != 9 {
            std::thread::yield_now();
        }
        g.free(a).expect("free");
        // Charged until the kernel lets go; the address is not handed out again meanwhile.
        let b = g.alloc(4096).expect("alloc");
        assert_ne!(b.addr, a);
        k.join().expect("thread").expect("fill completes");
    });
    assert_eq!(g.memory_usage().allocations, 1);
}

mod storage;

/// A decommitted (swapped-out) range is refused to every access with an error, never
/// touched: its mapping is `PROT_NONE` and a touch would fault the worker.
#[test]
fn a_decommitted_range_is_refused_not_touched() {
    let g = gpu();
    let granule = g.commit_granule();
    let a = g.alloc(2 * granule).expect("alloc").addr;
    put(&g, a, &vec![7u8; (2 * granule) as usize]).expect("fill");
    g.decommit(a, 0, granule).expect("decommit");
    let refused = |r: Result<u64>, what: &str| match r {
        Err(BackendError::Device(why)) => assert!(why.contains("swapped out"), "{what}: {why}"),
        other => panic!("{what}: {other:?}"),
    };
    refused(put(&g, a + 100, &[1, 2, 3]), "a copy in");
    refused(
        get(&g, a + granule - 8, 16).map(|_| 0),
        "a copy out across the edge",
    );
    refused(g.memset(a, 0, 4, 16), "a memset");
    refused(
        g.copy_dtod(a + granule, a, 4096),
        "a device copy out of the range",
    );
    // The committed half is untouched and serves.
    assert_eq!(
        get(&g, a + granule, 4096).expect("the committed half"),
        vec![7u8; 4096]
    );
    g.recommit(a, 0, granule).expect("recommit");
    put(&g, a, &[9; 4096]).expect("a copy in once recommitted");
    assert_eq!(get(&g, a, 4096).expect("back"), vec![9u8; 4096]);
}
