//! Moving a vGPU's state to a fresh worker over a stream: bytes, addresses and handles
//! survive; a wrong token, addresses outside the range and a broken stream are refused
//! with everything placed freed again.

use std::os::unix::net::UnixStream;
use std::sync::Arc;

use vgpu_backend::{Access, ArgValue, Backend, LaunchOne, ModuleImage};

use super::tests::{get, one_d, pattern, put, sim, MIB};
use crate::wire::Message;
use crate::{Migratable, MigrationError};

fn fill(m: &Migratable, f: u64, addr: u64, v: u32, words: u64) {
    m.launch_one(
        f,
        &one_d(),
        &[
            ArgValue::Ptr {
                addr,
                access: Access::Write,
            },
            ArgValue::U32(v),
            ArgValue::U64(words),
        ],
    )
    .expect("launch");
}

#[test]
fn state_moves_to_a_fresh_vgpu_over_a_stream() {
    let src = Arc::new(Migratable::new(sim(64 * MIB)));
    let a = src.alloc(3 * MIB + 5).expect("a").addr;
    let b = src.alloc(4096).expect("b").addr;
    let gone = src.alloc(MIB).expect("gone").addr;
    put(&*src, a, &pattern(1, 3 << 20));
    put(&*src, b, &pattern(2, 4096));
    let module = src
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    let f = src
        .modules()
        .get_function(module, b"fill")
        .expect("fill")
        .handle;
    let dst = Arc::new(Migratable::new(sim(64 * MIB)));
    let (s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.receive_from(d, b"t0ken", || {}))
    };
    let mut tx = src.send_to(s, b"t0ken").expect("hello");
    tx.precopy_round().expect("round 1");
    // Written and freed between rounds: sent again, freed there too.
    fill(&src, f, b, 0x0303_0303, 1024);
    src.free(gone).expect("free");
    tx.precopy_round().expect("round 2");
    let report = tx.finish().expect("finish");
    assert_eq!(report.rounds, 2);
    let got = rx.join().expect("thread").expect("received");
    assert_eq!(got.allocations, 2);
    assert_eq!(got.modules, 1);
    assert_eq!(got.functions, 1);
    assert_eq!(get(&*dst, a, 3 << 20), pattern(1, 3 << 20));
    assert!(get(&*dst, b, 4096).iter().all(|v| *v == 3));
    // The guest's function handle works there; new handles and addresses do not collide.
    fill(&dst, f, b, 0x0505_0505, 1024);
    assert!(get(&*dst, b, 4096).iter().all(|v| *v == 5));
    let m2 = dst
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    assert!(m2 > f && m2 > module);
    let c = dst.alloc(MIB).expect("c").addr;
    assert!(c >= b + 4096 || c + MIB <= a, "fresh address {c:#x}");
    // The source still holds its state.
    assert_eq!(get(&*src, a, 3 << 20), pattern(1, 3 << 20));
}

#[test]
fn a_wrong_token_is_refused_and_nothing_is_placed() {
    let src = Migratable::new(sim(64 * MIB));
    src.alloc(MIB).expect("a");
    let dst = Arc::new(Migratable::new(sim(64 * MIB)));
    let (s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.receive_from(d, b"right", || {}))
    };
    let e = src
        .send_to(s, b"wrong")
        .and_then(|mut tx| {
            let _ = tx.precopy_round();
            tx.finish()
        })
        .expect_err("refused");
    assert!(
        e.to_string().contains("token") || matches!(e, MigrationError::Stream(_)),
        "{e}"
    );
    let e = rx.join().expect("thread").expect_err("refused");
    assert!(e.to_string().contains("wrong token"), "{e}");
    assert_eq!(dst.current().memory_usage().used, 0);
    // A later move works (the source is free to try again).
    let (s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.receive_from(d, b"right", || {}))
    };
    src.send_to(s, b"right")
        .and_then(|tx| tx.finish())
        .expect("second try");
    assert_eq!(rx.join().expect("thread").expect("ok").allocations, 1);
}

