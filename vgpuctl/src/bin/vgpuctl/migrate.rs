//! `vgpu migrate` and `vm migrate`: the request, and following it to its end.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use vgpu_api::api::{MigrateRequest, Migration};
use vgpu_api::client::{Client, ClientError};
use vgpu_api::units::human_bytes;

use crate::output::emit;

#[derive(Args, Debug, Clone)]
pub struct MigrateArgs {
    /// Target GPU.
    #[arg(long)]
    target_gpu: Option<u32>,
    /// stop_copy or precopy.
    #[arg(long)]
    mode: Option<String>,
    /// Longest acceptable pause, ms.
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
}

/// Follows a migration with a progress bar until it ends; exit 0 when it completed.
pub fn follow_migration(
    c: &Client,
    json: bool,
    m: Migration,
    no_wait: bool,
) -> Result<ExitCode, ClientError> {
    if no_wait {
        emit(json, &m, migration_line);
        return Ok(ExitCode::SUCCESS);
    }
    let bar = if json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(1)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} vGPU {prefix} {msg:24} [{bar:30}] {bytes}/{total_bytes}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(format!(
        "{}: GPU {} -> {}",
        m.vgpu, m.source_gpu, m.target_gpu
    ));
    let done = c.wait_migration(m.id, Duration::from_secs(600), |m| {
        bar.set_length(m.total_bytes.max(1));
        bar.set_position(m.bytes.min(m.total_bytes));
        bar.set_message(format!("{} (round {})", m.phase, m.rounds));
    })?;
    bar.finish_and_clear();
    emit(json, &done, migration_line);
    Ok(if done.state == "completed" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn migration_line(m: &Migration) -> String {
    match m.state.as_str() {
        "completed" => format!(
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
        ),
        "failed" => format!(
            "migration {}: vGPU {} stays on GPU {}: {}\n",
            m.id,
            m.vgpu,
            m.source_gpu,
            m.error.as_deref().unwrap_or("failed")
        ),
        _ => format!(
            "migration {}: vGPU {} GPU {} -> {}: {} ({} of {})\n",
            m.id,
            m.vgpu,
            m.source_gpu,
            m.target_gpu,
            m.phase,
            human_bytes(m.bytes),
            human_bytes(m.total_bytes)
        ),
    }
}
