//! guest-driver's vGPU API over the process transport against a real sim `vgpu-worker`:
//! alloc, copies, a built-in launch, free, pool growth, sealed memfds.

mod common;

use guest_driver::linux::selftest::stream_options;
use guest_driver::process::ProcessTransport;
use guest_driver::vgpu::{launch_1d, Stream};
use guest_driver::{Transport, VgpuDevice};
use vgpu_proto::{Access, KernelArg};

#[test]
fn alloc_copy_launch_free_over_the_process_transport() {
    let worker = common::Worker::sim("transport", "256M", 2);
    let t = ProcessTransport::connect(&worker.socket).expect("connect");
    for fd in t.region_fds() {
        // SAFETY: F_GET_SEALS on a descriptor the transport keeps open.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        assert_eq!(seals & want, want, "memfd {fd} not sealed");
    }
    let mut gpu = VgpuDevice::probe(t.clone()).expect("probe");
    assert_eq!(gpu.num_queues(), 2);
    let mut s0: Stream<_> = gpu.open_stream(0, stream_options(64)).expect("stream 0");
    let mut s1: Stream<_> = gpu.open_stream(1, stream_options(64)).expect("stream 1");
    gpu.start().expect("driver ok");
    assert!(!t.failed());

    let info = s0.get_info().expect("info");
    assert_eq!(info.memory_share, 256 << 20);

    let n = 4096usize;
    let bytes = n * 4;
    let mut host_a = t.dma_alloc(bytes, 64).expect("dma a");
    let mut host_b = t.dma_alloc(bytes, 64).expect("dma b");
    for (i, c) in host_a.as_mut_slice().chunks_exact_mut(4).enumerate() {
        c.copy_from_slice(&(i as f32).to_le_bytes());
    }
    for (i, c) in host_b.as_mut_slice().chunks_exact_mut(4).enumerate() {
        c.copy_from_slice(&(2.0 * i as f32).to_le_bytes());
    }
    let a = s0.alloc(bytes as u64).expect("alloc a");
    let b = s0.alloc(bytes as u64).expect("alloc b");
    let c = s1.alloc(bytes as u64).expect("alloc c");
    s0.memcpy_htod(a, host_a.as_slice()).expect("htod a");
    s0.memcpy_htod(b, host_b.as_slice()).expect("htod b");

    let module = s1.load_builtin().expect("builtin");
    let f = s1.get_function(module, "vector_add").expect("vector_add");
    let args = [
        KernelArg::ptr(a, Access::Read),
        KernelArg::ptr(b, Access::Read),
        KernelArg::ptr(c, Access::Write),
        KernelArg::u64(n as u64),
    ];
    s1.launch(&launch_1d(f.handle, n as u64, 256), &args)
        .expect("launch");

    // The same launch with its header in DMA memory of its own, followed by a parameter
    // blob larger than a slot's header area (no argument names its bytes): the device
    // reads the whole descriptor.
    let blob = vec![0x5au8; 3000];
    let mut header = t
        .dma_alloc(
            vgpu_proto::launch_request_len(args.len(), 0) + blob.len(),
            64,
        )
        .expect("header");
    // SAFETY: `header` stays allocated until the request completed (waited for below).
    let tk = unsafe {
        s1.enqueue_launch_in(
            &mut header,
            &launch_1d(f.handle, n as u64, 256),
            &args,
            &[],
            &blob,
        )
    }
    .expect("enqueue launch in own memory");
    s1.submit();
    s1.wait(tk).expect("launch with a large header");
    // SAFETY: the request completed.
    unsafe { t.dma_free(header) };

    // The pool grows past its first region (a second memfd, the table sent again) and the
    // result lands in the new region.
    let big = t.dma_alloc(96 << 20, 4096).expect("grow");
    assert!(t.regions() >= 2);
    let mut out = t.dma_alloc(bytes, 64).expect("dma out");
    s1.memcpy_dtoh(out.as_mut_slice(), c).expect("dtoh");
    for (i, w) in out.as_slice().chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        assert_eq!(v, 3.0 * i as f32, "element {i}");
    }
    // Many requests, one doorbell.
    let tickets: Vec<_> = (0..8)
        .map(|i| s0.enqueue_memset(a, i, n as u64, 4).expect("memset"))
        .collect();
    s0.submit();
    for tk in tickets {
        s0.wait(tk).expect("memset done");
    }
    s0.memcpy_dtoh(out.as_mut_slice(), a).expect("dtoh a");
    assert!(out
        .as_slice()
        .chunks_exact(4)
        .all(|w| w == 7u32.to_le_bytes()));

    // Memory outside the pool has no device address.
    let stack = [0u8; 16];
    assert!(s0.memcpy_htod(a, &stack).is_err());
    s0.free(a).expect("free a");
    s0.free(b).expect("free b");
    s1.free(c).expect("free c");
    assert!(s0.free(a).is_err(), "double free must fail");
    // SAFETY: no request uses these regions any more (every request completed).
    unsafe {
        t.dma_free(host_a);
        t.dma_free(host_b);
        t.dma_free(big);
        t.dma_free(out);
    }
}
