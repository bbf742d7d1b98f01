//! One conformance suite over the `Backend` trait: every test runs on the sim backend, and
//! on the cuda backend where a CUDA GPU is present (otherwise it says `SKIPPED (cuda): why`
//! and checks sim only). With `VGPU_REQUIRE_CUDA=1` a missing GPU fails the suite instead,
//! so a run on the GPU machine cannot pass by skipping.
//!
//! Results are compared bit for bit with CPU references that follow the documented
//! semantics (docs/protocol.md, "Built-in kernels").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vgpu_backend::cuda::ContextLimits;
use vgpu_backend::{
    Backend, BackendError, CudaConfig, CudaGpu, HostRegion, LaunchConfig, ModuleImage, SimConfig,
    SimGpu, DEFAULT_VA_BASE,
};
use vgpu_proto::builtin::{fnv1a64, FNV_OFFSET};
use vgpu_proto::{Access, ArgValue, Status};
use vm_memory::VolatileSlice;

const MIB: u64 = 1 << 20;

/// Why cuda is not tested here, or None when it is.
fn cuda_skip() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| match CudaGpu::probe() {
        Ok(p) => {
            eprintln!("cuda: testing on {} ({} device(s))", p.name, p.devices);
            None
        }
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
            );
            Some(why)
        }
    })
    .as_deref()
}

/// What GPU 0's context reserves at the default limits: charged to every cuda share at
/// start, before anything is allocated.
fn cuda_reserve() -> u64 {
    static RESERVE: OnceLock<u64> = OnceLock::new();
    *RESERVE.get_or_init(|| {
        CudaGpu::context_reserve_of(0, &ContextLimits::default())
            .expect("context reserve")
            .total()
            .expect("reserve fits u64")
    })
}

/// A fresh cuda backend with its own address range (tests run in parallel in one process,
/// all in the device's primary context) and `memory` bytes to allocate beside its context
/// reserve.
fn cuda(memory: u64) -> CudaGpu {
    cuda_with(memory + cuda_reserve(), ContextLimits::default())
}

/// A fresh cuda backend whose share is `memory` (the context reserve included) and whose
/// context has `limits`.
fn cuda_with(memory: u64, limits: ContextLimits) -> CudaGpu {
    try_cuda(memory, limits).expect("cuda backend")
}

fn try_cuda(memory: u64, limits: ContextLimits) -> Result<CudaGpu, BackendError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    CudaGpu::new(CudaConfig {
        ordinal: 0,
        memory,
        limits,
        va_base: DEFAULT_VA_BASE + (k + 1) * (64 << 30),
        va_size: 16 << 30,
        ..CudaConfig::default()
    })
}

fn sim(memory: u64) -> SimGpu {
    SimGpu::new(SimConfig {
        memory,
        va_size: 16 << 30,
        threads: 2,
        ..SimConfig::default()
    })
    .expect("sim backend")
}

/// Runs `f` on a sim backend and, where possible, on a cuda backend, each with `memory`
/// bytes of device memory.
fn each(memory: u64, f: impl Fn(&str, &dyn Backend)) {
    f("sim", &sim(memory));
    match cuda_skip() {
        None => f("cuda", &cuda(memory)),
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

fn put(b: &dyn Backend, addr: u64, bytes: &[u8]) -> Result<u64, BackendError> {
    let mut buf = bytes.to_vec();
    b.copy_htod(addr, &VolatileSlice::from(&mut buf[..]))
}

fn get(b: &dyn Backend, addr: u64, len: usize) -> Result<Vec<u8>, BackendError> {
    let mut buf = vec![0u8; len];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut buf[..]))?;
    Ok(buf)
}

fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn get_u32(b: &dyn Backend, addr: u64, n: usize) -> Vec<u32> {
    get(b, addr, n * 4)
        .expect("dtoh")
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn get_f32_bits(b: &dyn Backend, addr: u64, n: usize) -> Vec<u32> {
    get_u32(b, addr, n)
}

/// Pseudo-random f32s in [-50, 93), with fractions, deterministic per seed.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 14_300) as f32 / 100.0 - 50.0 + (x >> 20) as f32 / 4096.0
        })
        .collect()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u64 * 131 + u64::from(seed) * 7 + (i as u64 >> 9)) as u8)
        .collect()
}

