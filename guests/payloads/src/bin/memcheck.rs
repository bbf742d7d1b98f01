//! Device memory integrity under oversubscription: allocates more than the GPU can hold
//! (when other vGPUs do the same), and checks every byte across many evictions.
//!
//! `buffers` allocations of `size_mib` MiB each are filled with a pattern unique to
//! (seed, buffer, version). Each round visits every buffer: reads it back with
//! device-to-host copies (a swapped-out buffer is read where it is), has the device
//! checksum it with the built-in `checksum` kernel (a launch brings it back), compares
//! both with the pattern, then writes the next version of the pattern. The last line is
//! `MEMCHECK OK buffers=<k> rounds=<r> bytes=<checked> checksum=0x...` and exit 0;
//! otherwise a diagnostic and 2 bad argument, 3 no vGPU, 4 driver/device error,
//! 6 mismatch.
//!
//! Arguments: `buffers=<k>` (default 4), `size_mib=<m>` (default 8), `rounds=<r>`
//! (default 3), `seed=<s>` (default 1), `pause_ms=<ms>` between rounds (default 0),
//! `keep=1` (default 0): every read-back lands in its own guest pages, all allocated and
//! zeroed before the first round, kept, and compared again after the last round (pages
//! only the device writes once the run is going: a whole-VM move that lost one of them
//! shows here; the last line then also says `kept=<bytes>`).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::{Access, KernelArg};
use guest_driver::Error;
use payload_rt::vgpu::{open_single, GpuStream};
use payload_rt::{println, Args, BootInfo};

payload_rt::entry!(main);

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_MISMATCH: u8 = 6;

/// Bytes moved per copy.
const CHUNK: usize = 1 << 20;

struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("memcheck: FAIL {what}");
    Failure(code)
}

fn driver(what: &'static str) -> impl Fn(Error) -> Failure {
    move |e| fail(EXIT_DRIVER, format_args!("{what}: {e}"))
}

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    match run(boot, Args::new(args)) {
        Ok(()) => 0,
        Err(Failure(code)) => code,
    }
}

/// 8 pattern bytes for word `w` of buffer `b`, version `v`.
fn word(seed: u64, b: u64, v: u64, w: u64) -> u64 {
    let mut x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b << 48)
        .wrapping_add(v << 32)
        .wrapping_add(w);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The pattern bytes `[off, off + out.len())` of buffer `b`, version `v`.
fn pattern(seed: u64, b: u64, v: u64, off: usize, out: &mut [u8]) {
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let w = word(seed, b, v, (off / 8 + i) as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h = (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME);
    }
    h
}

