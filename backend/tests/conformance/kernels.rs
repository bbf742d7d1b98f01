//! Built-in and guest PTX kernels against their references, refused launches, queues.

use super::*;

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
            .launch_one(add, &CFG, &[r(pa), r(pb), w(pc), ArgValue::U64(n as u64)])
            .expect("vector_add");
        assert!(s.device_ns > 0, "{name}: device time reported");
        let want: Vec<u32> = x.iter().zip(&y).map(|(a, b)| (a + b).to_bits()).collect();
        assert!(get_f32_bits(b, pc, n) == want, "{name}: vector_add");

        let saxpy = builtin(b, "saxpy");
        let alpha = 1.7f32;
        b.launch_one(
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
        b.launch_one(
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
        b.launch_one(fill, &CFG, &[w(pc), ArgValue::F32(-2.5), ArgValue::U32(3)])
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
        b.launch_one(red, &CFG, &[r(px), w(out), ArgValue::U64(n as u64)])
            .expect("reduce_sum");
        assert_eq!(
            get_u32(b, out, 1)[0],
            reduce_ref(&x).to_bits(),
            "{name}: reduce_sum"
        );
        b.launch_one(red, &CFG, &[r(px), w(out), ArgValue::U64(0)])
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
        b.launch_one(
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
            status(b.launch_one(
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
        b.launch_one(ga, &CFG, &args).expect("gather");
        let want: Vec<u32> = idx.iter().map(|i| src[*i as usize]).collect();
        assert!(get_u32(b, pd, 5000) == want, "{name}: gather");
        let mut bad = idx.clone();
        bad[4321] = 1000;
        bad[4500] = u32::MAX;
        put(b, pi, &words(&bad)).expect("htod");
        let e = b
            .launch_one(ga, &CFG, &args)
            .expect_err("index past src_len");
        assert_eq!(e.status(), Status::KernelFault, "{name}: {e}");
        assert!(e.to_string().contains("idx[4321] = 1000"), "{name}: {e}");
        put(b, pi, &words(&idx)).expect("htod");
        b.launch_one(ga, &CFG, &args).expect("gather after a fault");

        // checksum from an unaligned start, odd length.
        let bytes = pattern(100_003, 7);
        let pd2 = b.alloc(200_000).expect("alloc").addr;
        put(b, pd2, &bytes).expect("htod");
        let ck = builtin(b, "checksum");
        b.launch_one(ck, &CFG, &[r(pd2 + 5), ArgValue::U64(99_990), w(out + 8)])
            .expect("checksum");
        let h = get(b, out + 8, 8).expect("dtoh");
        let got = u64::from_le_bytes(h.try_into().expect("8 bytes"));
        assert_eq!(
            got,
            fnv1a64(FNV_OFFSET, &bytes[5..5 + 99_990]),
            "{name}: checksum"
        );
        assert_eq!(
            status(b.launch_one(ck, &CFG, &[r(pd2), ArgValue::U64(8), w(out + 4)])),
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
            status(b.launch_one(f, &CFG, &[ArgValue::U64(u64::MAX)])),
            Status::InvalidArgument
        );
        let t = Instant::now();
        let s = b
            .launch_one(f, &CFG, &[ArgValue::U64(20_000)])
            .expect("spin");
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
            status(b.launch_one(add, &CFG, &[r(a), r(a), w(a)])),
            Status::BadArgCount
        );
        assert_eq!(
            status(b.launch_one(add, &CFG, &[r(a), r(a), r(a), n])),
            Status::BadArgType,
            "{name}: read-only pointer for a written parameter"
        );
        assert_eq!(
            status(b.launch_one(add, &CFG, &[r(a), ArgValue::U64(a), w(a), n])),
            Status::BadArgType
        );
        assert_eq!(
            status(b.launch_one(add, &CFG, &[r(a), r(a), w(a), ArgValue::U64(1025)])),
            Status::BadDevicePointer,
            "{name}: extent past the allocation"
        );
        assert_eq!(
            status(b.launch_one(add, &CFG, &[r(a + 2), r(a), w(a), ArgValue::U64(4)])),
            Status::BadDevicePointer,
            "{name}: misaligned"
        );
        assert_eq!(
            status(b.launch_one(add, &CFG, &[r(a), r(a), w(a + (4 << 20)), n])),
            Status::BadDevicePointer,
            "{name}: not an allocation"
        );
        assert_eq!(status(b.launch_one(0, &CFG, &[])), Status::UnknownFunction);
        assert_eq!(
            status(b.launch_one(u64::MAX, &CFG, &[])),
            Status::UnknownFunction
        );
        let m = b
            .modules()
            .module_load(ModuleImage::Builtin(b"builtin\0"))
            .expect("NUL-terminated name");
        assert_eq!(
            status(b.modules().get_function(m, b"no_such_kernel")),
            Status::UnknownFunction
        );
        let f = b.modules().get_function(m, b"fill").expect("fill");
        assert_eq!(f.param_count, 3);
        b.modules().module_unload(m).expect("unload");
        assert_eq!(
            status(b.launch_one(f.handle, &CFG, &[w(a), ArgValue::U32(0), ArgValue::U32(1)])),
            Status::UnknownFunction,
            "{name}: unloaded"
        );
        assert_eq!(status(b.modules().module_unload(m)), Status::UnknownModule);
        assert_eq!(
            status(b.modules().module_load(ModuleImage::Builtin(b"nope"))),
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
        let load = b
            .modules()
            .module_load(ModuleImage::Ptx(SCALE_PTX.as_bytes()));
        if !ptx {
            assert_eq!(status(load), Status::NotSupported, "{name}");
            return;
        }
        let m = load.expect("PTX module");
        let f = b.modules().get_function(m, b"scale").expect("scale");
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
        let s = b.launch_one(f.handle, &cfg, &args).expect("launch");
        assert!(s.device_ns > 0, "{name}");
        let want: Vec<u32> = x.iter().map(|v| (v * 3.0).to_bits()).collect();
        assert!(get_u32(b, a, n) == want, "{name}: PTX result");
        // Argument sizes and pointers are checked against the PTX's parameters.
        assert_eq!(
            status(b.launch_one(
                f.handle,
                &cfg,
                &[rw(a), ArgValue::F64(3.0), ArgValue::U64(1)]
            )),
            Status::BadArgType,
            "{name}"
        );
        assert_eq!(
            status(b.launch_one(f.handle, &cfg, &[rw(a), ArgValue::F32(3.0)])),
            Status::BadArgCount,
            "{name}"
        );
        assert_eq!(
            status(b.launch_one(
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
            status(b.launch_one(f.handle, &bad_geometry, &args)),
            Status::InvalidArgument,
            "{name}"
        );
        // Broken PTX is the guest's error, with the JIT's words.
        let e = b
            .modules()
            .module_load(ModuleImage::Ptx(
                b".version 7.8\n.target sm_90\nthis is not ptx",
            ))
            .expect_err("broken PTX");
        assert_eq!(e.status(), Status::InvalidArgument, "{name}: {e}");
        assert_eq!(
            status(b.modules().get_function(m, b"missing")),
            Status::UnknownFunction
        );
        // The device still works.
        b.launch_one(f.handle, &cfg, &args)
            .expect("launch after errors");
    });
}

/// Timing-sensitive on a real GPU: other tests of this process creating or destroying
/// contexts meanwhile can hold the copies back behind the 1 s kernel (seen on the H200), so
/// the GPU suite runs this test alone (`ci/gpu/suite.sh`, step `conformance`).
#[test]
fn queues_run_concurrently_and_synchronize_waits() {
    each(256 * MIB, |name, b| {
        let spin = builtin(b, "spin");
        let bufs: Vec<(u64, Vec<u8>)> = (0..2u8)
            .map(|i| (b.alloc(MIB).expect("alloc").addr, pattern(MIB as usize, i)))
            .collect();
        let t = Instant::now();
        let launching = std::sync::atomic::AtomicBool::new(false);
        let launching = &launching;
        std::thread::scope(|s| {
            // A long kernel on one "queue" does not block copies on others.
            s.spawn(move || {
                launching.store(true, std::sync::atomic::Ordering::Release);
                b.launch_one(spin, &CFG, &[ArgValue::U64(1_000_000)])
                    .expect("spin")
            });
            // A loaded machine may start the kernel's thread late: wait for it, then give
            // the launch time to reach the device before the copies and the synchronize.
            while !launching.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::yield_now();
            }
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
