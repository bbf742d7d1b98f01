//! Bad input and dead devices come back to the caller as typed errors, never a hang.

mod common;

use common::*;
use std::time::{Duration, Instant};
use vgpu_storage::controller::{EmulatedController, EmulatedOptions};
use vgpu_storage::nvme::{NvmeStatus, Sqe};
use vgpu_storage::{
    kernels, DmaRegion, DmaSlice, Error, Namespace, NamespaceOptions, PageCache, StorageArray,
};

#[test]
fn lba_beyond_the_namespace_is_refused_by_host_and_controller() {
    let f = pattern_file("range", 1 << 12); // 32 KiB = 64 blocks
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    assert!(matches!(
        ns.read(ns.bytes(), &buf.slice(0, 512).unwrap()),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        ns.read(ns.bytes() - 512, &buf),
        Err(Error::OutOfRange { .. })
    ));
    // Straight to the controller: the status comes back typed.
    let q = ns.queue();
    for (slba, nlb) in [(64u64, 1u32), (60, 8), (u64::MAX - 2, 8)] {
        let sqe = ns.raw_command(false, slba, nlb, &buf).unwrap();
        let r = q.execute(sqe);
        assert!(
            matches!(r, Err(Error::Status(NvmeStatus::LbaOutOfRange))),
            "{slba}: {r:?}"
        );
    }
    // The queue keeps working.
    ns.read(0, &buf).unwrap();
}

#[test]
fn controller_error_statuses_are_typed() {
    let f = pattern_file("status", 1 << 12);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    let q = ns.queue();
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    let mut bad_ns = ns.raw_command(false, 0, 1, &buf).unwrap();
    bad_ns.nsid = 7;
    assert!(matches!(
        q.execute(bad_ns),
        Err(Error::Status(NvmeStatus::InvalidNamespace))
    ));
    let mut bad_op = ns.raw_command(false, 0, 1, &buf).unwrap();
    bad_op.cdw0 = (bad_op.cdw0 & !0xff) | 0x7f;
    assert!(matches!(
        q.execute(bad_op),
        Err(Error::Status(NvmeStatus::InvalidOpcode))
    ));
    // A buffer never mapped for the device: the controller refuses to DMA into it.
    let unmapped = DmaSlice::whole(DmaRegion::host(4096).unwrap());
    let r = q.execute(Sqe::read(1, 0, 8, unmapped.iova(), 0));
    assert!(
        matches!(r, Err(Error::Status(NvmeStatus::DataTransferError))),
        "{r:?}"
    );
    // More than MDTS in one command.
    let big = DmaSlice::whole(ns.alloc_dma(16384).unwrap());
    let r = q.execute(Sqe::read(1, 0, 32, big.iova(), big.iova() + 4096));
    assert!(
        matches!(r, Err(Error::Status(NvmeStatus::InvalidField))),
        "{r:?}"
    );
    ns.read(0, &buf).unwrap();
}

#[test]
fn a_shrunk_backing_file_gives_read_errors_to_kernel_threads() {
    let words = 1u64 << 15; // 256 KiB
    let f = pattern_file("shrink", words);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    let cache = PageCache::new(ns.clone(), 4096, 16).unwrap();
    let a: StorageArray<u64> = StorageArray::new(cache, 0, words).unwrap();
    assert_eq!(a.get(words - 1).unwrap(), pattern(words - 1));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f.0)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    let r = ns.read(8192, &buf);
    assert!(
        matches!(r, Err(Error::Status(NvmeStatus::UnrecoveredReadError))),
        "{r:?}"
    );
    let idx: Vec<u64> = (0..256).map(|i| i * 100).collect();
    let r = kernels::gather(&a, &idx, 4);
    assert!(
        matches!(r, Err(Error::Status(NvmeStatus::UnrecoveredReadError))),
        "{r:?}"
    );
    // What is still there still reads.
    assert_eq!(a.get(3).unwrap(), pattern(3));
}

#[test]
fn missing_or_empty_backing_files_are_errors() {
    let r = Namespace::open_file(
        "/nonexistent/vgpu-storage-none",
        &NamespaceOptions::default(),
    );
    assert!(matches!(r, Err(Error::Io { .. })));
    let f = file_with("empty", &[&[1, 2, 3]]);
    let r = Namespace::open_file(&f.0, &NamespaceOptions::default());
    assert!(matches!(r, Err(Error::InvalidArgument(_))));
}

#[test]
fn a_hung_controller_gives_timeouts_then_poisoned_queues() {
    let f = pattern_file("hung", 1 << 12);
    let ctrl = EmulatedController::start(EmulatedOptions::new(&f.0)).unwrap();
    let bar = std::sync::Arc::new(ctrl.bar());
    let opts = NamespaceOptions {
        queues: 1,
        queue_depth: 4,
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let ns = Namespace::attach(bar.clone(), bar.clone(), &opts).unwrap();
    let q = ns.queue();
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    bar.set_stalled(true);
    let t = Instant::now();
    let s: Vec<_> = (0..3)
        .map(|_| ns.submit_read(q, 0, &buf.slice(0, 512).unwrap()).unwrap())
        .collect();
    // The queue (depth 4, three in flight) is full: a non-waiting submit says so ...
    let sqe = ns.raw_command(false, 0, 1, &buf).unwrap();
    assert!(matches!(q.try_submit(sqe), Err(Error::QueueFull(1))));
    // ... and a waiting one gives up after the timeout.
    assert!(matches!(q.submit(sqe), Err(Error::Timeout(_))));
    assert!(matches!(q.wait(s[0]), Err(Error::Poisoned(1))));
    assert!(matches!(ns.read(0, &buf), Err(Error::Poisoned(1))));
    assert!(t.elapsed() < Duration::from_secs(2));
    bar.set_stalled(false);
}

#[test]
fn waiting_on_a_completion_that_never_comes_times_out() {
    let f = pattern_file("hung2", 1 << 12);
    let ctrl = EmulatedController::start(EmulatedOptions::new(&f.0)).unwrap();
    let bar = std::sync::Arc::new(ctrl.bar());
    let opts = NamespaceOptions {
        queues: 1,
        queue_depth: 8,
        timeout: Duration::from_millis(100),
        ..Default::default()
    };
    let ns = Namespace::attach(bar.clone(), bar.clone(), &opts).unwrap();
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    bar.set_stalled(true);
    let cache = PageCache::new(std::sync::Arc::new(ns), 4096, 4).unwrap();
    let a: StorageArray<u64> = StorageArray::new(cache, 0, 512).unwrap();
    let t = Instant::now();
    let got = a.get(5);
    assert!(matches!(got, Err(Error::Timeout(_))), "{got:?}");
    assert!(t.elapsed() < Duration::from_secs(1));
    drop(buf);
}

#[test]
fn a_read_only_namespace_refuses_writes_and_serves_reads() {
    let f = pattern_file("ro", 1 << 12);
    let opts = NamespaceOptions {
        read_only: true,
        ..NamespaceOptions::default()
    };
    let ns = Namespace::open_file(&f.0, &opts).unwrap();
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    assert!(
        matches!(
            ns.write(0, &buf),
            Err(Error::Status(NvmeStatus::NamespaceWriteProtected))
        ),
        "a write to a read-only namespace is refused"
    );
    ns.read(0, &buf).unwrap();
}
