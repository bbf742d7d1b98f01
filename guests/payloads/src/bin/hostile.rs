//! A guest that gets everything wrong on purpose: malformed headers, bad lengths, foreign
//! and wrapping addresses, wrong chain shapes, bad device pointers, bad kernel arguments,
//! a faulting kernel. Every request must get the error status docs/protocol.md names (or
//! no response, where the protocol says so), and the queue must keep working after each:
//! a valid request follows every case. At the end the device must still compute right
//! and hold no memory of ours.
//!
//! Prints one `hostile: <case>: <outcome>` line per case and `HOSTILE OK`, exit 0;
//! a diagnostic and a non-zero code at the first deviation.
//!
//! `mode=<name>` runs one of the bounds modes instead (`hostile/bounds.rs`: a shm flood,
//! its neighbour, writes into a read-only mapping, full event and module tables).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::{
    self, features, Access, KernelArg, LaunchArgs, Opcode, RequestHeader, Response, Status,
};
use guest_driver::{Buffer, Error};
use payload_rt::vgpu::{open_single, GpuStream};
use payload_rt::{println, Args, BootInfo};

#[path = "hostile/bounds.rs"]
mod bounds;

payload_rt::entry!(main);

const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_WRONG_ANSWER: u8 = 8;
const EXIT_QUEUE_BROKEN: u8 = 9;

const BUF: u64 = 64 * 1024;

struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("hostile: FAIL {what}");
    Failure(code)
}

fn driver(what: &'static str) -> impl Fn(Error) -> Failure {
    move |e| fail(EXIT_DRIVER, format_args!("{what}: {e}"))
}

/// What a case must produce.
#[derive(Clone, Copy)]
enum Expect {
    Is(Status),
    /// The chain comes back with this used length (raw chains).
    Used(u32),
}

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    let args = Args::new(args);
    if let Some(mode) = args.value("mode") {
        return match bounds::run(boot, mode, &args) {
            Ok(()) => 0,
            Err(Failure(code)) => code,
        };
    }
    match run(boot) {
        Ok(n) => {
            println!("hostile: {n} cases answered as specified");
            println!("HOSTILE OK");
            0
        }
        Err(Failure(code)) => code,
    }
}

/// Runs one case and checks the queue still serves a valid request afterwards.
fn case(
    s: &mut GpuStream,
    count: &mut u32,
    name: &str,
    expect: Expect,
    f: impl FnOnce(&mut GpuStream) -> Result<[u64; 4], Error>,
) -> Result<(), Failure> {
    let got = f(s);
    let ok = match (expect, got) {
        (Expect::Is(want), Err(Error::Device { status, .. })) => status == want,
        (Expect::Used(want), Ok(r)) => r[0] == u64::from(want),
        _ => false,
    };
    if !ok {
        return Err(fail(
            EXIT_WRONG_ANSWER,
            format_args!("{name}: got {}", Outcome(got)),
        ));
    }
    s.stream_sync().map_err(|e| {
        fail(
            EXIT_QUEUE_BROKEN,
            format_args!("queue stopped working after {name}: {e}"),
        )
    })?;
    *count += 1;
    println!("hostile: {name}: {}", Outcome(got));
    Ok(())
}

struct Outcome(Result<[u64; 4], Error>);

impl core::fmt::Display for Outcome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match &self.0 {
            Ok(r) => write!(f, "ok [{:#x}, {:#x}, {:#x}, {:#x}]", r[0], r[1], r[2], r[3]),
            Err(Error::Device { status, .. }) => write!(f, "{status}"),
            Err(e) => write!(f, "{e}"),
        }
    }
}

/// A request with a hand-made header (opcode, flags, argument bytes) and data buffers.
fn custom(
    s: &mut GpuStream,
    opcode: u32,
    flags: u32,
    args: &[u8],
    data: &[Buffer],
) -> Result<[u64; 4], Error> {
    let encode = |id: u64, out: &mut [u8]| {
        let h = RequestHeader { opcode, flags, id }.to_bytes();
        let end = h.len() + args.len();
        let dst = out.get_mut(..end)?;
        dst[..h.len()].copy_from_slice(&h);
        dst[h.len()..].copy_from_slice(args);
        Some(end)
    };
    // SAFETY: every data buffer the cases pass either lies outside guest RAM (the device
    // must refuse it) or is a live heap buffer of the caller that outlives this wait.
    let t = unsafe { s.enqueue_encoded(opcode, encode, data)? };
    s.submit();
    s.wait(t)
}

