//! `vgpuctl top`: live per-vGPU utilization and memory; `q` (or Ctrl-C) quits.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use vgpu_api::api::{Attach, Gpu, Vgpu, VgpuState, VgpuStats, Vm};
use vgpu_api::client::{Client, ClientError};
use vgpu_api::units::human_bytes;

use crate::output::{pct, table};

/// The terminal in non-canonical mode without echo or signals (so `q` and Ctrl-C arrive
/// as bytes) while `top` runs; the saved settings come back on drop.
struct RawInput {
    saved: libc::termios,
}

impl RawInput {
    /// Switches stdin when it is a terminal; None otherwise.
    fn new() -> Option<Self> {
        if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            return None;
        }
        // SAFETY: an all-zero termios is a valid value for tcgetattr to overwrite.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd 0 is open (it is a terminal) and `saved` is a valid termios.
        if unsafe { libc::tcgetattr(0, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: fd 0 is a terminal and `raw` is a valid termios.
        if unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(Self { saved })
    }

    /// Waits up to `d` for a key; true when it asks to quit (`q`, `Q`, Ctrl-C, Ctrl-D).
    fn quit_within(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fd = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut fd, 1, ms) };
            if n <= 0 {
                return false;
            }
            let mut buf = [0u8; 16];
            match std::io::stdin().read(&mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(k) => {
                    if buf[..k].iter().any(|b| matches!(b, b'q' | b'Q' | 3 | 4)) {
                        return true;
                    }
                }
            }
            if left.is_zero() {
                return false;
            }
        }
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        // SAFETY: restores the settings read from the same terminal in `new`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
    }
}

/// One GPU's memory as `top` shows it: what hard shares reserve, what oversubscribed
/// vGPUs were promised, and where the allocated bytes are.
fn gpu_line(g: &Gpu, vgpus: &[Vgpu], stats: &[VgpuStats], handovers: Option<f64>) -> String {
    let on: Vec<&Vgpu> = vgpus.iter().filter(|v| g.vgpus.contains(&v.id)).collect();
    let over: u64 = on
        .iter()
        .filter(|v| v.oversubscribe)
        .map(|v| v.memory_bytes)
        .sum();
    let here: Vec<&VgpuStats> = stats.iter().filter(|s| s.gpu == g.index).collect();
    let resident: u64 = here.iter().map(|s| s.memory_resident_bytes).sum();
    let swapped: u64 = here.iter().map(|s| s.memory_swapped_bytes).sum();
    // The compute engine's changes of hands: a rate once two screens were read.
    let hands = match handovers {
        Some(r) => format!("; {r:.0} hand-overs/s"),
        None => format!("; {} hand-overs", g.compute_handovers),
    };
    format!(
        "GPU {} {}: {} memory; promised {} ({} reserved by hard shares, {} oversubscribed); resident {}, swapped out {}; compute {} copy {} committed{hands}\n",
        g.index,
        g.name,
        human_bytes(g.memory_bytes),
        human_bytes(g.memory_committed_bytes + over),
        human_bytes(g.memory_committed_bytes),
        human_bytes(over),
        human_bytes(resident),
        human_bytes(swapped),
        pct(g.compute_committed),
        pct(g.copy_committed)
    )
}

/// The width to fit: the terminal's columns (or `$COLUMNS`), None for a pipe without
/// `$COLUMNS`.
fn width(tty: bool) -> Option<usize> {
    if tty {
        // SAFETY: an all-zero winsize is a valid value for the ioctl to overwrite.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one winsize to the valid pointer; fd 1 is open.
        if unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
            return Some(usize::from(ws.ws_col));
        }
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse().ok())
        .filter(|c| *c > 0)
}

/// `line` cut to `width` characters, its end replaced by `…` when cut.
fn elide(line: &str, width: Option<usize>) -> String {
    match width {
        Some(w) if line.chars().count() > w => {
            let mut out: String = line.chars().take(w.saturating_sub(1)).collect();
            out.push('…');
            out
        }
        _ => line.to_owned(),
    }
}

/// Columns of the vGPU table, in the order shown; `drop` ranks which go first when the
/// table is wider than the terminal (0: never).
const COLUMNS: &[(&str, u8)] = &[
    ("VGPU", 0),
    ("VM", 0),
    ("OWNER", 8),
    ("STATE", 0),
    ("GPU", 7),
    ("UTIL", 0),
    ("", 1),
    ("SHARE", 9),
    ("COPY", 3),
    ("MEM SHARE", 6),
    ("USED", 10),
    ("RESIDENT", 4),
    ("SWAPPED", 5),
    ("KERNELS", 2),
    ("NAME", 11),
];

