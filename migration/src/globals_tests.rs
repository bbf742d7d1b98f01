//! Module variables across moves: a tenant's `counter` and `table` (the sim's built-in
//! module variables) keep their bytes and the addresses it was given, between GPUs and
//! over a stream; a stream whose variables do not fit the module is refused and the
//! source goes on.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::{Access, ArgValue, Backend, LaunchOne, ModuleImage};

use super::remote_tests::receive;
use super::tests::{get, one_d, pattern, put, sim, MIB};
use crate::wire::{read_message, Message};
use crate::{Migratable, MigrateOptions, MigrationError, Mode};

/// What the tenant set up: its module, the variables' addresses, the `fill` function.
struct Tenant {
    module: u64,
    counter: u64,
    table: u64,
    fill: u64,
}

const COUNTER: u64 = 0x1234_5678_9abc_def0;

/// Loads the built-in module and sets its variables as a tenant would: `counter` with a
/// copy to the address `module_global` answered, `table` with a kernel (`fill` through
/// a pointer to it). A buffer allocated before and freed after leaves a hole where a fresh
/// GPU places the reloaded variables instead, so they move to other addresses there.
fn set_up(m: &Migratable) -> Tenant {
    let hole = m.alloc(MIB).expect("hole").addr;
    let module = m
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    let (counter, size) = m
        .modules()
        .module_global(module, b"counter")
        .expect("counter");
    assert_eq!(size, 8);
    let (table, size) = m.modules().module_global(module, b"table").expect("table");
    assert_eq!(size, 1024);
    m.free(hole).expect("free");
    put(m, counter, &COUNTER.to_le_bytes());
    let fill = m
        .modules()
        .get_function(module, b"fill")
        .expect("fill")
        .handle;
    fill_table(m, fill, table, 0x0707_0707);
    Tenant {
        module,
        counter,
        table,
        fill,
    }
}

fn fill_table(m: &Migratable, fill: u64, table: u64, v: u32) {
    m.launch_one(
        fill,
        &one_d(),
        &[
            ArgValue::Ptr {
                addr: table,
                access: Access::Write,
            },
            ArgValue::U32(v),
            ArgValue::U64(256),
        ],
    )
    .expect("fill the table");
}

/// The tenant reads its variables at the addresses it holds, looks them up again (same
/// answers), writes them with a copy and a kernel again, and cannot free them.
fn check(m: &Migratable, t: &Tenant, table_byte: u8) {
    assert_eq!(get(m, t.counter, 8), COUNTER.to_le_bytes(), "counter");
    assert!(
        get(m, t.table, 1024).iter().all(|b| *b == table_byte),
        "table"
    );
    assert_eq!(
        m.modules()
            .module_global(t.module, b"counter")
            .expect("again"),
        (t.counter, 8)
    );
    assert_eq!(
        m.modules()
            .module_global(t.module, b"table")
            .expect("again"),
        (t.table, 1024)
    );
    put(m, t.counter + 4, &[0xee; 4]);
    assert_eq!(get(m, t.counter, 8)[4..], [0xee; 4]);
    put(m, t.counter, &COUNTER.to_le_bytes());
    fill_table(m, t.fill, t.table, 0x0909_0909);
    assert!(get(m, t.table, 1024).iter().all(|b| *b == 9));
    fill_table(m, t.fill, t.table, u32::from_ne_bytes([table_byte; 4]));
    assert!(m.free(t.counter).is_err(), "a variable is no allocation");
    // A fresh allocation never lands on a variable's address.
    let a = m.alloc(3 * MIB).expect("alloc").addr;
    for v in [t.counter, t.table] {
        assert!(v < a || v >= a + 3 * MIB, "{a:#x} covers {v:#x}");
    }
    put(m, a, &pattern(3, 4096));
    assert_eq!(get(m, t.counter, 8), COUNTER.to_le_bytes());
    m.free(a).expect("free");
}