/// A caller-built chain, as is.
fn raw(s: &mut GpuStream, chain: &[Buffer]) -> Result<[u64; 4], Error> {
    // SAFETY: the chains point at heap buffers of the caller that outlive this wait.
    let t = unsafe { s.enqueue_raw_chain(chain)? };
    s.submit();
    s.wait(t)
}

fn launch(s: &mut GpuStream, l: &LaunchArgs, args: &[KernelArg]) -> Result<[u64; 4], Error> {
    let t = s.enqueue_launch(l, args, &[])?;
    s.submit();
    s.wait(t)
}

fn u64s(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn addr(b: &[u8]) -> u64 {
    b.as_ptr() as u64
}

fn run(boot: &BootInfo) -> Result<u32, Failure> {
    let (_gpu, mut s) = open_single(boot).map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    let info = s.get_info().map_err(driver("GET_INFO"))?;
    let baseline_used = info.memory_used;
    let buf = s.alloc(BUF).map_err(driver("ALLOC"))?;
    let module = s.load_builtin().map_err(driver("MODULE_LOAD"))?;
    let fun = |s: &mut GpuStream, name| s.get_function(module, name).map(|f| f.handle);
    let vector_add = fun(&mut s, "vector_add").map_err(driver("GET_FUNCTION"))?;
    let gather = fun(&mut s, "gather").map_err(driver("GET_FUNCTION"))?;
    let spin = fun(&mut s, "spin").map_err(driver("GET_FUNCTION"))?;

    let mut n = 0u32;
    let c = &mut n;
    let host = vec![0x5au8; 4096];
    let mut sink = vec![0u8; 4096];
    use Expect::*;

    // Headers.
    case(
        &mut s,
        c,
        "unknown opcode",
        Is(Status::UnknownOpcode),
        |s| custom(s, 0xdead, 0, &[], &[]),
    )?;
    case(
        &mut s,
        c,
        "header flags set",
        Is(Status::InvalidArgument),
        |s| custom(s, Opcode::StreamSync as u32, 1, &[], &[]),
    )?;
    case(&mut s, c, "8-byte header", Is(Status::BadLength), |s| {
        // SAFETY: no data buffers.
        let t = unsafe { s.enqueue_encoded(0, |_, _| Some(8), &[])? };
        s.submit();
        s.wait(t)
    })?;
    case(
        &mut s,
        c,
        "ALLOC with half its arguments",
        Is(Status::BadLength),
        |s| custom(s, Opcode::Alloc as u32, 0, &u64s(&[4096]), &[]),
    )?;

    // Memory management.
    case(
        &mut s,
        c,
        "ALLOC 0 bytes",
        Is(Status::InvalidArgument),
        |s| s.alloc(0).map(|a| [a, 0, 0, 0]),
    )?;
    case(
        &mut s,
        c,
        "ALLOC with flags",
        Is(Status::InvalidArgument),
        |s| custom(s, Opcode::Alloc as u32, 0, &u64s(&[4096, 1]), &[]),
    )?;
    case(
        &mut s,
        c,
        "ALLOC beyond the share",
        Is(Status::OutOfMemory),
        |s| s.alloc(1 << 50).map(|a| [a, 0, 0, 0]),
    )?;
    case(
        &mut s,
        c,
        "FREE of a never-allocated address",
        Is(Status::BadDevicePointer),
        |s| s.free(0x1234_5000).map(|_| [0; 4]),
    )?;
    case(
        &mut s,
        c,
        "FREE of an interior pointer",
        Is(Status::BadDevicePointer),
        |s| s.free(buf + 4096).map(|_| [0; 4]),
    )?;
    case(&mut s, c, "FREE twice", Is(Status::BadDevicePointer), |s| {
        let a = s.alloc(4096)?;
        s.free(a)?;
        s.free(a).map(|_| [0; 4])
    })?;

    // Copies: device side.
    case(
        &mut s,
        c,
        "HTOD across the allocation's end",
        Is(Status::BadDevicePointer),
        |s| s.memcpy_htod(buf + BUF - 8, &host[..16]).map(|_| [0; 4]),
    )?;
    case(
        &mut s,
        c,
        "HTOD to device address 0",
        Is(Status::BadDevicePointer),
        |s| s.memcpy_htod(0, &host[..16]).map(|_| [0; 4]),
    )?;
    case(
        &mut s,
        c,
        "DTOH from past the allocation",
        Is(Status::BadDevicePointer),
        |s| s.memcpy_dtoh(&mut sink[..64], buf + BUF).map(|_| [0; 4]),
    )?;
    case(
        &mut s,
        c,
        "DTOD with a wrapping size",
        Is(Status::BadDevicePointer),
        |s| s.memcpy_dtod(buf, buf + 8, u64::MAX - 4).map(|_| [0; 4]),
    )?;
    case(
        &mut s,
        c,
        "MEMSET element size 3",
        Is(Status::InvalidArgument),
        |s| s.memset(buf, 0, 16, 3).map(|_| [0; 4]),
    )?;
    case(
        &mut s,
        c,
        "MEMSET misaligned for its element",
        Is(Status::BadDevicePointer),
        |s| s.memset(buf + 1, 0, 16, 4).map(|_| [0; 4]),
    )?;

    // Copies: guest side (descriptors).
    case(
        &mut s,
        c,
        "HTOD data shorter than its size",
        Is(Status::BadLength),
        |s| {
            custom(
                s,
                Opcode::MemcpyHtoD as u32,
                0,
                &u64s(&[buf, 100]),
                &[Buffer::readable(addr(&host), 50)],
            )
        },
    )?;
    case(
        &mut s,
        c,
        "HTOD from outside guest RAM",
        Is(Status::BadDescriptor),
        |s| {
            custom(
                s,
                Opcode::MemcpyHtoD as u32,
                0,
                &u64s(&[buf, 64]),
                &[Buffer::readable(0x7000_0000_0000, 64)],
            )
        },
    )?;
    case(
        &mut s,
        c,
        "HTOD from a wrapping guest range",
        Is(Status::BadDescriptor),
        |s| {
            custom(
                s,
                Opcode::MemcpyHtoD as u32,
                0,
                &u64s(&[buf, 64]),
                &[Buffer::readable(u64::MAX - 16, 64)],
            )
        },
    )?;
    case(
        &mut s,
        c,
        "DTOH into a device-readable buffer",
        Is(Status::BadDescriptor),
        |s| {
            custom(
                s,
                Opcode::MemcpyDtoH as u32,
                0,
                &u64s(&[buf, 64]),
                &[Buffer::readable(addr(&host), 64)],
            )
        },
    )?;
    case(
        &mut s,
        c,
        "STREAM_SYNC with a data descriptor",
        Is(Status::BadDescriptor),
        |s| {
            custom(
                s,
                Opcode::StreamSync as u32,
                0,
                &[],
                &[Buffer::readable(addr(&host), 64)],
            )
        },
    )?;

    // Chain shapes (raw chains: no response added by the driver).
    let hdr = RequestHeader {
        opcode: Opcode::StreamSync as u32,
        flags: 0,
        id: 77,
    }
    .to_bytes();
    let mut resp = vec![0u8; 64];
    case(&mut s, c, "chain without a response", Used(0), |s| {
        raw(s, &[Buffer::readable(addr(&hdr), hdr.len() as u32)])
    })?;
    case(&mut s, c, "response descriptor of 16 bytes", Used(0), |s| {
        raw(
            s,
            &[
                Buffer::readable(addr(&hdr), hdr.len() as u32),
                Buffer::writable(resp.as_mut_ptr() as u64, 16),
            ],
        )
    })?;
    case(
        &mut s,
        c,
        "device-readable response descriptor",
        Used(0),
        |s| {
            raw(
                s,
                &[
                    Buffer::readable(addr(&hdr), hdr.len() as u32),
                    Buffer::readable(addr(&resp), 48),
                ],
            )
        },
    )?;
    case(&mut s, c, "response outside guest RAM", Used(0), |s| {
        raw(
            s,
            &[
                Buffer::readable(addr(&hdr), hdr.len() as u32),
                Buffer::writable(0x7000_0000_0000, 48),
            ],
        )
    })?;
    resp.fill(0);
    case(
        &mut s,
        c,
        "response with no header",
        Used(Response::SIZE as u32),
        |s| raw(s, &[Buffer::writable(resp.as_mut_ptr() as u64, 48)]),
    )?;
    let answer = Response::decode(&resp)
        .map_err(|_| fail(EXIT_WRONG_ANSWER, format_args!("short response")))?;
    if answer.status() != Some(vgpu_proto::Status::BadDescriptor) {
        return Err(fail(
            EXIT_WRONG_ANSWER,
            format_args!("headerless chain answered {}", answer.status),
        ));
    }

    // Modules and functions.
    case(
        &mut s,
        c,
        "MODULE_LOAD of an unknown built-in",
        Is(Status::UnknownModule),
        |s| {
            s.load_module_builtin("no-such-module")
                .map(|h| [h, 0, 0, 0])
        },
    )?;
    case(
        &mut s,
        c,
        "GET_FUNCTION of an unknown name",
        Is(Status::UnknownFunction),
        |s| {
            s.get_function(module, "no_such_kernel")
                .map(|f| [f.handle, 0, 0, 0])
        },
    )?;
    case(
        &mut s,
        c,
        "GET_FUNCTION in an unknown module",
        Is(Status::UnknownModule),
        |s| {
            s.get_function(module ^ 0x5a5a_0000, "vector_add")
                .map(|f| [f.handle, 0, 0, 0])
        },
    )?;

    // Launches.
    let va = |n: u64| launch_1d(vector_add, n, 64);
    let ptrs = |a: Access, b: Access, c: Access, n: u64| {
        [
            KernelArg::ptr(buf, a),
            KernelArg::ptr(buf + 16384, b),
            KernelArg::ptr(buf + 32768, c),
            KernelArg::u64(n),
        ]
    };
    case(
        &mut s,
        c,
        "LAUNCH of an unknown function",
        Is(Status::UnknownFunction),
        |s| launch(s, &launch_1d(0xdead_beef, 1, 1), &[]),
    )?;
    case(
        &mut s,
        c,
        "LAUNCH with too few arguments",
        Is(Status::BadArgCount),
        |s| {
            launch(
                s,
                &va(16),
                &ptrs(Access::Read, Access::Read, Access::Write, 16)[..3],
            )
        },
    )?;
    case(
        &mut s,
        c,
        "LAUNCH with 33 arguments",
        Is(Status::BadArgCount),
        |s| launch(s, &va(16), &[KernelArg::u32(0); 33]),
    )?;
    case(
        &mut s,
        c,
        "LAUNCH writing through a READ pointer",
        Is(Status::BadArgType),
        |s| {
            launch(
                s,
                &va(16),
                &ptrs(Access::Read, Access::Read, Access::Read, 16),
            )
        },
    )?;
    case(
        &mut s,
        c,
        "LAUNCH with an unknown argument kind",
        Is(Status::BadArgType),
        |s| {
            let mut a = ptrs(Access::Read, Access::Read, Access::Write, 16);
            a[3] = KernelArg {
                kind: 99,
                access: 0,
                value: 16,
            };
            launch(s, &va(16), &a)
        },
    )?;
    case(
        &mut s,
        c,
        "LAUNCH reading past an allocation",
        Is(Status::BadDevicePointer),
        |s| {
            launch(
                s,
                &va(16384),
                &ptrs(Access::Read, Access::Read, Access::Write, 16384),
            )
        },
    )?;
    case(
        &mut s,
        c,
        "LAUNCH with 2048-thread blocks",
        Is(Status::InvalidArgument),
        |s| {
            let mut l = va(16);
            l.block = [2048, 1, 1];
            launch(s, &l, &ptrs(Access::Read, Access::Read, Access::Write, 16))
        },
    )?;
    case(
        &mut s,
        c,
        "LAUNCH with an empty grid",
        Is(Status::InvalidArgument),
        |s| {
            let mut l = va(16);
            l.grid = [0, 1, 1];
            launch(s, &l, &ptrs(Access::Read, Access::Read, Access::Write, 16))
        },
    )?;
    case(
        &mut s,
        c,
        "LAUNCH of spin beyond its cap",
        Is(Status::InvalidArgument),
        |s| {
            launch(
                s,
                &launch_1d(spin, 1, 1),
                &[KernelArg::u64(vgpu_proto::builtin::MAX_SPIN_US + 1)],
            )
        },
    )?;
    let mut idx = vec![0u8; 64];
    idx[..4].copy_from_slice(&1_000_000u32.to_le_bytes());
    s.memcpy_htod(buf + 16384, &idx)
        .map_err(driver("HTOD indices"))?;
    case(
        &mut s,
        c,
        "gather with an index out of range",
        Is(Status::KernelFault),
        |s| {
            let args = [
                KernelArg::ptr(buf, Access::Read),
                KernelArg::ptr(buf + 16384, Access::Read),
                KernelArg::ptr(buf + 32768, Access::Write),
                KernelArg::u64(16),
                KernelArg::u64(16),
            ];
            launch(s, &launch_1d(gather, 16, 16), &args)
        },
    )?;

    // Events and optional features.
    case(
        &mut s,
        c,
        "EVENT_ELAPSED of unknown events",
        Is(Status::UnknownEvent),
        |s| s.event_elapsed(0xe1, 0xe2).map(|ns| [ns, 0, 0, 0]),
    )?;
    case(
        &mut s,
        c,
        "EVENT_DESTROY of an unknown event",
        Is(Status::UnknownEvent),
        |s| s.event_destroy(0xe3).map(|_| [0; 4]),
    )?;
    if info.features & features::SHM == 0 {
        case(
            &mut s,
            c,
            "SHM_GET without the SHM capability",
            Is(Status::NotSupported),
            |s| s.shm_get(1, 4096, 1).map(|id| [id, 0, 0, 0]),
        )?;
    }
    if info.features & features::PTX == 0 {
        case(
            &mut s,
            c,
            "PTX MODULE_LOAD without the PTX capability",
            Is(Status::NotSupported),
            |s| s.load_module_ptx(b".version 7.0\n").map(|h| [h, 0, 0, 0]),
        )?;
    }

    still_computes(&mut s, vector_add)?;
    s.free(buf).map_err(driver("FREE"))?;
    s.unload_module(module).map_err(driver("MODULE_UNLOAD"))?;
    let used = s.get_info().map_err(driver("GET_INFO"))?.memory_used;
    if used != baseline_used {
        return Err(fail(
            EXIT_WRONG_ANSWER,
            format_args!("device memory in use {used} after freeing all, {baseline_used} before"),
        ));
    }
    Ok(n)
}

/// After all that, a correct vector_add on fresh allocations.
fn still_computes(s: &mut GpuStream, vector_add: u64) -> Result<(), Failure> {
    const N: usize = 256;
    let bits: Vec<u32> = (0..2 * N as u32).map(|v| (v as f32).to_bits()).collect();
    let a: Vec<u8> = (0..N).flat_map(|i| bits[i].to_le_bytes()).collect();
    let mut out = vec![0u8; 4 * N];
    let [da, db, dc] = [0; 3].map(|_| s.alloc(4 * N as u64));
    let (da, db, dc) = (
        da.map_err(driver("ALLOC"))?,
        db.map_err(driver("ALLOC"))?,
        dc.map_err(driver("ALLOC"))?,
    );
    s.memcpy_htod(da, &a).map_err(driver("HTOD"))?;
    s.memcpy_htod(db, &a).map_err(driver("HTOD"))?;
    let args = [
        KernelArg::ptr(da, Access::Read),
        KernelArg::ptr(db, Access::Read),
        KernelArg::ptr(dc, Access::Write),
        KernelArg::u64(N as u64),
    ];
    s.launch(&launch_1d(vector_add, N as u64, 64), &args)
        .map_err(driver("LAUNCH"))?;
    s.memcpy_dtoh(&mut out, dc).map_err(driver("DTOH"))?;
    for i in 0..N {
        let got = u32::from_le_bytes([out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]]);
        if got != bits[2 * i] {
            return Err(fail(
                EXIT_WRONG_ANSWER,
                format_args!("vector_add after the abuse: c[{i}] = {got:#x}"),
            ));
        }
    }
    for d in [da, db, dc] {
        s.free(d).map_err(driver("FREE"))?;
    }
    println!("hostile: the device still computes correctly");
    Ok(())
}
