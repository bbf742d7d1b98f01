//! The bounds modes of `hostile` (`mode=<name>`): a guest that tries to exhaust what the
//! host keeps for it, or to write where it may only read. Each prints its findings and
//! one `<MODE> OK ...` line, exit 0; a diagnostic and a non-zero code otherwise.
//!
//! - `shm-flood [attempts=N] [secs=S]`: creates 1-byte shared objects with key 0 (each a
//!   new object) and attaches each, until the host refuses with `OUT_OF_MEMORY`; then
//!   keeps asking for `S` seconds (every ask refused), and checks the device still
//!   computes. Fails if `N` objects were all granted (no bound).
//! - `shm-neighbour [rounds=R] [size=B]`: R times: a fresh object of B bytes, attached,
//!   written, read back and compared, detached and removed. Fails on any error or a
//!   wrong byte.
//! - `readonly key=K`: attaches one object read-write and read-only, then writes into
//!   the read-only mapping by HtoD, memset, DtoD and a kernel's WRITE and READ_WRITE
//!   pointers: each must be answered `BAD_DEVICE_POINTER`, the bytes must stay, the
//!   device must still compute.
//! - `objects`: records events until the event table is full (`OUT_OF_RESOURCES`) and
//!   loads the built-in module until the module table is (`OUT_OF_RESOURCES`), then frees
//!   them all and checks the memory in use is back where it was.

use alloc::vec;
use alloc::vec::Vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::args::{shm_cmd, shm_flags};
use guest_driver::vgpu::vgpu_proto::{Access, KernelArg, Status};
use guest_driver::Error;
use payload_rt::time::Instant;
use payload_rt::vgpu::{open_single, GpuStream};
use payload_rt::{println, Args, BootInfo};

use super::{driver, fail, still_computes, Failure, EXIT_DRIVER, EXIT_NO_DEVICE};

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_UNBOUNDED: u8 = 10;
const EXIT_WRONG: u8 = 8;
const READ_ONLY: u64 = 1;

/// One write attempt of the `readonly` mode.
type Attempt<'a> = dyn Fn(&mut GpuStream) -> Result<(), Error> + 'a;

/// Runs mode `mode`.
pub fn run(boot: &BootInfo, mode: &str, args: &Args<'_>) -> Result<(), Failure> {
    let num = |key, default| {
        args.number(key, default)
            .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))
    };
    let (_gpu, mut s) = open_single(boot).map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    match mode {
        "shm-flood" => shm_flood(&mut s, num("attempts", 4096)?, num("secs", 3)?),
        "shm-neighbour" => shm_neighbour(&mut s, num("rounds", 50)?, num("size", 65536)?),
        "readonly" => readonly(&mut s, num("key", 0x0dd)?),
        "objects" => objects(&mut s),
        other => Err(fail(
            EXIT_BAD_ARGS,
            format_args!("mode {other}: use shm-flood, shm-neighbour, readonly or objects"),
        )),
    }
}

fn is(e: &Error, want: Status) -> bool {
    matches!(e, Error::Device { status, .. } if *status == want)
}

