//! Whole-VM migration between two vgpud daemons on one machine: downtime, total time and
//! bytes sent of moving a running VM with its vGPU, against guest RAM and resident device
//! memory, beside the plain transfer of the same bytes over the same kind of connection.
//!
//! Two sim vgpud daemons (`TestDaemon`, unix sockets, one sim GPU each). For every point a
//! `gpu-load` VM of the given RAM starts on the first daemon with a vGPU holding the given
//! device memory resident (`hold=<MiB>`, filled once), then keeps computing through its vGPU
//! (an HtoD copy, `saxpy` and a 2 ms `spin` per round, every 50 rounds a checksum read back
//! into guest RAM and checked by the guest). It moves to the second daemon with
//! `POST /v1/vms/{id}/migrate`, once in each mode: `precopy` (RAM and device memory copied
//! while the VM runs; the vGPU backend's writes to guest RAM in the vhost-user dirty log)
//! and `stop_copy` (the VM stops first, everything moves while it is stopped); the figures
//! come from `GET /v1/migrations/{id}` on both sides (`host`: RAM and vGPU bytes, rounds,
//! the RAM sent while stopped, the vGPU's share of the stop). The guest must still be
//! running and checking its results at the destination, else the benchmark fails.
//!
//! The anchor: the same number of bytes written through a unix socket pair between two
//! threads (4 MiB writes) in the same run, once for everything the move sent and once for
//! what it sent while the VM was stopped (the median of three each).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use vgpu_api::api::{HostMigration, MigrationDestination, VgpuState, VmMigrateRequest, VmState};
use vgpu_api::client::Client;
use vgpuctl::plot::{xy_png, Axes, Line, Style};

use super::shared::fig;
use crate::bench::{median, Figure};
use crate::daemon::{gpu_load, TestDaemon};

const MIB: u64 = 1 << 20;
/// The goal: downtime at 2 GiB of RAM and 4 GiB of device memory.
const GOAL_MS: f64 = 50.0;
const GOAL_RAM_MIB: u64 = 2048;
const GOAL_DEV_MIB: u64 = 4096;
/// Device memory the vGPU needs beside `hold` (x, y, the checksum, the module).
const DEV_SLACK: u64 = 32 * MIB;
/// Writes of the plain transfer.
const CHUNK: usize = 4 << 20;
/// Plain transfers per anchor (the median is reported).
const PLAIN_RUNS: usize = 3;

/// The benchmark's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// Guest RAM sizes, MiB.
    pub ram_mib: Vec<u64>,
    /// Resident device memory sizes, MiB.
    pub dev_mib: Vec<u64>,
    /// The downtime budget each move asks for, ms.
    pub downtime_ms: u64,
}

/// The two ways a VM moves.
const MODES: [&str; 2] = ["precopy", "stop_copy"];

/// One move's figures.
struct Point {
    ram_mib: u64,
    dev_mib: u64,
    /// `precopy` or `stop_copy`.
    mode: &'static str,
    downtime_ms: f64,
    total_ms: f64,
    /// The source's record.
    src: HostMigration,
    /// The destination's record of the same move.
    dst: HostMigration,
    /// Plain transfer of everything sent, ms.
    plain_all_ms: f64,
    /// Plain transfer of what was sent while stopped, ms.
    plain_stop_ms: f64,
}

impl Point {
    fn sent(&self) -> u64 {
        self.src.vmm_bytes + self.src.vgpu_bytes
    }

    /// Bytes sent while the VM was stopped: its RAM, and with stop-and-copy the vGPU's
    /// memory too.
    fn stopped(&self) -> u64 {
        if self.mode == "stop_copy" {
            self.sent()
        } else {
            self.src.stop_ram_bytes
        }
    }

    fn label(&self) -> String {
        format!(
            "{} RAM + {} vGPU, {}",
            size(self.ram_mib),
            size(self.dev_mib),
            self.mode
        )
    }
}