#[test]
fn module_variables_keep_their_values_and_addresses_across_moves_between_gpus() {
    for mode in [Mode::StopCopy, Mode::Precopy] {
        let m = Migratable::new(sim(64 * MIB));
        let data = m.alloc(2 * MIB).expect("data").addr;
        put(&m, data, &pattern(1, 2 << 20));
        let t = set_up(&m);
        check(&m, &t, 7);
        let before = m.current();
        let opts = MigrateOptions {
            mode,
            max_downtime: Duration::from_millis(5),
            max_rounds: 4,
        };
        m.migrate(sim(64 * MIB), &opts, |_| {}).expect("migrate");
        assert!(!Arc::ptr_eq(&before, &m.current()));
        drop(before);
        // On the target the reloaded variables live elsewhere; the tenant's addresses
        // still reach them.
        let real = m.current().modules().module_globals(1).unwrap_or_default();
        let now = |name: &[u8]| real.iter().find(|g| g.name == name).map(|g| g.addr);
        assert!(
            now(b"counter") != Some(t.counter) && now(b"table") != Some(t.table),
            "the test means the variables to move: {real:?}"
        );
        check(&m, &t, 7);
        assert_eq!(get(&m, data, 2 << 20), pattern(1, 2 << 20));
        // And back again, then once more.
        m.migrate(sim(64 * MIB), &opts, |_| {}).expect("back");
        check(&m, &t, 7);
        m.migrate(sim(64 * MIB), &opts, |_| {}).expect("again");
        check(&m, &t, 7);
        m.modules().module_unload(t.module).expect("unload");
        assert!(get_err(&m, t.counter));
    }
}

fn get_err(b: &dyn Backend, addr: u64) -> bool {
    let mut v = [0u8; 8];
    b.copy_dtoh(addr, &vm_memory::VolatileSlice::from(&mut v[..]))
        .is_err()
}

#[test]
fn module_variables_reach_a_fresh_vgpu_over_a_stream() {
    let src = Arc::new(Migratable::new(sim(64 * MIB)));
    let t = set_up(&src);
    let dst = Arc::new(Migratable::new(sim(64 * MIB)));
    let (s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.receive_from(d, b"k", || {}))
    };
    let mut tx = src.send_to(s, b"k").expect("hello");
    tx.precopy_round().expect("round");
    // Set after the last round: the stop carries it.
    put(&*src, t.counter, &COUNTER.to_le_bytes());
    tx.finish().expect("finish");
    let got = rx.join().expect("thread").expect("received");
    assert_eq!(got.variables, 2);
    check(&dst, &t, 7);
    // The source still holds its own.
    check(&src, &t, 7);
}

/// Sits between a source and a destination and passes every message on, each
/// `Variable` through `edit` (raw payload bytes, after the 16-byte header).
fn relay(
    mut from: UnixStream,
    mut to: UnixStream,
    edit: impl Fn(&mut Vec<u8>) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let mut back_from = to.try_clone().expect("clone");
    let mut back_to = from.try_clone().expect("clone");
    std::thread::spawn(move || {
        std::io::copy(&mut back_from, &mut back_to).ok();
    });
    std::thread::spawn(move || loop {
        let mut h = [0u8; 16];
        if from.read_exact(&mut h).is_err() {
            return;
        }
        let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let mut p = vec![0u8; len];
        if from.read_exact(&mut p).is_err() {
            return;
        }
        if u16::from_le_bytes([h[6], h[7]]) == 10 {
            edit(&mut p);
            h[8..12].copy_from_slice(&(p.len() as u32).to_le_bytes());
        }
        if to.write_all(&h).and_then(|()| to.write_all(&p)).is_err() {
            return;
        }
    })
}

#[test]
fn a_variable_larger_than_the_modules_own_is_refused_and_the_source_goes_on() {
    let src = Arc::new(Migratable::new(sim(64 * MIB)));
    let t = set_up(&src);
    let dst = Arc::new(Migratable::new(sim(64 * MIB)));
    let (s, relay_in) = UnixStream::pair().expect("pair");
    let (relay_out, d) = UnixStream::pair().expect("pair");
    let rx = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.receive_from(d, b"k", || {}))
    };
    // The counter's size claimed 4 KiB larger, with 4 KiB more bytes.
    let _relay = relay(relay_in, relay_out, |p| {
        let size = u64::from_le_bytes(p[16..24].try_into().expect("8"));
        p[16..24].copy_from_slice(&(size + 4096).to_le_bytes());
        p.extend_from_slice(&[0xab; 4096]);
    });
    let e = src
        .send_to(s, b"k")
        .and_then(|tx| tx.finish())
        .expect_err("refused");
    assert!(matches!(e, MigrationError::Refused(_)), "{e}");
    let e = rx.join().expect("thread").expect_err("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("bytes in this module; the source sent"),
        "a clear reason: {msg}"
    );
    assert_eq!(dst.current().memory_usage().used, 0, "everything freed");
    // The source goes on with its variables, and moves later.
    check(&src, &t, 7);
    let (s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.receive_from(d, b"k", || {}))
    };
    src.send_to(s, b"k")
        .and_then(|tx| tx.finish())
        .expect("second try");
    assert_eq!(rx.join().expect("thread").expect("ok").variables, 2);
    check(&dst, &t, 7);
}