fn shm_flood(s: &mut GpuStream, attempts: u64, secs: u64) -> Result<(), Failure> {
    let (mut created, mut attached, mut refused) = (0u64, 0u64, 0u64);
    let mut first_refusal = None;
    for _ in 0..attempts {
        match s.shm_get(0, 1, shm_flags::CREATE) {
            Ok(id) => {
                created += 1;
                match s.shm_at(id, 0) {
                    Ok(_) => attached += 1,
                    Err(e) if is(&e, Status::OutOfMemory) => refused += 1,
                    Err(e) => return Err(fail(EXIT_DRIVER, format_args!("SHM_AT {id}: {e}"))),
                }
            }
            Err(e) if is(&e, Status::OutOfMemory) => {
                refused += 1;
                first_refusal.get_or_insert(created);
                break;
            }
            Err(e) => return Err(fail(EXIT_DRIVER, format_args!("SHM_GET: {e}"))),
        }
    }
    let Some(bound) = first_refusal else {
        return Err(fail(
            EXIT_UNBOUNDED,
            format_args!("{created} shared objects created and none refused: no bound"),
        ));
    };
    println!("hostile: shm-flood: refused with OUT_OF_MEMORY after {bound} objects");
    // Keep knocking while the neighbours work: every ask is refused, nothing breaks.
    let t = Instant::now();
    while t.elapsed_ns().unwrap_or(u64::MAX) < secs.saturating_mul(1_000_000_000) {
        match s.shm_get(0, 1, shm_flags::CREATE) {
            Err(e) if is(&e, Status::OutOfMemory) => refused += 1,
            Ok(id) => {
                return Err(fail(
                    EXIT_UNBOUNDED,
                    format_args!("object {id} granted past the bound"),
                ))
            }
            Err(e) => return Err(fail(EXIT_DRIVER, format_args!("SHM_GET: {e}"))),
        }
    }
    let module = s.load_builtin().map_err(driver("MODULE_LOAD"))?;
    let vector_add = s
        .get_function(module, "vector_add")
        .map_err(driver("GET_FUNCTION"))?
        .handle;
    still_computes(s, vector_add)?;
    println!("SHM-FLOOD OK created={created} attached={attached} refused={refused} bound={bound}");
    Ok(())
}

fn pattern(round: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(round * 7 + 1) as u8)
        .collect()
}

fn shm_neighbour(s: &mut GpuStream, rounds: u64, size: u64) -> Result<(), Failure> {
    let len = usize::try_from(size).unwrap_or(0);
    if len == 0 || size > 1 << 24 {
        return Err(fail(EXIT_BAD_ARGS, format_args!("size 1..=16 MiB")));
    }
    let mut back = vec![0u8; len];
    for round in 0..rounds {
        let id = s
            .shm_get(0, size, shm_flags::CREATE)
            .map_err(driver("SHM_GET"))?;
        let addr = s.shm_at(id, 0).map_err(driver("SHM_AT"))?;
        let want = pattern(round, len);
        s.memcpy_htod(addr, &want).map_err(driver("HTOD"))?;
        s.memcpy_dtoh(&mut back, addr).map_err(driver("DTOH"))?;
        if back != want {
            return Err(fail(
                EXIT_WRONG,
                format_args!("round {round}: the object read back differs"),
            ));
        }
        s.shm_dt(addr).map_err(driver("SHM_DT"))?;
        s.shm_ctl(id, shm_cmd::RMID)
            .map_err(driver("SHM_CTL RMID"))?;
    }
    println!("SHM-NEIGHBOUR OK rounds={rounds} size={size}");
    Ok(())
}

