//! Device queues (the queue pairs GPU threads submit to): a submitter that writes SQEs into
//! the queue memory and rings the doorbell page directly, the way a GPU does, without
//! waking the controller thread, gets its completions while it holds a poll guard; queue
//! ids are handed out and returned.

mod common;

use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use vgpu_storage::nvme::{NvmeStatus, Sqe};
use vgpu_storage::queue::queue_memory_bytes;
use vgpu_storage::{DmaRegion, DmaSlice, Namespace, NamespaceOptions};

fn opts() -> NamespaceOptions {
    NamespaceOptions {
        queues: 2,
        queue_depth: 64,
        timeout: Duration::from_secs(5),
        ..NamespaceOptions::default()
    }
}

/// The 32-bit doorbell at byte `off` of the doorbell page.
fn doorbell(page: &DmaRegion, off: u64) -> &AtomicU32 {
    assert!(off as usize + 4 <= page.len());
    // SAFETY: in bounds (checked), 4-byte aligned (doorbell offsets are), and the page is
    // only ever accessed atomically.
    unsafe { &*page.as_ptr().add(off as usize).cast::<AtomicU32>() }
}

#[test]
fn a_device_side_submitter_reads_through_its_own_queue() {
    init_tracing();
    let f = pattern_file("devq", 1 << 17);
    let ns = Namespace::open_file(&f.0, &opts()).unwrap();
    let depth = 16u32;
    let mem = ns.alloc_dma(queue_memory_bytes(depth)).unwrap();
    let q = ns
        .device_queue(depth, DmaSlice::whole(mem.clone()))
        .unwrap();
    assert_eq!(q.qid(), 3, "after the two host queues");
    let page = ns
        .doorbell_page()
        .expect("emulated controllers have a doorbell page");
    let data = ns.alloc_dma(4096 * 40).unwrap();
    let _poll = ns.keep_polling().expect("emulated");

    let sq = mem.as_ptr().cast::<Sqe>();
    // SAFETY: the CQ lies at cq_offset inside the queue memory.
    let cq = unsafe { mem.as_ptr().add(q.cq_offset() as usize) };
    // 40 commands over more than two laps of the 16-entry queue, in batches of 8 with one
    // doorbell each (as a tail-lock winner rings once for many marks).
    let (mut tail, mut head) = (0u64, 0u64);
    for batch in 0..5u64 {
        for k in 0..8u64 {
            let i = batch * 8 + k;
            let mut sqe = Sqe::read(1, (i * 4096 * 3) / 512, 8, data.iova() + i * 4096, 0);
            sqe.set_cid((tail % u64::from(depth)) as u16);
            // SAFETY: slot < depth, inside the SQ.
            unsafe { std::ptr::write_volatile(sq.add((tail % u64::from(depth)) as usize), sqe) };
            tail += 1;
        }
        doorbell(&page, q.sq_doorbell_offset())
            .store((tail % u64::from(depth)) as u32, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(10);
        while head < tail {
            let loc = (head % u64::from(depth)) as usize;
            // SAFETY: dword 3 of CQ entry `loc`, accessed atomically.
            let dw3 =
                unsafe { &*cq.add(loc * 16 + 12).cast::<AtomicU32>() }.load(Ordering::Acquire);
            let want_phase = (head / u64::from(depth)) % 2 == 0;
            if (dw3 & (1 << 16) != 0) == want_phase {
                assert_eq!(dw3 >> 17, 0, "status of command {head}");
                head += 1;
                doorbell(&page, q.cq_doorbell_offset())
                    .store((head % u64::from(depth)) as u32, Ordering::Release);
            } else {
                assert!(Instant::now() < deadline, "completion {head} never came");
                std::thread::yield_now();
            }
        }
    }
    for i in 0..40u64 {
        let mut b = [0u8; 8];
        DmaSlice::new(data.clone(), (i * 4096) as usize, 8)
            .unwrap()
            .read_to(&mut b);
        assert_eq!(u64::from_le_bytes(b), pattern(i * 4096 * 3 / 8), "line {i}");
    }
    // The host queues still work next to it.
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    ns.read(8192, &buf).unwrap();
}

#[test]
fn device_queue_ids_are_handed_out_and_returned() {
    let f = pattern_file("devqid", 1 << 12);
    let ns = Namespace::open_file(&f.0, &opts()).unwrap();
    let granted = 64u16; // EmulatedOptions::max_io_queues
    let mk = || {
        let mem = ns.alloc_dma(queue_memory_bytes(4)).unwrap();
        ns.device_queue(4, DmaSlice::whole(mem))
    };
    let mut held: Vec<_> = (3..=granted).map(|_| mk().expect("queue")).collect();
    let err = mk().err().expect("every queue id is taken");
    assert!(err.to_string().contains("all are in use"), "{err}");
    let freed = held.swap_remove(10).qid();
    assert_eq!(mk().expect("a freed id is reused").qid(), freed);
    // Bad depths are refused and do not leak the id.
    drop(held.pop());
    let mem = ns.alloc_dma(queue_memory_bytes(4)).unwrap();
    assert!(ns.device_queue(3, DmaSlice::whole(mem)).is_err());
    assert!(mk().is_ok());
}

/// What GPU threads write into their queue memory and doorbell page is guest input: a
/// vGPU's kernels can write anything there (the pages are mapped into its context). Each
/// forged entry gets its error status and a forged doorbell value is ignored; the queue,
/// and the host's queues next to it, keep working.
#[test]
fn forged_entries_and_doorbells_from_device_submitters_are_refused() {
    init_tracing();
    let f = pattern_file("devq-forged", 1 << 12); // 32 KiB = 64 blocks
    let ns = Namespace::open_file(&f.0, &opts()).unwrap();
    let depth = 16u32;
    let mem = ns.alloc_dma(queue_memory_bytes(depth)).unwrap();
    let q = ns
        .device_queue(depth, DmaSlice::whole(mem.clone()))
        .unwrap();
    let page = ns.doorbell_page().expect("emulated");
    let data = ns.alloc_dma(4096 * 4).unwrap();
    let unmapped = DmaRegion::host(4096).unwrap();
    let _poll = ns.keep_polling().expect("emulated");
    let sq = mem.as_ptr().cast::<Sqe>();
    // SAFETY: the CQ lies at cq_offset inside the queue memory.
    let cq = unsafe { mem.as_ptr().add(q.cq_offset() as usize) };
    let mut bad_opcode = Sqe::read(1, 0, 8, data.iova(), 0);
    bad_opcode.cdw0 = (bad_opcode.cdw0 & !0xff) | 0x7f;
    let cases: Vec<(&str, Sqe, Option<NvmeStatus>)> = vec![
        (
            "PRP outside the device's memory",
            Sqe::read(1, 0, 8, unmapped.iova(), 0),
            Some(NvmeStatus::DataTransferError),
        ),
        (
            "PRP at a wild address",
            Sqe::read(1, 0, 8, 0xdead_0000_0000, 0),
            Some(NvmeStatus::DataTransferError),
        ),
        (
            "misaligned PRP1",
            Sqe::read(1, 0, 1, data.iova() + 2, 0),
            Some(NvmeStatus::InvalidField),
        ),
        (
            "PRP2 not page aligned",
            Sqe::read(1, 0, 16, data.iova(), data.iova() + 4096 + 8),
            Some(NvmeStatus::InvalidField),
        ),
        (
            "unknown opcode",
            bad_opcode,
            Some(NvmeStatus::InvalidOpcode),
        ),
        (
            "another namespace",
            Sqe::read(9, 0, 8, data.iova(), 0),
            Some(NvmeStatus::InvalidNamespace),
        ),
        (
            "LBA past the end",
            Sqe::read(1, 60, 8, data.iova(), data.iova() + 4096),
            Some(NvmeStatus::LbaOutOfRange),
        ),
        (
            "LBA range wrapping",
            Sqe::read(1, u64::MAX - 2, 8, data.iova(), data.iova() + 4096),
            Some(NvmeStatus::LbaOutOfRange),
        ),
        ("a good read", Sqe::read(1, 8, 8, data.iova(), 0), None),
    ];
    let db = |off: u64, v: u32| doorbell(&page, off).store(v, Ordering::Release);
    // A forged tail beyond the queue first: ignored, nothing is fetched.
    db(q.sq_doorbell_offset(), 1000);
    db(q.cq_doorbell_offset(), 999);
    std::thread::sleep(Duration::from_millis(50));
    db(q.cq_doorbell_offset(), 0);
    for (i, (_, sqe, _)) in cases.iter().enumerate() {
        let mut sqe = *sqe;
        sqe.set_cid(i as u16);
        // SAFETY: slot i < depth, inside the SQ.
        unsafe { std::ptr::write_volatile(sq.add(i), sqe) };
    }
    db(q.sq_doorbell_offset(), cases.len() as u32);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut head = 0usize;
    while head < cases.len() {
        // SAFETY: dword 3 of CQ entry `head` (< depth), accessed atomically.
        let dw3 = unsafe { &*cq.add(head * 16 + 12).cast::<AtomicU32>() }.load(Ordering::Acquire);
        if dw3 & (1 << 16) != 0 {
            let (name, _, want) = &cases[(dw3 & 0xffff) as usize];
            let field = (dw3 >> 17) as u16;
            assert_eq!(
                field,
                want.map_or(0, NvmeStatus::to_field),
                "{name}: status {:?}",
                NvmeStatus::from_field(field)
            );
            head += 1;
            db(q.cq_doorbell_offset(), head as u32);
        } else {
            assert!(
                Instant::now() < deadline,
                "completion {head} never came (the forged tail was not ignored?)"
            );
            std::thread::yield_now();
        }
    }
    let mut b = [0u8; 8];
    DmaSlice::new(data.clone(), 0, 8).unwrap().read_to(&mut b);
    assert_eq!(u64::from_le_bytes(b), pattern(8 * 512 / 8), "the good read");
    // The host queues still work next to it.
    let buf = DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    ns.read(8192, &buf).unwrap();
}
