//! `vgpu migrate`, `vm migrate` and `migration list|show|watch`: the request, and
//! following a migration to its end with every phase and its bytes.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use vgpu_api::api::{MigrateRequest, Migration};
use vgpu_api::client::{Client, ClientError};
use vgpu_api::units::human_bytes;

use crate::errors::{code, Failure};
use crate::output::{emit, table};

#[derive(Args, Debug, Clone)]
pub struct MigrateArgs {
    /// Target GPU [default: the least loaded other GPU with room].
    #[arg(long)]
    target_gpu: Option<u32>,
    /// precopy (copy while the guest runs, pause for the rest) or stop_copy (pause, copy
    /// everything) [default: precopy]; with --to, for the whole VM.
    #[arg(long, value_parser = ["precopy", "stop_copy"])]
    mode: Option<String>,
    /// Longest acceptable pause, ms: pre-copy aims for it; if the measured pause is
    /// longer, vgpuctl warns and exits with 4.
    #[arg(long)]
    max_downtime_ms: Option<u64>,
    /// Return at once instead of following the migration with a progress bar.
    #[arg(long)]
    pub no_wait: bool,
}

impl MigrateArgs {
    pub fn req(&self) -> MigrateRequest {
        MigrateRequest {
            target_gpu: self.target_gpu,
            mode: self.mode.clone(),
            max_downtime_ms: self.max_downtime_ms,
        }
    }

    /// The mode asked for, if any.
    pub fn mode(&self) -> Option<String> {
        self.mode.clone()
    }

    /// The pause the user asked for at most.
    pub fn max_downtime_ms(&self) -> Option<u64> {
        self.max_downtime_ms
    }
}

#[derive(Subcommand, Debug)]
pub enum MigrationCmd {
    /// List migrations (running and finished).
    List,
    /// Show one migration with its phases.
    Show { id: u32 },
    /// Follow a running migration to its end (exit 0 once completed, 1 if it failed).
    Watch { id: u32 },
}

