//! The grant path in real time: a server thread, clients on their own pages, bursts that
//! really take time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_grant::{Gate, GrantClient, GrantServer, Resource, ServerConfig};
use vgpu_scheduler::Share;

fn client(server: &GrantServer, vgpu: u32, share: f64) -> GrantClient {
    let fds = server
        .attach(vgpu, Share::new(share), Share::new(share))
        .unwrap();
    GrantClient::from_fds(fds.page, fds.doorbell).unwrap()
}

/// A non-preemptive kernel of length `d`. It sleeps rather than spins: GPU work does not
/// take host CPU, and on a 2-core CI machine two spinning "kernels" would starve the
/// scheduler thread they are measuring.
fn burst(d: Duration) {
    let t = Instant::now();
    std::thread::sleep(d);
    // Sleeps overshoot; what the kernel "ran" is what the permit measures anyway.
    let _ = t.elapsed();
}

/// A guest that keeps asking for the engine and runs `d` each time, until `stop`.
fn keep_running(
    c: Arc<GrantClient>,
    d: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let _p = c.acquire(Resource::Compute);
            burst(d);
        }
    })
}

#[test]
fn band_splits_real_time_70_30_with_mixed_bursts() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let a = Arc::new(client(&server, 1, 0.7));
    let b = Arc::new(client(&server, 2, 0.3));
    let stop = Arc::new(AtomicBool::new(false));
    let ta = keep_running(a, Duration::from_micros(200), stop.clone());
    let tb = keep_running(b, Duration::from_millis(5), stop.clone());
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    ta.join().unwrap();
    tb.join().unwrap();
    let ua = server.usage(1).unwrap().compute_busy_ns as f64;
    let ub = server.usage(2).unwrap().compute_busy_ns as f64;
    let share = ua / (ua + ub);
    eprintln!(
        "vGPU 1 got {share:.3} of the busy time (wanted 0.700); busy {:.2} s of 3 s",
        (ua + ub) / 1e9
    );
    // Real time on a shared 2-core CI machine: a wide band here; the benchmark reports the
    // precise error.
    assert!((share - 0.7).abs() < 0.06, "share {share}");
}

#[test]
fn the_holder_runs_alone_and_detach_passes_the_resource_on() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let a = client(&server, 1, 0.5);
    let b = Arc::new(client(&server, 2, 0.5));
    let held = a.acquire(Resource::Compute);
    let got = Arc::new(AtomicBool::new(false));
    let t = {
        let (b, got) = (b.clone(), got.clone());
        std::thread::spawn(move || {
            let _p = b.acquire(Resource::Compute);
            got.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !got.load(Ordering::SeqCst),
        "vGPU 2 ran while vGPU 1 held the engine"
    );
    // Copy is a separate engine (MRQ): vGPU 2 can copy meanwhile.
    drop(b.acquire(Resource::Copy));
    // vGPU 1's worker dies holding the engine: detaching it hands the engine on.
    std::mem::forget(held);
    server.detach(1);
    t.join().unwrap();
    assert!(got.load(Ordering::SeqCst));
}

#[test]
fn grant_round_trip_is_cheap() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let a = client(&server, 1, 1.0);
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        drop(a.acquire(Resource::Compute));
    }
    let per = t.elapsed() / n;
    eprintln!("grant round trip: {per:?}");
    // No socket round trip: well under a millisecond even on a loaded CI machine.
    assert!(per < Duration::from_millis(1), "{per:?}");
}

#[test]
fn shares_are_checked_and_changed() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let _a = client(&server, 1, 0.6);
    assert!(
        server.attach(2, Share::new(0.5), Share::new(0.1)).is_err(),
        "0.6 + 0.5 > 1"
    );
    let _b = client(&server, 2, 0.4);
    assert!(server
        .set_shares(1, Share::new(0.7), Share::new(0.6))
        .is_err());
    server
        .set_shares(2, Share::new(0.2), Share::new(0.2))
        .unwrap();
    server
        .set_shares(1, Share::new(0.8), Share::new(0.8))
        .unwrap();
    assert!(server
        .set_shares(9, Share::new(0.1), Share::new(0.1))
        .is_err());
    assert!(server.usage(9).is_none());
}

