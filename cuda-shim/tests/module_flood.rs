//! A guest that floods its vGPU with modules over the process transport (sim workers):
//! module memory is charged to the share, the load past it is refused with
//! OUT_OF_MEMORY, `memory_used` says so, and a neighbour vGPU works unaffected.

mod common;

use guest_driver::linux::selftest::stream_options;
use guest_driver::process::ProcessTransport;
use guest_driver::vgpu::{launch_1d, Stream};
use guest_driver::{Error, Transport, VgpuDevice};
use vgpu_proto::{Access, KernelArg, Status};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;

type Dev = VgpuDevice<ProcessTransport>;

fn open(worker: &common::Worker) -> (ProcessTransport, Dev, Stream<ProcessTransport>) {
    let t = ProcessTransport::connect(&worker.socket).expect("connect");
    let mut gpu = VgpuDevice::probe(t.clone()).expect("probe");
    let s: Stream<_> = gpu.open_stream(0, stream_options(64)).expect("stream");
    gpu.start().expect("driver ok");
    (t, gpu, s)
}

#[test]
fn a_module_flood_is_refused_at_the_share_and_the_neighbour_is_unaffected() {
    let hostile = common::Worker::sim("flood", "4M", 1);
    let neighbour = common::Worker::sim("flood-neighbour", "4M", 1);
    let (_th, _gh, mut h) = open(&hostile);
    let (tn, _gn, mut n) = open(&neighbour);

    // The hostile guest takes all but 16 pages with memory, then loads modules until the
    // device refuses.
    let share = h.get_info().expect("info").memory_share;
    assert_eq!(share, 4 * MIB);
    h.alloc(share - 16 * PAGE).expect("alloc");
    let mut loaded = 0;
    let refused = loop {
        match h.load_builtin() {
            Ok(_) => loaded += 1,
            Err(e) => break e,
        }
        assert!(loaded <= 16, "more modules than the share holds");
    };
    assert_eq!(loaded, 16);
    assert!(
        matches!(
            refused,
            Error::Device {
                status: Status::OutOfMemory,
                ..
            }
        ),
        "{refused:?}"
    );
    let info = h.get_info().expect("info");
    assert_eq!(info.memory_used, share, "modules count in memory_used");

    // The neighbour allocates, loads and computes as if nothing happened.
    let before = n.get_info().expect("info").memory_used;
    assert_eq!(before, 0);
    let count = 1024usize;
    let bytes = count * 4;
    let a = n.alloc(bytes as u64).expect("a");
    let b = n.alloc(bytes as u64).expect("b");
    let c = n.alloc(bytes as u64).expect("c");
    let mut host = tn.dma_alloc(bytes, 64).expect("dma");
    for (i, w) in host.as_mut_slice().chunks_exact_mut(4).enumerate() {
        w.copy_from_slice(&(i as f32).to_le_bytes());
    }
    n.memcpy_htod(a, host.as_slice()).expect("htod a");
    n.memcpy_htod(b, host.as_slice()).expect("htod b");
    let m = n.load_builtin().expect("the neighbour loads a module");
    let f = n.get_function(m, "vector_add").expect("vector_add");
    let args = [
        KernelArg::ptr(a, Access::Read),
        KernelArg::ptr(b, Access::Read),
        KernelArg::ptr(c, Access::Write),
        KernelArg::u64(count as u64),
    ];
    n.launch(&launch_1d(f.handle, count as u64, 256), &args)
        .expect("launch");
    n.memcpy_dtoh(host.as_mut_slice(), c).expect("dtoh");
    for (i, w) in host.as_slice().chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        assert_eq!(v, 2.0 * i as f32, "element {i}");
    }
    let used = n.get_info().expect("info").memory_used;
    assert_eq!(
        used,
        3 * bytes as u64 + PAGE,
        "three allocations and one module"
    );
}