/// Who uses vGPU `v`: its VM (id and name) or its process owner.
fn user(v: &Vgpu, vms: &[Vm]) -> (String, String) {
    match (v.attach, v.vm) {
        (Attach::Process, _) => {
            let id = |x: Option<u32>| x.map_or("-".into(), |i| i.to_string());
            (
                "process".into(),
                format!("{}:{}", id(v.owner_uid), id(v.owner_gid)),
            )
        }
        (Attach::Vm, Some(id)) => {
            let name = vms.iter().find(|m| m.id == id).and_then(|m| m.name.clone());
            let vm = match name {
                Some(n) => format!("{id} {n}"),
                None => id.to_string(),
            };
            (vm, "-".into())
        }
        (Attach::Vm, None) => ("-".into(), "-".into()),
    }
}

/// The state of `v` in a few words.
fn short_state(v: &Vgpu) -> String {
    match &v.state {
        VgpuState::Failed { .. } => "failed".into(),
        other => crate::output::vgpu_state(other),
    }
}

/// The vGPU table fitted to `width`: the lowest-ranked columns go until it fits, then
/// each line is cut.
fn fitted_table(rows: Vec<Vec<String>>, width: Option<usize>) -> String {
    let mut keep: Vec<usize> = (0..COLUMNS.len()).collect();
    let render = |keep: &[usize]| {
        let headers: Vec<&str> = keep.iter().map(|&i| COLUMNS[i].0).collect();
        let rows = rows
            .iter()
            .map(|r| keep.iter().map(|&i| r[i].clone()).collect())
            .collect();
        table(&headers, rows)
    };
    let mut out = render(&keep);
    if let Some(w) = width {
        let mut ranks: Vec<(u8, usize)> = COLUMNS
            .iter()
            .enumerate()
            .filter(|(_, (_, d))| *d > 0)
            .map(|(i, (_, d))| (*d, i))
            .collect();
        ranks.sort();
        for (_, i) in ranks {
            if out.lines().all(|l| l.chars().count() <= w) {
                break;
            }
            keep.retain(|k| *k != i);
            out = render(&keep);
        }
    }
    out.lines().map(|l| elide(l, width) + "\n").collect()
}

/// Each GPU's compute hand-overs when the last screen was read.
struct Seen {
    at: Instant,
    handovers: Vec<(u32, u64)>,
}

impl Seen {
    /// GPU `g`'s hand-overs a second since this was read (None: not seen then, or its
    /// count went back, as after a restart of vgpud).
    fn rate(&self, g: &Gpu, now: Instant) -> Option<f64> {
        let (_, before) = self.handovers.iter().find(|(i, _)| *i == g.index)?;
        let secs = now.duration_since(self.at).as_secs_f64();
        let more = g.compute_handovers.checked_sub(*before)?;
        (secs > 0.0).then(|| more as f64 / secs)
    }
}

