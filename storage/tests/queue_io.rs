//! Reads and writes through the BaM queues on the emulated controller.

mod common;

use common::*;
use std::sync::Arc;
use vgpu_storage::{Namespace, NamespaceOptions};

fn words_at(ns: &Namespace, offset: u64, n: usize, buf_off: usize) -> Vec<u64> {
    let buf = vgpu_storage::DmaSlice::whole(ns.alloc_dma(n * 8 + buf_off).unwrap())
        .slice(buf_off, n * 8)
        .unwrap();
    ns.read(offset, &buf).unwrap();
    let mut bytes = vec![0u8; n * 8];
    buf.read_to(&mut bytes);
    bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Waits for each read of `pending` (block, buffer, command), last first; checks each
/// buffer's first word and that nothing is left in flight.
fn collect_in_reverse(
    q: &vgpu_storage::queue::QueuePair,
    pending: Vec<(u64, vgpu_storage::DmaSlice, vgpu_storage::queue::Submitted)>,
) {
    for (lba, buf, s) in pending.into_iter().rev() {
        q.wait(s).unwrap();
        let mut b = [0u8; 8];
        buf.read_to(&mut b);
        assert_eq!(u64::from_le_bytes(b), pattern(lba * 64));
    }
    assert_eq!(q.outstanding(), 0);
}

#[test]
fn reads_return_the_file_contents() {
    init_tracing();
    let f = pattern_file("read", 1 << 16);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    assert_eq!(ns.bytes(), 8 << 16);
    assert_eq!(ns.info().block_size, 512);
    assert_eq!(ns.controller_info().max_transfer, 8192);
    // Several sizes and buffer alignments; a 2048-offset buffer crosses a page (PRP2).
    for (off, n, buf_off) in [
        (0u64, 64usize, 0usize),
        (4096, 512, 2048),
        (512 * 77, 1024, 512),
        (519_680, 512, 4),
        (0, 5120, 2048),
    ] {
        let got = words_at(&ns, off, n, buf_off);
        let want: Vec<u64> = (0..n as u64).map(|i| pattern(off / 8 + i)).collect();
        assert_eq!(got, want, "offset {off}");
    }
    ns.shutdown().unwrap();
}

#[test]
fn writes_then_flush_land_in_the_file() {
    let f = pattern_file("write", 1 << 12);
    let ns = Namespace::open_file(&f.0, &NamespaceOptions::default()).unwrap();
    let buf = vgpu_storage::DmaSlice::whole(ns.alloc_dma(4096).unwrap());
    buf.write_from(&[0xabu8; 4096]);
    ns.write(8192, &buf).unwrap();
    ns.flush().unwrap();
    let back = std::fs::read(&f.0).unwrap();
    assert!(back[8192..12288].iter().all(|&b| b == 0xab));
    assert_eq!(&back[0..8], &pattern(0).to_le_bytes());
}

#[test]
fn one_thread_keeps_a_full_queue_in_flight_and_polls_out_of_order() {
    let f = pattern_file("async", 1 << 15);
    let opts = NamespaceOptions {
        queues: 1,
        queue_depth: 64,
        ..Default::default()
    };
    let ns = Namespace::open_file(&f.0, &opts).unwrap();
    let q = ns.queue();
    let mem = ns.alloc_dma(63 * 512).unwrap();
    let mut rng = Rng(7);
    for _round in 0..20 {
        let mut pending = Vec::new();
        for k in 0..63 {
            let lba = rng.next() % (ns.info().blocks);
            let buf = vgpu_storage::DmaSlice::new(mem.clone(), k * 512, 512).unwrap();
            pending.push((
                lba,
                buf.clone(),
                ns.submit_read(q, lba * 512, &buf).unwrap(),
            ));
        }
        // A full queue refuses a non-waiting submit.
        let extra = vgpu_storage::DmaSlice::new(mem.clone(), 0, 512).unwrap();
        let sqe = ns.raw_command(false, 0, 1, &extra).unwrap();
        assert!(matches!(
            q.try_submit(sqe),
            Err(vgpu_storage::Error::QueueFull(1))
        ));
        // Reap in reverse: the CQ head must still move once earlier entries are consumed.
        collect_in_reverse(q, pending);
    }
}

#[test]
fn a_batch_larger_than_the_free_slots_behind_its_own_uncollected_completions_goes_through() {
    // One queue of 8 entries (7 in flight). The first three reads complete but nobody
    // collects them; slots free in order, so without parking the eighth submission would
    // wait for a slot only its own submitter can free, and time out.
    let f = pattern_file("batch", 1 << 12);
    let opts = NamespaceOptions {
        queues: 1,
        queue_depth: 8,
        timeout: std::time::Duration::from_secs(5),
        ..NamespaceOptions::default()
    };
    let ns = Namespace::open_file(&f.0, &opts).unwrap();
    let q = ns.queue();
    let mem = ns.alloc_dma(12 * 512).unwrap();
    let mut pending = Vec::new();
    for k in 0..12u64 {
        let buf = vgpu_storage::DmaSlice::new(mem.clone(), k as usize * 512, 512).unwrap();
        let lba = (k * 7) % 64;
        pending.push((
            lba,
            buf.clone(),
            ns.submit_read(q, lba * 512, &buf).unwrap(),
        ));
        if k == 2 {
            // Let the first three complete before the queue fills up.
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    // Collect in reverse: parked and unparked completions alike reach their owner.
    collect_in_reverse(q, pending);
    assert!(!q.is_poisoned());
    ns.shutdown().unwrap();
}

#[test]
fn thousands_of_concurrent_submitters_all_complete_correctly() {
    // 64 OS threads x 32 logical submitters each = 2048 commands in flight at once,
    // across 4 queues of 1024 entries; every read is checked.
    let f = pattern_file("stress", 1 << 17);
    // 64 threads on a 2-core CI box share the cores with other test binaries: give slow
    // completions room (a timeout poisons the queue for every thread).
    let opts = NamespaceOptions {
        timeout: std::time::Duration::from_secs(120),
        ..NamespaceOptions::default()
    };
    let ns = Namespace::open_file(&f.0, &opts).unwrap();
    let blocks = ns.info().blocks;
    std::thread::scope(|s| {
        for t in 0..64u64 {
            let ns = Arc::clone(&ns);
            s.spawn(move || {
                let q = ns.queue();
                let mem = ns.alloc_dma(32 * 512).unwrap();
                let mut rng = Rng(t + 1);
                for _round in 0..8 {
                    let mut pending = Vec::with_capacity(32);
                    for k in 0..32 {
                        let lba = rng.next() % blocks;
                        let buf = vgpu_storage::DmaSlice::new(mem.clone(), k * 512, 512).unwrap();
                        pending.push((
                            lba,
                            buf.clone(),
                            ns.submit_read(q, lba * 512, &buf).unwrap(),
                        ));
                    }
                    for (lba, buf, s) in pending {
                        q.wait(s).unwrap();
                        let mut b = [0u8; 512];
                        buf.read_to(&mut b);
                        for w in 0..64 {
                            let v = u64::from_le_bytes(b[w * 8..w * 8 + 8].try_into().unwrap());
                            assert_eq!(v, pattern(lba * 64 + w as u64));
                        }
                    }
                }
            });
        }
    });
    for q in ns.queues() {
        assert_eq!(q.outstanding(), 0);
        assert!(!q.is_poisoned());
    }
}
