//! BAND: shares met under non-preemptive bursts, beside Credit (the policy Gdev
//! improves on) and FIFO (no scheduling: the throughput anchor); the real grant path's
//! latency beside a unix-socket round trip (what it avoids); HEFT-ranked queue mapping
//! beside round-robin.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_grant::{Gate, GrantClient, GrantServer, Resource, ServerConfig};
use vgpu_scheduler::clock::{MS, US};
use vgpu_scheduler::gpu::{GpuScheduler, PolicyKind, QueueMode};
use vgpu_scheduler::mapping::{random_dag, simulate, wavefront, Mapping};
use vgpu_scheduler::simulate::{run_switching, Burst, Report, Workload};
use vgpu_scheduler::{Config, Share};

use crate::bench::Figure;

struct Scenario {
    name: &'static str,
    vgpus: Vec<(f64, Burst)>,
}

fn scenarios() -> Vec<Scenario> {
    let short = Burst::Uniform(100 * US, MS);
    let long = Burst::Uniform(MS, 10 * MS);
    let any = Burst::Uniform(100 * US, 10 * MS);
    vec![
        Scenario {
            name: "50/50",
            vgpus: vec![(0.5, short), (0.5, long)],
        },
        Scenario {
            name: "70/30",
            vgpus: vec![(0.7, short), (0.3, long)],
        },
        Scenario {
            name: "30/70",
            vgpus: vec![(0.3, short), (0.7, long)],
        },
        Scenario {
            name: "60/30/10",
            vgpus: vec![(0.6, short), (0.3, long), (0.1, any)],
        },
        Scenario {
            name: "4x25",
            vgpus: vec![
                (0.25, short),
                (0.25, long),
                (0.25, any),
                (0.25, Burst::Uniform(5 * MS, 10 * MS)),
            ],
        },
    ]
}

fn workloads(s: &Scenario, kinds: &[Resource]) -> Vec<Workload> {
    let mut w = Vec::new();
    for (i, (share, burst)) in s.vgpus.iter().enumerate() {
        for &resource in kinds {
            w.push(Workload {
                vgpu: i as u32 + 1,
                compute_share: Share::new(*share),
                copy_share: Share::new(*share),
                resource,
                burst: *burst,
                think: 20 * US,
                streams: 1,
            });
        }
    }
    w
}

/// Largest |share of busy time − share| over vGPUs and resources, in percentage points;
/// and the same over 1 s windows.
fn errors(r: &Report, s: &Scenario, kinds: &[Resource]) -> (f64, f64) {
    let mut whole: f64 = 0.0;
    let mut window: f64 = 0.0;
    for (i, (share, _)) in s.vgpus.iter().enumerate() {
        for &k in kinds {
            let v = i as u32 + 1;
            whole = whole.max((r.share_of_busy(v, k) - share).abs());
            window = window.max(r.max_window_error(v, k, *share));
        }
    }
    (whole * 100.0, window * 100.0)
}

fn busy_fraction(r: &Report, kinds: &[Resource]) -> f64 {
    let total: u64 = r
        .busy
        .iter()
        .filter(|((_, k), _)| kinds.contains(k))
        .map(|(_, b)| *b)
        .sum();
    total as f64 / (r.duration as f64 * kinds.len() as f64)
}

/// What the GPU pays when its engine passes from one vGPU's context to another's: on the
/// H200 two VMs' 1 ms rounds kept the GPU 0.907 busy in device time against 0.790 in work,
/// about 150 µs per round, each round a hand-over (docs/PERFORMANCE.md, "GPU busy with N
/// VMs").
const SWITCH: u64 = 150 * US;

fn sim(kind: PolicyKind, w: &[Workload], seconds: u64) -> Report {
    run_switching(
        GpuScheduler::new(kind, QueueMode::Mrq, Config::default()),
        w,
        seconds * 1000 * MS,
        1000 * MS,
        42,
        SWITCH,
    )
}

fn fig(name: String, value: f64, unit: &str, anchor_name: &str, anchor: f64) -> Figure {
    Figure {
        name,
        value,
        unit: unit.into(),
        anchor_name: anchor_name.into(),
        anchor,
        anchor_unit: unit.into(),
    }
}