fn screen(
    c: &Client,
    interval: Duration,
    tty: bool,
    seen: &mut Option<Seen>,
) -> Result<String, ClientError> {
    let vgpus = c.vgpus()?;
    let gpus = c.gpus()?;
    let now = Instant::now();
    let vms = c.vms()?;
    let mut stats = Vec::new();
    for v in vgpus.iter().filter(|v| v.worker_pid.is_some()) {
        match c.vgpu_stats(v.id) {
            Ok(s) => stats.push(s),
            Err(ClientError::Api { status: 404, .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let w = width(tty);
    let mut out = String::new();
    if tty {
        out.push_str("\x1b[H\x1b[2J");
    }
    let shown: Vec<&Vgpu> = vgpus
        .iter()
        .filter(|v| v.state != VgpuState::Released)
        .collect();
    let running = vms.iter().filter(|v| v.state.is_live()).count();
    let head = format!(
        "vgpuctl top: {} GPUs, {} vGPUs, {} running VMs; every {} ms{} — {}",
        gpus.len(),
        shown.len(),
        running,
        interval.as_millis(),
        if tty { "; q quits" } else { "" },
        c.endpoint(),
    );
    out.push_str(&elide(&head, w));
    out.push_str("\n\n");
    for g in &gpus {
        let rate = seen.as_ref().and_then(|s| s.rate(g, now));
        out.push_str(&elide(gpu_line(g, &vgpus, &stats, rate).trim_end(), w));
        out.push('\n');
    }
    *seen = Some(Seen {
        at: now,
        handovers: gpus
            .iter()
            .map(|g| (g.index, g.compute_handovers))
            .collect(),
    });
    out.push('\n');
    let rows = shown
        .iter()
        .map(|v| {
            let (vm, owner) = user(v, &vms);
            let s = stats.iter().find(|s| s.vgpu == v.id);
            let num = |f: &dyn Fn(&VgpuStats) -> String| s.map_or("-".into(), f);
            let filled = s.map_or(0, |s| {
                (s.compute_utilization.clamp(0.0, 1.0) * 20.0).round() as usize
            });
            vec![
                v.id.to_string(),
                vm,
                owner,
                short_state(v),
                v.gpu.to_string(),
                num(&|s| pct(s.compute_utilization)),
                format!("[{}{}]", "#".repeat(filled), ".".repeat(20 - filled)),
                pct(v.compute_share),
                num(&|s| s.copy_utilization.map_or("-".into(), pct)),
                human_bytes(v.memory_bytes),
                num(&|s| human_bytes(s.memory_used_bytes)),
                num(&|s| human_bytes(s.memory_resident_bytes)),
                num(&|s| human_bytes(s.memory_swapped_bytes)),
                num(&|s| s.kernels.to_string()),
                v.name.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    out.push_str(&fitted_table(rows, w));
    Ok(out)
}

/// Whether `e` means vgpud is away for now (stopped, restarting): `top` waits for it.
fn away(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::NotRunning { .. } | ClientError::Io { .. } | ClientError::Protocol(_)
    )
}

/// Refreshes every `interval` until `q` or Ctrl-C, or `count` times (0 = no limit). While
/// vgpud is away (a restart) it says so and keeps trying.
pub fn top(c: &Client, interval: Duration, count: u64) -> Result<(), ClientError> {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let input = if tty { RawInput::new() } else { None };
    let mut n = 0;
    let mut seen = None;
    loop {
        let start = Instant::now();
        let out = match screen(c, interval, tty, &mut seen) {
            Ok(out) => out,
            Err(e) if away(&e) => {
                let line = format!(
                    "vgpuctl top: vgpud does not answer; trying again every {} ms — {e}",
                    interval.as_millis()
                );
                let clear = if tty { "\x1b[H\x1b[2J" } else { "" };
                format!("{clear}{}\n", elide(&line, width(tty)))
            }
            Err(e) => return Err(e),
        };
        print!("{out}");
        let _ = std::io::stdout().flush();
        n += 1;
        if count != 0 && n >= count {
            return Ok(());
        }
        let wait = interval.saturating_sub(start.elapsed());
        match &input {
            Some(i) => {
                if i.quit_within(wait) {
                    return Ok(());
                }
            }
            None => std::thread::sleep(wait),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_narrow_terminal_gets_the_main_columns_and_no_line_wider_than_it() {
        let row: Vec<String> = COLUMNS.iter().map(|(h, _)| format!("{h}-value")).collect();
        let full = fitted_table(vec![row.clone()], None);
        assert!(full.contains("KERNELS") && full.contains("NAME"), "{full}");
        for w in [40, 60, 80, 120] {
            let t = fitted_table(vec![row.clone()], Some(w));
            assert!(t.lines().all(|l| l.chars().count() <= w), "{w}: {t}");
            assert!(t.starts_with("VGPU"), "{w}: {t}");
        }
        let t = fitted_table(vec![row], Some(80));
        for col in ["VM", "STATE", "UTIL"] {
            assert!(t.contains(col), "{col} kept at 80 columns: {t}");
        }
        assert_eq!(elide("abcdef", Some(4)), "abc…");
        assert_eq!(elide("abc", Some(4)), "abc");
    }

    fn gpu(index: u32, handovers: u64) -> Gpu {
        Gpu {
            index,
            name: format!("gpu{index}"),
            backend: "sim".into(),
            memory_bytes: 1 << 30,
            memory_committed_bytes: 0,
            memory_free_bytes: 1 << 30,
            memory_shared_bytes: 0,
            oversubscribed_pool_bytes: 0,
            oversubscribed_resident_bytes: 0,
            swap_area_bytes: 0,
            swap_area_used_bytes: 0,
            copy_bandwidth: 0,
            speed: 1.0,
            compute_committed: 0.0,
            copy_committed: 0.0,
            vgpus: Vec::new(),
            compute_handovers: handovers,
            copy_handovers: 0,
        }
    }

    #[test]
    fn the_gpu_line_gives_hand_overs_a_second_once_two_screens_were_read() {
        let at = Instant::now();
        let seen = Seen {
            at,
            handovers: vec![(0, 100)],
        };
        let later = at + Duration::from_secs(2);
        assert_eq!(seen.rate(&gpu(0, 300), later), Some(100.0));
        // A GPU not seen before, or a count that went back (vgpud restarted): no rate.
        assert_eq!(seen.rate(&gpu(1, 300), later), None);
        assert_eq!(seen.rate(&gpu(0, 40), later), None);
        let line = gpu_line(&gpu(0, 300), &[], &[], Some(100.0));
        assert!(line.contains("; 100 hand-overs/s"), "{line}");
        let line = gpu_line(&gpu(0, 300), &[], &[], None);
        assert!(line.contains("; 300 hand-overs"), "{line}");
    }
}
