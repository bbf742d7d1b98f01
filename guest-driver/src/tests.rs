//! Driver tests against the fake device model in fake.rs.

use crate::fake::{FakeDevice, FakeTransport};
use crate::spec::{feature, ring, status};
use crate::{Buffer, Error, SplitQueue, Token, Transport, VirtioMmio};

const QSIZE: u16 = 8;

/// A driven device with queue 0 active, and the model behind it.
fn setup(offered: u64, optional: u64) -> (VirtioMmio<FakeTransport>, SplitQueue, FakeTransport) {
    let t = FakeTransport::new(FakeDevice::new(offered, u32::from(QSIZE)));
    let mut dev = VirtioMmio::probe(t.clone()).expect("probe");
    dev.negotiate(0, optional).expect("negotiate");
    let size = dev.pick_queue_size(0, 64).expect("queue size");
    let mut q: SplitQueue = SplitQueue::allocate(dev.transport(), size).expect("queue");
    dev.activate_queue(0, &mut q).expect("activate");
    dev.driver_ok().expect("driver ok");
    (dev, q, t)
}

fn addr(b: &[u8]) -> u64 {
    b.as_ptr() as u64
}

/// Sends one echo request and checks it round-trips.
fn echo_once(
    dev: &VirtioMmio<FakeTransport>,
    q: &mut SplitQueue,
    t: &FakeTransport,
    n: usize,
    seed: u8,
) {
    let src: Vec<u8> = (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let dst = vec![0u8; n];
    let tok = q
        .add(&[
            Buffer::readable(addr(&src), n as u32),
            Buffer::writable(addr(&dst), n as u32),
        ])
        .expect("add");
    dev.kick(0, q);
    assert_eq!(t.dev.borrow_mut().echo(0), 1);
    let used = q.pop_used().expect("pop").expect("a used entry");
    assert_eq!(used.token, tok);
    assert_eq!(used.len as usize, n);
    assert_eq!(src, dst);
    assert_eq!(q.pop_used().expect("pop"), None);
}

#[test]
fn init_sequence_follows_the_spec() {
    let (dev, q, t) = setup(
        feature::VERSION_1 | feature::RING_EVENT_IDX | 1 << 3,
        feature::RING_EVENT_IDX,
    );
    let d = t.dev.borrow();
    use status::*;
    assert_eq!(
        d.status_writes,
        [
            0,
            ACKNOWLEDGE,
            ACKNOWLEDGE | DRIVER,
            ACKNOWLEDGE | DRIVER | FEATURES_OK,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
        ]
    );
    // Bit 3 was offered but not asked for, so it is not accepted.
    assert_eq!(
        d.driver_features,
        feature::VERSION_1 | feature::RING_EVENT_IDX
    );
    assert_eq!(dev.features(), d.driver_features);
    let fq = &d.queues[0];
    assert_eq!((fq.num, fq.ready), (u32::from(QSIZE), 1));
    assert_eq!(
        (fq.desc, fq.driver, fq.device),
        (q.desc_addr(), q.driver_addr(), q.device_addr())
    );
    assert_eq!(fq.desc % 4096, 0);
    assert_eq!(fq.driver, fq.desc + 16 * u64::from(QSIZE));
    assert_eq!(fq.device % 4, 0);
}

#[test]
fn probe_rejects_wrong_devices() {
    let mut d = FakeDevice::new(feature::VERSION_1, 8);
    d.magic = 0x1234;
    assert_eq!(
        VirtioMmio::probe(FakeTransport::new(d)).err(),
        Some(Error::BadMagic(0x1234))
    );
    let mut d = FakeDevice::new(feature::VERSION_1, 8);
    d.version = 1;
    assert_eq!(
        VirtioMmio::probe(FakeTransport::new(d)).err(),
        Some(Error::UnsupportedVersion(1))
    );
    let mut d = FakeDevice::new(feature::VERSION_1, 8);
    d.device_id = 0;
    assert_eq!(
        VirtioMmio::probe(FakeTransport::new(d)).err(),
        Some(Error::NoDevice)
    );
    let d = FakeDevice::new(feature::VERSION_1, 8);
    assert_eq!(
        VirtioMmio::probe_id(FakeTransport::new(d), 7).err(),
        Some(Error::WrongDevice {
            expected: 7,
            found: 0x30
        })
    );
}

#[test]
fn negotiation_fails_without_version_1() {
    let t = FakeTransport::new(FakeDevice::new(feature::RING_EVENT_IDX, 8));
    let mut dev = VirtioMmio::probe(t.clone()).expect("probe");
    assert_eq!(
        dev.negotiate(0, feature::RING_EVENT_IDX),
        Err(Error::MissingFeatures(feature::VERSION_1))
    );
    assert_ne!(t.dev.borrow().status & status::FAILED, 0);
    assert_eq!(t.dev.borrow().status & status::FEATURES_OK, 0);
}

#[test]
fn negotiation_fails_when_required_feature_missing() {
    let t = FakeTransport::new(FakeDevice::new(feature::VERSION_1, 8));
    let mut dev = VirtioMmio::probe(t.clone()).expect("probe");
    assert_eq!(
        dev.negotiate(1 << 5, 0),
        Err(Error::MissingFeatures(1 << 5))
    );
    assert_ne!(t.dev.borrow().status & status::FAILED, 0);
}

#[test]
fn negotiation_fails_when_device_refuses_features_ok() {
    let mut d = FakeDevice::new(feature::VERSION_1, 8);
    d.reject_features = true;
    let t = FakeTransport::new(d);
    let mut dev = VirtioMmio::probe(t.clone()).expect("probe");
    assert_eq!(dev.negotiate(0, 0), Err(Error::FeaturesRejected));
    assert_ne!(t.dev.borrow().status & status::FAILED, 0);
    assert_eq!(dev.features(), 0);
}

#[test]
fn queue_setup_checks_the_device() {
    let t = FakeTransport::new(FakeDevice::new(feature::VERSION_1, 8));
    t.dev.borrow_mut().queues[1].max = 0;
    let mut dev = VirtioMmio::probe(t.clone()).expect("probe");
    dev.negotiate(0, 0).expect("negotiate");
    assert_eq!(dev.pick_queue_size(1, 64), Err(Error::QueueUnavailable(1)));
    assert_eq!(dev.pick_queue_size(0, 64), Ok(8));
    t.dev.borrow_mut().queues[2].max = 100;
    assert_eq!(dev.pick_queue_size(2, 256), Ok(64));
    let mut big: SplitQueue = SplitQueue::allocate(&t, 16).expect("queue");
    assert_eq!(
        dev.activate_queue(0, &mut big),
        Err(Error::BadQueueSize(16))
    );
    let mut q: SplitQueue = SplitQueue::allocate(&t, 8).expect("queue");
    dev.activate_queue(0, &mut q).expect("activate");
    let mut again: SplitQueue = SplitQueue::allocate(&t, 8).expect("queue");
    assert_eq!(
        dev.activate_queue(0, &mut again),
        Err(Error::QueueAlreadyActive(0))
    );
    assert_eq!(
        SplitQueue::<8>::allocate(&t, 16).err(),
        Some(Error::BadQueueSize(16))
    );
    assert_eq!(
        SplitQueue::<64>::allocate(&t, 12).err(),
        Some(Error::BadQueueSize(12))
    );
}

#[test]
fn queue_memory_is_checked_and_returned() {
    let t = FakeTransport::new(FakeDevice::new(feature::VERSION_1, 8));
    let small = t
        .dma_alloc(SplitQueue::<8>::memory_size(8) - 1, 4096)
        .expect("dma");
    assert_eq!(
        SplitQueue::<8>::new(small, 8).err(),
        Some(Error::BadQueueMemory)
    );
    let q = SplitQueue::<8>::allocate(&t, 8).expect("queue");
    assert_eq!(t.live_allocations(), 2);
    // SAFETY: the queue was never handed to the device.
    unsafe { t.dma_free(q.into_region()) };
    assert_eq!(t.live_allocations(), 1);
}

#[test]
fn add_and_pop_round_trip() {
    let (dev, mut q, t) = setup(feature::VERSION_1, 0);
    echo_once(&dev, &mut q, &t, 100, 1);
    assert_eq!(t.dev.borrow().notifies, [0]);
    assert_eq!(q.num_free(), QSIZE);
}

#[test]
fn chain_descriptors_are_laid_out_for_the_device() {
    let (_dev, mut q, t) = setup(feature::VERSION_1, 0);
    let a = [1u8; 10];
    let b = [2u8; 20];
    let c = [0u8; 30];
    let tok = q
        .add(&[
            Buffer::readable(addr(&a), 10),
            Buffer::readable(addr(&b), 20),
            Buffer::writable(addr(&c), 30),
        ])
        .expect("add");
    assert!(q.publish());
    let d = t.dev.borrow();
    let chain = d.chain(0, tok.index());
    assert_eq!(chain.len(), 3);
    assert_eq!(
        (chain[0].addr, chain[0].len, chain[0].flags),
        (addr(&a), 10, ring::DESC_F_NEXT)
    );
    assert_eq!(
        (chain[1].addr, chain[1].len, chain[1].flags),
        (addr(&b), 20, ring::DESC_F_NEXT)
    );
    assert_eq!(
        (chain[2].addr, chain[2].len, chain[2].flags),
        (addr(&c), 30, ring::DESC_F_WRITE)
    );
    assert_eq!(q.num_free(), QSIZE - 3);
}

#[test]
fn bad_chains_are_refused() {
    let (_dev, mut q, _t) = setup(feature::VERSION_1, 0);
    assert_eq!(q.add(&[]), Err(Error::EmptyChain));
    assert_eq!(
        q.add(&[Buffer::writable(0x1000, 1), Buffer::readable(0x2000, 1)]),
        Err(Error::BadChainOrder)
    );
    assert_eq!(
        q.add(&[
            Buffer::writable(0x1000, u32::MAX),
            Buffer::writable(0x2000, 1)
        ]),
        Err(Error::BufferTooLarge)
    );
    let nine = [Buffer::readable(0x1000, 1); 9];
    assert_eq!(q.add(&nine), Err(Error::QueueFull));
    // Nothing leaked from the refused chains.
    assert_eq!(q.num_free(), QSIZE);
    assert!(!q.publish());
}

#[test]
fn wraps_around_three_times_the_queue_size() {
    let (dev, mut q, t) = setup(feature::VERSION_1, 0);
    for i in 0..3 * usize::from(QSIZE) + 5 {
        echo_once(&dev, &mut q, &t, 1 + i * 7, i as u8);
    }
    // Full batches too: every descriptor in use at once, across the wrap.
    for round in 0..3u8 {
        let bufs: Vec<(Vec<u8>, Vec<u8>)> = (0..QSIZE / 2)
            .map(|i| (vec![round ^ i as u8; 64], vec![0u8; 64]))
            .collect();
        let toks: Vec<Token> = bufs
            .iter()
            .map(|(s, d)| {
                q.add(&[Buffer::readable(addr(s), 64), Buffer::writable(addr(d), 64)])
                    .expect("add")
            })
            .collect();
        assert_eq!(q.num_free(), 0);
        assert_eq!(q.add(&[Buffer::readable(0x1000, 1)]), Err(Error::QueueFull));
        dev.kick(0, &mut q);
        assert_eq!(t.dev.borrow_mut().echo(0), usize::from(QSIZE / 2));
        for tok in toks {
            assert_eq!(q.pop_used().expect("pop").map(|u| u.token), Some(tok));
        }
        assert!(bufs.iter().all(|(s, d)| s == d));
    }
    assert_eq!(q.num_free(), QSIZE);
    assert_eq!(q.outstanding(), 0);
}

#[test]
fn completions_out_of_order() {
    let (_dev, mut q, t) = setup(feature::VERSION_1, 0);
    let bufs = [[0u8; 4]; 4];
    let toks: Vec<Token> = bufs
        .iter()
        .map(|b| q.add(&[Buffer::writable(addr(b), 4)]).expect("add"))
        .collect();
    q.publish();
    let heads = t.dev.borrow_mut().take_avail(0);
    assert_eq!(heads, toks.iter().map(|t| t.index()).collect::<Vec<_>>());
    for &h in heads.iter().rev() {
        t.dev.borrow_mut().push_used(0, u32::from(h), 2);
    }
    let popped: Vec<Token> = std::iter::from_fn(|| q.pop_used().expect("pop"))
        .map(|u| u.token)
        .collect();
    assert_eq!(popped, toks.iter().rev().copied().collect::<Vec<_>>());
    assert_eq!(q.num_free(), QSIZE);
    // Freed descriptors are reused in a valid way after the reordering.
    let b = [0u8; 8];
    for _ in 0..QSIZE {
        q.add(&[Buffer::writable(addr(&b), 8)])
            .expect("add after reorder");
    }
}

#[test]
fn notifications_honour_no_notify_flag() {
    let (dev, mut q, t) = setup(feature::VERSION_1, 0);
    let b = [0u8; 4];
    t.dev.borrow().set_used_flags(0, ring::USED_F_NO_NOTIFY);
    q.add(&[Buffer::writable(addr(&b), 4)]).expect("add");
    assert!(!dev.kick(0, &mut q));
    t.dev.borrow().set_used_flags(0, 0);
    q.add(&[Buffer::writable(addr(&b), 4)]).expect("add");
    assert!(dev.kick(0, &mut q));
    assert_eq!(t.dev.borrow().notifies.len(), 1);
}

#[test]
fn event_idx_suppresses_notifications() {
    let (dev, mut q, t) = setup(
        feature::VERSION_1 | feature::RING_EVENT_IDX,
        feature::RING_EVENT_IDX,
    );
    let b = [0u8; 4];
    let add = |q: &mut SplitQueue| q.add(&[Buffer::writable(addr(&b), 4)]).expect("add");
    // avail_event 0: the device wants a kick when entry 0 is published.
    add(&mut q);
    assert!(dev.kick(0, &mut q));
    // Still 0: it was told about entry 0 already; entry 1 does not cross the event.
    add(&mut q);
    assert!(!dev.kick(0, &mut q));
    // The device asks to hear about entry 3; publishing entry 2 alone stays quiet...
    t.dev.borrow().set_avail_event(0, 3);
    add(&mut q);
    assert!(!dev.kick(0, &mut q));
    // ...and a batch of entries 3 and 4 crosses it: one kick for both.
    add(&mut q);
    add(&mut q);
    assert!(dev.kick(0, &mut q));
    assert_eq!(t.dev.borrow().notifies, [0, 0]);
    // Flags must stay 0 under EVENT_IDX; a polling driver pushes used_event far ahead.
    assert_eq!(t.dev.borrow().avail_flags(0), 0);
    q.set_interrupts(false);
    assert_eq!(t.dev.borrow().used_event(0), 0x8000);
    q.set_interrupts(true);
    assert_eq!(t.dev.borrow().used_event(0), 0);
    assert_eq!(t.dev.borrow_mut().echo(0), 5);
    while q.pop_used().expect("pop").is_some() {}
    assert_eq!(t.dev.borrow().used_event(0), 5);
}

#[test]
fn interrupts_can_be_suppressed_without_event_idx() {
    let (_dev, mut q, t) = setup(feature::VERSION_1, 0);
    q.set_interrupts(false);
    assert_eq!(t.dev.borrow().avail_flags(0), ring::AVAIL_F_NO_INTERRUPT);
    q.set_interrupts(true);
    assert_eq!(t.dev.borrow().avail_flags(0), 0);
}

#[test]
fn bogus_used_ids_are_errors() {
    let (dev, mut q, t) = setup(feature::VERSION_1, 0);
    let b = [0u8; 16];
    let toks: Vec<Token> = (0..3)
        .map(|_| q.add(&[Buffer::writable(addr(&b), 16)]).expect("add"))
        .collect();
    dev.kick(0, &mut q);
    // Out of range.
    t.dev.borrow_mut().push_used(0, 999, 1);
    assert_eq!(q.pop_used(), Err(Error::BadUsedId(999)));
    // In range but not an outstanding head.
    let not_head = u32::from(QSIZE) - 1;
    t.dev.borrow_mut().push_used(0, not_head, 1);
    assert_eq!(q.pop_used(), Err(Error::BadUsedId(not_head)));
    // The bogus entries were skipped, not followed: an honest one still pops.
    t.dev
        .borrow_mut()
        .push_used(0, u32::from(toks[1].index()), 16);
    assert_eq!(
        q.pop_used().expect("pop").map(|u| (u.token, u.len)),
        Some((toks[1], 16))
    );
    // Returning the same head twice is caught too.
    for _ in 0..2 {
        q.add(&[Buffer::writable(addr(&b), 16)]).expect("add");
    }
    q.publish();
    t.dev
        .borrow_mut()
        .push_used(0, u32::from(toks[0].index()), 16);
    assert_eq!(q.pop_used().expect("pop").map(|u| u.token), Some(toks[0]));
    t.dev
        .borrow_mut()
        .push_used(0, u32::from(toks[0].index()), 16);
    assert_eq!(
        q.pop_used(),
        Err(Error::BadUsedId(u32::from(toks[0].index())))
    );
}

#[test]
fn used_len_beyond_writable_is_an_error() {
    let (dev, mut q, t) = setup(feature::VERSION_1, 0);
    let b = [0u8; 16];
    let tok = q
        .add(&[
            Buffer::readable(addr(&b), 16),
            Buffer::writable(addr(&b), 8),
        ])
        .expect("add");
    dev.kick(0, &mut q);
    t.dev.borrow_mut().push_used(0, u32::from(tok.index()), 9);
    assert_eq!(
        q.pop_used(),
        Err(Error::UsedLenTooLarge {
            token: tok.index(),
            len: 9,
            writable: 8
        })
    );
    // The chain was recycled all the same.
    assert_eq!(q.num_free(), QSIZE);
}

#[test]
fn used_index_running_ahead_is_an_error() {
    let (dev, mut q, t) = setup(feature::VERSION_1, 0);
    let b = [0u8; 16];
    let tok = q.add(&[Buffer::writable(addr(&b), 16)]).expect("add");
    dev.kick(0, &mut q);
    t.dev.borrow_mut().push_used(0, u32::from(tok.index()), 1);
    t.dev.borrow_mut().push_used(0, u32::from(tok.index()), 1);
    assert_eq!(
        q.pop_used(),
        Err(Error::BadUsedIndex {
            last_seen: 0,
            device: 2
        })
    );
    // Nothing was consumed by the refused read.
    assert_eq!(q.num_free(), QSIZE - 1);
}

#[test]
fn config_reads_retry_until_generation_is_stable() {
    let (dev, _q, t) = setup(feature::VERSION_1, 0);
    t.dev.borrow_mut().generation_bumps = 3;
    assert_eq!(dev.config_u32(4), Ok(u32::from_le_bytes([4, 5, 6, 7])));
    assert_eq!(
        dev.config_u64(8),
        Ok(u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]))
    );
    let mut odd = [0u8; 5];
    dev.read_config(1, &mut odd).expect("read");
    assert_eq!(odd, [1, 2, 3, 4, 5]);
    t.dev.borrow_mut().generation_bumps = u32::MAX;
    assert_eq!(dev.config_u32(0), Err(Error::ConfigUnstable));
    assert_eq!(
        dev.read_config(0xf00, &mut [0u8; 1]),
        Err(Error::ConfigOutOfRange {
            offset: 0xf00,
            len: 1
        })
    );
}

