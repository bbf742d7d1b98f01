//! `vmm`: runs one VM. See `vmm --help` and docs/payload-abi.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use vmm::{parse_size, VgpuSpec, Vm, VmConfig};

/// Runs one KVM virtual machine with a payload guest and its vGPU devices.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The no_std payload ELF to boot (see docs/payload-abi.md).
    #[arg(long)]
    payload: PathBuf,
    /// A string handed to the payload (at most 4096 bytes).
    #[arg(long, default_value = "")]
    payload_arg: String,
    /// Guest RAM, e.g. 256M or 2G.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    memory: u64,
    /// Number of vCPUs (1..=16).
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// A vGPU served by a vhost-user backend: socket=PATH. Repeat for more.
    #[arg(long = "vgpu")]
    vgpus: Vec<VgpuSpec>,
    /// Print the time from vmm start to the guest's first port I/O on stderr.
    #[arg(long)]
    timing: bool,
}

fn main() -> ExitCode {
    let started = Instant::now();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VMM_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = VmConfig {
        payload: args.payload,
        payload_arg: args.payload_arg,
        memory: args.memory,
        vcpus: args.vcpus,
        vgpus: args.vgpus,
    };
    match Vm::build(&config, started, args.timing).and_then(Vm::run) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("vmm: {e}");
            ExitCode::from(1)
        }
    }
}