/// The policies in virtual time.
fn policies(seconds: u64, out: &mut Vec<Figure>) {
    let kinds: [(&str, Vec<Resource>); 3] = [
        ("compute", vec![Resource::Compute]),
        ("copy", vec![Resource::Copy]),
        ("mixed", vec![Resource::Compute, Resource::Copy]),
    ];
    for s in scenarios() {
        for (kname, k) in &kinds {
            let w = workloads(&s, k);
            let band = sim(PolicyKind::Band, &w, seconds);
            let credit = sim(PolicyKind::Credit, &w, seconds);
            let fifo = sim(PolicyKind::Fifo, &w, seconds);
            let (be, bw) = errors(&band, &s, k);
            let (ce, cw) = errors(&credit, &s, k);
            for (i, (share, _)) in s.vgpus.iter().enumerate() {
                let v = i as u32 + 1;
                let k0 = k[0];
                out.push(fig(
                    format!(
                        "{} {kname}: vGPU {v} share {:.0}% got (BAND)",
                        s.name,
                        share * 100.0
                    ),
                    band.share_of_busy(v, k0) * 100.0,
                    "%",
                    "Credit",
                    credit.share_of_busy(v, k0) * 100.0,
                ));
            }
            out.push(fig(
                format!("{} {kname}: max share error, whole run (BAND)", s.name),
                be,
                "pp",
                "Credit",
                ce,
            ));
            out.push(fig(
                format!("{} {kname}: max share error, 1 s windows (BAND)", s.name),
                bw,
                "pp",
                "Credit",
                cw,
            ));
            out.push(fig(
                format!("{} {kname}: GPU busy (BAND)", s.name),
                busy_fraction(&band, k) * 100.0,
                "%",
                "FIFO",
                busy_fraction(&fifo, k) * 100.0,
            ));
            let per_s = |r: &Report| r.handovers as f64 / seconds as f64;
            out.push(fig(
                format!("{} {kname}: hand-overs per second (BAND)", s.name),
                per_s(&band),
                "/s",
                "FIFO",
                per_s(&fifo),
            ));
        }
    }
}

/// A kernel that takes `d` of GPU time and no host CPU.
fn burst(d: Duration) {
    std::thread::sleep(d);
}

/// Two vGPUs 70/30 through the real grant path; returns vGPU 1's share of busy time.
fn real_split(policy: PolicyKind, seconds: u64) -> f64 {
    let config = ServerConfig {
        policy,
        ..ServerConfig::default()
    };
    let server = GrantServer::start(config, "bench").expect("scheduler thread");
    let client = |v, share| {
        let fds = server
            .attach(v, Share::new(share), Share::new(share))
            .expect("attach");
        Arc::new(GrantClient::from_fds(fds.page, fds.doorbell).expect("client"))
    };
    let (a, b) = (client(1, 0.7), client(2, 0.3));
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |c: Arc<GrantClient>, d: Duration| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _p = c.acquire(Resource::Compute);
                burst(d);
            }
        })
    };
    let ta = spawn(a, Duration::from_micros(200));
    let tb = spawn(b, Duration::from_millis(5));
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::SeqCst);
    let _ = ta.join();
    let _ = tb.join();
    let ua = server.usage(1).map(|u| u.compute_busy_ns).unwrap_or(0) as f64;
    let ub = server.usage(2).map(|u| u.compute_busy_ns).unwrap_or(0) as f64;
    ua / (ua + ub).max(1.0)
}

/// Mean time of `acquire` + release for a lone vGPU.
fn grant_latency(lease: bool, n: u32) -> Duration {
    let mut config = ServerConfig::default();
    if !lease {
        config.sched = Config {
            lease: 0,
            ..Config::default()
        };
    }
    let server = GrantServer::start(config, "bench").expect("scheduler thread");
    let fds = server
        .attach(1, Share::new(1.0), Share::new(1.0))
        .expect("attach");
    let c = GrantClient::from_fds(fds.page, fds.doorbell).expect("client");
    for _ in 0..100 {
        drop(c.acquire(Resource::Compute));
    }
    let t = Instant::now();
    for _ in 0..n {
        drop(c.acquire(Resource::Compute));
    }
    t.elapsed() / n
}