/// Runs one `migration` subcommand.
pub fn run(c: &Client, json: bool, cmd: MigrationCmd) -> Result<ExitCode, Failure> {
    match cmd {
        MigrationCmd::List => emit(json, &c.migrations()?, |m| migration_rows(m)),
        MigrationCmd::Show { id } => emit(json, &c.migration(id)?, migration_detail),
        MigrationCmd::Watch { id } => {
            let m = c.migration(id)?;
            return follow_migration(c, json, m, false, None);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What one progress report says: phase, round and bytes.
fn progress_text(m: &Migration) -> String {
    let round = if m.rounds > 0 {
        format!(" round {}", m.rounds)
    } else {
        String::new()
    };
    format!(
        "{}{round}: {} of {} copied, {} dirty",
        m.phase,
        human_bytes(m.bytes),
        human_bytes(m.total_bytes),
        human_bytes(m.dirty_bytes)
    )
}

/// Follows a migration until it ends: a progress bar on a terminal, one line per phase
/// or round on stderr otherwise. Exit 0 when it completed within `max_downtime_ms`, 4
/// when it completed with a longer pause, 1 when it failed.
pub fn follow_migration(
    c: &Client,
    json: bool,
    m: Migration,
    no_wait: bool,
    max_downtime_ms: Option<u64>,
) -> Result<ExitCode, Failure> {
    if no_wait {
        emit(json, &m, migration_line);
        return Ok(ExitCode::SUCCESS);
    }
    let was_running = m.state == "running";
    let tty = !json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = if tty {
        indicatif::ProgressBar::new(m.total_bytes)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {prefix} {msg:28} [{bar:30}] {bytes}/{total_bytes}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(match &m.host {
        Some(h) => format!("VM {} -> {}", h.vm, h.peer),
        None => format!("vGPU {}: GPU {} -> {}", m.vgpu, m.source_gpu, m.target_gpu),
    });
    let mut last = (String::new(), u32::MAX);
    let done = c.wait_migration(m.id, Duration::from_secs(600), |m| {
        bar.set_length(m.total_bytes);
        bar.set_position(m.bytes.min(m.total_bytes));
        let round = if m.rounds > 0 {
            format!(" (round {})", m.rounds)
        } else {
            String::new()
        };
        bar.set_message(format!("{}{round}", m.phase));
        if !tty && !json && m.state == "running" && (m.phase.clone(), m.rounds) != last {
            last = (m.phase.clone(), m.rounds);
            eprintln!("migration {}: {}", m.id, progress_text(m));
        }
    })?;
    bar.finish_and_clear();
    emit(json, &done, migration_line);
    if done.state != "completed" {
        return Ok(ExitCode::from(code::FAILED));
    }
    // Where the vGPU runs now, as vgpud places it (a migration watched after its end
    // may have been followed by others).
    match c.vgpu(done.vgpu) {
        _ if done.host.is_some() => {}
        Ok(v) if !json && was_running => {
            if v.gpu == done.target_gpu {
                println!("vGPU {} now runs on GPU {}", v.id, v.gpu);
            } else {
                eprintln!(
                    "vgpuctl: warning: vGPU {} is on GPU {}, not on the migration's target GPU {}",
                    v.id, v.gpu, done.target_gpu
                );
            }
        }
        Ok(_) | Err(ClientError::Api { status: 404, .. }) => {}
        Err(e) => return Err(e.into()),
    }
    if let (Some(max), Some(took)) = (max_downtime_ms, done.downtime_ms) {
        if took > max as f64 {
            let _ = std::io::stdout().flush();
            eprintln!(
                "vgpuctl: warning: the guest was paused {took:.2} ms, longer than --max-downtime-ms {max} ({} mode); the migration completed (exit code 4)",
                done.mode
            );
            return Ok(ExitCode::from(code::DOWNTIME_EXCEEDED));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The phases a migration went through, with their durations.
fn phases(m: &Migration) -> String {
    m.timeline
        .iter()
        .map(|s| format!("{} {:.1} ms", s.phase, s.end_ms - s.start_ms))
        .collect::<Vec<_>>()
        .join(", ")
}

fn migration_line(m: &Migration) -> String {
    if let Some(h) = &m.host {
        let whither = match h.direction.as_str() {
            "incoming" => format!("VM {} from {}", h.vm, h.peer),
            _ => format!(
                "VM {} to {} (VM {} there)",
                h.vm,
                h.peer,
                h.remote_vm.unwrap_or(0)
            ),
        };
        return match m.state.as_str() {
            "completed" => format!(
                "migration {}: moved {whither} in {:.1} ms: guest RAM {} in {} rounds ({} while stopped), vGPU {} in {} rounds, downtime {:.2} ms\n",
                m.id,
                m.elapsed_ms,
                human_bytes(h.vmm_bytes),
                h.vmm_rounds,
                human_bytes(h.stop_ram_bytes),
                human_bytes(h.vgpu_bytes),
                h.vgpu_rounds,
                m.downtime_ms.unwrap_or(0.0)
            ),
            "failed" => format!(
                "migration {}: {whither} did not move, it runs where it was: {}\n",
                m.id,
                m.error.as_deref().unwrap_or("failed")
            ),
            _ => format!("migration {}: {whither}: {}\n", m.id, progress_text(m)),
        };
    }
    match m.state.as_str() {
        "completed" => {
            let mut s = format!(
                "migration {}: vGPU {} moved from GPU {} to GPU {} in {:.1} ms ({}, {} rounds, {} copied of {}), downtime {:.2} ms\n",
                m.id,
                m.vgpu,
                m.source_gpu,
                m.target_gpu,
                m.elapsed_ms,
                m.mode,
                m.rounds,
                human_bytes(m.bytes),
                human_bytes(m.total_bytes),
                m.downtime_ms.unwrap_or(0.0)
            );
            if !m.timeline.is_empty() {
                s.push_str(&format!("  phases: {}\n", phases(m)));
            }
            s
        }
        "failed" => format!(
            "migration {}: vGPU {} stays on GPU {}: {}\n",
            m.id,
            m.vgpu,
            m.source_gpu,
            m.error.as_deref().unwrap_or("failed")
        ),
        _ => format!(
            "migration {}: vGPU {} GPU {} -> {}: {}\n",
            m.id,
            m.vgpu,
            m.source_gpu,
            m.target_gpu,
            progress_text(m)
        ),
    }
}

fn migration_rows(ms: &[Migration]) -> String {
    table(
        &[
            "ID", "VGPU", "FROM", "TO", "MODE", "STATE", "PHASE", "ROUNDS", "COPIED", "OF",
            "DOWNTIME", "ELAPSED",
        ],
        ms.iter()
            .map(|m| {
                vec![
                    m.id.to_string(),
                    m.vgpu.to_string(),
                    m.source_gpu.to_string(),
                    m.target_gpu.to_string(),
                    m.mode.clone(),
                    m.state.clone(),
                    m.phase.clone(),
                    m.rounds.to_string(),
                    human_bytes(m.bytes),
                    human_bytes(m.total_bytes),
                    m.downtime_ms.map_or("-".into(), |d| format!("{d:.2} ms")),
                    format!("{:.1} ms", m.elapsed_ms),
                ]
            })
            .collect(),
    )
}

fn migration_detail(m: &Migration) -> String {
    let mut s = migration_rows(std::slice::from_ref(m));
    if let Some(e) = &m.error {
        s.push_str(&format!("error: {e}\n"));
    }
    if !m.timeline.is_empty() {
        s.push('\n');
        s.push_str(&table(
            &["PHASE", "START", "END", "TOOK"],
            m.timeline
                .iter()
                .map(|p| {
                    vec![
                        p.phase.clone(),
                        format!("{:.2} ms", p.start_ms),
                        format!("{:.2} ms", p.end_ms),
                        format!("{:.2} ms", p.end_ms - p.start_ms),
                    ]
                })
                .collect(),
        ));
    }
    s
}
