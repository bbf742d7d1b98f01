//! The grant path against a worker that overruns or lies: kernel deadlines on the daemon's
//! clock, and a grant page written directly, as a compromised worker would.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_grant::audit::{MAX_IN_FLIGHT, MAX_VIOLATIONS};
use vgpu_grant::shm::{Completion, Page};
use vgpu_grant::{Gate, GrantClient, GrantServer, Resource, ServerConfig};
use vgpu_scheduler::clock::MS;
use vgpu_scheduler::{Config, Share};

/// A client on the real page, and the same page as the worker maps it, to forge with.
fn attach(server: &GrantServer, vgpu: u32) -> (GrantClient, Page, OwnedFd) {
    let fds = server
        .attach(vgpu, Share::new(0.5), Share::new(0.5))
        .unwrap();
    let forged = Page::open(fds.page.try_clone().unwrap()).unwrap();
    let bell = fds.doorbell.try_clone().unwrap();
    let client = GrantClient::from_fds(fds.page, fds.doorbell).unwrap();
    (client, forged, bell)
}

fn ring(bell: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a live buffer to an eventfd we hold.
    let n = unsafe { libc::write(bell.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    assert_eq!(n, 8);
}

/// Waits until `f` holds (the scheduler thread works asynchronously).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn completion(r: u32, started: u64, finished: u64) -> Completion {
    Completion {
        resource: r,
        _pad: 0,
        started,
        finished,
    }
}

#[test]
fn a_kernel_past_its_deadline_loses_the_gpu_and_pays_for_it() {
    let config = ServerConfig {
        sched: Config {
            deadline: 300 * MS,
            ..Config::default()
        },
        ..ServerConfig::default()
    };
    let period = Duration::from_nanos(config.sched.period);
    let server = GrantServer::start(config, "test").unwrap();
    let (a, _, _) = attach(&server, 1);
    let b = Arc::new(attach(&server, 2).0);
    // vGPU 1's kernel never ends (its permit is never dropped).
    std::mem::forget(a.acquire(Resource::Compute));
    let t = Instant::now();
    let waited = std::thread::spawn({
        let b = b.clone();
        move || {
            drop(b.acquire(Resource::Compute));
            t.elapsed()
        }
    })
    .join()
    .unwrap();
    eprintln!("the neighbour waited {waited:?}");
    assert!(
        waited >= Duration::from_millis(250),
        "{waited:?}: before the deadline"
    );
    // Deadline plus one period, and slack for a loaded CI machine.
    assert!(
        waited < Duration::from_millis(300) + period + Duration::from_millis(400),
        "{waited:?}"
    );
    // The neighbour keeps running while the late kernel runs.
    let t = Instant::now();
    for _ in 0..50 {
        drop(b.acquire(Resource::Compute));
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let u = server.usage(1).unwrap();
    assert_eq!(u.compute_overruns, 1);
    // It pays for its late kernel as it runs, not only when it ends.
    std::thread::sleep(Duration::from_millis(200));
    eventually("the late kernel is charged as it runs", || {
        server.usage(1).unwrap().compute_busy_ns >= 450 * MS
    });
    assert_eq!(server.usage(2).unwrap().compute_overruns, 0);
}

#[test]
fn a_deadline_is_set_per_vgpu() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let (a, _, _) = attach(&server, 1);
    let (b, _, _) = attach(&server, 2);
    server
        .set_kernel_deadline(1, Duration::from_millis(100))
        .unwrap();
    assert!(server
        .set_kernel_deadline(9, Duration::from_millis(100))
        .is_err());
    std::mem::forget(a.acquire(Resource::Copy));
    let t = Instant::now();
    drop(b.acquire(Resource::Copy));
    let waited = t.elapsed();
    eprintln!("the neighbour waited {waited:?} (deadline 100 ms, default 2 s)");
    assert!(waited < Duration::from_millis(900), "{waited:?}");
    assert_eq!(server.usage(1).unwrap().copy_overruns, 1);
}

#[test]
fn completions_it_did_not_grant_are_ignored_and_repeated_lies_detach_the_worker() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let (_client, page, bell) = attach(&server, 1);
    let now = vgpu_grant::time::now();
    // Nothing was granted: a completion claiming a second of work is not charged.
    assert!(page.push(completion(0, now - 1_000 * MS, now)));
    ring(&bell);
    eventually("the forged completion is counted", || {
        server.usage(1).is_some_and(|u| u.violations == 1)
    });
    let u = server.usage(1).unwrap();
    assert_eq!(
        u.compute_busy_ns, 0,
        "nothing charged for work never granted"
    );
    // A resource that does not exist.
    assert!(page.push(completion(7, now, now)));
    ring(&bell);
    eventually("the bad resource is counted", || {
        server.usage(1).is_some_and(|u| u.violations == 2)
    });
    assert!(server.expelled(1).is_none(), "a few lies are only counted");
    for _ in 0..MAX_VIOLATIONS {
        assert!(page.push(completion(1, 0, 1)));
    }
    ring(&bell);
    eventually("the worker is detached", || server.expelled(1).is_some());
    eprintln!("detached: {}", server.expelled(1).unwrap());
    assert!(server.usage(1).is_none(), "no longer scheduled");
}