#[test]
fn device_needs_reset_is_reported() {
    let (mut dev, _q, t) = setup(feature::VERSION_1, 0);
    assert!(!dev.needs_reset());
    t.dev.borrow_mut().status |= status::DEVICE_NEEDS_RESET;
    assert!(dev.needs_reset());
    dev.reset().expect("reset");
    assert_eq!(dev.status(), 0);
    assert_eq!(dev.features(), 0);
}

#[test]
fn interrupts_are_read_and_acknowledged() {
    let (dev, mut q, t) = setup(feature::VERSION_1, 0);
    echo_once(&dev, &mut q, &t, 8, 0);
    assert_eq!(dev.interrupt_status(), 1);
    dev.ack_interrupt(1);
    assert_eq!(dev.interrupt_status(), 0);
    assert_eq!(t.dev.borrow().acked, 1);
}

/// With EVENT_IDX and interrupts off, used_event is written only when the next used index
/// comes within a quarter of the index space of it (the device reads it after every
/// completion), and over more than the whole index space the device's index never
/// reaches it: no completion asks for an interrupt.
#[test]
fn used_event_stays_ahead_without_a_write_per_completion() {
    let (dev, mut q, t) = setup(
        feature::VERSION_1 | feature::RING_EVENT_IDX,
        feature::RING_EVENT_IDX,
    );
    q.set_interrupts(false);
    let (src, dst) = ([7u8; 8], [0u8; 8]);
    let mut writes = 0;
    let mut last = t.dev.borrow().used_event(0);
    for i in 0..70_000u32 {
        q.add(&[
            Buffer::readable(addr(&src), 8),
            Buffer::writable(addr(&dst), 8),
        ])
        .expect("add");
        dev.kick(0, &mut q);
        let old = i as u16;
        assert_eq!(t.dev.borrow_mut().echo(0), 1);
        let e = t.dev.borrow().used_event(0);
        // The device's check after its completion moved the used index old -> old + 1.
        let new = old.wrapping_add(1);
        assert!(
            new.wrapping_sub(e).wrapping_sub(1) >= new.wrapping_sub(old),
            "completion {i} would interrupt (used_event {e})"
        );
        assert!(q.pop_used().expect("pop").is_some());
        let e = t.dev.borrow().used_event(0);
        if e != last {
            writes += 1;
            last = e;
        }
        assert!(e.wrapping_sub(q.outstanding()).wrapping_sub(new) >= 0x4000 - 1);
    }
    // One write per quarter of the index space passed, not one per completion.
    assert!((4..=8).contains(&writes), "{writes} writes of used_event");
}