fn builtin(b: &dyn Backend, name: &str) -> u64 {
    let m = b
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin module");
    b.get_function(m, name.as_bytes()).expect("function").handle
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

fn status<T: std::fmt::Debug>(r: Result<T, BackendError>) -> Status {
    r.expect_err("must fail").status()
}

#[test]
fn alloc_free_accounting_and_zeroed_reuse() {
    each(256 * MIB, |name, b| {
        // The context reserve (cuda; 0 on sim) is charged from the start.
        let base = b.memory_usage().used;
        let info = b.info().clone();
        let g = info.alloc_granularity;
        assert!(g >= 4096 && g.is_power_of_two(), "{name}: granularity {g}");
        let a = b.alloc(1).expect("alloc");
        assert_eq!(a.charged, g, "{name}");
        assert_eq!(a.addr % (2 * MIB), 0, "{name}: 2 MiB aligned");
        assert!(
            a.addr >= info.va_base && a.addr < info.va_base + info.va_size,
            "{name}: inside the address space"
        );
        let big = b.alloc(3 * MIB + 5).expect("alloc");
        assert_ne!(a.addr, big.addr);
        let charged = (3 * MIB + 5).div_ceil(g) * g;
        assert_eq!(big.charged, charged, "{name}");
        let u = b.memory_usage();
        assert_eq!((u.used, u.allocations), (base + g + charged, 2), "{name}");
        assert!(
            get(b, big.addr, (3 * MIB + 5) as usize)
                .expect("read")
                .iter()
                .all(|x| *x == 0),
            "{name}: fresh memory is zero"
        );
        put(b, big.addr, &vec![0xa5; (3 * MIB) as usize]).expect("dirty it");
        assert_eq!(
            status(b.free(big.addr + 8)),
            Status::BadDevicePointer,
            "{name}"
        );
        b.free(big.addr).expect("free");
        assert_eq!(
            status(b.free(big.addr)),
            Status::BadDevicePointer,
            "{name}: double free"
        );
        assert_eq!(status(b.free(0)), Status::BadDevicePointer, "{name}");
        assert_eq!(b.memory_usage().used, base + g, "{name}");
        let again = b.alloc(3 * MIB + 5).expect("alloc");
        assert!(
            get(b, again.addr, (3 * MIB) as usize)
                .expect("read")
                .iter()
                .all(|x| *x == 0),
            "{name}: reused memory comes back zeroed"
        );
        assert_eq!(status(b.alloc(0)), Status::InvalidArgument, "{name}");
    });
}

#[test]
fn out_of_memory_and_recovery() {
    each(8 * MIB, |name, b| {
        let g = b.info().alloc_granularity;
        let half = 4 * MIB;
        let a = b.alloc(half).expect("alloc");
        let _b2 = b.alloc(half).expect("alloc");
        let e = b.alloc(1).expect_err("full");
        assert!(
            matches!(e, BackendError::OutOfMemory { available: 0, .. }),
            "{name}: {e}"
        );
        assert_eq!(e.status(), Status::OutOfMemory);
        assert_eq!(status(b.alloc(u64::MAX)), Status::OutOfMemory, "{name}");
        assert_eq!(
            status(b.alloc(u64::MAX - g + 2)),
            Status::OutOfMemory,
            "{name}"
        );
        b.free(a.addr).expect("free");
        b.alloc(half).expect("room again");
    });
}

#[test]
fn copies_at_allocation_boundaries() {
    each(64 * MIB, |name, b| {
        let a = b.alloc(2 * MIB).expect("alloc");
        let n = b.alloc(2 * MIB).expect("alloc");
        let full = pattern((2 * MIB) as usize, 1);
        assert_eq!(put(b, a.addr, &full).expect("whole allocation"), 2 * MIB);
        assert_eq!(
            get(b, a.addr, full.len()).expect("read back"),
            full,
            "{name}"
        );
        assert_eq!(
            get(b, a.addr + 2 * MIB - 1, 1).expect("last byte"),
            vec![full[full.len() - 1]],
            "{name}"
        );
        assert_eq!(status(put(b, a.addr + 1, &full)), Status::BadDevicePointer);
        assert_eq!(
            status(get(b, a.addr + 2 * MIB - 1, 2)),
            Status::BadDevicePointer
        );
        assert_eq!(status(get(b, a.addr - 1, 1)), Status::BadDevicePointer);
        assert_eq!(status(get(b, 0, 1)), Status::BadDevicePointer);
        assert_eq!(status(get(b, u64::MAX, 1)), Status::BadDevicePointer);
        assert_eq!(
            status(b.check_range(a.addr, u64::MAX)),
            Status::BadDevicePointer
        );
        assert_eq!(
            status(b.check_range(a.addr + 5, u64::MAX - 4)),
            Status::BadDevicePointer
        );
        b.check_range(a.addr, 2 * MIB).expect("whole allocation");
        assert!(
            get(b, n.addr, 4096)
                .expect("neighbour")
                .iter()
                .all(|x| *x == 0),
            "{name}: failed copies touched nothing"
        );
        // Unaligned offsets and odd lengths.
        let odd = pattern(12_345, 2);
        put(b, a.addr + 3, &odd).expect("odd htod");
        assert_eq!(
            get(b, a.addr + 3, odd.len()).expect("odd dtoh"),
            odd,
            "{name}"
        );
        b.free(a.addr).expect("free");
        assert_eq!(
            status(get(b, a.addr, 1)),
            Status::BadDevicePointer,
            "{name}: freed"
        );
    });
}

#[test]
fn large_copies_round_trip_from_plain_and_registered_memory() {
    const LEN: usize = 40 << 20; // several copy chunks, not a multiple of any
    each(128 * MIB, |name, b| {
        let a = b.alloc(LEN as u64 + 4096).expect("alloc");
        let src = pattern(LEN - 7, 3);
        put(b, a.addr + 7, &src).expect("htod");
        assert!(
            get(b, a.addr + 7, src.len()).expect("dtoh") == src,
            "{name}: plain memory"
        );

        // Page-aligned memory registered once, like guest RAM.
        let len = LEN + 4096;
        // SAFETY: a fresh private anonymous mapping of our own; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let region = HostRegion {
            addr: p as usize,
            len,
        };
        b.register_host_memory(&[region]).expect("register");
        // SAFETY: [p, p + len) is our live mapping until munmap below; nothing else uses it.
        let host = unsafe { VolatileSlice::new(p.cast::<u8>(), len) };
        let want = pattern(LEN, 4);
        host.subslice(100, LEN).expect("slice").copy_from(&want);
        b.copy_htod(a.addr, &host.subslice(100, LEN).expect("slice"))
            .expect("registered htod");
        host.subslice(0, len)
            .expect("slice")
            .copy_from(&vec![0u8; len]);
        b.copy_dtoh(a.addr, &host.subslice(50, LEN).expect("slice"))
            .expect("registered dtoh");
        let mut back = vec![0u8; LEN];
        host.subslice(50, LEN)
            .expect("slice")
            .copy_to(&mut back[..]);
        assert!(back == want, "{name}: registered memory");
        b.unregister_host_memory(&[region]);
        // Still works unregistered.
        b.copy_dtoh(a.addr, &host.subslice(0, 4096).expect("slice"))
            .expect("dtoh after unregister");
        let mut first = vec![0u8; 4096];
        host.subslice(0, 4096)
            .expect("slice")
            .copy_to(&mut first[..]);
        assert_eq!(first, want[..4096], "{name}");
        // SAFETY: unmaps our own mapping; `host` is not used after this.
        assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    });
}

