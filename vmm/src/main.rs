//! `vmm`: runs one VM. See `vmm --help`, docs/payload-abi.md and docs/linux-guests.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use vmm::{parse_size, CpuProfile, Guest, LinuxConfig, VgpuSpec, Vm, VmConfig, DEFAULT_CMDLINE};

/// Runs one KVM virtual machine with a payload guest or a Linux kernel, and its vGPU devices.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The no_std payload ELF to boot (see docs/payload-abi.md).
    #[arg(long, required_unless_present = "kernel", conflicts_with = "kernel")]
    payload: Option<PathBuf>,
    /// A string handed to the payload (at most 4096 bytes).
    #[arg(long, default_value = "")]
    payload_arg: String,
    /// A Linux kernel to boot instead of a payload: a bzImage or an uncompressed vmlinux
    /// (see docs/linux-guests.md).
    #[arg(long)]
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
    };
    match Vm::build(&config, started, args.timing).and_then(Vm::run) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("vmm: {e}");
            ExitCode::from(1)
        }
    }
}