/// Writes a hand-made stream and returns the destination's verdict.
pub(crate) fn receive(
    msgs: &[Message<'_>],
    truncate: bool,
) -> (Result<crate::Received, MigrationError>, Arc<Migratable>) {
    let dst = Arc::new(Migratable::new(sim(64 * MIB)));
    let (mut s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.receive_from(d, b"k", || {}))
    };
    let info = dst.info().clone();
    Message::Hello {
        token: b"k",
        va_base: info.va_base,
        va_size: info.va_size,
    }
    .write(&mut s)
    .expect("hello");
    for m in msgs {
        m.write(&mut s).expect("write");
    }
    if truncate {
        drop(s);
    }
    let r = rx.join().expect("thread");
    (r, dst)
}

#[test]
fn hostile_streams_end_in_a_clear_error_with_everything_freed() {
    let base = sim(MIB).info().va_base;
    let va_size = sim(MIB).info().va_size;
    let cases: Vec<(Vec<Message<'_>>, &str)> = vec![
        (
            vec![Message::Alloc {
                addr: 0,
                size: 4096,
            }],
            "outside",
        ),
        (
            vec![Message::Alloc {
                addr: base + va_size - 4096,
                size: 8192,
            }],
            "outside",
        ),
        (
            vec![Message::Alloc {
                addr: u64::MAX - 10,
                size: 100,
            }],
            "overflow",
        ),
        (
            vec![
                Message::Alloc {
                    addr: base,
                    size: 4096,
                },
                Message::Data {
                    addr: base,
                    offset: 4000,
                    bytes: &[0; 200],
                },
            ],
            "run past",
        ),
        (
            vec![
                Message::Alloc {
                    addr: base,
                    size: 4096,
                },
                Message::Data {
                    addr: base + 1,
                    offset: 0,
                    bytes: &[0; 2],
                },
            ],
            "unknown allocation",
        ),
        (
            vec![
                Message::Alloc {
                    addr: base,
                    size: 2 * MIB,
                },
                Message::Function {
                    handle: 2,
                    module: 1,
                    name: b"fill",
                },
            ],
            "unknown module",
        ),
        (
            vec![
                Message::Alloc {
                    addr: base,
                    size: 2 * MIB,
                },
                Message::Module {
                    handle: 1,
                    kind: crate::wire::ImageKind::Builtin,
                    image: b"builtin",
                },
                Message::Done { next_handle: 1 },
            ],
            "next handle",
        ),
    ];
    for (msgs, want) in cases {
        let (r, dst) = receive(&msgs, false);
        let e = r.expect_err(want);
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert_eq!(dst.current().memory_usage().used, 0, "{want}: freed");
    }
    // A source that goes away mid-stream.
    let (r, dst) = receive(
        &[Message::Alloc {
            addr: base,
            size: 2 * MIB,
        }],
        true,
    );
    assert!(matches!(r, Err(MigrationError::Stream(_))), "{r:?}");
    assert_eq!(dst.current().memory_usage().used, 0);
}

/// A broker that grants every reservation (the test evicts by hand).
struct Grants;

impl vgpu_backend::pager::Broker for Grants {
    fn reserve(&self, _bytes: u64) -> Result<(), String> {
        Ok(())
    }

    fn report(&self, _state: vgpu_backend::pager::MemState) {}
}

/// A sim GPU, its migratable layer and a pager over it.
fn paged(share: u64) -> (Arc<Migratable>, Arc<vgpu_backend::pager::Pager>) {
    let m = Arc::new(Migratable::new(sim(64 * MIB)));
    let p = Arc::new(vgpu_backend::pager::Pager::new(
        m.clone(),
        Arc::new(Grants),
        share,
    ));
    (m, p)
}