pub fn run(p: &Params) -> Vec<Figure> {
    let max_dev = p.dev_mib.iter().copied().max().unwrap_or(0);
    let sim_memory = format!("{}M", max_dev + 256);
    let opts = ["--sim-gpus", "1", "--sim-memory", sim_memory.as_str()];
    let a = TestDaemon::start("hmbench-a", &opts);
    let b = TestDaemon::start("hmbench-b", &opts);
    println!(
        "two sim vgpud daemons on this machine (unix sockets, 1 sim GPU each, {sim_memory}); \
         gpu-load guest computing through its vGPU during each move; pre-copy (a \
         {} ms downtime budget) and stop-and-copy; anchor: plain transfer through a unix \
         socket pair",
        p.downtime_ms
    );
    let points = match measure(&a, &b, p) {
        Ok(points) => points,
        Err(e) => {
            // The daemons and everything they started go before the process exits.
            drop((a, b));
            fail(&e)
        }
    };
    table(&points);
    plot(&points, Path::new("out/bench-host-migration-downtime.png"));
    figures(&points)
}

/// Every point that fits in the host's memory, in order.
fn measure(a: &TestDaemon, b: &TestDaemon, p: &Params) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    for &ram in &p.ram_mib {
        for &dev in &p.dev_mib {
            // Source and destination hold the VM's RAM and the vGPU's memory at once.
            let need = 2 * (ram + dev) * MIB + (1 << 30);
            if let Some(avail) = mem_available().filter(|a| *a < need) {
                println!(
                    "note: {} RAM + {} vGPU skipped: a move holds both sides ({} MiB with \
                     slack), {} MiB available",
                    size(ram),
                    size(dev),
                    need / MIB,
                    avail / MIB
                );
                continue;
            }
            for mode in MODES {
                let pt = point(a, b, p, ram, dev, mode)?;
                println!(
                    "{}: downtime {:.1} ms (vGPU's stop {:.1} ms), total {:.0} ms, {} MiB \
                     sent, {} MiB of RAM while stopped",
                    pt.label(),
                    pt.downtime_ms,
                    pt.src.vgpu_downtime_ms.unwrap_or(f64::NAN),
                    pt.total_ms,
                    pt.sent() / MIB,
                    pt.src.stop_ram_bytes / MIB
                );
                points.push(pt);
            }
        }
    }
    Ok(points)
}

