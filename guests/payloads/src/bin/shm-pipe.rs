//! Shared device memory between two VMs (Gdev's dataflow case): a producer fills a shared
//! object on the device, a consumer checksums it on the device, handing off through a
//! sequence word in the object itself; no byte crosses the host.
//!
//! `role=producer|consumer|intruder key=<k> size_mib=<m> items=<n>`.
//! Layout of the object: word 0 = items produced, word 1 = items consumed (u64 each), the
//! data from offset 4096. Item `i` is the 32-bit word `0x5eed0000 + i` repeated.
//! The producer waits for the consumer to acknowledge each item before the next; the
//! consumer compares the device checksum of each item with the expected one, and at the
//! end removes the object (RMID; freed at the last detach).
//! An `intruder` (a vGPU outside the share group) must be refused the key and every
//! plausible object id; it exits 0 when it was.
//!
//! Last line: `SHM-PIPE OK role=<r> items=<n> bytes=<b> ns_per_item=<t>` and exit 0;
//! otherwise 2 bad argument, 3 no vGPU, 4 driver/device error, 6 mismatch, 7 timeout,
//! 8 the intruder got in.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::args::{shm_cmd, shm_flags};
use guest_driver::vgpu::vgpu_proto::{Access, KernelArg, Status};
use guest_driver::Error;
use payload_rt::time::Instant;
use payload_rt::vgpu::{open_single, GpuStream};
use payload_rt::{println, Args, BootInfo};

payload_rt::entry!(main);

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_MISMATCH: u8 = 6;
const EXIT_TIMEOUT: u8 = 7;
const EXIT_BREACH: u8 = 8;

const DATA: u64 = 4096;
/// How long either side waits for the other.
const WAIT_NS: u64 = 60_000_000_000;

struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("shm-pipe: FAIL {what}");
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

fn item_word(i: u64) -> u32 {
    0x5eed_0000u32.wrapping_add(i as u32)
}