/// The anchor: one request/response over a unix socket between two threads.
fn socket_round_trip(n: u32) -> Duration {
    let (mut a, mut b) = UnixStream::pair().expect("socketpair");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 32];
        while b.read_exact(&mut buf).is_ok() {
            if b.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut buf = [0u8; 32];
    let t = Instant::now();
    for _ in 0..n {
        let _ = a.write_all(&buf);
        let _ = a.read_exact(&mut buf);
    }
    let d = t.elapsed() / n;
    drop(a);
    let _ = echo.join();
    d
}

fn mapping(out: &mut Vec<Figure>) {
    let cases = [
        ("NW-like wavefront 16x16", wavefront(16, 16, 100 * US)),
        ("random DAG 300 tasks", random_dag(300, 16, 9)),
    ];
    for (name, g) in cases {
        let prio = simulate(&g, 4, Mapping::Priority).unwrap_or(0);
        let rr = simulate(&g, 4, Mapping::RoundRobin { quantum: 100 * US }).unwrap_or(0);
        out.push(fig(
            format!("makespan, {name}, 16 queues on 4 slots (HEFT priority)"),
            prio as f64 / 1e6,
            "ms",
            "round-robin, 100 us quantum",
            rr as f64 / 1e6,
        ));
    }
}

/// Utilization over time of the 70/30 compute scenario under BAND (thick) and Credit
/// (thin), 100 ms windows, as a PNG.
fn plot(seconds: u64, path: &std::path::Path) {
    let s = &scenarios()[1];
    let w = workloads(s, &[Resource::Compute]);
    let window = 100 * MS;
    let run = |kind| {
        run_switching(
            GpuScheduler::new(kind, QueueMode::Mrq, Config::default()),
            &w,
            seconds * 1000 * MS,
            window,
            42,
            SWITCH,
        )
    };
    let (band, credit) = (run(PolicyKind::Band), run(PolicyKind::Credit));
    let mut lines = Vec::new();
    for (i, (share, _)) in s.vgpus.iter().enumerate() {
        let v = i as u32 + 1;
        let series = |r: &Report| -> Vec<(f64, f64)> {
            r.windows
                .get(&(v, Resource::Compute))
                .map(|ws| {
                    ws.iter()
                        .enumerate()
                        .map(|(k, u)| ((k as f64 + 0.5) * 0.1, *u))
                        .collect()
                })
                .unwrap_or_default()
        };
        lines.push(vgpuctl::plot::Line {
            label: Some(format!("vGPU {v}, share {:.0}%: BAND", share * 100.0)),
            points: series(&band),
            color: i,
            style: vgpuctl::plot::Style::Thick,
        });
        lines.push(vgpuctl::plot::Line {
            label: None,
            points: series(&credit),
            color: i,
            style: vgpuctl::plot::Style::Thin,
        });
        lines.push(vgpuctl::plot::Line::level(*share, i));
    }
    match vgpuctl::plot::utilization_png(
        path,
        "70/30, 0.1-1 ms vs 1-10 ms bursts (virtual time)",
        "thick: BAND, thin: Credit, dashed: share",
        &lines,
    ) {
        Ok(()) => println!("(plot of utilization over time: {})", path.display()),
        Err(e) => eprintln!("vgpu-bench band: cannot draw {}: {e}", path.display()),
    }
}

pub fn run(seconds: u64, real_seconds: u64) -> Vec<Figure> {
    let mut out = Vec::new();
    plot(
        seconds,
        std::path::Path::new("out/bench-band-utilization.png"),
    );
    policies(seconds, &mut out);
    let band = real_split(PolicyKind::Band, real_seconds);
    let credit = real_split(PolicyKind::Credit, real_seconds);
    out.push(fig(
        "real time 70/30 (0.2 ms vs 5 ms kernels): vGPU 1 got (BAND)".into(),
        band * 100.0,
        "%",
        "Credit",
        credit * 100.0,
    ));
    let n = 20_000;
    let sock = socket_round_trip(n).as_secs_f64() * 1e6;
    out.push(fig(
        "grant round trip, holder's lease".into(),
        grant_latency(true, n).as_secs_f64() * 1e6,
        "us",
        "unix socket round trip",
        sock,
    ));
    out.push(fig(
        "grant round trip, no lease (ask + grant)".into(),
        grant_latency(false, n / 4).as_secs_f64() * 1e6,
        "us",
        "unix socket round trip",
        sock,
    ));
    mapping(&mut out);
    out
}
