//! `vmm`: runs one VM. See `vmm --help`, docs/payload-abi.md and docs/linux-guests.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use vmm::migration::{dest, Address};
use vmm::{
    parse_size, Boot, CpuProfile, Guest, LinuxConfig, VgpuSpec, Vm, VmConfig, DEFAULT_CMDLINE,
};

/// Runs one KVM virtual machine with a payload guest or a Linux kernel, and its vGPU devices.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The no_std payload ELF to boot (see docs/payload-abi.md).
    #[arg(long, required_unless_present_any = ["kernel", "migrate_from"], conflicts_with_all = ["kernel", "migrate_from"])]
    payload: Option<PathBuf>,
    /// A string handed to the payload (at most 4096 bytes).
    #[arg(long, default_value = "")]
    payload_arg: String,
    /// A Linux kernel to boot instead of a payload: a bzImage or an uncompressed vmlinux
    /// (see docs/linux-guests.md).
    #[arg(long, conflicts_with = "migrate_from")]
    kernel: Option<PathBuf>,
    /// An initramfs for the Linux kernel.
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// The Linux command line (default: see docs/linux-guests.md); the vmm appends one
    /// virtio_mmio.device= per --vgpu.
    #[arg(long)]
    cmdline: Option<String>,
    /// CPUID the guest sees: host (KVM's supported set) or restricted (without the
    /// features a nested KVM cannot emulate in ring 0: cmpxchg16b, xsave, AVX*, ...).
    #[arg(long, value_enum, default_value_t = CpuProfile::Host)]
    cpu_profile: CpuProfile,
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
    /// The control API's unix socket (pause, resume, migrate, status; docs/migration.md).
    #[arg(long)]
    api_socket: Option<PathBuf>,
    /// Wait on unix:PATH or tcp:HOST:PORT for a VM migrating in, instead of booting one;
    /// its memory, vCPUs and CPU profile come from the source. Give one --vgpu per vGPU
    /// the VM has.
    #[arg(long)]
    migrate_from: Option<Address>,
    /// With --migrate-from: a file holding the one-time token the source must present.
    #[arg(long, requires = "migrate_from")]
    migrate_token_file: Option<PathBuf>,
}

/// Receives a VM on `addr` and runs it.
fn run_incoming(
    addr: &Address,
    vgpus: Vec<VgpuSpec>,
    api_socket: Option<PathBuf>,
    token_file: Option<PathBuf>,
    started: Instant,
    timing: bool,
) -> Result<i32, String> {
    let token = match &token_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read the migration token {}: {e}", f.display()))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let (mut stream, desc) = dest::accept(addr, token.as_deref()).map_err(|e| e.to_string())?;
    let cpu_profile = CpuProfile::from_name(&desc.cpu_profile).ok_or_else(|| {
        dest::fail(
            &mut stream,
            vmm::migration::MigrationError::Incompatible(format!(
                "unknown CPU profile {:?}",
                desc.cpu_profile
            )),
        )
        .to_string()
    })?;
    if desc.vgpus != vgpus.len() {
        let e = vmm::migration::MigrationError::Incompatible(format!(
            "the VM has {} vGPUs; this vmm was given {} --vgpu",
            desc.vgpus,
            vgpus.len()
        ));
        return Err(dest::fail(&mut stream, e).to_string());
    }
    let config = VmConfig {
        guest: Guest::Payload {
            path: PathBuf::new(),
            arg: String::new(),
        },
        memory: desc.memory,
        vcpus: desc.vcpus,
        vgpus,
        cpu_profile,
        api_socket,
    };
    let mut vm = match Vm::assemble(&config, started, timing, Boot::Incoming(&desc)) {
        Ok(vm) => vm,
        Err(e) => {
            let e = vmm::migration::MigrationError::Incompatible(e.to_string());
            return Err(dest::fail(&mut stream, e).to_string());
        }
    };
    dest::receive(&mut stream, &mut vm).map_err(|e| format!("incoming migration failed: {e}"))?;
    drop(stream);
    tracing::info!("incoming VM restored; running it");
    vm.run().map_err(|e| e.to_string())
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
    if let Some(addr) = &args.migrate_from {
        return match run_incoming(
            addr,
            args.vgpus,
            args.api_socket,
            args.migrate_token_file,
            started,
            args.timing,
        ) {
            Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => {
                eprintln!("vmm: {e}");
                ExitCode::from(1)
            }
        };
    }
    if args.kernel.is_none() && (args.initrd.is_some() || args.cmdline.is_some()) {
        eprintln!("vmm: --initrd and --cmdline go with --kernel");
        return ExitCode::from(2);
    }
    let guest = match (args.payload, args.kernel) {
        (_, Some(kernel)) => Guest::Linux(LinuxConfig {
            kernel,
            initrd: args.initrd,
            cmdline: args.cmdline.unwrap_or_else(|| DEFAULT_CMDLINE.into()),
        }),
        (Some(path), None) => Guest::Payload {
            path,
            arg: args.payload_arg,
        },
        // clap requires one of them.
        (None, None) => {
            eprintln!("vmm: give --payload or --kernel");
            return ExitCode::from(2);
        }
    };
    let config = VmConfig {
        guest,
        memory: args.memory,
        vcpus: args.vcpus,
        vgpus: args.vgpus,
        cpu_profile: args.cpu_profile,
        api_socket: args.api_socket,
    };
    match Vm::build(&config, started, args.timing).and_then(Vm::run) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("vmm: {e}");
            ExitCode::from(1)
        }
    }
}