fn expected(i: u64, bytes: u64) -> u64 {
    let w = item_word(i).to_le_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for k in 0..bytes {
        h = (h ^ u64::from(w[(k % 4) as usize])).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn read_word(s: &mut GpuStream, addr: u64) -> Result<u64, Failure> {
    let mut b = [0u8; 8];
    s.memcpy_dtoh(&mut b, addr)
        .map_err(driver("MEMCPY_DTOH word"))?;
    Ok(u64::from_le_bytes(b))
}

fn write_word(s: &mut GpuStream, addr: u64, v: u64) -> Result<(), Failure> {
    s.memcpy_htod(addr, &v.to_le_bytes())
        .map_err(driver("MEMCPY_HTOD word"))
}

/// Waits until the word at `addr` reaches `v`.
fn wait_word(s: &mut GpuStream, addr: u64, v: u64) -> Result<(), Failure> {
    let t = Instant::now();
    loop {
        if read_word(s, addr)? >= v {
            return Ok(());
        }
        if t.elapsed_ns().unwrap_or(0) > WAIT_NS {
            return Err(fail(
                EXIT_TIMEOUT,
                format_args!("waited {} s for the other side", WAIT_NS / 1_000_000_000),
            ));
        }
        payload_rt::exit::idle_us(200);
    }
}

fn run(boot: &BootInfo, args: Args) -> Result<(), Failure> {
    let num = |key, default| {
        args.number(key, default)
            .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))
    };
    let role = args.value("role").unwrap_or("");
    let key = num("key", 0x5eed)?;
    let size_mib = num("size_mib", 4)?;
    let items = num("items", 8)?;
    if key == 0 || size_mib == 0 || size_mib > 1024 {
        return Err(fail(
            EXIT_BAD_ARGS,
            format_args!("key must be non-zero, size_mib 1..=1024"),
        ));
    }
    let bytes = size_mib << 20;
    let (_gpu, mut s) = open_single(boot).map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    if role == "intruder" {
        return intrude(&mut s, key);
    }
    if role != "producer" && role != "consumer" {
        return Err(fail(
            EXIT_BAD_ARGS,
            format_args!("role must be producer, consumer or intruder"),
        ));
    }
    let id = s
        .shm_get(key, DATA + bytes, shm_flags::CREATE)
        .map_err(driver("SHM_GET"))?;
    let base = s.shm_at(id, 0).map_err(driver("SHM_AT"))?;
    let (produced, consumed, data) = (base, base + 8, base + DATA);
    let module = s.load_builtin().map_err(driver("MODULE_LOAD builtin"))?;
    let t = Instant::now();
    if role == "producer" {
        let fill = s
            .get_function(module, "fill")
            .map_err(driver("GET_FUNCTION fill"))?;
        for i in 0..items {
            wait_word(&mut s, consumed, i)?;
            s.launch(
                &launch_1d(fill.handle, bytes / 4, 256),
                &[
                    KernelArg::ptr(data, Access::Write),
                    KernelArg::u32(item_word(i)),
                    KernelArg::u64(bytes / 4),
                ],
            )
            .map_err(driver("LAUNCH fill"))?;
            write_word(&mut s, produced, i + 1)?;
        }
        wait_word(&mut s, consumed, items)?;
    } else {
        let checksum = s
            .get_function(module, "checksum")
            .map_err(driver("GET_FUNCTION checksum"))?;
        let dsum = s.alloc(8).map_err(driver("ALLOC sum"))?;
        let mut sum = vec![0u8; 8];
        for i in 0..items {
            wait_word(&mut s, produced, i + 1)?;
            s.launch(
                &launch_1d(checksum.handle, 1, 1),
                &[
                    KernelArg::ptr(data, Access::Read),
                    KernelArg::u64(bytes),
                    KernelArg::ptr(dsum, Access::Write),
                ],
            )
            .map_err(driver("LAUNCH checksum"))?;
            s.memcpy_dtoh(&mut sum, dsum)
                .map_err(driver("MEMCPY_DTOH sum"))?;
            let got = u64::from_le_bytes([
                sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7],
            ]);
            let want = expected(i, bytes);
            if got != want {
                return Err(fail(
                    EXIT_MISMATCH,
                    format_args!("item {i}: checksum {got:#018x}, want {want:#018x}"),
                ));
            }
            write_word(&mut s, consumed, i + 1)?;
        }
        s.free(dsum).map_err(driver("FREE"))?;
        let st = s
            .shm_ctl(id, shm_cmd::STAT)
            .map_err(driver("SHM_CTL STAT"))?;
        println!(
            "shm-pipe: object {id}: {} bytes, {} attachments",
            st[0], st[1]
        );
        s.shm_ctl(id, shm_cmd::RMID)
            .map_err(driver("SHM_CTL RMID"))?;
    }
    let ns = t.elapsed_ns().unwrap_or(0);
    s.shm_dt(base).map_err(driver("SHM_DT"))?;
    println!(
        "SHM-PIPE OK role={role} items={items} bytes={} ns_per_item={}",
        items * bytes,
        ns / items.max(1)
    );
    Ok(())
}

/// A vGPU outside the share group: the key and ids must all be refused.
fn intrude(s: &mut GpuStream, key: u64) -> Result<(), Failure> {
    let refused = |r: Result<u64, Error>| match r {
        Err(Error::Device { status, .. }) => matches!(
            status,
            Status::PermissionDenied | Status::InvalidArgument | Status::NotSupported
        ),
        _ => false,
    };
    if !refused(s.shm_get(key, 0, 0)) {
        return Err(fail(
            EXIT_BREACH,
            format_args!("looked up key {key:#x} of another group"),
        ));
    }
    for id in 1..=16 {
        if !refused(s.shm_at(id, 0)) {
            return Err(fail(
                EXIT_BREACH,
                format_args!("attached object {id} of another group"),
            ));
        }
        if !refused(s.shm_ctl(id, shm_cmd::RMID).map(|_| 0)) {
            return Err(fail(
                EXIT_BREACH,
                format_args!("removed object {id} of another group"),
            ));
        }
    }
    if !refused(s.shm_dt(0x2000_0000_0000).map(|_| 0)) {
        return Err(fail(
            EXIT_BREACH,
            format_args!("detached a mapping it never made"),
        ));
    }
    println!("SHM-PIPE OK role=intruder refused");
    Ok(())
}