#[test]
fn a_closed_gate_lets_its_waiters_go_when_nobody_grants_any_more() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let a = client(&server, 1, 0.5);
    let gate = Arc::new(vgpu_grant::SwitchGate::new(client(&server, 2, 0.5)));
    // vGPU 1 holds the engine and its daemon dies: nobody will grant vGPU 2 again.
    std::mem::forget(a.acquire(Resource::Compute));
    drop(server);
    let (tx, rx) = std::sync::mpsc::channel();
    let t = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            let _p = gate.acquire(Resource::Compute);
            let _ = tx.send(());
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "vGPU 2 ran while vGPU 1 held the engine"
    );
    // The worker stops: its waiting request runs ungated, and so does any later one.
    gate.close();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the waiter was not let go");
    t.join().unwrap();
    drop(gate.acquire(Resource::Copy));
}

/// Median time from vGPU 1's release to vGPU 2's grant over `n` hand-overs, vGPU 1's
/// kernels announced as taking `expect` (zero: not announced).
fn hand_over(
    server: &GrantServer,
    a: &Arc<GrantClient>,
    b: &Arc<GrantClient>,
    expect: Duration,
) -> Duration {
    let kernel = Duration::from_millis(3);
    let mut gaps = Vec::new();
    for _ in 0..20 {
        // vGPU 1 runs a kernel; vGPU 2 asks meanwhile.
        let held = a.acquire_for(Resource::Compute, expect.as_nanos() as u64);
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || {
                let p = b.acquire(Resource::Compute);
                let at = Instant::now();
                drop(p);
                at
            })
        };
        std::thread::sleep(kernel);
        let released = Instant::now();
        drop(held);
        let granted = waiter.join().unwrap();
        gaps.push(granted.saturating_duration_since(released));
    }
    let _ = server;
    gaps.sort();
    gaps[gaps.len() / 2]
}

#[test]
fn a_hand_over_announced_by_its_end_estimate_comes_without_waking_twice() {
    let config = ServerConfig {
        handover_poll: true,
        ..ServerConfig::default()
    };
    let server = GrantServer::start(config, "test").unwrap();
    let a = Arc::new(client(&server, 1, 0.5));
    let b = Arc::new(client(&server, 2, 0.5));
    let plain = hand_over(&server, &a, &b, Duration::ZERO);
    let announced = hand_over(&server, &a, &b, Duration::from_millis(3));
    eprintln!("hand-over, release to grant, median: {plain:?} unannounced, {announced:?} with the end estimate");
    // Correctness only here (the timeline bench measures the gain on a real worker): the
    // waiter is granted once the holder released, every time, either way.
    assert!(plain < Duration::from_millis(50), "{plain:?}");
    assert!(announced < Duration::from_millis(50), "{announced:?}");
}

#[test]
fn every_queue_thread_completing_at_once_is_counted() {
    // A worker runs each of its queues on its own thread, and their requests complete
    // at the same moments. Two such workers share the engine: none is expelled, none
    // reports what cannot be true, and when they are done neither is still counted as
    // running (each gets the engine at once afterwards; a lost completion would hold it
    // until the kernel deadline).
    let server = Arc::new(GrantServer::start(ServerConfig::default(), "test").unwrap());
    let clients = [
        Arc::new(client(&server, 1, 0.7)),
        Arc::new(client(&server, 2, 0.3)),
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    let threads = clients
        .iter()
        .flat_map(|c| (0..4).map(move |_| c.clone()))
        .map(|c| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for _ in 0..1_500 {
                    let p = c.acquire(Resource::Compute);
                    std::hint::black_box(&p);
                }
                let _ = tx.send(());
            })
        })
        .count();
    for done in 0..threads {
        // A worker the daemon expelled waits for grants that never come.
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "{done} of {threads} queue threads finished; expelled: {:?}, {:?}",
                    server.expelled(1),
                    server.expelled(2)
                )
            });
    }
    for (v, c) in [1, 2].into_iter().zip(&clients) {
        assert_eq!(server.expelled(v), None, "vGPU {v}");
        let u = server.usage(v).expect("attached");
        assert_eq!(u.violations, 0, "vGPU {v}: {u:?}");
        let t = Instant::now();
        drop(c.acquire(Resource::Compute));
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "vGPU {v} waited {:?} for the idle engine",
            t.elapsed()
        );
    }
}

/// vGPU 1 alone on the engine, its lease quiet: its first request asked (the grant opened
/// the lease), and the daemon marked the lease quiet in the same wake-up.
fn quiet_holder(server: &GrantServer) -> GrantClient {
    let a = client(server, 1, 0.5);
    drop(a.acquire(Resource::Compute));
    std::thread::sleep(Duration::from_millis(5));
    a
}