/// Starts a VM of `ram` MiB whose vGPU holds `dev` MiB on `a`, moves it to `b` in `mode`,
/// checks that it runs on there, and removes it.
fn point(
    a: &TestDaemon,
    b: &TestDaemon,
    p: &Params,
    ram: u64,
    dev: u64,
    mode: &'static str,
) -> Result<Point, String> {
    let arg = format!("rounds=2000000 n=65536 spin_us=2000 check=50 hold={dev}");
    let mut vm = gpu_load(&arg, 0, 0.2, dev * MIB + DEV_SLACK);
    vm.memory_bytes = ram * MIB;
    let created = a
        .client
        .create_vm(&vm)
        .map_err(|e| format!("{} RAM + {} vGPU: create the VM: {e}", size(ram), size(dev)))?;
    let id = created.id;
    // Resident and computing: the first checked round came after the fill.
    wait_console(&a.client, id, "ok checksum=", Duration::from_secs(180))?;
    let req = VmMigrateRequest {
        destination: MigrationDestination {
            socket: Some(b.socket.display().to_string()),
            url: None,
            token: None,
        },
        downtime_ms: Some(p.downtime_ms),
        mode: Some(mode.into()),
    };
    let m = a
        .client
        .migrate_vm_to(id, &req)
        .map_err(|e| format!("migrate VM {id}: {e}"))?;
    let done = a
        .client
        .wait_migration(m.id, Duration::from_secs(600), |_| {})
        .map_err(|e| format!("migration {}: {e}", m.id))?;
    if done.state != "completed" {
        return Err(format!("the move did not complete: {done:?}"));
    }
    let src = done.host.clone().ok_or("no host figures at the source")?;
    let (remote_vm, remote_mid) = src
        .remote_vm
        .zip(src.remote_migration)
        .ok_or("the source does not name the destination's VM and record")?;
    let theirs = wait_settled(&b.client, remote_mid)?;
    let dst = theirs.host.ok_or("no host figures at the destination")?;
    if theirs.downtime_ms != done.downtime_ms || dst.vgpu_bytes != src.vgpu_bytes {
        return Err(format!(
            "the two records disagree: source {done:?}, destination {dst:?}"
        ));
    }
    // The guest goes on computing and checking at the destination.
    let before = checked_rounds(&b.client, remote_vm);
    let start = Instant::now();
    while checked_rounds(&b.client, remote_vm) <= before {
        let state = b.client.vm(remote_vm).map(|v| v.state).ok();
        if state != Some(VmState::Running) || start.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "the VM does not go on at the destination ({state:?}):\n{}",
                console(&b.client, remote_vm)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    b.client
        .delete_vm(remote_vm)
        .map_err(|e| format!("delete VM {remote_vm}: {e}"))?;
    wait_empty(a)?;
    wait_empty(b)?;
    let mut pt = Point {
        ram_mib: ram,
        dev_mib: dev,
        mode,
        downtime_ms: done.downtime_ms.unwrap_or(f64::NAN),
        total_ms: done.elapsed_ms,
        src,
        dst,
        plain_all_ms: 0.0,
        plain_stop_ms: 0.0,
    };
    pt.plain_all_ms = plain_median(pt.sent())?;
    pt.plain_stop_ms = plain_median(pt.stopped())?;
    Ok(pt)
}

/// The destination's record of move `id` once it is settled.
fn wait_settled(c: &Client, id: u32) -> Result<vgpu_api::api::Migration, String> {
    let start = Instant::now();
    loop {
        let m = c
            .migration(id)
            .map_err(|e| format!("the destination's migration {id}: {e}"))?;
        if m.state == "completed" {
            return Ok(m);
        }
        if m.state != "running" || start.elapsed() > Duration::from_secs(30) {
            return Err(format!("the destination's record: {m:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until no VM and no vGPU of `d` holds resources.
fn wait_empty(d: &TestDaemon) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let vms = d.client.vms().map_err(|e| e.to_string())?;
        let vgpus = d.client.vgpus().map_err(|e| e.to_string())?;
        let idle = vms.iter().all(|v| !v.state.is_live())
            && vgpus
                .iter()
                .all(|v| matches!(v.state, VgpuState::Released | VgpuState::Failed { .. }));
        if idle {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("a daemon still holds {vms:?} {vgpus:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

/// Rounds the guest has checked so far (its progress lines).
fn checked_rounds(c: &Client, id: u32) -> usize {
    console(c, id).matches("ok checksum=").count()
}

/// Waits until VM `id`'s console shows `what`; fails when the VM ends first.
fn wait_console(c: &Client, id: u32, what: &str, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let out = console(c, id);
        if out.contains(what) {
            return Ok(());
        }
        let state = c.vm(id).map(|v| v.state).map_err(|e| e.to_string())?;
        if !state.is_live() || start.elapsed() > limit {
            return Err(format!(
                "VM {id} ({state:?}) never printed {what:?}:\n{out}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The median of [`PLAIN_RUNS`] plain transfers of `bytes`, ms.
fn plain_median(bytes: u64) -> Result<f64, String> {
    let runs = (0..PLAIN_RUNS)
        .map(|_| plain_transfer(bytes))
        .collect::<Result<Vec<f64>, String>>()?;
    Ok(median(runs))
}

/// Writes `bytes` through a unix socket pair from one thread to another (4 MiB writes);
/// the time from the first write to the last byte read, ms.
fn plain_transfer(bytes: u64) -> Result<f64, String> {
    let (mut tx, mut rx) = UnixStream::pair().map_err(|e| format!("socket pair: {e}"))?;
    let start = Instant::now();
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let buf = vec![0x5au8; CHUNK];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            tx.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    while got < bytes {
        match rx.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("plain transfer: {e}")),
        }
    }
    let ms = start.elapsed().as_secs_f64() * 1e3;
    match writer.join() {
        Ok(Ok(())) if got == bytes => Ok(ms),
        Ok(Ok(())) => Err(format!("plain transfer: {got} of {bytes} bytes arrived")),
        Ok(Err(e)) => Err(format!("plain transfer: {e}")),
        Err(_) => Err("plain transfer: the writer panicked".into()),
    }
}

/// Prints the table of every point and whether the goal is met.
fn table(points: &[Point]) {
    println!();
    println!(
        "| guest RAM | vGPU resident | mode | downtime | of which the vGPU's stop \
         | total time | RAM sent (rounds) | of which while stopped | vGPU sent (rounds) \
         | plain transfer: bytes sent stopped | plain transfer: all bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for pt in points {
        println!(
            "| {} | {} | {} | {:.1} ms | {:.1} ms | {:.0} ms | {} MiB ({}) | {} MiB \
             | {} MiB ({}) | {:.0} ms | {:.0} ms |",
            size(pt.ram_mib),
            size(pt.dev_mib),
            pt.mode,
            pt.downtime_ms,
            pt.src.vgpu_downtime_ms.unwrap_or(f64::NAN),
            pt.total_ms,
            pt.src.vmm_bytes / MIB,
            pt.src.vmm_rounds,
            pt.src.stop_ram_bytes / MIB,
            pt.src.vgpu_bytes / MIB,
            pt.src.vgpu_rounds,
            pt.plain_stop_ms,
            pt.plain_all_ms
        );
    }
    match points.iter().find(|pt| goal_point(pt)) {
        Some(pt) => println!(
            "\ngoal (pre-copy downtime at 2 GiB RAM + 4 GiB vGPU <= {GOAL_MS:.0} ms): \
             {:.1} ms: {}",
            pt.downtime_ms,
            if pt.downtime_ms <= GOAL_MS {
                "met"
            } else {
                "NOT met"
            }
        ),
        None => println!(
            "\ngoal (pre-copy downtime at 2 GiB RAM + 4 GiB vGPU <= {GOAL_MS:.0} ms): not \
             measured (--ram-mib 2048 --dev-mib 4096 measures it)"
        ),
    }
    if let Some(pt) = points
        .iter()
        .filter(|pt| pt.mode == "precopy")
        .max_by_key(|pt| (pt.ram_mib, pt.dev_mib))
    {
        println!(
            "where the pre-copy stop goes at {}: {:.1} ms in all; {} KiB of RAM sent stopped \
             (KVM's dirty pages and the vGPU backend's, since the last round; plain transfer \
             {:.1} ms); the vGPU's own stop {:.1} ms (its writes since its last round, \
             modules, functions, the destination's acknowledgement); the rest: pausing the \
             vCPUs and rings, the vCPU and device state, the destination's restore",
            pt.label(),
            pt.downtime_ms,
            pt.src.stop_ram_bytes / 1024,
            pt.plain_stop_ms,
            pt.src.vgpu_downtime_ms.unwrap_or(f64::NAN)
        );
    }
    println!();
}

/// The goal's point: pre-copy at 2 GiB of RAM and 4 GiB of device memory.
fn goal_point(pt: &Point) -> bool {
    pt.ram_mib == GOAL_RAM_MIB && pt.dev_mib == GOAL_DEV_MIB && pt.mode == "precopy"
}

/// The figures of every point, each beside its anchor.
fn figures(points: &[Point]) -> Vec<Figure> {
    let mut out = Vec::new();
    for pt in points {
        let l = pt.label();
        let mib = |b: u64| b as f64 / MIB as f64;
        out.push(fig(
            format!("{l}: downtime"),
            pt.downtime_ms,
            "ms",
            &format!(
                "plain transfer of the {:.1} MiB sent stopped",
                mib(pt.stopped())
            ),
            pt.plain_stop_ms,
        ));
        out.push(fig(
            format!("{l}: the vGPU's share of the stop"),
            pt.src.vgpu_downtime_ms.unwrap_or(f64::NAN),
            "ms",
            "downtime",
            pt.downtime_ms,
        ));
        out.push(fig(
            format!("{l}: total time"),
            pt.total_ms,
            "ms",
            &format!("plain transfer of the {:.0} MiB sent", mib(pt.sent())),
            pt.plain_all_ms,
        ));
        out.push(fig(
            format!("{l}: bytes sent (source's record)"),
            mib(pt.sent()),
            "MiB",
            "guest RAM + resident device memory",
            (pt.ram_mib + pt.dev_mib) as f64,
        ));
        out.push(fig(
            format!("{l}: bytes received (destination's record)"),
            mib(pt.dst.vmm_bytes + pt.dst.vgpu_bytes),
            "MiB",
            "bytes sent (source's record)",
            mib(pt.sent()),
        ));
        out.push(fig(
            format!("{l}: RAM sent while stopped"),
            mib(pt.src.stop_ram_bytes),
            "MiB",
            "guest RAM",
            pt.ram_mib as f64,
        ));
    }
    if let Some(pt) = points.iter().find(|pt| goal_point(pt)) {
        out.push(fig(
            "goal: pre-copy downtime at 2 GiB RAM + 4 GiB vGPU".into(),
            pt.downtime_ms,
            "ms",
            "goal",
            GOAL_MS,
        ));
    }
    out
}

/// Downtime against guest RAM, one line per mode and resident device memory size, beside
/// the plain transfer of what each mode sent stopped and the goal.
fn plot(points: &[Point], path: &Path) {
    let mut devs: Vec<u64> = points.iter().map(|pt| pt.dev_mib).collect();
    devs.sort_unstable();
    devs.dedup();
    let mut lines: Vec<Line> = Vec::new();
    for (m, mode) in MODES.iter().enumerate() {
        for (i, &dev) in devs.iter().enumerate() {
            lines.push(Line {
                label: Some(format!("{mode} downtime, {} vGPU resident", size(dev))),
                points: points
                    .iter()
                    .filter(|pt| pt.dev_mib == dev && pt.mode == *mode)
                    .map(|pt| (pt.ram_mib as f64, pt.downtime_ms))
                    .collect(),
                color: (m * devs.len() + i) % 4,
                style: if m == 0 { Style::Thick } else { Style::Thin },
            });
        }
    }
    if let Some(&dev) = devs.last() {
        for mode in MODES {
            lines.push(Line {
                label: Some(format!(
                    "plain transfer of what {mode} sends stopped, {} vGPU",
                    size(dev)
                )),
                points: points
                    .iter()
                    .filter(|pt| pt.dev_mib == dev && pt.mode == mode)
                    .map(|pt| (pt.ram_mib as f64, pt.plain_stop_ms))
                    .collect(),
                color: 4,
                style: Style::Thin,
            });
        }
    }
    lines.push(Line {
        label: Some("goal 50 ms".into()),
        ..Line::level(GOAL_MS, 5)
    });
    let axes = Axes {
        x_label: "guest RAM (MiB)",
        y_label: "ms",
        percent: false,
    };
    match xy_png(
        path,
        "Whole-VM migration between two sim vgpud daemons: downtime",
        "guest computing through its vGPU; pre-copy and stop-and-copy",
        &axes,
        &lines,
    ) {
        Ok(()) => println!("(plot of downtime vs guest RAM: {})", path.display()),
        Err(e) => eprintln!(
            "vgpu-bench host-migration: cannot draw {}: {e}",
            path.display()
        ),
    }
}

/// Bytes of memory available now (MemAvailable).
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

fn fail(e: &str) -> ! {
    eprintln!("vgpu-bench host-migration: FAILED: {e}");
    std::process::exit(1);
}

fn size(mib: u64) -> String {
    if mib >= 1024 && mib % 1024 == 0 {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{mib} MiB")
    }
}