fn run(boot: &BootInfo, args: Args) -> Result<(), Failure> {
    let num = |key, default| {
        args.number(key, default)
            .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))
    };
    let buffers = num("buffers", 4)?;
    let size_mib = num("size_mib", 8)?;
    let rounds = num("rounds", 3)?;
    let seed = num("seed", 1)?;
    let pause_ms = num("pause_ms", 0)?;
    let keep = num("keep", 0)? != 0;
    if buffers == 0 || buffers > 64 || size_mib == 0 || size_mib > 4096 {
        return Err(fail(
            EXIT_BAD_ARGS,
            format_args!("buffers must be 1..=64 and size_mib 1..=4096"),
        ));
    }
    let size = (size_mib << 20) as usize;
    let (_gpu, mut s) = open_single(boot).map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    let info = s.get_info().map_err(driver("GET_INFO"))?;
    println!(
        "memcheck: vGPU {} share {} MiB: {buffers} buffers of {size_mib} MiB, {rounds} rounds",
        info.vgpu_id,
        info.memory_share >> 20
    );
    let module = s.load_builtin().map_err(driver("MODULE_LOAD builtin"))?;
    let checksum = s
        .get_function(module, "checksum")
        .map_err(driver("GET_FUNCTION checksum"))?;
    let dsum = s.alloc(8).map_err(driver("ALLOC sum"))?;
    let mut bufs = Vec::new();
    for _ in 0..buffers {
        bufs.push(s.alloc(size as u64).map_err(driver("ALLOC buffer"))?);
    }
    // One scratch buffer for the whole run (the payload heap never frees).
    let mut want = vec![0u8; CHUNK];
    let mut got = vec![0u8; CHUNK];
    let mut sum = vec![0u8; 8];
    let write = |s: &mut GpuStream, want: &mut [u8], b: usize, v: u64| {
        let mut off = 0;
        while off < size {
            let n = CHUNK.min(size - off);
            pattern(seed, b as u64, v, off, &mut want[..n]);
            s.memcpy_htod(bufs[b] + off as u64, &want[..n])
                .map_err(driver("MEMCPY_HTOD"))?;
            off += n;
        }
        Ok::<_, Failure>(())
    };
    for b in 0..bufs.len() {
        write(&mut s, &mut want, b, 0)?;
    }
    let mut checked = 0u64;
    let mut last = 0u64;
    // With `keep`: (buffer, version, the bytes read back) of every read-back, allocated
    // now so that from here on only the device's copies write them.
    let mut kept: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    if keep {
        for r in 0..rounds {
            for b in 0..bufs.len() {
                kept.push((b as u64, r, vec![0u8; size]));
            }
        }
    }
    for r in 0..rounds {
        for (b, dbuf) in bufs.iter().enumerate() {
            let slot = usize::try_from(r).unwrap_or(usize::MAX) * bufs.len() + b;
            // Read back where the bytes are.
            let mut h = FNV_OFFSET;
            let mut off = 0;
            while off < size {
                let n = CHUNK.min(size - off);
                let got = match kept.get_mut(slot) {
                    Some((_, _, k)) => &mut k[off..off + n],
                    None => &mut got[..n],
                };
                s.memcpy_dtoh(got, dbuf + off as u64)
                    .map_err(driver("MEMCPY_DTOH"))?;
                pattern(seed, b as u64, r, off, &mut want[..n]);
                if got[..] != want[..n] {
                    let at = (0..n).find(|i| got[*i] != want[*i]).unwrap_or(0);
                    return Err(fail(
                        EXIT_MISMATCH,
                        format_args!(
                            "round {r} buffer {b} byte {}: read {:#04x}, want {:#04x}",
                            off + at,
                            got[at],
                            want[at]
                        ),
                    ));
                }
                h = fnv(h, &want[..n]);
                off += n;
            }
            // The device's own view (a launch restores the buffer).
            s.launch(
                &launch_1d(checksum.handle, 1, 1),
                &[
                    KernelArg::ptr(*dbuf, Access::Read),
                    KernelArg::u64(size as u64),
                    KernelArg::ptr(dsum, Access::Write),
                ],
            )
            .map_err(driver("LAUNCH checksum"))?;
            s.memcpy_dtoh(&mut sum, dsum)
                .map_err(driver("MEMCPY_DTOH sum"))?;
            let dev = u64::from_le_bytes([
                sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7],
            ]);
            if dev != h {
                return Err(fail(
                    EXIT_MISMATCH,
                    format_args!(
                        "round {r} buffer {b}: device checksum {dev:#018x}, want {h:#018x}"
                    ),
                ));
            }
            last = h;
            checked += size as u64;
            write(&mut s, &mut want, b, r + 1)?;
        }
        println!("memcheck: round {}/{rounds} ok", r + 1);
        for _ in 0..pause_ms {
            payload_rt::exit::idle_us(1000);
        }
    }
    for d in bufs.iter().chain([dsum].iter()) {
        s.free(*d).map_err(driver("FREE"))?;
    }
    if keep {
        for (b, v, bytes) in &kept {
            for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
                let off = i * CHUNK;
                pattern(seed, *b, *v, off, &mut want[..chunk.len()]);
                if let Some(at) = (0..chunk.len()).find(|j| chunk[*j] != want[*j]) {
                    return Err(fail(
                        EXIT_MISMATCH,
                        format_args!(
                            "kept read-back of buffer {b} version {v}, byte {}: {:#04x}, want {:#04x}",
                            off + at,
                            chunk[at],
                            want[at]
                        ),
                    ));
                }
            }
        }
        let bytes = kept.len() as u64 * size as u64;
        println!(
            "MEMCHECK OK buffers={buffers} rounds={rounds} bytes={checked} checksum={last:#018x} kept={bytes}"
        );
        return Ok(());
    }
    println!("MEMCHECK OK buffers={buffers} rounds={rounds} bytes={checked} checksum={last:#018x}");
    Ok(())
}
