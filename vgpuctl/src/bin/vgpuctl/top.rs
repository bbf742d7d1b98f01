//! `vgpuctl top`: live per-vGPU utilization and memory.

use std::io::Write;
use std::time::{Duration, Instant};

use vgpu_api::client::{Client, ClientError};
use vgpu_api::units::human_bytes;

use crate::output::{pct, table};

/// Refreshes every `interval` until Ctrl-C, or `count` times (0 = no limit).
pub fn top(c: &Client, interval: Duration, count: u64) -> Result<(), ClientError> {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut n = 0;
    loop {
        let start = Instant::now();
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
            "vgpuctl top — {}  ({} GPUs, {} live vGPUs; every {} ms)\n\n",
            c.endpoint(),
            gpus.len(),
            stats.len(),
            interval.as_millis()
        ));
        for g in &gpus {
            out.push_str(&format!(
                "GPU {} {}: memory {} / {} committed, compute {} copy {} committed\n",
                g.index,
                g.name,
                human_bytes(g.memory_committed_bytes),
                human_bytes(g.memory_bytes),
                pct(g.compute_committed),
                pct(g.copy_committed)
            ));
        }
        out.push('\n');
        out.push_str(&table(
            &[
                "VGPU", "GPU", "UTIL", "", "SHARE", "COPY", "MEM USED", "KERNELS",
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
                        human_bytes(s.memory_used_bytes),
                        s.kernels.to_string(),
                    ]
                })
                .collect(),
        ));
        print!("{out}");
        let _ = std::io::stdout().flush();
        n += 1;
        if count != 0 && n >= count {
            return Ok(());
        }
        std::thread::sleep(interval.saturating_sub(start.elapsed()));
    }
}