#[test]
fn a_lone_holder_rings_no_doorbell_and_every_request_is_still_counted() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let a = quiet_holder(&server);
    let before = a.doorbells();
    let n: u32 = 500;
    let each = Duration::from_micros(200);
    for _ in 0..n {
        let _p = a.acquire(Resource::Compute);
        burst(each);
    }
    let rung = a.doorbells() - before;
    eprintln!("{n} requests of a lone holder rang {rung} doorbells");
    assert!(
        rung <= 2,
        "{rung} doorbells for {n} requests under a quiet lease"
    );
    // The daemon read the page anyway: every request is charged, none is doubted, and
    // none is left running.
    let u = server.usage(1).unwrap();
    let busy = Duration::from_nanos(u.compute_busy_ns);
    assert!(
        busy >= each * n,
        "charged {busy:?} for {n} requests of {each:?}"
    );
    assert_eq!(u.violations, 0, "{u:?}");
    assert_eq!(server.expelled(1), None);
}

#[test]
fn a_quiet_holder_shares_at_once_when_another_vgpu_asks() {
    let server = Arc::new(GrantServer::start(ServerConfig::default(), "test").unwrap());
    let a = Arc::new(client(&server, 1, 0.5));
    let b = Arc::new(client(&server, 2, 0.5));
    let stop = Arc::new(AtomicBool::new(false));
    let ta = keep_running(a.clone(), Duration::from_micros(300), stop.clone());
    // vGPU 1 runs alone under a quiet lease for a while.
    std::thread::sleep(Duration::from_millis(300));
    let quiet_rings = a.doorbells();
    let alone = server.usage(1).unwrap().compute_busy_ns;
    // Then vGPU 2 asks, and keeps asking.
    let asked = Instant::now();
    drop(b.acquire(Resource::Compute));
    let waited = asked.elapsed();
    let tb = keep_running(b.clone(), Duration::from_micros(300), stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    ta.join().unwrap();
    tb.join().unwrap();
    let ua = server.usage(1).unwrap().compute_busy_ns - alone;
    let ub = server.usage(2).unwrap().compute_busy_ns;
    let share = ub as f64 / (ua + ub) as f64;
    let loud_rings = a.doorbells() - quiet_rings;
    eprintln!(
        "vGPU 2 waited {waited:?} for its first grant, then got {share:.3} of the busy time; \
         vGPU 1 rang {quiet_rings} doorbells alone, {loud_rings} beside it"
    );
    // Its first request waits for BAND's hand-over margin (the holder keeps the engine
    // until the newcomer is owed that much), not for a renewal of the lone holder's
    // quiet lease (50 ms).
    assert!(waited < Duration::from_millis(40), "{waited:?}");
    assert!((share - 0.5).abs() < 0.1, "share {share}");
    // Beside a neighbour the holder rings again, so the daemon hands over at once.
    assert!(
        loud_rings > 100,
        "{loud_rings} doorbells beside a neighbour"
    );
    for v in [1, 2] {
        assert_eq!(server.usage(v).unwrap().violations, 0, "vGPU {v}");
    }
}

#[test]
fn a_quiet_holder_rings_when_its_ring_is_half_full() {
    use vgpu_grant::shm::SLOTS;
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let a = quiet_holder(&server);
    let before = a.doorbells();
    // Requests as short as a worker's can be, far more than the ring holds between two of
    // the daemon's own wake-ups.
    let n = 4 * u64::from(SLOTS);
    for _ in 0..n {
        drop(a.acquire(Resource::Compute));
    }
    let rung = a.doorbells() - before;
    eprintln!("{n} back-to-back requests of a quiet holder rang {rung} doorbells");
    // It rang when the ring reached half full (and a few times more while the daemon
    // woke), not per request: ringing on every completion past half a ring, or a full
    // ring (the worker then sleeps and rings on every completion), would ring thousands.
    assert!(
        rung >= 1,
        "never rang with {n} completions for a ring of {SLOTS}"
    );
    assert!(
        rung <= 8 * n / u64::from(SLOTS / 2),
        "{rung} doorbells for {n} requests"
    );
    let u = server.usage(1).unwrap();
    assert_eq!(u.violations, 0, "{u:?}");
    assert_eq!(server.expelled(1), None);
}