fn readonly(s: &mut GpuStream, key: u64) -> Result<(), Failure> {
    const SIZE: u64 = 8192;
    let id = s
        .shm_get(key, SIZE, shm_flags::CREATE)
        .map_err(driver("SHM_GET"))?;
    let rw = s.shm_at(id, 0).map_err(driver("SHM_AT read-write"))?;
    let ro = s
        .shm_at(id, READ_ONLY)
        .map_err(driver("SHM_AT read-only"))?;
    let own = s.alloc(SIZE).map_err(driver("ALLOC"))?;
    let want = pattern(1, SIZE as usize);
    s.memcpy_htod(rw, &want)
        .map_err(driver("HTOD read-write"))?;
    let module = s.load_builtin().map_err(driver("MODULE_LOAD"))?;
    let fun = |s: &mut GpuStream, name| s.get_function(module, name).map(|f| f.handle);
    let fill = fun(s, "fill").map_err(driver("GET_FUNCTION"))?;
    let checksum = fun(s, "checksum").map_err(driver("GET_FUNCTION"))?;
    let vector_add = fun(s, "vector_add").map_err(driver("GET_FUNCTION"))?;
    let junk = vec![0xEEu8; SIZE as usize];
    let cases: [(&str, &Attempt); 6] = [
        ("HTOD into the read-only mapping", &|s| {
            s.memcpy_htod(ro, &junk)
        }),
        ("HTOD inside it", &|s| s.memcpy_htod(ro + 100, &junk[..16])),
        ("MEMSET of it", &|s| s.memset(ro, 0xAB, SIZE, 1)),
        ("DTOD into it", &|s| s.memcpy_dtod(ro, own, SIZE)),
        ("a kernel WRITE pointer into it", &|s| {
            let args = [
                KernelArg::ptr(ro, Access::Write),
                KernelArg::u32(1),
                KernelArg::u64(16),
            ];
            s.launch(&launch_1d(fill, 16, 16), &args).map(drop)
        }),
        ("a kernel READ_WRITE pointer into it", &|s| {
            let args = [
                KernelArg::ptr(own, Access::Read),
                KernelArg::u64(16),
                KernelArg::ptr(ro + 8, Access::ReadWrite),
            ];
            s.launch(&launch_1d(checksum, 1, 1), &args).map(drop)
        }),
    ];
    for (name, f) in cases {
        match f(s) {
            Err(e) if is(&e, Status::BadDevicePointer) => {
                println!("hostile: readonly: {name}: {}", Status::BadDevicePointer)
            }
            Ok(()) => return Err(fail(EXIT_WRONG, format_args!("{name}: accepted"))),
            Err(e) => return Err(fail(EXIT_WRONG, format_args!("{name}: {e}"))),
        }
    }
    let mut back = vec![0u8; SIZE as usize];
    s.memcpy_dtoh(&mut back, ro)
        .map_err(driver("DTOH read-only"))?;
    if back != want {
        return Err(fail(
            EXIT_WRONG,
            format_args!("a refused write changed the object"),
        ));
    }
    still_computes(s, vector_add)?;
    s.shm_dt(ro).map_err(driver("SHM_DT"))?;
    s.shm_dt(rw).map_err(driver("SHM_DT"))?;
    s.shm_ctl(id, shm_cmd::RMID)
        .map_err(driver("SHM_CTL RMID"))?;
    s.free(own).map_err(driver("FREE"))?;
    println!("READONLY OK");
    Ok(())
}

fn objects(s: &mut GpuStream) -> Result<(), Failure> {
    let used_before = s.get_info().map_err(driver("GET_INFO"))?.memory_used;
    let mut events = 0u64;
    loop {
        match s.event_record(0x1000 + events) {
            Ok(_) => events += 1,
            Err(e) if is(&e, Status::OutOfResources) => break,
            Err(e) => return Err(fail(EXIT_DRIVER, format_args!("EVENT_RECORD: {e}"))),
        }
        if events > 1 << 20 {
            return Err(fail(
                EXIT_UNBOUNDED,
                format_args!("{events} events recorded and none refused"),
            ));
        }
    }
    println!("hostile: objects: event {events} refused with OUT_OF_RESOURCES");
    let mut modules = Vec::new();
    loop {
        match s.load_builtin() {
            Ok(m) => modules.push(m),
            Err(e) if is(&e, Status::OutOfResources) => break,
            Err(e) => return Err(fail(EXIT_DRIVER, format_args!("MODULE_LOAD: {e}"))),
        }
        if modules.len() > 16384 {
            return Err(fail(
                EXIT_UNBOUNDED,
                format_args!("{} modules loaded and none refused", modules.len()),
            ));
        }
    }
    println!(
        "hostile: objects: module {} refused with OUT_OF_RESOURCES",
        modules.len()
    );
    for e in 0..events {
        s.event_destroy(0x1000 + e)
            .map_err(driver("EVENT_DESTROY"))?;
    }
    let vector_add = match modules.first() {
        Some(m) => {
            s.get_function(*m, "vector_add")
                .map_err(driver("GET_FUNCTION"))?
                .handle
        }
        None => return Err(fail(EXIT_DRIVER, format_args!("no module loaded"))),
    };
    still_computes(s, vector_add)?;
    for m in &modules {
        s.unload_module(*m).map_err(driver("MODULE_UNLOAD"))?;
    }
    let used_after = s.get_info().map_err(driver("GET_INFO"))?.memory_used;
    if used_after != used_before {
        return Err(fail(
            EXIT_WRONG,
            format_args!(
                "memory in use {used_after} after freeing every object, {used_before} before"
            ),
        ));
    }
    println!("OBJECTS OK events={events} modules={}", modules.len());
    Ok(())
}
