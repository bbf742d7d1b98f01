//! How answers look to people: plain text tables (and JSON with `--json`).

use serde::Serialize;
use vgpu_api::api::{Attach, Gpu, Vgpu, VgpuState, VgpuStats, Vm, VmState};
use vgpu_api::units::human_bytes;

/// A plain text table.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(x) = w.get_mut(i) {
                *x = (*x).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

pub fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

pub fn vgpu_state(s: &VgpuState) -> String {
    match s {
        VgpuState::Starting => "starting".into(),
        VgpuState::Ready => "ready".into(),
        VgpuState::Attached => "attached".into(),
        VgpuState::Releasing => "releasing".into(),
        VgpuState::Released => "released".into(),
        VgpuState::Failed { reason } => format!("failed: {reason}"),
    }
}

pub fn vm_state(s: &VmState) -> String {
    match s {
        VmState::Starting => "starting".into(),
        VmState::Running => "running".into(),
        VmState::Exited { code } => format!("exited ({code})"),
        VmState::Failed { reason } => format!("failed: {reason}"),
    }
}

pub fn vgpu_rows(v: &[Vgpu]) -> String {
    table(
        &[
            "ID", "GPU", "MEMORY", "COMPUTE", "COPY", "PRIO", "QUEUES", "VM", "STATE", "NAME",
        ],
        v.iter()
            .map(|v| {
                vec![
                    v.id.to_string(),
                    v.gpu.to_string(),
                    human_bytes(v.memory_bytes),
                    pct(v.compute_share),
                    pct(v.copy_share),
                    v.priority.to_string(),
                    v.queues.to_string(),
                    match (v.vm, v.attach) {
                        (Some(x), _) => x.to_string(),
                        (None, Attach::Process) => "process".into(),
                        (None, Attach::Vm) => "-".into(),
                    },
                    vgpu_state(&v.state),
                    v.name.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect(),
    )
}

pub fn vm_rows(v: &[Vm]) -> String {
    table(
        &[
            "ID", "VGPU", "VCPUS", "RAM", "UPTIME", "PAYLOAD", "STATE", "NAME",
        ],
        v.iter()
            .map(|v| {
                vec![
                    v.id.to_string(),
                    v.vgpu.map_or("-".into(), |x| x.to_string()),
                    v.vcpus.to_string(),
                    human_bytes(v.memory_bytes),
                    format!("{:.1}s", v.uptime_ms as f64 / 1000.0),
                    std::path::Path::new(&v.payload)
                        .file_name()
                        .map_or(v.payload.clone(), |f| f.to_string_lossy().into_owned()),
                    vm_state(&v.state),
                    v.name.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect(),
    )
}

pub fn stats_rows(s: &[VgpuStats]) -> String {
    table(
        &[
            "VGPU",
            "GPU",
            "COMPUTE",
            "SHARE",
            "COPY",
            "MEM SHARE",
            "USED",
            "RESIDENT",
            "SWAPPED",
            "PINNED HOST",
            "KERNELS",
            "REQUESTS",
            "ERRORS",
            "OVERRUNS",
            "VIOLATIONS",
        ],
        s.iter()
            .map(|s| {
                vec![
                    s.vgpu.to_string(),
                    s.gpu.to_string(),
                    pct(s.compute_utilization),
                    pct(s.compute_share),
                    s.copy_utilization.map_or("-".into(), pct),
                    human_bytes(s.memory_share_bytes),
                    human_bytes(s.memory_used_bytes),
                    human_bytes(s.memory_resident_bytes),
                    human_bytes(s.memory_swapped_bytes),
                    human_bytes(s.pinned_host_bytes),
                    s.kernels.to_string(),
                    s.requests.to_string(),
                    s.errors.to_string(),
                    format!("{}/{}", s.compute_overruns, s.copy_overruns),
                    s.violations.to_string(),
                ]
            })
            .collect(),
    )
}

/// The GPUs as a table.
pub fn gpu_rows(gpus: &[Gpu]) -> String {
    table(
        &[
            "GPU",
            "NAME",
            "BACKEND",
            "MEMORY",
            "COMMITTED",
            "FREE",
            "OVERSUB RESIDENT/POOL",
            "SWAP AREA USED",
            "COMPUTE",
            "COPY",
            "COPY BW",
            "HAND-OVERS",
            "VGPUS",
        ],
        gpus.iter()
            .map(|g| {
                vec![
                    g.index.to_string(),
                    g.name.clone(),
                    g.backend.clone(),
                    human_bytes(g.memory_bytes),
                    human_bytes(g.memory_committed_bytes),
                    human_bytes(g.memory_free_bytes),
                    format!(
                        "{}/{}",
                        human_bytes(g.oversubscribed_resident_bytes),
                        human_bytes(g.oversubscribed_pool_bytes)
                    ),
                    format!(
                        "{}/{}",
                        human_bytes(g.swap_area_used_bytes),
                        human_bytes(g.swap_area_bytes)
                    ),
                    pct(g.compute_committed),
                    pct(g.copy_committed),
                    if g.copy_bandwidth == 0 {
                        "unpaced".into()
                    } else {
                        format!("{:.1} GB/s", g.copy_bandwidth as f64 / 1e9)
                    },
                    format!("{}/{}", g.compute_handovers, g.copy_handovers),
                    g.vgpus
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ]
            })
            .collect(),
    )
}

/// Prints `v` as JSON, or as `human` renders it.
pub fn emit<T: Serialize>(json: bool, v: &T, human: impl FnOnce(&T) -> String) {
    if json {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        print!("{}", human(v));
    }
}