#[test]
fn dtod_is_memmove_and_memset_fills() {
    each(128 * MIB, |name, b| {
        let a = b.alloc(4096).expect("alloc");
        let src: Vec<u8> = (0..100u8).collect();
        put(b, a.addr, &src).expect("htod");
        b.copy_dtod(a.addr + 10, a.addr, 100)
            .expect("overlapping dtod");
        assert_eq!(
            &get(b, a.addr + 10, 100).expect("dtoh")[..],
            &src[..],
            "{name}"
        );
        assert_eq!(
            status(b.copy_dtod(a.addr, a.addr + 4000, 100)),
            Status::BadDevicePointer
        );
        // Large overlapping moves in both directions (several staging pieces).
        let big = b.alloc(40 * MIB).expect("alloc");
        let len = 30 << 20;
        let p = pattern(40 << 20, 5);
        for (dst_off, src_off) in [(4096 + 3, 0), (0, 1 << 20)] {
            put(b, big.addr, &p).expect("htod");
            b.copy_dtod(big.addr + dst_off, big.addr + src_off, len as u64)
                .expect("memmove");
            let mut want = p.clone();
            want.copy_within(src_off as usize..src_off as usize + len, dst_off as usize);
            assert!(
                get(b, big.addr, p.len()).expect("dtoh") == want,
                "{name}: memmove {src_off} -> {dst_off}"
            );
        }

        put(b, a.addr, &pattern(4096, 6)).expect("htod");
        let before = get(b, a.addr, 8).expect("dtoh");
        b.memset(a.addr + 1, 0xab, 1, 6).expect("memset8");
        let got = get(b, a.addr, 8).expect("dtoh");
        assert_eq!(&got[1..7], &[0xab; 6], "{name}");
        assert_eq!(
            (got[0], got[7]),
            (before[0], before[7]),
            "{name}: edges untouched"
        );
        b.memset(a.addr + 2, 0x1234, 2, 3).expect("memset16");
        assert_eq!(
            get(b, a.addr + 2, 6).expect("dtoh"),
            vec![0x34, 0x12, 0x34, 0x12, 0x34, 0x12],
            "{name}"
        );
        b.memset(a.addr + 8, 0xdead_beef, 4, 1000)
            .expect("memset32");
        assert!(
            get_u32(b, a.addr + 8, 1000)
                .iter()
                .all(|v| *v == 0xdead_beef),
            "{name}"
        );
        assert_eq!(
            status(b.memset(a.addr + 2, 1, 4, 1)),
            Status::BadDevicePointer
        );
        assert_eq!(status(b.memset(a.addr, 1, 3, 1)), Status::InvalidArgument);
        assert_eq!(
            status(b.memset(a.addr, 1, 4, 1025)),
            Status::BadDevicePointer
        );
        assert_eq!(
            status(b.memset(a.addr, 1, 4, u64::MAX / 2)),
            Status::BadDevicePointer
        );
    });
}

#[test]
fn elementwise_kernels_match_the_reference() {
    each(64 * MIB, |name, b| {
        let n = 1_000_003usize;
        let (x, y) = (data(n, 1), data(n, 2));
        let (pa, pb, pc) = (
            b.alloc(n as u64 * 4).expect("alloc").addr,
            b.alloc(n as u64 * 4).expect("alloc").addr,
            b.alloc(n as u64 * 4).expect("alloc").addr,
        );
        put(b, pa, &floats(&x)).expect("htod");
        put(b, pb, &floats(&y)).expect("htod");
        let add = builtin(b, "vector_add");
        let s = b
            .launch(add, &CFG, &[r(pa), r(pb), w(pc), ArgValue::U64(n as u64)])
            .expect("vector_add");
        assert!(s.device_ns > 0, "{name}: device time reported");
        let want: Vec<u32> = x.iter().zip(&y).map(|(a, b)| (a + b).to_bits()).collect();
        assert!(get_f32_bits(b, pc, n) == want, "{name}: vector_add");

        let saxpy = builtin(b, "saxpy");
        let alpha = 1.7f32;
        b.launch(
            saxpy,
            &CFG,
            &[ArgValue::F32(alpha), r(pa), rw(pb), ArgValue::U32(n as u32)],
        )
        .expect("saxpy");
        // Two roundings, as documented (Rust does not contract a * x + y).
        let want: Vec<u32> = x
            .iter()
            .zip(&y)
            .map(|(x, y)| (alpha * x + y).to_bits())
            .collect();
        assert!(get_f32_bits(b, pb, n) == want, "{name}: saxpy");

        let fill = builtin(b, "fill");
        b.launch(
            fill,
            &CFG,
            &[
                w(pc),
                ArgValue::U32(0x1234_5678),
                ArgValue::U64(n as u64 - 1),
            ],
        )
        .expect("fill u32");
        let got = get_u32(b, pc, n);
        assert!(
            got[..n - 1].iter().all(|v| *v == 0x1234_5678),
            "{name}: fill"
        );
        assert_eq!(got[n - 1], want_add_last(&x, &y), "{name}: fill stops at n");
        b.launch(fill, &CFG, &[w(pc), ArgValue::F32(-2.5), ArgValue::U32(3)])
            .expect("fill f32");
        assert_eq!(get_u32(b, pc, 3), vec![(-2.5f32).to_bits(); 3], "{name}");
    });
}

fn want_add_last(x: &[f32], y: &[f32]) -> u32 {
    (x[x.len() - 1] + y[y.len() - 1]).to_bits()
}

