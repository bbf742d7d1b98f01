//! `vgpuctl top`: live per-vGPU utilization and memory; `q` (or Ctrl-C) quits.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use vgpu_api::api::{Gpu, Vgpu, VgpuStats};
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
fn gpu_line(g: &Gpu, vgpus: &[Vgpu], stats: &[VgpuStats]) -> String {
    let on: Vec<&Vgpu> = vgpus.iter().filter(|v| g.vgpus.contains(&v.id)).collect();
    let over: u64 = on
        .iter()
        .filter(|v| v.oversubscribe)
        .map(|v| v.memory_bytes)
        .sum();
    let here: Vec<&VgpuStats> = stats.iter().filter(|s| s.gpu == g.index).collect();
    let resident: u64 = here.iter().map(|s| s.memory_resident_bytes).sum();
    let swapped: u64 = here.iter().map(|s| s.memory_swapped_bytes).sum();
    format!(
        "GPU {} {}: {} memory; promised {} ({} reserved by hard shares, {} oversubscribed); resident {}, swapped out {}; compute {} copy {} committed\n",
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

fn screen(c: &Client, interval: Duration, tty: bool) -> Result<String, ClientError> {
    let vgpus = c.vgpus()?;
    let gpus = c.gpus()?;
    let mut stats = Vec::new();
    for v in vgpus.iter().filter(|v| v.worker_pid.is_some()) {
        match c.vgpu_stats(v.id) {
            Ok(s) => stats.push(s),
            Err(ClientError::Api { status: 404, .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let mut out = String::new();
    if tty {
        out.push_str("\x1b[H\x1b[2J");
    }
    out.push_str(&format!(
        "vgpuctl top — {}  ({} GPUs, {} live vGPUs; every {} ms{})\n\n",
        c.endpoint(),
        gpus.len(),
        stats.len(),
        interval.as_millis(),
        if tty { "; q quits" } else { "" }
    ));
    for g in &gpus {
        out.push_str(&gpu_line(g, &vgpus, &stats));
    }
    out.push('\n');
    out.push_str(&table(
        &[
            "VGPU",
            "GPU",
            "UTIL",
            "",
            "SHARE",
            "COPY",
            "MEM SHARE",
            "USED",
            "RESIDENT",
            "SWAPPED",
            "KERNELS",
            "NAME",
        ],
        stats
            .iter()
            .map(|s| {
                let filled = ((s.compute_utilization.clamp(0.0, 1.0)) * 20.0).round() as usize;
                vec![
                    s.vgpu.to_string(),
                    s.gpu.to_string(),
                    pct(s.compute_utilization),
                    format!("[{}{}]", "#".repeat(filled), ".".repeat(20 - filled)),
                    pct(s.compute_share),
                    s.copy_utilization.map_or("-".into(), pct),
                    human_bytes(s.memory_share_bytes),
                    human_bytes(s.memory_used_bytes),
                    human_bytes(s.memory_resident_bytes),
                    human_bytes(s.memory_swapped_bytes),
                    s.kernels.to_string(),
                    vgpus
                        .iter()
                        .find(|v| v.id == s.vgpu)
                        .and_then(|v| v.name.clone())
                        .unwrap_or_else(|| "-".into()),
                ]
            })
            .collect(),
    ));
    Ok(out)
}

/// Refreshes every `interval` until `q` or Ctrl-C, or `count` times (0 = no limit).
pub fn top(c: &Client, interval: Duration, count: u64) -> Result<(), ClientError> {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let input = if tty { RawInput::new() } else { None };
    let mut n = 0;
    loop {
        let start = Instant::now();
        let out = screen(c, interval, tty)?;
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