#[test]
fn a_claim_outside_the_grant_window_is_charged_on_the_daemons_clock() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let (client, page, bell) = attach(&server, 1);
    // A real grant; the worker then lies about when its request ran.
    std::mem::forget(client.acquire(Resource::Compute));
    std::thread::sleep(Duration::from_millis(50));
    // Started an hour before the grant: it would be charged an hour.
    let now = vgpu_grant::time::now();
    assert!(page.push(completion(0, now.saturating_sub(3_600_000 * MS), now)));
    ring(&bell);
    eventually("the early start is counted", || {
        server.usage(1).is_some_and(|u| u.violations == 1)
    });
    let busy = server.usage(1).unwrap().compute_busy_ns;
    assert!(
        (50 * MS..2_000 * MS).contains(&busy),
        "charged {busy} ns: from the grant to the daemon's reading"
    );
    // Finished in the future.
    std::mem::forget(client.acquire(Resource::Compute));
    let now = vgpu_grant::time::now();
    assert!(page.push(completion(0, now, now + 3_600_000 * MS)));
    ring(&bell);
    eventually("the late finish is counted", || {
        server.usage(1).is_some_and(|u| u.violations == 2)
    });
    let busy2 = server.usage(1).unwrap().compute_busy_ns;
    assert!(busy2 - busy < 1_000 * MS, "charged {} ns", busy2 - busy);
}

#[test]
fn a_worker_claiming_more_requests_than_a_guest_can_have_is_detached() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let (_client, page, bell) = attach(&server, 1);
    let (b, _, _) = attach(&server, 2);
    page.submitted(Resource::Compute)
        .fetch_add(MAX_IN_FLIGHT + 1, Ordering::SeqCst);
    ring(&bell);
    eventually("the worker is detached", || server.expelled(1).is_some());
    let why = server.expelled(1).unwrap();
    assert!(why.contains("in flight"), "{why}");
    // Its neighbour is unaffected.
    drop(b.acquire(Resource::Compute));
}

#[test]
fn an_honest_worker_is_never_doubted() {
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let (a, _, _) = attach(&server, 1);
    let (b, _, _) = attach(&server, 2);
    let (a, b) = (Arc::new(a), Arc::new(b));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = [a.clone(), a, b.clone(), b]
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let r = if i % 2 == 0 {
                    Resource::Compute
                } else {
                    Resource::Copy
                };
                while !stop.load(Ordering::Relaxed) {
                    let _p = c.acquire(r);
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    for v in [1, 2] {
        let u = server.usage(v).unwrap();
        assert_eq!(u.violations, 0, "vGPU {v}: {u:?}");
        assert!(server.expelled(v).is_none());
    }
}

#[test]
fn a_worker_that_keeps_its_lease_quiet_beside_a_neighbour_only_slows_itself() {
    use vgpu_grant::shm::LEASE_QUIET;
    // vGPU 1's worker sets the quiet bit on its own lease word again and again, so that it
    // rings for none of its starts and completions even while vGPU 2 waits. The daemon
    // then learns of its completions only at its own wake-ups: vGPU 1 holds the GPU
    // longer than it needs, but vGPU 2 still gets its half.
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let (a, page, _) = attach(&server, 1);
    let (b, _, _) = attach(&server, 2);
    let (a, b) = (Arc::new(a), Arc::new(b));
    let stop = Arc::new(AtomicBool::new(false));
    let forger = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                page.lease(Resource::Compute)
                    .fetch_or(LEASE_QUIET, Ordering::SeqCst);
                std::thread::yield_now();
            }
        })
    };
    let run = |c: Arc<GrantClient>, stop: Arc<AtomicBool>| {
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _p = c.acquire(Resource::Compute);
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };
    let ta = run(a, stop.clone());
    let tb = run(b, stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    for t in [ta, tb, forger] {
        t.join().unwrap();
    }
    let ua = server.usage(1).unwrap().compute_busy_ns as f64;
    let ub = server.usage(2).unwrap().compute_busy_ns as f64;
    let share = ub / (ua + ub);
    eprintln!("the honest vGPU got {share:.3} of the busy time beside a quiet forger");
    assert!(share > 0.4, "the honest vGPU got {share:.3}");
    assert!(server.expelled(2).is_none());
    assert_eq!(server.usage(2).unwrap().violations, 0);
}

#[test]
fn a_forged_lease_word_is_read_by_its_count_alone() {
    use vgpu_grant::shm::{LEASE_OPEN, LEASE_QUIET};
    let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
    let (_client, page, bell) = attach(&server, 1);
    let (b, _, _) = attach(&server, 2);
    // Both flag bits and no start: nothing is counted as running, so the neighbour gets
    // the engine at once and the forger is not doubted.
    page.lease(Resource::Compute)
        .store(LEASE_OPEN | LEASE_QUIET, Ordering::SeqCst);
    ring(&bell);
    let t = Instant::now();
    drop(b.acquire(Resource::Compute));
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "the neighbour waited {:?}",
        t.elapsed()
    );
    assert!(server.expelled(1).is_none());
    // The quiet bit does not hide an impossible count: more starts than a guest can have
    // detach the worker.
    page.lease(Resource::Compute).store(
        LEASE_OPEN | LEASE_QUIET | (MAX_IN_FLIGHT + 1),
        Ordering::SeqCst,
    );
    ring(&bell);
    eventually("the worker is detached", || server.expelled(1).is_some());
    // The count read is the low bits alone: 4097, not the flag bits with it.
    let why = server.expelled(1).unwrap();
    assert!(why.contains("4097"), "{why}");
    drop(b.acquire(Resource::Compute));
}
