//! Backend-level benchmark of the cuda backend, each figure beside its native anchor
//! measured in the same process and run (ignored by default; needs a GPU):
//!
//! - host->device and device->host copy throughput, 4 KiB to 1 GiB: `Backend::copy_htod` /
//!   `copy_dtoh` from a `MAP_SHARED` memfd mapping registered once with
//!   `HostMemory::register` (exactly how guest RAM reaches the worker) versus
//!   `cuMemcpyHtoDAsync`/`DtoHAsync` + stream sync between a `cuMemHostAlloc` buffer and a
//!   `cuMemAlloc` buffer;
//! - the same 256 MiB copy from unregistered (pageable) memory, for scale;
//! - null-kernel round trip: `Backend::launch` of the built-in `spin` for 0 µs (argument
//!   checks, the launch, the wait; timed on the host) versus `cuLaunchKernel` of the same
//!   kernel + `cuStreamSynchronize`, and versus the same between two timing events whose
//!   time is read (what timing a lone kernel with events would cost);
//! - the same round trip of a 1.6 ms `spin` (about one 8192³ bf16 product): noticing a long
//!   kernel's end, the backend's polling wait beside the driver's;
//! - batches of 32 null launches under one wait (`Backend::launch` of 32 items), per
//!   launch, versus 32 `cuLaunchKernel` + `cuStreamSynchronize`, versus the same between two
//!   timing events, versus enqueueing alone;
//! - the time `HostMemory::register` takes for 1 GiB.
//!
//! Prints `name: value unit | anchor: value unit | ratio: x` per figure (docs/PERFORMANCE.md) and, when
//! `VGPU_BENCH_JSON` names a file, writes the figures there as JSON.
//! Run: `cargo test --release -p vgpu-backend --test cuda_bench -- --ignored --nocapture`.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::sys::{self, CUresult};
use vgpu_backend::cuda::BUILTIN_PTX;
use vgpu_backend::{
    Backend, CudaConfig, CudaGpu, HostRegion, Launch, LaunchConfig, LaunchOne, ModuleImage,
    NO_CLUSTER,
};
use vgpu_proto::ArgValue;
use vm_memory::VolatileSlice;

const GIB: usize = 1 << 30;
/// Null launches per batch in the batched figures (what the library posts between waits).
const BATCH: usize = 32;

fn ok(rc: CUresult, what: &str) {
    assert_eq!(rc, CUresult::CUDA_SUCCESS, "{what}");
}

struct Figure {
    name: String,
    value: f64,
    unit: &'static str,
    anchor_name: String,
    anchor: f64,
}

impl Figure {
    fn line(&self) -> String {
        format!(
            "{}: {:.2} {} | anchor ({}): {:.2} {} | ratio: {:.3}x",
            self.name,
            self.value,
            self.unit,
            self.anchor_name,
            self.anchor,
            self.unit,
            self.value / self.anchor
        )
    }

    fn json(&self) -> String {
        format!(
            "{{\"name\":\"{}\",\"value\":{},\"unit\":\"{}\",\"anchor_name\":\"{}\",\"anchor\":{},\"ratio\":{}}}",
            self.name,
            self.value,
            self.unit,
            self.anchor_name,
            self.anchor,
            self.value / self.anchor
        )
    }
}

/// Iterations for a copy of `size` bytes: about 8 GiB moved, 5..=5000 times.
fn iters(size: usize) -> usize {
    (8 * GIB / size).clamp(5, 5000)
}