#[test]
fn swapped_pieces_of_an_oversubscribed_vgpu_arrive_and_belong_to_the_pager_there() {
    use vgpu_backend::pager::Tier;
    let (src_m, src_p) = paged(32 * MIB);
    let a_len = 6 * MIB as usize + 100;
    let b_len = 4 * MIB as usize;
    let a = src_p.alloc(a_len as u64).expect("a").addr;
    let b = src_p.alloc(b_len as u64).expect("b").addr;
    put(&*src_p, a, &pattern(1, a_len));
    put(&*src_p, b, &pattern(2, b_len));
    // Pieces of both go out: some to the swap area, some to host memory.
    assert!(src_p.evict(4 * MIB, Tier::Device) > 0);
    assert!(src_p.evict(4 * MIB, Tier::Host) > 0);
    let before = src_p.state();
    assert!(
        before.device_swap + before.host_swap >= 8 * MIB,
        "{before:?}"
    );
    let (dst_m, dst_p) = paged(32 * MIB);
    let (s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let (dst_m, dst_p) = (dst_m.clone(), dst_p.clone());
        std::thread::spawn(move || dst_m.receive_into(d, b"k", Some(&*dst_p), || {}))
    };
    let mut tx = src_m.send_to(s, b"k").expect("hello").through(&src_p);
    tx.precopy_round().expect("round 1");
    // Nothing was restored for the read.
    assert_eq!(src_p.state().resident, before.resident);
    // Written between rounds: the swapped piece written comes back here and goes again;
    // another piece is swapped out after it was sent (its bytes must not change there).
    let mut head = pattern(9, 4096);
    put(&*src_p, a, &head);
    src_p.evict(2 * MIB, Tier::Host);
    tx.precopy_round().expect("round 2");
    let report = tx.finish().expect("finish");
    assert_eq!(report.total, (a_len + b_len) as u64);
    let got = rx.join().expect("thread").expect("received");
    // Only the guest's allocations, not the swap area's buffers.
    assert_eq!(got.allocations, 2);
    let mut want_a = pattern(1, a_len);
    want_a[..4096].copy_from_slice(&head);
    assert_eq!(get(&*dst_p, a, a_len), want_a);
    assert_eq!(get(&*dst_p, b, b_len), pattern(2, b_len));
    // They are the pager's own there: charged, and evictable.
    let there = dst_p.state();
    assert_eq!(there.used, src_p.state().used, "{there:?}");
    assert_eq!(there.resident, there.used, "{there:?}");
    assert!(dst_p.evict(6 * MIB, Tier::Host) > 0);
    assert_eq!(get(&*dst_p, a, a_len), want_a);
    head = pattern(7, 4096);
    put(&*dst_p, b, &head);
    assert_eq!(get(&*dst_p, b, 4096), head);
    dst_p.free(a).expect("free a");
    dst_p.free(b).expect("free b");
    assert_eq!(dst_p.state().used, 0);
    // The source still holds its state.
    assert_eq!(get(&*src_p, a, a_len), want_a);
}

#[test]
fn a_refused_oversubscribed_move_leaves_the_pager_there_empty() {
    let (src_m, src_p) = paged(32 * MIB);
    src_p.alloc(8 * MIB).expect("a");
    // The destination's share cannot hold it.
    let (dst_m, dst_p) = paged(4 * MIB);
    let (s, d) = UnixStream::pair().expect("pair");
    let rx = {
        let (dst_m, dst_p) = (dst_m.clone(), dst_p.clone());
        std::thread::spawn(move || dst_m.receive_into(d, b"k", Some(&*dst_p), || {}))
    };
    src_m
        .send_to(s, b"k")
        .and_then(|tx| tx.through(&src_p).finish())
        .expect_err("refused");
    let e = rx.join().expect("thread").expect_err("refused");
    assert!(e.to_string().contains("charging"), "{e}");
    assert_eq!(dst_p.state().used, 0);
    assert_eq!(dst_m.current().memory_usage().used, 0);
}

#[test]
fn a_move_to_another_host_refuses_virtual_memory() {
    let src = Arc::new(Migratable::new(sim(64 * MIB)));
    let v = src.virtual_memory().expect("virtual memory");
    let va = v.reserve(2 * MIB, 0, 0).expect("reserve");
    let (s, _d) = UnixStream::pair().expect("pair");
    let e = src.send_to(s, b"k").map(drop).expect_err("not carried");
    assert!(matches!(e, MigrationError::VirtualMemory(1)), "{e}");
    assert!(e.to_string().contains("cuMemAddressFree"), "{e}");
    // Nothing frozen afterwards: the vGPU goes on making objects.
    let h = v.create(2 * MIB).expect("create after the refusal").handle;
    v.map(va, 2 * MIB, 0, h).expect("map");
}
