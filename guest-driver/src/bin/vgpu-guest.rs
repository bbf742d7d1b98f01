//! `vgpu-guest`: the vGPU from a Linux guest's userspace, through the guest-driver Linux
//! transport (docs/linux-guests.md). One static binary:
//! `cargo build --release -p guest-driver --features std --bin vgpu-guest --target x86_64-unknown-linux-musl`.
//!
//! ```text
//! vgpu-guest [OPTIONS] info       device, config space and GET_INFO
//! vgpu-guest [OPTIONS] memory     the vGPU's memory share and use, DMA memory
//! vgpu-guest [OPTIONS] selftest   vector_add checked, then a copy benchmark
//!
//! --regs ADDR        register window (default: first virtio_mmio.device= of /proc/cmdline)
//! --uio PATH         registers from map 0 of a UIO device instead
//! --hugepages N      DMA memory: N 2 MiB hugepages (default 4)
//! --reserved PHYS:LEN  DMA memory: a memmap= region instead (e.g. 0x10000000:64M)
//! --n ELEMENTS       vector_add size (default 65536)
//! --copy BYTES       copy benchmark buffer (default 1M), --iters N (default 16)
//! --mem PATH, --pagemap PATH, --cmdline PATH   the files (for tests and odd systems)
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use guest_driver::linux::HUGEPAGE_SIZE;
use guest_driver::linux::{parse_u64, selftest, DmaSource, LinuxTransport, Paths, Registers};

struct Options {
    command: String,
    paths: Paths,
    regs: Option<Registers>,
    dma: DmaSource,
    n: usize,
    copy: usize,
    iters: u32,
}

fn size(s: &str) -> Option<u64> {
    let (digits, shift) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 10),
        (i, 'M' | 'm') => (&s[..i], 20),
        (i, 'G' | 'g') => (&s[..i], 30),
        _ => (s, 0),
    };
    parse_u64(digits)?.checked_mul(1 << shift)
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        command: String::new(),
        paths: Paths::default(),
        regs: None,
        dma: DmaSource::Hugepages { count: 4 },
        n: 65536,
        copy: 1 << 20,
        iters: 16,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let bad = |name: &str, v: &str| format!("{name}: cannot parse {v:?}");
        match a.as_str() {
            "--regs" => {
                let v = value(a)?;
                let base = parse_u64(&v).ok_or_else(|| bad(a, &v))?;
                o.regs = Some(Registers::DevMem { base });
            }
            "--uio" => {
                o.regs = Some(Registers::Uio {
                    path: PathBuf::from(value(a)?),
                })
            }
            "--hugepages" => {
                let v = value(a)?;
                let count = v.parse().map_err(|_| bad(a, &v))?;
                o.dma = DmaSource::Hugepages { count };
            }
            "--reserved" => {
                let v = value(a)?;
                let (p, l) = v.split_once(':').ok_or_else(|| bad(a, &v))?;
                let phys = parse_u64(p).ok_or_else(|| bad(a, &v))?;
                let len = size(l)
                    .and_then(|l| usize::try_from(l).ok())
                    .ok_or_else(|| bad(a, &v))?;
                o.dma = DmaSource::Reserved { phys, len };
            }
            "--n" => {
                let v = value(a)?;
                o.n = v.parse().map_err(|_| bad(a, &v))?;
            }
            "--copy" => {
                let v = value(a)?;
                o.copy = size(&v)
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| bad(a, &v))?;
            }
            "--iters" => {
                let v = value(a)?;
                o.iters = v.parse().map_err(|_| bad(a, &v))?;
            }
            "--mem" => o.paths.mem = value(a)?.into(),
            "--pagemap" => o.paths.pagemap = value(a)?.into(),
            "--cmdline" => o.paths.cmdline = value(a)?.into(),
            "-h" | "--help" => o.command = "help".into(),
            c if !c.starts_with('-') && o.command.is_empty() => o.command = c.into(),
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if o.n == 0 || o.copy == 0 || o.iters == 0 {
        return Err("--n, --copy and --iters must be at least 1".into());
    }
    Ok(o)
}

fn usage() {
    let doc = include_str!("vgpu-guest.rs");
    for line in doc.lines().take_while(|l| l.starts_with("//!")) {
        println!("{}", line.trim_start_matches("//!").trim_start());
    }
}

fn open(o: &Options) -> Result<LinuxTransport, String> {
    let regs = match &o.regs {
        Some(r) => r.clone(),
        None => Registers::DevMem {
            base: LinuxTransport::first_device(&o.paths)
                .map_err(|e| e.to_string())?
                .base,
        },
    };
    LinuxTransport::open(&o.paths, &regs, &o.dma).map_err(|e| e.to_string())
}

fn run(o: &Options) -> Result<(), String> {
    let t = open(o)?;
    let (gpu, mut s) = selftest::open(t.clone()).map_err(|e| format!("vGPU: {e}"))?;
    match o.command.as_str() {
        "info" => {
            let c = gpu.config();
            println!(
                "vgpu-guest: config: vGPU {} version {:#x} queues {} memory share {} MiB compute {} copy {}",
                c.vgpu_id,
                c.version,
                c.num_queues,
                c.memory_share >> 20,
                c.compute_share,
                c.copy_share
            );
            let i = s.get_info().map_err(|e| format!("GET_INFO: {e}"))?;
            println!(
                "vgpu-guest: device: '{}' backend {} features {:#x} va {:#x}+{:#x}",
                i.name_str(),
                i.backend,
                i.features,
                i.va_base,
                i.va_size
            );
        }
        "memory" => {
            let i = s.get_info().map_err(|e| format!("GET_INFO: {e}"))?;
            println!(
                "vgpu-guest: memory: share {} MiB, used {} MiB; DMA memory free {} KiB",
                i.memory_share >> 20,
                i.memory_used >> 20,
                t.dma_free_bytes() >> 10
            );
        }
        "selftest" => {
            let need = 12 * o.n + o.copy + (1 << 20);
            if let DmaSource::Hugepages { count } = o.dma {
                if count * HUGEPAGE_SIZE < need {
                    return Err(format!(
                        "the self-test needs about {} KiB of DMA memory: give more --hugepages",
                        need >> 10
                    ));
                }
            }
            let r = selftest::run(&mut s, &t, o.n, o.copy, o.iters)?;
            println!(
                "vgpu-guest: vector_add {} elements ok, device time {} ns",
                r.vecadd_elements, r.vecadd_device_ns
            );
            println!(
                "BENCH linux_guest_htod_bandwidth {:.1} MB/s\nBENCH linux_guest_dtoh_bandwidth {:.1} MB/s",
                r.htod_mb_s, r.dtoh_mb_s
            );
            println!("SELFTEST OK");
        }
        other => {
            return Err(format!(
                "unknown command {other:?} (info, memory, selftest)"
            ))
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vgpu-guest: {e}");
            return ExitCode::from(2);
        }
    };
    if o.command.is_empty() || o.command == "help" {
        usage();
        return ExitCode::from(u8::from(o.command.is_empty()) * 2);
    }
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-guest: {e}");
            ExitCode::from(1)
        }
    }
}
