//! The migrated vGPU: its contents, their checks, and the guest that runs on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vgpu_backend::{Access, ArgValue, Backend, LaunchOne, ModuleImage};
use vgpu_migration::Migratable;
use vm_memory::VolatileSlice;

use super::super::shared::{ptr, ONE_THREAD};
use super::tap::Tap;
use super::{Params, CHUNK, HOT_N, MIB, PIECES, WINDOW};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Word `i` of the big buffer with `seed` (splitmix64).
fn word(seed: u64, i: u64) -> u64 {
    let mut z = ((seed << 40) ^ i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pattern bytes of words `first..` into `buf`.
fn pattern_into(seed: u64, first: u64, buf: &mut [u8]) {
    for (k, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(seed, first + k as u64).to_le_bytes());
    }
}

fn x_at(i: u64) -> f32 {
    (i % 7) as f32
}

/// y after `k` launches of `y += 1.0 * x` (integers below 2^24: exact in f32).
fn y_at(i: u64, k: u64) -> f32 {
    ((i % 5) + k * (i % 7)) as f32
}

fn f32_bytes(n: u64, f: impl Fn(u64) -> f32) -> Vec<u8> {
    (0..n).flat_map(|i| f(i).to_le_bytes()).collect()
}

fn put(b: &dyn Backend, addr: u64, bytes: &mut [u8]) -> Result<(), String> {
    b.copy_htod(addr, &VolatileSlice::from(bytes))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn get(b: &dyn Backend, addr: u64, bytes: &mut [u8]) -> Result<(), String> {
    b.copy_dtoh(addr, &VolatileSlice::from(bytes))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Calls `f(offset, length)` for each piece of at most [`CHUNK`] of `size` bytes, in order.
fn chunks(size: u64, mut f: impl FnMut(u64, usize) -> Result<(), String>) -> Result<(), String> {
    let mut off = 0;
    while off < size {
        let n = CHUNK.min(size - off) as usize;
        f(off, n)?;
        off += n as u64;
    }
    Ok(())
}

/// A big buffer: address, size, pattern seed.
#[derive(Clone, Copy)]
pub(super) struct Big {
    addr: u64,
    size: u64,
    seed: u64,
}

/// The hot working set and the guest's functions.
#[derive(Clone, Copy)]
pub(super) struct Hot {
    x: u64,
    y: u64,
    out: u64,
    saxpy: u64,
    checksum: u64,
}

pub(super) struct Vgpu {
    pub(super) m: Arc<Migratable>,
    pub(super) big: Vec<Big>,
    pub(super) hot: Hot,
    /// `saxpy` launches so far (the shadow of y).
    pub(super) launches: u64,
}

impl Vgpu {
    pub(super) fn new(p: Params, size: u64) -> Result<Self, String> {
        let e = |e: vgpu_backend::BackendError| e.to_string();
        let src = Tap::new(p, size + 64 * MIB);
        let m = Arc::new(Migratable::new(src));
        let piece = size / PIECES;
        let mut buf = vec![0u8; CHUNK as usize];
        let mut big = Vec::new();
        for k in 0..PIECES {
            let b = Big {
                addr: m.alloc(piece).map_err(e)?.addr,
                size: piece,
                seed: k + 1,
            };
            chunks(piece, |off, n| {
                pattern_into(b.seed, off / 8, &mut buf[..n]);
                put(&*m, b.addr + off, &mut buf[..n])
            })?;
            big.push(b);
        }
        let module = m
            .modules()
            .module_load(ModuleImage::Builtin(b"builtin"))
            .map_err(e)?;
        let hot = Hot {
            x: m.alloc(HOT_N * 4).map_err(e)?.addr,
            y: m.alloc(HOT_N * 4).map_err(e)?.addr,
            out: m.alloc(8).map_err(e)?.addr,
            saxpy: m
                .modules()
                .get_function(module, b"saxpy")
                .map_err(e)?
                .handle,
            checksum: m
                .modules()
                .get_function(module, b"checksum")
                .map_err(e)?
                .handle,
        };
        put(&*m, hot.x, &mut f32_bytes(HOT_N, x_at))?;
        put(&*m, hot.y, &mut f32_bytes(HOT_N, |i| y_at(i, 0)))?;
        Ok(Self {
            m,
            big,
            hot,
            launches: 0,
        })
    }

    /// Every allocation: (address, size).
    pub(super) fn allocs(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.big.iter().map(|b| (b.addr, b.size)).collect();
        v.extend([
            (self.hot.x, HOT_N * 4),
            (self.hot.y, HOT_N * 4),
            (self.hot.out, 8),
        ]);
        v
    }

    pub(super) fn bytes(&self) -> u64 {
        self.allocs().iter().map(|a| a.1).sum()
    }

    /// Checks every byte: big buffers against their pattern, x unchanged, y against the
    /// shadow of `launches` saxpys.
    pub(super) fn verify(&self, what: &str) -> Result<(), String> {
        let mut got = vec![0u8; CHUNK as usize];
        let mut want = vec![0u8; CHUNK as usize];
        for (k, b) in self.big.iter().enumerate() {
            chunks(b.size, |off, n| {
                get(&*self.m, b.addr + off, &mut got[..n])?;
                pattern_into(b.seed, off / 8, &mut want[..n]);
                if got[..n] == want[..n] {
                    return Ok(());
                }
                let i = got[..n]
                    .iter()
                    .zip(&want[..n])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                Err(format!(
                    "{what}: big buffer {k} ({:#x}) byte {} is {:#04x}, want {:#04x}",
                    b.addr,
                    off + i as u64,
                    got[i],
                    want[i]
                ))
            })?;
        }
        let mut v = vec![0u8; (HOT_N * 4) as usize];
        for (name, addr, f) in [
            ("x", self.hot.x, &x_at as &dyn Fn(u64) -> f32),
            ("y", self.hot.y, &|i| y_at(i, self.launches)),
        ] {
            get(&*self.m, addr, &mut v)?;
            for (i, c) in v.chunks_exact(4).enumerate() {
                let g = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let w = f(i as u64);
                if g.to_bits() != w.to_bits() {
                    return Err(format!(
                        "{what}: {name}[{i}] = {g}, want {w} after {} saxpy launches",
                        self.launches
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The guest: saxpy on the hot buffers, then a checksum of a window of a big buffer
/// (checked), until `stop`. Returns the saxpy launches and when each iteration ended.
pub(super) fn guest(
    m: &Migratable,
    hot: Hot,
    big: &[Big],
    stop: &AtomicBool,
) -> Result<(u64, Vec<Instant>), String> {
    let e = |e: vgpu_backend::BackendError| e.to_string();
    let mut launches = 0;
    let mut ends = Vec::new();
    let mut window = vec![0u8; WINDOW as usize];
    let mut it = 0u64;
    while !stop.load(Ordering::Relaxed) {
        m.launch_one(
            hot.saxpy,
            &ONE_THREAD,
            &[
                ArgValue::F32(1.0),
                ptr(hot.x, Access::Read),
                ptr(hot.y, Access::ReadWrite),
                ArgValue::U64(HOT_N),
            ],
        )
        .map_err(e)?;
        launches += 1;
        let b = big[(it % big.len() as u64) as usize];
        let off = it.wrapping_mul(7919).wrapping_mul(WINDOW) % (b.size - WINDOW) / 8 * 8;
        m.launch_one(
            hot.checksum,
            &ONE_THREAD,
            &[
                ptr(b.addr + off, Access::Read),
                ArgValue::U64(WINDOW),
                ptr(hot.out, Access::Write),
            ],
        )
        .map_err(e)?;
        let mut h = [0u8; 8];
        get(m, hot.out, &mut h)?;
        pattern_into(b.seed, off / 8, &mut window);
        let want = window.iter().fold(FNV_OFFSET, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME)
        });
        if u64::from_le_bytes(h) != want {
            return Err(format!(
                "guest: checksum of {:#x}+{off:#x} read {:#x}, want {want:#x}",
                b.addr,
                u64::from_le_bytes(h)
            ));
        }
        ends.push(Instant::now());
        it += 1;
    }
    Ok((launches, ends))
}