/// reduce_sum as documented: 65536-element blocks summed in order in f64, block sums in
/// order in f64, rounded to f32.
fn reduce_ref(x: &[f32]) -> f32 {
    x.chunks(65536)
        .map(|c| c.iter().fold(0.0f64, |a, v| a + f64::from(*v)))
        .fold(0.0f64, |a, s| a + s) as f32
}

#[test]
fn reduce_matmul_gather_checksum_match_the_reference() {
    each(64 * MIB, |name, b| {
        // reduce_sum over several blocks and a partial one.
        let n = 3 * 65536 + 17;
        let x = data(n, 3);
        let px = b.alloc(n as u64 * 4).expect("alloc").addr;
        let out = b.alloc(64).expect("alloc").addr;
        put(b, px, &floats(&x)).expect("htod");
        let red = builtin(b, "reduce_sum");
        b.launch(red, &CFG, &[r(px), w(out), ArgValue::U64(n as u64)])
            .expect("reduce_sum");
        assert_eq!(
            get_u32(b, out, 1)[0],
            reduce_ref(&x).to_bits(),
            "{name}: reduce_sum"
        );
        b.launch(red, &CFG, &[r(px), w(out), ArgValue::U64(0)])
            .expect("empty reduce_sum");
        assert_eq!(get_u32(b, out, 1)[0], 0, "{name}: empty sum");

        // matmul, odd shapes.
        let (m, nn, k) = (37usize, 53usize, 29usize);
        let (a, bm) = (data(m * k, 4), data(k * nn, 5));
        let (pa, pb, pc) = (
            b.alloc((m * k * 4) as u64).expect("alloc").addr,
            b.alloc((k * nn * 4) as u64).expect("alloc").addr,
            b.alloc((m * nn * 4) as u64).expect("alloc").addr,
        );
        put(b, pa, &floats(&a)).expect("htod");
        put(b, pb, &floats(&bm)).expect("htod");
        let mm = builtin(b, "matmul");
        b.launch(
            mm,
            &CFG,
            &[
                r(pa),
                r(pb),
                w(pc),
                ArgValue::U32(m as u32),
                ArgValue::U32(nn as u32),
                ArgValue::U64(k as u64),
            ],
        )
        .expect("matmul");
        let mut want = vec![0u32; m * nn];
        for i in 0..m {
            for j in 0..nn {
                let mut acc = 0.0f32;
                for l in 0..k {
                    acc += a[i * k + l] * bm[l * nn + j];
                }
                want[i * nn + j] = acc.to_bits();
            }
        }
        assert!(get_u32(b, pc, m * nn) == want, "{name}: matmul");
        assert_eq!(
            status(b.launch(
                mm,
                &CFG,
                &[
                    r(pa),
                    r(pb),
                    w(pc),
                    ArgValue::U64(1 << 40),
                    ArgValue::U64(1 << 40),
                    ArgValue::U64(1 << 40)
                ]
            )),
            Status::InvalidArgument,
            "{name}: overflowing shape"
        );

        // gather, then a fault that stays in the launch: the next one works.
        let src: Vec<u32> = (0..1000u32).map(|i| i * 3 + 1).collect();
        let idx: Vec<u32> = (0..5000u32).map(|i| (i * 7919) % 1000).collect();
        let (ps, pi, pd) = (
            b.alloc(4000).expect("alloc").addr,
            b.alloc(20_000).expect("alloc").addr,
            b.alloc(20_000).expect("alloc").addr,
        );
        put(b, ps, &words(&src)).expect("htod");
        put(b, pi, &words(&idx)).expect("htod");
        let ga = builtin(b, "gather");
        let args = [
            r(ps),
            r(pi),
            w(pd),
            ArgValue::U64(5000),
            ArgValue::U64(1000),
        ];
        b.launch(ga, &CFG, &args).expect("gather");
        let want: Vec<u32> = idx.iter().map(|i| src[*i as usize]).collect();
        assert!(get_u32(b, pd, 5000) == want, "{name}: gather");
        let mut bad = idx.clone();
        bad[4321] = 1000;
        bad[4500] = u32::MAX;
        put(b, pi, &words(&bad)).expect("htod");
        let e = b.launch(ga, &CFG, &args).expect_err("index past src_len");
        assert_eq!(e.status(), Status::KernelFault, "{name}: {e}");
        assert!(e.to_string().contains("idx[4321] = 1000"), "{name}: {e}");
        put(b, pi, &words(&idx)).expect("htod");
        b.launch(ga, &CFG, &args).expect("gather after a fault");

        // checksum from an unaligned start, odd length.
        let bytes = pattern(100_003, 7);
        let pd2 = b.alloc(200_000).expect("alloc").addr;
        put(b, pd2, &bytes).expect("htod");
        let ck = builtin(b, "checksum");
        b.launch(ck, &CFG, &[r(pd2 + 5), ArgValue::U64(99_990), w(out + 8)])
            .expect("checksum");
        let h = get(b, out + 8, 8).expect("dtoh");
        let got = u64::from_le_bytes(h.try_into().expect("8 bytes"));
        assert_eq!(
            got,
            fnv1a64(FNV_OFFSET, &bytes[5..5 + 99_990]),
            "{name}: checksum"
        );
        assert_eq!(
            status(b.launch(ck, &CFG, &[r(pd2), ArgValue::U64(8), w(out + 4)])),
            Status::BadDevicePointer,
            "{name}: misaligned u64 output"
        );
    });
}

#[test]
fn spin_takes_its_time() {
    each(16 * MIB, |name, b| {
        let f = builtin(b, "spin");
        assert_eq!(
            status(b.launch(f, &CFG, &[ArgValue::U64(u64::MAX)])),
            Status::InvalidArgument
        );
        let t = Instant::now();
        let s = b.launch(f, &CFG, &[ArgValue::U64(20_000)]).expect("spin");
        assert!(t.elapsed() >= Duration::from_millis(20), "{name}");
        assert!(
            s.device_ns >= 19_900_000 && s.device_ns < 200_000_000,
            "{name}: {} ns",
            s.device_ns
        );
    });
}

