//! `vgpu-bench <name>`: the project's one benchmark entry point. Each benchmark prints
//! `name: value unit | anchor: value unit | ratio: x` per figure and writes the same as
//! JSON under `out/`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use vgpu_tests::bench::report;
use vgpu_tests::benches;

#[derive(Parser)]
#[command(about = "vgpu benchmarks: every figure beside its anchor, measured in the same run")]
struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// VMM start and vhost-user doorbell round trip vs one KVM exit.
    Vmm {
        /// VM starts to time.
        #[arg(long, default_value_t = 10)]
        runs: usize,
    },
    /// Guest copy throughput vs host memcpy, request round trip, batching.
    Device,
    /// BAND vs Credit vs FIFO, the grant path, HEFT vs round-robin mapping.
    Band {
        /// Seconds of virtual time per scenario.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Seconds of real time for the grant-path run.
        #[arg(long, default_value_t = 5)]
        real_seconds: u64,
    },
    /// Oversubscription (Gdev's overload case, scaled), swap throughput of both tiers,
    /// shm dataflow vs copies through the host, on the sim backend; with `--backend cuda`
    /// the shm dataflow on GPU 0 of this machine.
    Memory {
        /// `sim` or `cuda`.
        #[arg(long, default_value = "sim")]
        backend: String,
        /// Sim host-device copy bandwidth, GB/s.
        #[arg(long, default_value_t = 2.0)]
        copy_gbps: f64,
        /// Sim compute speed (1.0 = 1e9 element operations/s).
        #[arg(long, default_value_t = 0.5)]
        speed: f64,
    },
    /// Placement and rebalancing across GPUs: overload time, completion times
    /// and migrations for static placement, placement only and placement + rebalancing
    /// on 2 and 4 GPUs, and GPU-hours freed by consolidation under light load (in-process
    /// simulation with vgpud's policy; compared with DCUDA's figures).
    Rebalance,
    /// Live migration of a running vGPU between two sim GPUs: downtime and total time vs
    /// resident memory, precopy vs stop_copy vs a plain copy, and a timeline.
    Migration {
        /// Sim copy bandwidth of both GPUs (a GPU-to-GPU copy), GB/s; 0 = unpaced.
        #[arg(long, default_value_t = 25.0)]
        copy_gbps: f64,
        /// Sim compute speed (1.0 = 1e9 element operations/s).
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// Runs per point (the median is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Largest resident size, MiB (64, 256, 1024, 4096 are measured up to it).
        #[arg(long, default_value_t = 4096)]
        max_mib: u64,
    },
    /// Whole-VM migration between two sim vgpud daemons on this machine (unix sockets): a
    /// VM computing through its vGPU moves pre-copy and stop-and-copy; downtime, total time
    /// and bytes sent vs guest RAM and resident device memory, beside the plain transfer of
    /// the same bytes through a unix socket pair.
    HostMigration {
        /// Guest RAM sizes, MiB.
        #[arg(long, value_delimiter = ',', default_values_t = [256, 512, 1024, 2048])]
        ram_mib: Vec<u64>,
        /// Resident device memory of the vGPU, MiB.
        #[arg(long, value_delimiter = ',', default_values_t = [64, 256, 1024])]
        dev_mib: Vec<u64>,
        /// The downtime budget each move asks for, ms.
        #[arg(long, default_value_t = 50)]
        downtime_ms: u64,
    },
    /// N VMs sharing one GPU through vgpud (1 ms and 10 ms kernels): GPU busy beside N
    /// native threads (sim) or N native processes counting the same fixed-work rounds
    /// (cuda).
    Sharing {
        /// VM counts to measure.
        #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 8])]
        vms: Vec<usize>,
        /// `sim` or `cuda`.
        #[arg(long, default_value = "sim")]
        backend: String,
        /// vgpud's BAND hand-over margin, µs, 0 to 15000 [default: vgpud's own]; 0
        /// measures the hand-over at the first owed microsecond.
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..=15_000))]
        band_margin_us: Option<u64>,
    },
    /// Where the time between two kernels goes, from per-request timelines (workers run
    /// with `VGPU_TIMELINE=DIR`): medians and p99 of each stage and gap.
    Timeline {
        /// Timeline CSV files, or directories holding `timeline-*.csv`.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Starting VMs with a vGPU through vgpud (REST call to the payload's main), one at a
    /// time and many at once, vs the same VMs started by hand (vgpu-worker + vmm).
    Start {
        /// `sim` or `cuda`.
        #[arg(long, default_value = "sim")]
        backend: String,
        /// Single starts timed (the median is reported).
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// VMs launched at once.
        #[arg(long, default_value_t = 16)]
        concurrent: usize,
        /// Also measure through a vgpud with this many pool workers per GPU
        /// (`--worker-pool`), each start with the pool full; 0: only without a pool.
        #[arg(long, default_value_t = 0)]
        pool: usize,
    },
}

fn main() {
    let args = Args::parse();
    let (figures, name) = match args.bench {
        Bench::Vmm { runs } => (benches::vmm::run(runs), "vmm"),
        Bench::Device => (benches::device::run(), "device"),
        Bench::Band {
            seconds,
            real_seconds,
        } => (benches::band::run(seconds, real_seconds), "band"),
        Bench::Memory { backend, .. } if backend != "sim" && backend != "cuda" => {
            eprintln!("vgpu-bench memory: --backend is sim or cuda, not {backend:?}");
            std::process::exit(2);
        }
        Bench::Memory { backend, .. } if backend == "cuda" => {
            (benches::memory::run_cuda(), "memory-cuda")
        }
        Bench::Memory {
            copy_gbps, speed, ..
        } => (
            benches::memory::run(benches::memory::Params {
                copy_bandwidth: (copy_gbps * 1e9) as u64,
                speed,
            }),
            "memory",
        ),
        Bench::Rebalance => (benches::rebalance::run(), "rebalance"),
        Bench::Migration {
            copy_gbps,
            speed,
            reps,
            max_mib,
        } => (
            benches::migration::run(benches::migration::Params {
                copy_bandwidth: (copy_gbps * 1e9) as u64,
                speed,
                reps: reps.max(1),
                max_size: max_mib << 20,
            }),
            "migration",
        ),
        Bench::HostMigration {
            ram_mib,
            dev_mib,
            downtime_ms,
        } => (
            benches::host_migration::run(&benches::host_migration::Params {
                ram_mib,
                dev_mib,
                downtime_ms: downtime_ms.max(1),
            }),
            "host-migration",
        ),
        Bench::Sharing {
            vms,
            backend,
            band_margin_us,
        } => (
            benches::sharing::run(&vms, &backend, band_margin_us),
            "sharing",
        ),
        Bench::Timeline { paths } => {
            if let Err(e) = benches::timeline::run(&paths) {
                eprintln!("vgpu-bench: cannot read the timeline: {e}");
                std::process::exit(1);
            }
            return;
        }
        Bench::Start {
            backend,
            runs,
            concurrent,
            pool,
        } => (
            benches::start::run(&benches::start::Params {
                backend,
                runs: runs.max(1),
                concurrent: concurrent.max(1),
                pool,
            }),
            "start",
        ),
    };
    if let Err(e) = report(&figures, &PathBuf::from(format!("out/bench-{name}.json"))) {
        eprintln!("vgpu-bench: cannot write results: {e}");
        std::process::exit(1);
    }
}