#[test]
fn hostile_variables_end_in_a_clear_error_with_everything_freed() {
    let base = sim(MIB).info().va_base;
    let module = Message::Module {
        handle: 1,
        kind: crate::wire::ImageKind::Builtin,
        image: b"builtin",
    };
    let var = |addr: u64, size: u64, offset: u64, name: &'static [u8], bytes: &'static [u8]| {
        Message::Variable {
            module: 1,
            addr,
            size,
            offset,
            name,
            bytes,
        }
    };
    let at = base + 512 * MIB;
    let cases: Vec<(Vec<Message<'_>>, &str)> = vec![
        (vec![var(at, 8, 0, b"counter", &[1; 8])], "no such module"),
        (
            vec![module.clone(), var(at, 16, 0, b"counter", &[1; 16])],
            "is 8 bytes in this module; the source sent 16",
        ),
        (
            vec![module.clone(), var(at, 8, 4, b"counter", &[1; 8])],
            "run past",
        ),
        (
            vec![module.clone(), var(at, 8, 0, b"nothing", &[1; 8])],
            "looking up module 1's variable \"nothing\"",
        ),
        (
            vec![module.clone(), var(u64::MAX - 3, 8, 0, b"counter", &[1; 8])],
            "is no range",
        ),
        (
            vec![
                module.clone(),
                var(at, 8, 0, b"counter", &[1; 8]),
                var(at + 4, 1024, 0, b"table", &[1; 8]),
            ],
            "overlaps another variable",
        ),
        (
            vec![
                module.clone(),
                var(at, 8, 0, b"counter", &[1; 4]),
                var(at, 16, 4, b"counter", &[1; 4]),
            ],
            "unlike before",
        ),
        (
            vec![
                Message::Alloc {
                    addr: at,
                    size: MIB,
                },
                module.clone(),
                var(at + 64, 8, 0, b"counter", &[1; 8]),
                Message::Done { next_handle: 2 },
            ],
            "overlaps the allocation",
        ),
    ];
    for (msgs, want) in cases {
        let (r, dst) = receive(&msgs, false);
        let e = r.expect_err(want);
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert_eq!(dst.current().memory_usage().used, 0, "{want}: freed");
        assert_eq!(dst.current().memory_usage().allocations, 0, "{want}: freed");
    }
    // A stream from a source that sends no variables (version 1) still loads.
    let (r, dst) = receive(
        &[
            Message::Alloc {
                addr: base,
                size: MIB,
            },
            module.clone(),
            Message::Done { next_handle: 2 },
        ],
        false,
    );
    assert_eq!(r.expect("a version 1 stream").variables, 0);
    let (c, n) = dst.modules().module_global(1, b"counter").expect("counter");
    assert_eq!((get(&*dst, c, 8), n), (vec![0; 8], 8));
    // A variable the guest never looked up (address 0) arrives by name only.
    let (r, dst) = receive(
        &[
            module.clone(),
            var(0, 8, 0, b"counter", &[7; 8]),
            Message::Done { next_handle: 2 },
        ],
        false,
    );
    assert_eq!(r.expect("by name").variables, 1);
    let (c, _) = dst.modules().module_global(1, b"counter").expect("counter");
    assert_eq!(get(&*dst, c, 8), vec![7; 8]);
}

#[test]
fn the_stream_reader_takes_version_one_headers() {
    let mut out = Vec::new();
    Message::Done { next_handle: 3 }
        .write(&mut out)
        .expect("write");
    assert_eq!(out[4], 1);
    let mut buf = Vec::new();
    assert_eq!(
        read_message(&mut &out[..], &mut buf).expect("read"),
        Message::Done { next_handle: 3 }
    );
}