#[test]
fn bad_launches_are_refused_before_running() {
    each(16 * MIB, |name, b| {
        let a = b.alloc(4096).expect("alloc").addr;
        let add = builtin(b, "vector_add");
        let n = ArgValue::U64(1024);
        assert_eq!(
            status(b.launch(add, &CFG, &[r(a), r(a), w(a)])),
            Status::BadArgCount
        );
        assert_eq!(
            status(b.launch(add, &CFG, &[r(a), r(a), r(a), n])),
            Status::BadArgType,
            "{name}: read-only pointer for a written parameter"
        );
        assert_eq!(
            status(b.launch(add, &CFG, &[r(a), ArgValue::U64(a), w(a), n])),
            Status::BadArgType
        );
        assert_eq!(
            status(b.launch(add, &CFG, &[r(a), r(a), w(a), ArgValue::U64(1025)])),
            Status::BadDevicePointer,
            "{name}: extent past the allocation"
        );
        assert_eq!(
            status(b.launch(add, &CFG, &[r(a + 2), r(a), w(a), ArgValue::U64(4)])),
            Status::BadDevicePointer,
            "{name}: misaligned"
        );
        assert_eq!(
            status(b.launch(add, &CFG, &[r(a), r(a), w(a + (4 << 20)), n])),
            Status::BadDevicePointer,
            "{name}: not an allocation"
        );
        assert_eq!(status(b.launch(0, &CFG, &[])), Status::UnknownFunction);
        assert_eq!(
            status(b.launch(u64::MAX, &CFG, &[])),
            Status::UnknownFunction
        );
        let m = b
            .module_load(ModuleImage::Builtin(b"builtin\0"))
            .expect("NUL-terminated name");
        assert_eq!(
            status(b.get_function(m, b"no_such_kernel")),
            Status::UnknownFunction
        );
        let f = b.get_function(m, b"fill").expect("fill");
        assert_eq!(f.param_count, 3);
        b.module_unload(m).expect("unload");
        assert_eq!(
            status(b.launch(f.handle, &CFG, &[w(a), ArgValue::U32(0), ArgValue::U32(1)])),
            Status::UnknownFunction,
            "{name}: unloaded"
        );
        assert_eq!(status(b.module_unload(m)), Status::UnknownModule);
        assert_eq!(
            status(b.module_load(ModuleImage::Builtin(b"nope"))),
            Status::UnknownModule
        );
        // The memory the refused launches named is untouched.
        assert!(
            get(b, a, 4096).expect("dtoh").iter().all(|x| *x == 0),
            "{name}"
        );
    });
}

/// PTX of `scale(float* x, float f, unsigned long long n)`: x[i] *= f (one rounding).
const SCALE_PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 x, .param .f32 f, .param .u64 n)
{
    .reg .pred %p;
    .reg .b32 %r<4>;
    .reg .f32 %v<3>;
    .reg .b64 %d<6>;
    ld.param.u64 %d0, [x];
    ld.param.f32 %v0, [f];
    ld.param.u64 %d1, [n];
    mov.u32 %r0, %ctaid.x;
    mov.u32 %r1, %ntid.x;
    mov.u32 %r2, %tid.x;
    mad.lo.u32 %r3, %r0, %r1, %r2;
    cvt.u64.u32 %d2, %r3;
    setp.ge.u64 %p, %d2, %d1;
    @%p bra DONE;
    cvta.to.global.u64 %d3, %d0;
    shl.b64 %d4, %d2, 2;
    add.u64 %d5, %d3, %d4;
    ld.global.f32 %v1, [%d5];
    mul.rn.f32 %v2, %v1, %v0;
    st.global.f32 [%d5], %v2;
DONE:
    ret;
}
"#;

#[test]
fn guest_ptx_loads_and_runs_where_supported() {
    each(16 * MIB, |name, b| {
        let ptx = b.info().features & vgpu_proto::features::PTX != 0;
        let load = b.module_load(ModuleImage::Ptx(SCALE_PTX.as_bytes()));
        if !ptx {
            assert_eq!(status(load), Status::NotSupported, "{name}");
            return;
        }
        let m = load.expect("PTX module");
        let f = b.get_function(m, b"scale").expect("scale");
        assert_eq!(f.param_count, 3, "{name}");
        let n = 10_000usize;
        let x = data(n, 9);
        let a = b.alloc(n as u64 * 4).expect("alloc").addr;
        put(b, a, &floats(&x)).expect("htod");
        let cfg = LaunchConfig {
            grid: [n.div_ceil(128) as u32, 1, 1],
            block: [128, 1, 1],
            shared_bytes: 0,
        };
        let args = [rw(a), ArgValue::F32(3.0), ArgValue::U64(n as u64)];
        let s = b.launch(f.handle, &cfg, &args).expect("launch");
        assert!(s.device_ns > 0, "{name}");
        let want: Vec<u32> = x.iter().map(|v| (v * 3.0).to_bits()).collect();
        assert!(get_u32(b, a, n) == want, "{name}: PTX result");
        // Argument sizes and pointers are checked against the PTX's parameters.
        assert_eq!(
            status(b.launch(
                f.handle,
                &cfg,
                &[rw(a), ArgValue::F64(3.0), ArgValue::U64(1)]
            )),
            Status::BadArgType,
            "{name}"
        );
        assert_eq!(
            status(b.launch(f.handle, &cfg, &[rw(a), ArgValue::F32(3.0)])),
            Status::BadArgCount,
            "{name}"
        );
        assert_eq!(
            status(b.launch(
                f.handle,
                &cfg,
                &[rw(a + (8 << 20)), ArgValue::F32(3.0), ArgValue::U64(1)]
            )),
            Status::BadDevicePointer,
            "{name}"
        );
        let bad_geometry = LaunchConfig {
            grid: [1, 1, 1],
            block: [2048, 1, 1],
            shared_bytes: 0,
        };
        assert_eq!(
            status(b.launch(f.handle, &bad_geometry, &args)),
            Status::InvalidArgument,
            "{name}"
        );
        // Broken PTX is the guest's error, with the JIT's words.
        let e = b
            .module_load(ModuleImage::Ptx(
                b".version 7.8\n.target sm_90\nthis is not ptx",
            ))
            .expect_err("broken PTX");
        assert_eq!(e.status(), Status::InvalidArgument, "{name}: {e}");
        assert_eq!(
            status(b.get_function(m, b"missing")),
            Status::UnknownFunction
        );
        // The device still works.
        b.launch(f.handle, &cfg, &args)
            .expect("launch after errors");
    });
}

