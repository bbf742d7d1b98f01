//! `vgpuctl`: the operator CLI for vgpud. Every REST endpoint is a subcommand; tables for
//! people, `--json` for scripts. See `vgpuctl --help` and docs/api.md.

mod migrate;
mod output;
mod top;
mod vgpu;
mod vm;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use vgpu_api::client::{default_socket, Client, ClientError, Endpoint};

use crate::output::{emit, gpu_rows};
use crate::vgpu::VgpuCmd;
use crate::vm::VmCmd;

/// Operate vgpud: GPUs, vGPUs, VMs, stats.
#[derive(Parser, Debug)]
#[command(name = "vgpuctl", version)]
struct Cli {
    /// vgpud's unix socket [default: $XDG_RUNTIME_DIR/vgpud/vgpud.sock or /tmp/vgpud-$UID/vgpud.sock].
    #[arg(long, global = true, env = "VGPUD_SOCKET", conflicts_with = "url")]
    socket: Option<PathBuf>,
    /// vgpud over TCP, e.g. http://127.0.0.1:7070 (needs --token-file).
    #[arg(long, global = true, env = "VGPUD_URL")]
    url: Option<String>,
    /// File holding the bearer token.
    #[arg(long, global = true, env = "VGPUD_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Print JSON (the API's answers) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List the physical GPUs and what is committed on them.
    Gpus,
    /// vGPUs.
    #[command(subcommand)]
    Vgpu(VgpuCmd),
    /// VMs.
    #[command(subcommand)]
    Vm(VmCmd),
    /// Live per-vGPU utilization and memory (refreshing; q or Ctrl-C to stop).
    Top {
        /// Refresh period, ms.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes (0 = until Ctrl-C).
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// Print the Prometheus metrics.
    Metrics,
}

fn client(cli: &Cli) -> Result<Client, ClientError> {
    let token = match &cli.token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| {
                    ClientError::Usage(format!("cannot read the token file {}: {e}", p.display()))
                })?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let endpoint = match (&cli.url, &cli.socket) {
        (Some(u), _) => Endpoint::from_url(u)?,
        (None, Some(s)) => Endpoint::Unix(s.clone()),
        (None, None) => Endpoint::Unix(default_socket()),
    };
    Ok(Client::new(endpoint, token))
}

fn run(cli: Cli) -> Result<ExitCode, ClientError> {
    let c = client(&cli)?;
    let json = cli.json;
    match cli.cmd {
        Cmd::Gpus => emit(json, &c.gpus()?, |g| gpu_rows(g)),
        Cmd::Vgpu(cmd) => return vgpu::run(&c, json, cmd),
        Cmd::Vm(cmd) => return vm::run(&c, json, cmd),
        Cmd::Top { interval_ms, count } => {
            top::top(&c, Duration::from_millis(interval_ms.max(100)), count)?
        }
        Cmd::Metrics => print!("{}", c.metrics()?),
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if json {
                if let Some(b) = e.body() {
                    eprintln!("{}", serde_json::to_string(b).unwrap_or_default());
                }
            }
            eprintln!("vgpuctl: {e}");
            ExitCode::from(if matches!(e, ClientError::NotRunning { .. }) {
                3
            } else {
                1
            })
        }
    }
}