/// GB/s of `f` moving `size` bytes per call (after two warm-up calls).
fn gbps(size: usize, mut f: impl FnMut()) -> f64 {
    f();
    f();
    let n = iters(size);
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    (size * n) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn median_us(n: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..100 {
        f();
    }
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[n / 2]
}

/// Queues the built-in `spin` natively for `ns` nanoseconds (the kernel's own unit; the
/// backend converts the guest's µs) on `stream`, without waiting.
fn spin_native(f: sys::CUfunction, stream: sys::CUstream, ns: u64) {
    let mut ns = ns;
    let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
    // SAFETY: `f` is the live `spin` function of the current context, which takes one u64;
    // `params` points at it for the call (the driver copies the arguments before
    // returning); `stream` is a live stream of that context.
    let rc = unsafe {
        sys::cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    ok(rc, "launch");
}

/// A `MAP_SHARED` memfd mapping of `len` bytes, like the guest RAM the worker maps.
fn shared_mapping(len: usize) -> *mut u8 {
    // SAFETY: memfd_create with a static NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"bench-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: sizes our own fresh descriptor.
    assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
    // SAFETY: maps the whole memfd at an address of the kernel's choosing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping keeps the memory; the descriptor is ours to close.
    unsafe { libc::close(fd) };
    p.cast()
}

#[test]
#[ignore = "benchmark: needs a GPU (run with --ignored --nocapture)"]
fn cuda_copy_and_launch_bench() {
    if let Err(why) = CudaGpu::probe() {
        assert!(
            std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
            "VGPU_REQUIRE_CUDA is set: {why}"
        );
        eprintln!("SKIPPED: no CUDA GPU: {why}");
        return;
    }
    let gpu = CudaGpu::new(CudaConfig {
        memory: 4 << 30,
        va_size: 8 << 30,
        ..CudaConfig::default()
    })
    .expect("cuda backend");
    let mut figures = Vec::new();

    // Guest-RAM-like memory, registered once.
    let host = shared_mapping(GIB);
    let region = HostRegion {
        addr: host as usize,
        len: GIB,
    };
    let t = Instant::now();
    gpu.host_memory()
        .expect("host memory")
        .register(&[region])
        .expect("register");
    let reg_ms = t.elapsed().as_secs_f64() * 1e3;
    println!("HostMemory::register of 1 GiB (MAP_SHARED memfd): {reg_ms:.1} ms");
    // SAFETY: [host, host + 1 GiB) is our live mapping for the rest of the test.
    let guest = unsafe { VolatileSlice::new(host, GIB) };
    let dev = gpu.alloc(GIB as u64).expect("alloc").addr;

    // Native anchor in the same (primary) context.
    let mut cdev: sys::CUdevice = 0;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one device and one context handle; retains the primary context the
    // backend uses, and makes it current on this thread.
    unsafe {
        ok(sys::cuDeviceGet(&mut cdev, 0), "device");
        ok(sys::cuDevicePrimaryCtxRetain(&mut ctx, cdev), "retain");
        ok(sys::cuCtxSetCurrent(ctx), "current");
    }
    let mut pinned: *mut c_void = std::ptr::null_mut();
    let mut ndev: sys::CUdeviceptr = 0;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: plain allocations written into our locals.
    unsafe {
        ok(sys::cuMemHostAlloc(&mut pinned, GIB, 0), "cuMemHostAlloc");
        ok(sys::cuMemAlloc_v2(&mut ndev, GIB), "cuMemAlloc");
        ok(
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
            "stream",
        );
    }
    let native = |htod: bool, size: usize| {
        // SAFETY: `pinned` and `ndev` are live buffers of 1 GiB >= size; we wait for the copy.
        unsafe {
            ok(sys::cuCtxSetCurrent(ctx), "current");
            if htod {
                ok(
                    sys::cuMemcpyHtoDAsync_v2(ndev, pinned, size, stream),
                    "htod",
                );
            } else {
                ok(
                    sys::cuMemcpyDtoHAsync_v2(pinned, ndev, size, stream),
                    "dtoh",
                );
            }
            ok(sys::cuStreamSynchronize(stream), "sync");
        }
    };

    let sizes: [(usize, &str); 7] = [
        (4 << 10, "4KiB"),
        (64 << 10, "64KiB"),
        (1 << 20, "1MiB"),
        (16 << 20, "16MiB"),
        (64 << 20, "64MiB"),
        (256 << 20, "256MiB"),
        (GIB, "1GiB"),
    ];
    for (size, label) in sizes {
        let slice = guest.subslice(0, size).expect("slice");
        let b_h = gbps(size, || {
            gpu.copy_htod(dev, &slice).expect("htod");
        });
        let n_h = gbps(size, || native(true, size));
        let b_d = gbps(size, || {
            gpu.copy_dtoh(dev, &slice).expect("dtoh");
        });
        let n_d = gbps(size, || native(false, size));
        for (dir, v, a) in [("htod", b_h, n_h), ("dtoh", b_d, n_d)] {
            figures.push(Figure {
                name: format!("backend_{dir}_{label}_registered"),
                value: v,
                unit: "GB/s",
                anchor_name: format!("native_pinned_cuMemcpy_{dir}"),
                anchor: a,
            });
        }
    }
    // Pageable, for scale: what copies would do without registration.
    let size = 256 << 20;
    let mut plain = vec![1u8; size];
    let v = gbps(size, || {
        gpu.copy_htod(dev, &VolatileSlice::from(&mut plain[..]))
            .expect("pageable htod");
    });
    figures.push(Figure {
        name: "backend_htod_256MiB_pageable".into(),
        value: v,
        unit: "GB/s",
        anchor_name: "native_pinned_cuMemcpy_htod".into(),
        anchor: gbps(size, || native(true, size)),
    });

    // Null-kernel round trip.
    let m = gpu
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin");
    let spin = gpu.modules().get_function(m, b"spin").expect("spin").handle;
    let cfg = LaunchConfig {
        grid: [1; 3],
        block: [1; 3],
        shared_bytes: 0,
    };
    let backend_us = median_us(5000, || {
        gpu.launch_one(spin, &cfg, &[ArgValue::U64(0)])
            .expect("launch");
    });
    let mut text = BUILTIN_PTX.as_bytes().to_vec();
    text.push(0);
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX and name; writes one module and one function handle.
    unsafe {
        ok(sys::cuCtxSetCurrent(ctx), "current");
        ok(
            sys::cuModuleLoadData(&mut module, text.as_ptr().cast()),
            "load",
        );
        ok(
            sys::cuModuleGetFunction(&mut f, module, c"spin".as_ptr()),
            "spin",
        );
    }
    let native_us = median_us(5000, || {
        spin_native(f, stream, 0);
        // SAFETY: a live stream of the current context.
        ok(unsafe { sys::cuStreamSynchronize(stream) }, "sync");
    });
    // The same between two timing events, waited for and read: what a lone launch would
    // cost with events around it (the backend times a lone kernel on the host instead).
    let mut timing = [std::ptr::null_mut(); 2];
    for e in &mut timing {
        // SAFETY: writes one event handle.
        ok(unsafe { sys::cuEventCreate(e, 0) }, "event");
    }
    let native_events_us = median_us(5000, || {
        let mut ms = 0f32;
        // SAFETY: live events and stream of the current context; writes one float.
        unsafe {
            ok(sys::cuEventRecord(timing[0], stream), "record");
            spin_native(f, stream, 0);
            ok(sys::cuEventRecord(timing[1], stream), "record");
            ok(sys::cuEventSynchronize(timing[1]), "wait");
            ok(
                sys::cuEventElapsedTime_v2(&mut ms, timing[0], timing[1]),
                "elapsed",
            );
        }
    });
    // SAFETY: the events are idle (the last wait returned) and no longer used.
    unsafe {
        for e in timing {
            ok(sys::cuEventDestroy_v2(e), "event");
        }
    }
    for (anchor_name, anchor) in [
        ("native_cuLaunchKernel_plus_sync", native_us),
        (
            "native_between_two_timing_events_plus_sync",
            native_events_us,
        ),
    ] {
        figures.push(Figure {
            name: "backend_null_kernel_roundtrip".into(),
            value: backend_us,
            unit: "us",
            anchor_name: anchor_name.into(),
            anchor,
        });
    }

    // A kernel of about one large matrix product's length (1.6 ms): what noticing its end
    // costs, the backend's polling wait beside the driver's own.
    let long_us = 1600u64;
    let backend_long = median_us(200, || {
        gpu.launch_one(spin, &cfg, &[ArgValue::U64(long_us)])
            .expect("launch");
    });
    let native_long = median_us(200, || {
        spin_native(f, stream, long_us * 1000);
        // SAFETY: a live stream of the current context.
        ok(unsafe { sys::cuStreamSynchronize(stream) }, "sync");
    });
    figures.push(Figure {
        name: "backend_1600us_kernel_roundtrip".into(),
        value: backend_long,
        unit: "us",
        anchor_name: "native_cuLaunchKernel_plus_sync".into(),
        anchor: native_long,
    });

    // Batches of 32 null launches under one wait, per launch: the backend's batch beside 32
    // `cuLaunchKernel` and one `cuStreamSynchronize`, and beside the same with a timing
    // event before and after (the batch's own structure), so that what the backend adds
    // per launch is told apart from what events and the wait cost.
    let zero_arg = [ArgValue::U64(0)];
    let batch: Vec<Launch<'_>> = (0..BATCH)
        .map(|_| Launch {
            function: spin,
            config: cfg,
            cluster: NO_CLUSTER,
            args: &zero_arg,
            blob: &[],
        })
        .collect();
    let per_launch = |us: f64| us / BATCH as f64;
    let backend_batch = per_launch(median_us(2000, || {
        assert!(gpu.launch(&batch).iter().all(Result::is_ok), "batch");
    }));
    let launch_native = || spin_native(f, stream, 0);
    let native_batch = per_launch(median_us(2000, || {
        for _ in 0..BATCH {
            launch_native();
        }
        // SAFETY: a live stream of the current context.
        ok(unsafe { sys::cuStreamSynchronize(stream) }, "sync");
    }));
    let mut events = [std::ptr::null_mut(); 2];
    for e in &mut events {
        // SAFETY: writes one event handle.
        ok(unsafe { sys::cuEventCreate(e, 0) }, "event");
    }
    let native_timed = per_launch(median_us(2000, || {
        // SAFETY: live events and stream of the current context.
        unsafe {
            ok(sys::cuEventRecord(events[0], stream), "record");
            for _ in 0..BATCH {
                launch_native();
            }
            ok(sys::cuEventRecord(events[1], stream), "record");
            ok(sys::cuEventSynchronize(events[1]), "wait");
        }
    }));
    // Enqueueing alone: 32 launches timed, the stream drained untimed between rounds.
    let mut enqueue = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let t = Instant::now();
        for _ in 0..BATCH {
            launch_native();
        }
        enqueue.push(t.elapsed().as_secs_f64() * 1e6);
        // SAFETY: a live stream of the current context.
        ok(unsafe { sys::cuStreamSynchronize(stream) }, "sync");
    }
    enqueue.sort_by(|a, b| a.total_cmp(b));
    let native_enqueue = per_launch(enqueue[enqueue.len() / 2]);
    // SAFETY: the events are idle (the last wait returned) and no longer used.
    unsafe {
        for e in events {
            ok(sys::cuEventDestroy_v2(e), "event");
        }
    }
    for (anchor_name, anchor) in [
        ("native_32_cuLaunchKernel_plus_sync", native_batch),
        ("native_32_cuLaunchKernel_between_two_events", native_timed),
        ("native_cuLaunchKernel_enqueue_only", native_enqueue),
    ] {
        figures.push(Figure {
            name: "backend_batched_null_launch".into(),
            value: backend_batch,
            unit: "us",
            anchor_name: anchor_name.into(),
            anchor,
        });
    }

    for fig in &figures {
        println!("{}", fig.line());
    }
    if let Some(path) = std::env::var_os("VGPU_BENCH_JSON") {
        let body: Vec<String> = figures.iter().map(Figure::json).collect();
        std::fs::write(
            path,
            format!(
                "{{\"register_1GiB_ms\":{reg_ms},\"figures\":[{}]}}\n",
                body.join(",")
            ),
        )
        .expect("write JSON");
    }
    gpu.host_memory()
        .expect("host memory")
        .unregister(&[region]);
}
