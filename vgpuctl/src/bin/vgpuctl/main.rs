//! `vgpuctl`: the operator CLI for vgpud. Every REST endpoint is a subcommand; tables for
//! people, `--json` for scripts; errors name the flag at fault. See `vgpuctl --help` and
//! docs/api.md ("vgpuctl", with the exit codes).

mod cluster;
mod errors;
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

use crate::cluster::{PayloadCmd, RebalancerCmd, ShmCmd};
use crate::errors::Failure;
use crate::migrate::MigrationCmd;
use crate::output::{emit, gpu_rows};
use crate::vgpu::VgpuCmd;
use crate::vm::VmCmd;

/// Operate vgpud: GPUs, vGPUs, VMs, migrations, the rebalancer, shared memory, payloads.
///
/// Exit codes: 0 done; 1 refused or failed (the message names the flag at fault); 2 bad
/// command line; 3 vgpud not running; 4 a migration completed with a longer pause than
/// --max-downtime-ms. `vm wait` and `vm launch --wait` exit with the guest's exit code,
/// 123 if its vmm was gone when vgpud restarted, 124 if it still runs at the timeout, 125 if it
/// failed (its vmm killed or crashed, or its vGPU's worker died).
#[derive(Parser, Debug)]
#[command(name = "vgpuctl", version)]
struct Cli {
    /// vgpud's unix socket [default: $VGPUD_SOCKET, else /run/vgpud/vgpud.sock for root;
    /// for others $XDG_RUNTIME_DIR/vgpud/vgpud.sock, or the service's /run/vgpud/vgpud.sock
    /// when that one does not exist].
    #[arg(long, global = true, conflicts_with = "url")]
    socket: Option<PathBuf>,
    /// vgpud over TCP, e.g. http://127.0.0.1:7070 (needs --token-file).
    #[arg(long, global = true, env = "VGPUD_URL")]
    url: Option<String>,
    /// File holding the bearer token (vgpud over TCP).
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
    /// Live migrations (started with `vgpu migrate` / `vm migrate` or by the rebalancer).
    #[command(subcommand)]
    Migration(MigrationCmd),
    /// The rebalancer: demand it measures and what it decided.
    #[command(subcommand)]
    Rebalancer(RebalancerCmd),
    /// Shared device memory objects.
    #[command(subcommand)]
    Shm(ShmCmd),
    /// The payload guests vgpud can boot (its --payload-dir) and their arguments.
    #[command(subcommand)]
    Payload(PayloadCmd),
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
    /// Print the API's OpenAPI document.
    Openapi,
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
        (None, None) => Endpoint::Unix(implied_socket()?),
    };
    Ok(Client::new(endpoint, token))
}

/// The service's socket (packaging/vgpud.service).
const SERVICE_SOCKET: &str = "/run/vgpud/vgpud.sock";

/// The socket when neither --socket nor --url is given: `VGPUD_SOCKET` (read here, not by
/// clap, so that an exported variable never conflicts with --url), else the user's own
/// vgpud, else the service's.
fn implied_socket() -> Result<PathBuf, ClientError> {
    if let Some(s) = std::env::var_os("VGPUD_SOCKET").filter(|s| !s.is_empty()) {
        return Ok(PathBuf::from(s));
    }
    let service = std::path::Path::new(SERVICE_SOCKET);
    // The service's directory is root's (0700): the socket may exist yet be invisible.
    let service_there = service.parent().is_some_and(|d| d.exists());
    match default_socket() {
        Ok(own) if !own.exists() && service_there => Ok(service.to_path_buf()),
        Ok(own) => Ok(own),
        // No directory of the caller's own (no XDG_RUNTIME_DIR): the service's socket.
        Err(_) if service_there => Ok(service.to_path_buf()),
        Err(e) => Err(e),
    }
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let c = client(&cli)?;
    let json = cli.json;
    match cli.cmd {
        Cmd::Gpus => emit(json, &c.gpus()?, |g| gpu_rows(g)),
        Cmd::Vgpu(cmd) => return vgpu::run(&c, json, cmd),
        Cmd::Vm(cmd) => return vm::run(&c, json, cmd),
        Cmd::Migration(cmd) => return migrate::run(&c, json, cmd),
        Cmd::Rebalancer(cmd) => return cluster::rebalancer(&c, json, cmd),
        Cmd::Shm(cmd) => return cluster::shm(&c, json, cmd),
        Cmd::Payload(cmd) => return cluster::payload(&c, json, cmd),
        Cmd::Top { interval_ms, count } => {
            top::top(&c, Duration::from_millis(interval_ms.max(100)), count)?
        }
        Cmd::Metrics => print!("{}", c.metrics()?),
        Cmd::Openapi => print!(
            "{}",
            String::from_utf8_lossy(&c.checked("GET", "/v1/openapi.json", None)?.body)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli) {
        Ok(code) => code,
        Err(f) => {
            if json {
                if let Some(b) = f.err.body() {
                    eprintln!("{}", serde_json::to_string(b).unwrap_or_default());
                }
            }
            eprintln!("vgpuctl: {}", errors::message(f.ctx, &f.err));
            errors::exit_code(&f.err)
        }
    }
}