#[test]
fn queues_run_concurrently_and_synchronize_waits() {
    each(256 * MIB, |name, b| {
        let spin = builtin(b, "spin");
        let bufs: Vec<(u64, Vec<u8>)> = (0..2u8)
            .map(|i| (b.alloc(MIB).expect("alloc").addr, pattern(MIB as usize, i)))
            .collect();
        let t = Instant::now();
        std::thread::scope(|s| {
            // A long kernel on one "queue" does not block copies on others.
            s.spawn(|| {
                b.launch(spin, &CFG, &[ArgValue::U64(1_000_000)])
                    .expect("spin")
            });
            std::thread::sleep(Duration::from_millis(20));
            let copies = Instant::now();
            let hs: Vec<_> = bufs
                .iter()
                .map(|(addr, p)| {
                    s.spawn(move || {
                        for _ in 0..2 {
                            put(b, *addr, p).expect("htod");
                            assert!(get(b, *addr, p.len()).expect("dtoh") == *p);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("copy thread");
            }
            assert!(
                copies.elapsed() < Duration::from_millis(700),
                "{name}: copies waited for the kernel ({:?})",
                copies.elapsed()
            );
            b.synchronize();
            assert!(
                t.elapsed() >= Duration::from_millis(1000),
                "{name}: synchronize waited"
            );
        });
    });
}

/// Swapping on each backend: a pager with room for half of its data keeps every
/// byte through evictions to host memory and API-driven restores, and a kernel restores
/// what its pointers reach.
#[test]
fn pager_keeps_every_byte_through_swapping() {
    use std::sync::Arc;
    use vgpu_backend::pager::{LocalBroker, Pager};
    let mut backends: Vec<(&str, Arc<dyn Backend>)> = vec![("sim", Arc::new(sim(256 * MIB)))];
    match cuda_skip() {
        None => backends.push(("cuda", Arc::new(cuda(256 * MIB)))),
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
    for (name, inner) in backends {
        let broker = LocalBroker::new(16 * MIB, 0);
        // 128 MiB beside what the backend charged at start (cuda: its context reserve).
        let share = 128 * MIB + inner.memory_usage().used;
        let p = Arc::new(Pager::new(inner, broker.member(1, 0), share));
        broker.attach(1, &p);
        let bufs: Vec<u64> = (0..4)
            .map(|_| p.alloc(8 * MIB).expect("alloc").addr)
            .collect();
        for (i, a) in bufs.iter().enumerate() {
            put(&*p, *a, &pattern(8 << 20, i as u8)).expect("fill");
        }
        for round in 0..2u8 {
            for (i, a) in bufs.iter().enumerate() {
                let want = pattern(8 << 20, i as u8 + round * 16);
                assert_eq!(
                    get(&*p, *a, 8 << 20).expect("read"),
                    want,
                    "{name}: buffer {i}"
                );
                put(&*p, *a, &pattern(8 << 20, i as u8 + (round + 1) * 16)).expect("write");
            }
        }
        // A kernel on a swapped-out buffer: `fill` on bufs[0] after the others pushed it out.
        let f = builtin(&*p, "fill");
        p.launch(
            f,
            &LaunchConfig {
                grid: [64, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
            },
            &[
                w(bufs[0]),
                ArgValue::U32(0x0707_0707),
                ArgValue::U64(2 << 20),
            ],
        )
        .expect("fill");
        assert!(
            get(&*p, bufs[0], 8 << 20)
                .expect("read")
                .iter()
                .all(|v| *v == 7),
            "{name}"
        );
        let s = p.state();
        assert!(s.evictions > 0 && s.restores > 0, "{name}: {s:?}");
        eprintln!("{name}: pager {s:?}");
    }
}

/// A shared object (`export` makes one of `size` bytes) mapped read-write by one vGPU and
/// read-only by another: the bytes are the same memory, the read-only mapping refuses
/// writes before they reach the device, nothing is charged to the mappers, and the
/// mappings go with `free`.
fn shared_object_case(
    name: &str,
    export: &dyn Fn(u64) -> std::os::fd::OwnedFd,
    a: &dyn Backend,
    b: &dyn Backend,
) {
    const SIZE: u64 = 3 * MIB + 4096;
    let fd = export(SIZE);
    let dup = fd.try_clone().expect("dup");
    let (used_a, used_b) = (a.memory_usage().used, b.memory_usage().used);
    let wa = a.import_shared(fd, SIZE, false).expect("import read-write");
    let rb = b.import_shared(dup, SIZE, true).expect("import read-only");
    assert_eq!(
        get(b, rb, 4096).expect("fresh"),
        vec![0; 4096],
        "{name}: zeroed"
    );
    let bytes = pattern(SIZE as usize, 7);
    put(a, wa, &bytes).expect("write through the read-write mapping");
    a.synchronize();
    assert_eq!(get(b, rb, SIZE as usize).expect("read"), bytes, "{name}");
    assert_eq!(status(put(b, rb, &[1])), Status::BadDevicePointer, "{name}");
    assert_eq!(
        status(b.memset(rb, 0, 1, 1)),
        Status::BadDevicePointer,
        "{name}"
    );
    assert_eq!(
        status(b.copy_dtod(rb, rb + 4096, 16)),
        Status::BadDevicePointer
    );
    assert_eq!(
        status(a.check_range(wa, SIZE + 1)),
        Status::BadDevicePointer,
        "{name}"
    );
    assert_eq!(a.memory_usage().used, used_a, "{name}: not charged");
    assert_eq!(b.memory_usage().used, used_b, "{name}: not charged");
    // A kernel's WRITE pointer into the read-only mapping is refused before it runs (on a
    // GPU the write would fault and lose the context); the bytes stay, the backend serves.
    let fill = builtin(b, "fill");
    let fill_args = [w(rb), ArgValue::U32(0xdead_beef), ArgValue::U64(16)];
    assert_eq!(
        status(b.launch(fill, &CFG, &fill_args)),
        Status::BadDevicePointer,
        "{name}: kernel write into a read-only mapping"
    );
    assert_eq!(get(b, rb, 64).expect("read"), bytes[..64], "{name}: intact");
    b.free(rb).expect("detach read-only");
    a.free(wa).expect("detach read-write");
    assert!(get(a, wa, 1).is_err(), "{name}: unmapped");
}

#[test]
fn shared_objects_map_read_write_and_read_only() {
    let (a, b) = (sim(64 * MIB), sim(64 * MIB));
    let export = |size| a.export_shared(size).expect("export");
    shared_object_case("sim", &export, &a, &b);
    // The sim's object is sealed: nobody can shrink it under a mapper.
    let fd = a.export_shared(MIB).expect("export");
    // SAFETY: plain fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::F_GET_SEALS) };
    assert_eq!(seals, vgpu_backend::sim::SHARED_SEALS, "sim: sealed");
    assert!(
        a.export_shared(0).is_err(),
        "sim: an empty object is refused"
    );
    match cuda_skip() {
        None => {
            let (a, b) = (cuda(64 * MIB), cuda(64 * MIB));
            let export = |size| a.export_shared(size).expect("export");
            shared_object_case("cuda", &export, &a, &b);
            let fd = a.export_shared(MIB).expect("export");
            let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
            // SAFETY: fstat writes one stat into `st` (zeroed, so valid either way).
            let rc = unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd), st.as_mut_ptr()) };
            // SAFETY: zero-initialised and written by fstat.
            let st = unsafe { st.assume_init() };
            eprintln!(
                "cuda: exported object fstat rc {rc} mode {:o} size {} rdev {:#x}",
                st.st_mode, st.st_size, st.st_rdev
            );
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

#[test]
fn the_context_reserve_is_charged_from_the_start() {
    // Nothing to reserve on sim; the driver's stacks, heap and printf FIFO on cuda.
    let s = sim(8 * MIB);
    assert_eq!(s.memory_usage().used, 0, "sim: no context reserve");
    match cuda_skip() {
        None => {
            let reserve = cuda_reserve();
            let b = cuda_with(reserve + 4 * MIB, ContextLimits::default());
            let r = b.context_reserve();
            assert_eq!(r.total(), Some(reserve));
            assert_eq!(r.stack_bytes, vgpu_backend::cuda::DEFAULT_STACK);
            assert!(r.sms > 0 && r.threads_per_sm > 0, "{r:?}");
            let u = b.memory_usage();
            assert_eq!((u.used, u.allocations), (reserve, 0), "cuda: {r:?}");
            // Allocations see it: the share holds 4 MiB beside the reserve, no more.
            b.alloc(4 * MIB).expect("room beside the reserve");
            assert_eq!(status(b.alloc(1)), Status::OutOfMemory);
            eprintln!(
                "cuda: context reserve {} MiB ({})",
                reserve >> 20,
                r.detail()
            );
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

#[test]
fn a_share_below_the_context_reserve_is_refused_at_start() {
    match cuda_skip() {
        None => {
            let reserve = cuda_reserve();
            let e = try_cuda(reserve - 1, ContextLimits::default()).expect_err("too small");
            assert!(
                matches!(e, BackendError::ContextReserve { share, reserve: r, .. }
                    if share == reserve - 1 && r == reserve),
                "{e}"
            );
            assert_eq!(e.status(), Status::OutOfMemory);
            let m = e.to_string();
            for part in [reserve.to_string(), (reserve - 1).to_string()] {
                assert!(
                    m.contains(&part),
                    "the message names share and reserve: {m}"
                );
            }
            assert!(m.contains("--cuda-stack"), "{m}");
            // Exactly the reserve starts (with nothing left to allocate).
            let b = cuda_with(reserve, ContextLimits::default());
            assert_eq!(b.memory_usage().used, reserve);
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

/// PTX whose `big_local` keeps `words` u32s in a local array (16 KiB for 4096): it writes
/// buf[i] = i for i < n, then out[t] = buf[(t * 7) % n] for each thread t.
fn big_local_ptx(words: u32) -> String {
    format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n\
         .visible .entry big_local(.param .u64 o, .param .u32 n)\n{{\n\
         .local .align 4 .b8 buf[{}];\n\
         .reg .u64 %d<8>;\n.reg .u32 %r<10>;\n.reg .pred %p;\n\
         ld.param.u64 %d1, [o];\nld.param.u32 %r1, [n];\n\
         mov.u64 %d3, buf;\nmov.u32 %r2, 0;\n\
         L:\nsetp.ge.u32 %p, %r2, %r1;\n@%p bra E;\n\
         mul.wide.u32 %d2, %r2, 4;\nadd.u64 %d4, %d3, %d2;\nst.local.u32 [%d4], %r2;\n\
         add.u32 %r2, %r2, 1;\nbra L;\n\
         E:\nmov.u32 %r6, %tid.x;\nmul.lo.u32 %r7, %r6, 7;\nrem.u32 %r8, %r7, %r1;\n\
         mul.wide.u32 %d2, %r8, 4;\nadd.u64 %d4, %d3, %d2;\nld.local.u32 %r9, [%d4];\n\
         cvta.to.global.u64 %d7, %d1;\n\
         mul.wide.u32 %d5, %r6, 4;\nadd.u64 %d6, %d7, %d5;\nst.global.u32 [%d6], %r9;\n\
         ret;\n}}\n",
        words * 4
    )
}

#[test]
fn a_kernel_needing_more_local_memory_than_the_stack_is_refused_and_runs_within_it() {
    const WORDS: u32 = 4096;
    const THREADS: u32 = 128;
    let ptx = big_local_ptx(WORDS);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        shared_bytes: 0,
    };
    let run = |b: &dyn Backend| -> Result<Vec<u32>, BackendError> {
        let m = b.module_load(ModuleImage::Ptx(ptx.as_bytes()))?;
        let f = b.get_function(m, b"big_local")?.handle;
        let out = b.alloc(u64::from(THREADS) * 4)?.addr;
        b.launch(f, &cfg, &[w(out), ArgValue::U32(WORDS)])?;
        Ok(get_u32(b, out, THREADS as usize))
    };
    match cuda_skip() {
        None => {
            // The default 1 KiB stack: refused before the driver would grow every
            // thread's stack to 16 KiB behind the ledger's back.
            let b = cuda(64 * MIB);
            let e = run(&b).expect_err("over the stack");
            assert!(
                matches!(e, BackendError::LocalMemory { need, limit: 1024, .. } if need >= 16384),
                "{e}"
            );
            assert_eq!(e.status(), Status::OutOfMemory);
            let m = e.to_string();
            for part in ["big_local", "1024", "--cuda-stack"] {
                assert!(m.contains(part), "{m}");
            }
            let used = b.memory_usage().used;
            assert_eq!(
                run(&b).map(|_| ()).map_err(|e| e.status()),
                Err(Status::OutOfMemory)
            );
            assert!(b.memory_usage().used >= used, "the vGPU still serves");
            drop(b);
            // A stack that holds it: the reserve grows with it, and the kernel runs.
            let limits = ContextLimits {
                stack_bytes: 20 << 10,
                ..ContextLimits::default()
            };
            let reserve = CudaGpu::context_reserve_of(0, &limits)
                .expect("reserve")
                .total()
                .expect("fits");
            assert!(reserve > cuda_reserve(), "a larger stack reserves more");
            let b = cuda_with(reserve + 64 * MIB, limits);
            assert_eq!(b.memory_usage().used, reserve);
            let got = run(&b).expect("within the stack");
            let want: Vec<u32> = (0..THREADS).map(|t| (t * 7) % WORDS).collect();
            assert_eq!(got, want, "the local array kept every word");
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

/// A namespace file of `words` u64s (word i = i) for the storage charging case.
fn storage_file(tag: &str, words: u64) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "vgpu-conformance-storage-{}-{tag}",
        std::process::id()
    ));
    let b: Vec<u8> = (0..words).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(&p, b).expect("write namespace file");
    p
}

/// The storage kernels' setup of a namespace is charged once, on first use; refused (and
/// nothing left charged) when it does not fit the share.
fn storage_case(name: &str, b: &dyn Backend, small: &dyn Backend) {
    let scan = builtin(b, "storage_scan_sum");
    let out = b.alloc(8).expect("alloc").addr;
    let args = |out| {
        vec![
            ArgValue::U64(1),
            ArgValue::U64(0),
            ArgValue::U64(1024),
            ArgValue::U32(8),
            w(out),
        ]
    };
    let before = b.memory_usage().used;
    b.launch(scan, &CFG, &args(out)).expect("scan");
    let charged = b.memory_usage().used - before;
    if name == "sim" {
        let cache = (vgpu_backend::storage::CACHE_LINE * vgpu_backend::storage::CACHE_LINES) as u64;
        assert_eq!(charged, cache, "sim: the cache lines");
    } else {
        assert!(
            charged >= 64 * MIB,
            "cuda: region, block and doorbells: {charged}"
        );
    }
    b.launch(scan, &CFG, &args(out)).expect("scan again");
    assert_eq!(
        b.memory_usage().used,
        before + charged,
        "{name}: charged once"
    );
    eprintln!("{name}: storage setup charged {charged} bytes");

    let scan = builtin(small, "storage_scan_sum");
    let out = small.alloc(8).expect("alloc").addr;
    let before = small.memory_usage().used;
    let e = small
        .launch(scan, &CFG, &args(out))
        .expect_err("does not fit");
    assert_eq!(e.status(), Status::OutOfMemory, "{name}: {e}");
    assert_eq!(
        small.memory_usage().used,
        before,
        "{name}: nothing stays charged"
    );
    small.alloc(1).expect("the share still serves allocations");
}

#[test]
fn the_storage_setup_is_charged_once_and_refused_when_it_does_not_fit() {
    use std::sync::Arc;
    use vgpu_backend::storage::{NamespaceSpec, StorageSet};
    let path = storage_file("charge", 1 << 16);
    let set = || {
        let s = StorageSet::new(vec![NamespaceSpec {
            id: 1,
            path: path.clone(),
            read_only: true,
        }])
        .expect("set");
        s.attach(1).expect("attach");
        Arc::new(s)
    };
    storage_case(
        "sim",
        &sim(64 * MIB).with_storage(set()),
        &sim(2 * MIB).with_storage(set()),
    );
    match cuda_skip() {
        None => storage_case(
            "cuda",
            &cuda(256 * MIB).with_storage(set()),
            &cuda(8 * MIB).with_storage(set()),
        ),
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
    let _ = std::fs::remove_file(&path);
}
