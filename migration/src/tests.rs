//! Migration between two sim GPUs: identical addresses and bytes, handles that survive,
//! writes during pre-copy re-sent, swapped-out pieces kept swapped, rollback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::pager::{LocalBroker, Pager};
use vgpu_backend::{
    Access, ArgValue, Backend, Launch, LaunchConfig, LaunchOne, LaunchStats, ModuleImage, Paging,
    SimConfig, SimGpu,
};
use vm_memory::VolatileSlice;

use super::*;

pub(crate) const MIB: u64 = 1 << 20;

pub(crate) fn sim(memory: u64) -> Arc<dyn Backend> {
    Arc::new(
        SimGpu::new(SimConfig {
            memory,
            va_size: 1 << 30,
            threads: 1,
            ..SimConfig::default()
        })
        .expect("sim"),
    )
}

pub(crate) fn put(b: &dyn Backend, addr: u64, bytes: &[u8]) {
    let mut v = bytes.to_vec();
    b.copy_htod(addr, &VolatileSlice::from(&mut v[..]))
        .expect("htod");
}

pub(crate) fn get(b: &dyn Backend, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut v[..]))
        .expect("dtoh");
    v
}

pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The handle of the built-in `fill` on `m`, its module loaded.
fn builtin_fill(m: &Migratable) -> u64 {
    let module = m
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    m.modules()
        .get_function(module, b"fill")
        .expect("fill")
        .handle
}

pub(crate) fn one_d() -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
    }
}

fn opts(mode: Mode) -> MigrateOptions {
    MigrateOptions {
        mode,
        max_downtime: Duration::from_millis(5),
        max_rounds: 6,
    }
}

#[test]
fn bytes_addresses_and_handles_survive_both_modes() {
    for mode in [Mode::StopCopy, Mode::Precopy] {
        let m = Migratable::new(sim(64 * MIB));
        let a = m.alloc(3 * MIB + 5).expect("a").addr;
        let b = m.alloc(4096).expect("b").addr;
        put(&m, a, &pattern(1, 3 << 20));
        put(&m, b, &pattern(2, 4096));
        let fill = builtin_fill(&m);
        let r = m
            .migrate(sim(64 * MIB), &opts(mode), |_| {})
            .expect("migrate");
        assert_eq!(r.total, 3 * MIB + 5 + 4096);
        assert!(r.precopy_bytes + r.stop_bytes >= r.total, "{r:?}");
        assert_eq!(get(&m, a, 3 << 20), pattern(1, 3 << 20), "{mode:?}");
        assert_eq!(get(&m, b, 4096), pattern(2, 4096));
        // The old function handle works on the new GPU.
        m.launch_one(
            fill,
            &one_d(),
            &[
                ArgValue::Ptr {
                    addr: b,
                    access: Access::Write,
                },
                ArgValue::U32(0x0101_0101),
                ArgValue::U64(1024),
            ],
        )
        .expect("launch after the move");
        assert!(get(&m, b, 4096).iter().all(|v| *v == 1));
        // New allocations do not collide with moved ones.
        let c = m.alloc(MIB).expect("c").addr;
        assert!(c >= b + 4096 || c + MIB <= a, "fresh address {c:#x}");
        m.free(a).expect("free a");
    }
}

#[test]
fn writes_during_precopy_are_sent_again() {
    let m = Arc::new(Migratable::new(sim(128 * MIB)));
    let bufs: Vec<u64> = (0..8)
        .map(|_| m.alloc(4 * MIB).expect("alloc").addr)
        .collect();
    for (i, a) in bufs.iter().enumerate() {
        put(&*m, *a, &pattern(i as u8, 4 << 20));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (m, stop, a) = (m.clone(), stop.clone(), bufs[0]);
        std::thread::spawn(move || {
            let mut v = 0u8;
            while !stop.load(Ordering::Relaxed) {
                v = v.wrapping_add(1);
                put(&*m, a, &vec![v; 4096]);
            }
            v
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let mut phases = Vec::new();
    let r = m
        .migrate(sim(128 * MIB), &opts(Mode::Precopy), |p| {
            phases.push(p.phase)
        })
        .expect("migrate");
    stop.store(true, Ordering::Relaxed);
    let last = writer.join().expect("writer");
    assert!(r.rounds >= 1 && r.precopy_bytes >= 32 * MIB, "{r:?}");
    assert!(phases.contains(&Phase::Draining) && phases.last() == Some(&Phase::Done));
    assert_eq!(
        get(&*m, bufs[0], 4096),
        vec![last; 4096],
        "the last write arrived"
    );
    for (i, a) in bufs.iter().enumerate().skip(1) {
        assert_eq!(get(&*m, *a, 4 << 20), pattern(i as u8, 4 << 20));
    }
}

#[test]
fn swapped_out_memory_stays_swapped_and_intact() {
    let broker = LocalBroker::new(8 * MIB, 0);
    let mig = Arc::new(Migratable::new(sim(64 * MIB)));
    let pager = Arc::new(Pager::new(mig.clone(), broker.member(1, 0), 32 * MIB));
    broker.attach(1, &pager);
    let bufs: Vec<u64> = (0..4)
        .map(|_| pager.alloc(4 * MIB).expect("alloc").addr)
        .collect();
    for (i, a) in bufs.iter().enumerate() {
        put(&*pager, *a, &pattern(i as u8 + 7, 4 << 20));
    }
    let before = pager.state();
    assert!(
        before.host_swap >= 8 * MIB,
        "half is swapped out: {before:?}"
    );
    mig.migrate(sim(64 * MIB), &opts(Mode::Precopy), |_| {})
        .expect("migrate");
    assert_eq!(pager.state().host_swap, before.host_swap, "still swapped");
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(
            get(&*pager, *a, 4 << 20),
            pattern(i as u8 + 7, 4 << 20),
            "buffer {i}"
        );
    }
    // Swap in and out on the new GPU.
    for (i, a) in bufs.iter().enumerate() {
        put(&*pager, *a, &pattern(i as u8 + 9, 4 << 20));
    }
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(get(&*pager, *a, 4 << 20), pattern(i as u8 + 9, 4 << 20));
    }
}

/// A piece swapped back in between the last pre-copy round and the stop: the pager
/// recommits it in one call and writes its bytes in the next, and the stop falls between
/// them. The target must hold the piece committed by then (a write into a decommitted sim
/// range faults the worker).
#[test]
fn a_piece_recommitted_just_before_the_stop_is_committed_on_the_target() {
    let mig = Arc::new(Migratable::new(sim(64 * MIB)));
    let a = mig.alloc(4 * MIB).expect("alloc").addr;
    put(&*mig, a, &pattern(3, 4 << 20));
    let granule = mig.commit_granule();
    assert!(granule > 0 && granule < 4 * MIB, "granule {granule}");
    mig.decommit(a, 0, granule).expect("decommit");
    let mut recommitted = false;
    mig.migrate(sim(64 * MIB), &opts(Mode::Precopy), |p| {
        if p.phase == Phase::Draining && !recommitted {
            // The pre-copy rounds are over and the target holds the piece decommitted.
            mig.recommit(a, 0, granule).expect("recommit");
            recommitted = true;
        }
    })
    .expect("migrate");
    assert!(recommitted, "the migration drained");
    // The pager's write of the piece's bytes, now on the target.
    let fresh = pattern(5, granule as usize);
    put(&*mig, a, &fresh);
    let back = get(&*mig, a, 4 << 20);
    assert_eq!(
        &back[..granule as usize],
        &fresh[..],
        "the recommitted piece"
    );
    assert_eq!(
        &back[granule as usize..],
        &pattern(3, 4 << 20)[granule as usize..],
        "the rest"
    );
}

/// Moves back and forth while a tenant reads and rewrites its buffers through an
/// oversubscribed pager, so that pieces are swapped out and back in all along the moves:
/// every read returns the last bytes written, and no move leaves a piece the pager holds
/// resident decommitted on the GPU serving it (a write there faults the worker).
#[test]
fn moves_while_the_pager_swaps_keep_every_byte() {
    const N: usize = 4;
    const LEN: usize = 4 << 20;
    let broker = LocalBroker::new(8 * MIB, 0);
    let mig = Arc::new(Migratable::new(sim(64 * MIB)));
    let pager = Arc::new(Pager::new(mig.clone(), broker.member(1, 0), 32 * MIB));
    broker.attach(1, &pager);
    let bufs: Vec<u64> = (0..N)
        .map(|_| pager.alloc(LEN as u64).expect("alloc").addr)
        .collect();
    for (i, a) in bufs.iter().enumerate() {
        put(&*pager, *a, &pattern(i as u8, LEN));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tenant = {
        let (pager, stop, bufs, done) = (pager.clone(), stop.clone(), bufs.clone(), done.clone());
        std::thread::spawn(move || {
            let mut seeds: [u8; N] = std::array::from_fn(|i| i as u8);
            let mut rounds = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // Round robin over twice the resident memory: each buffer comes back from
                // swap, is checked, and is overwritten whole (its pieces recommitted, then
                // written: two calls a move may fall between).
                let i = rounds % N;
                assert_eq!(
                    get(&*pager, bufs[i], LEN),
                    pattern(seeds[i], LEN),
                    "buffer {i} in round {rounds}"
                );
                seeds[i] = seeds[i].wrapping_add(N as u8);
                put(&*pager, bufs[i], &pattern(seeds[i], LEN));
                rounds += 1;
                done.store(rounds, Ordering::Relaxed);
            }
            (seeds, rounds)
        })
    };
    // At least 8 moves, and moves until the tenant went round its buffers 4 times.
    let mut moves = 0;
    while moves < 8 || (done.load(Ordering::Relaxed) < 4 * N && !tenant.is_finished()) {
        mig.migrate(sim(64 * MIB), &opts(Mode::Precopy), |_| {})
            .expect("migrate");
        moves += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (seeds, rounds) = tenant.join().expect("the tenant's reads were intact");
    assert!(
        pager.state().host_swap > 0,
        "the pager swapped: {:?}",
        pager.state()
    );
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(get(&*pager, *a, LEN), pattern(seeds[i], LEN), "buffer {i}");
    }
    eprintln!("{rounds} tenant rounds across {moves} moves");
}

#[test]
fn allocations_freed_and_made_again_during_precopy_do_not_fail_it() {
    // What the pager does with its device swap buffers beside a move: 2 MiB allocations
    // freed and allocated again, often at the same address, while pre-copy reads them.
    let m = Arc::new(Migratable::new(sim(64 * MIB)));
    let keep = m.alloc(8 * MIB).expect("alloc").addr;
    put(&*m, keep, &pattern(9, 8 << 20));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (m, stop) = (m.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let bufs: Vec<u64> = (0..4)
                    .map(|_| m.alloc(2 * MIB).expect("alloc").addr)
                    .collect();
                for b in bufs {
                    m.free(b).expect("free");
                }
                n += 1;
            }
            n
        })
    };
    for _ in 0..40 {
        m.migrate(sim(64 * MIB), &opts(Mode::Precopy), |_| {})
            .expect("a freed allocation is not a failed read");
    }
    stop.store(true, Ordering::Relaxed);
    let n = churn.join().expect("churn");
    assert!(n > 0);
    assert_eq!(get(&*m, keep, 8 << 20), pattern(9, 8 << 20));
}

#[test]
fn a_full_target_rolls_back_and_the_vgpu_keeps_working() {
    let m = Migratable::new(sim(64 * MIB));
    let a = m.alloc(16 * MIB).expect("a").addr;
    put(&m, a, &pattern(3, 16 << 20));
    let e = m
        .migrate(sim(8 * MIB), &opts(Mode::Precopy), |_| {})
        .expect_err("target too small");
    assert!(matches!(e, MigrationError::Target { .. }), "{e}");
    assert!(e.to_string().contains("target GPU"), "{e}");
    assert_eq!(
        get(&m, a, 16 << 20),
        pattern(3, 16 << 20),
        "still on the source"
    );
    put(&m, a, &pattern(4, 16 << 20));
    m.migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {})
        .expect("a later migration works");
    assert_eq!(get(&m, a, 16 << 20), pattern(4, 16 << 20));
}

#[test]
fn shared_mappings_refuse_to_move() {
    let m = Migratable::new(sim(64 * MIB));
    let fd = vgpu_backend::sim::shared_object(MIB).expect("memfd");
    let addr = m
        .shared_memory()
        .expect("shared memory")
        .import(fd, MIB, false)
        .expect("import");
    let e = m
        .migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {})
        .expect_err("shm");
    assert!(matches!(e, MigrationError::SharedMappings(1)), "{e}");
    m.free(addr).expect("detach");
    m.migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {})
        .expect("movable once detached");
}

#[test]
fn virtual_memory_moves_with_its_addresses_handles_and_bytes() {
    for mode in [Mode::Precopy, Mode::StopCopy] {
        let m = Migratable::new(sim(64 * MIB));
        let v = m.virtual_memory().expect("virtual memory");
        let va = v.reserve(16 * MIB, 0, 0).expect("reserve");
        let a = v.create(4 * MIB).expect("create a");
        let b = v.create(2 * MIB).expect("create b");
        v.map(va, 4 * MIB, 0, a.handle).expect("map a");
        // b twice: one allocation, two addresses.
        v.map(va + 4 * MIB, 2 * MIB, 0, b.handle).expect("map b");
        v.map(va + 8 * MIB, 2 * MIB, 0, b.handle)
            .expect("map b again");
        v.release(b.handle).expect("only the mappings hold b");
        put(&m, va, &pattern(7, 4 << 20));
        put(&m, va + 4 * MIB, &pattern(8, 2 << 20));
        let used = m.memory_usage().used;
        m.migrate(sim(64 * MIB), &opts(mode), |_| {})
            .expect("migrate");
        assert_eq!(
            m.memory_usage().used,
            used,
            "{mode:?}: charged the same there"
        );
        assert_eq!(
            get(&m, va, 4 << 20),
            pattern(7, 4 << 20),
            "{mode:?}: a's bytes"
        );
        assert_eq!(
            get(&m, va + 8 * MIB, 2 << 20),
            pattern(8, 2 << 20),
            "{mode:?}: b's bytes at its other address"
        );
        // Still one allocation behind b's two mappings.
        put(&m, va + 4 * MIB, &[9u8; 16]);
        assert_eq!(
            get(&m, va + 8 * MIB, 16),
            vec![9u8; 16],
            "{mode:?}: aliases"
        );
        // The handles the guest holds work there; new ones never collide.
        let v = m.virtual_memory().expect("virtual memory");
        let [h, ..] = v.retain(va + 8 * MIB).expect("retain b");
        assert_eq!(h, b.handle);
        let c = v.create(2 * MIB).expect("create c");
        assert!(c.handle > b.handle, "{mode:?}: handles are never reused");
        for h in [a.handle, b.handle, c.handle] {
            v.release(h).expect("release");
        }
        v.unmap(va, 16 * MIB).expect("unmap");
        v.free_range(va, 16 * MIB).expect("free");
        m.synchronize();
        assert_eq!(v.objects(), 0);
    }
}

#[test]
fn an_allocation_mapped_nowhere_with_bytes_refuses_to_move() {
    let m = Migratable::new(sim(64 * MIB));
    let v = m.virtual_memory().expect("virtual memory");
    let va = v.reserve(2 * MIB, 0, 0).expect("reserve");
    let a = v.create(2 * MIB).expect("create");
    v.map(va, 2 * MIB, 0, a.handle).expect("map");
    put(&m, va, &pattern(5, 2 << 20));
    v.unmap(va, 2 * MIB)
        .expect("unmap: the handle keeps the bytes");
    let e = m
        .migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {})
        .expect_err("bytes it cannot copy");
    assert!(matches!(e, MigrationError::Source(_)), "{e}");
    assert!(e.to_string().contains("mapped nowhere"), "{e}");
    // Still here, whole: mapped again, the bytes are there.
    v.map(va, 2 * MIB, 0, a.handle).expect("map again");
    assert_eq!(get(&m, va, 2 << 20), pattern(5, 2 << 20));
    m.migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {})
        .expect("movable once mapped");
    assert_eq!(get(&m, va, 2 << 20), pattern(5, 2 << 20));
}

#[test]
fn an_idle_vgpu_is_copied_once_and_nothing_is_left_for_the_stop() {
    let m = Migratable::new(sim(64 * MIB));
    let bufs: Vec<u64> = (0..4)
        .map(|_| m.alloc(4 * MIB).expect("alloc").addr)
        .collect();
    for (i, a) in bufs.iter().enumerate() {
        put(&m, *a, &pattern(i as u8, 4 << 20));
    }
    let r = m
        .migrate(sim(64 * MIB), &opts(Mode::Precopy), |_| {})
        .expect("migrate");
    assert_eq!(r.rounds, 1, "{r:?}");
    assert_eq!(r.precopy_bytes, 16 * MIB, "{r:?}");
    assert_eq!(r.stop_bytes, 0, "nothing was written since round 1: {r:?}");
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(get(&m, *a, 4 << 20), pattern(i as u8, 4 << 20));
    }
}

#[test]
fn the_migratable_layer_offers_every_capability_and_what_goes_through_it_moves() {
    let m = Migratable::new(sim(64 * MIB));
    let offered = [
        m.paging().is_some(),
        m.relocation().is_some(),
        m.shared_memory().is_some(),
        m.host_memory().is_some(),
    ];
    assert_eq!(
        offered, [true; 4],
        "paging, relocation, shared, host memory"
    );
    // An allocation placed at a given address is the vGPU's like any other: it moves.
    let at = m.info().va_base + 512 * MIB;
    let placed = m
        .relocation()
        .expect("relocation")
        .alloc_at(at, MIB)
        .expect("alloc_at");
    assert_eq!(placed.addr, at);
    put(&m, at, &pattern(7, 1 << 20));
    // A shared object mapped through it is counted: it cannot move with the vGPU.
    let shared = m.shared_memory().expect("shared memory");
    let object = shared.export(MIB).expect("export");
    let mapping = shared.import(object, MIB, false).expect("import");
    let refused = m.migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {});
    assert!(
        matches!(refused, Err(MigrationError::SharedMappings(1))),
        "{refused:?}"
    );
    m.free(mapping).expect("unmap");
    let r = m
        .migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {})
        .expect("migrate");
    assert_eq!(r.total, MIB, "the placed allocation moved");
    assert_eq!(get(&m, at, 1 << 20), pattern(7, 1 << 20));
}

#[test]
fn a_launch_that_may_write_through_a_pointer_it_does_not_name_marks_everything_written() {
    let m = Migratable::new(sim(64 * MIB));
    let a = m.alloc(MIB).expect("alloc").addr;
    let b = m.alloc(MIB).expect("alloc").addr;
    let written = |addr: u64| {
        vgpu_backend::sync::lock(&m.allocs)
            .get(&addr)
            .map(|x| x.written.load(Ordering::Acquire))
            .expect("tracked")
    };
    let round = |m: &Migratable| m.epoch.fetch_add(1, Ordering::SeqCst) + 1;
    // A pointer argument that writes: only its allocation.
    let e = round(&m);
    m.mark_launch(&[ArgValue::Ptr {
        addr: a,
        access: Access::ReadWrite,
    }]);
    assert_eq!((written(a), written(b)), (e, 1));
    // A by-value struct (a CUTLASS params struct, a TMA tensor map), an integer or small
    // by-value bytes holding an address: every allocation, as any may be written.
    for args in [
        vec![ArgValue::Blob {
            offset: 0,
            len: 128,
        }],
        vec![ArgValue::U64(b)],
        vec![ArgValue::Bytes { len: 8, bits: b }],
    ] {
        let e = round(&m);
        m.mark_launch(&args);
        assert_eq!((written(a), written(b)), (e, e), "{args:?}");
    }
    // Plain values: nothing.
    let before = (written(a), written(b));
    round(&m);
    m.mark_launch(&[ArgValue::U32(7), ArgValue::F32(1.0), ArgValue::U64(3)]);
    assert_eq!((written(a), written(b)), before);
}

#[test]
fn device_mapped_host_memory_moves_with_the_vgpu() {
    let m = Migratable::new(sim(64 * MIB));
    let host: &'static mut [u32] = Box::leak(vec![0u32; 1024].into_boxed_slice());
    let p = host.as_mut_ptr();
    let region = vgpu_backend::HostRegion {
        addr: p as usize,
        len: 4096,
    };
    let read = |i: usize| {
        // SAFETY: `p` points to 1024 leaked u32s; nothing writes while we read.
        unsafe { std::ptr::read_volatile(p.add(i)) }
    };
    let h = m.host_memory().expect("host memory");
    h.map_for_device(region).expect("mapped");
    m.memset(region.addr as u64, 5, 4, 2)
        .expect("memset on the source");
    m.migrate(sim(64 * MIB), &opts(Mode::StopCopy), |_| {})
        .expect("moves");
    m.memset(region.addr as u64 + 8, 6, 4, 2)
        .expect("memset on the target");
    assert_eq!([read(0), read(1), read(2), read(3)], [5, 5, 6, 6]);
    m.host_memory()
        .expect("host memory")
        .unmap_for_device(region);
    assert!(
        m.memset(region.addr as u64, 7, 4, 1).is_err(),
        "unmapped: host-only again"
    );
    assert_eq!(read(0), 5);
}

/// The sim, telling whether its `launch_then` call has returned yet.
struct Watched {
    sim: Arc<dyn Backend>,
    returned: AtomicBool,
}

impl Backend for Watched {
    fn launch(&self, launches: &[Launch<'_>]) -> Vec<vgpu_backend::Result<LaunchStats>> {
        self.sim.launch(launches)
    }
    fn launch_then(
        &self,
        launches: &[Launch<'_>],
        ended: &mut dyn FnMut(&[vgpu_backend::Result<LaunchStats>]),
    ) -> Vec<vgpu_backend::Result<LaunchStats>> {
        self.returned.store(false, Ordering::SeqCst);
        let r = self.sim.launch_then(launches, ended);
        self.returned.store(true, Ordering::SeqCst);
        r
    }
    vgpu_backend::forward_backend!(sim:
        info, memory_usage, alloc, free, check_range, copy_htod, copy_dtoh, copy_dtod, memset,
        synchronize, modules, paging, relocation, shared_memory, host_memory, virtual_memory
    );
}

#[test]
fn launches_are_answered_from_inside_the_gpu_s_call_unless_one_is_unknown() {
    let gpu = Arc::new(Watched {
        sim: sim(64 * MIB),
        returned: AtomicBool::new(false),
    });
    let m = Migratable::new(gpu.clone());
    let b = m.alloc(4096).expect("b").addr;
    let fill = builtin_fill(&m);
    let args = [
        ArgValue::Ptr {
            addr: b,
            access: Access::Write,
        },
        ArgValue::U32(0x0202_0202),
        ArgValue::U64(1024),
    ];
    let launch = |function| Launch {
        function,
        config: one_d(),
        cluster: vgpu_backend::NO_CLUSTER,
        args: &args,
        blob: &[],
    };
    let run = |launches: &[Launch<'_>]| {
        let mut seen = Vec::new();
        let r = m.launch_then(launches, &mut |results| {
            seen.push((
                gpu.returned.load(Ordering::SeqCst),
                results.iter().map(Result::is_ok).collect::<Vec<_>>(),
            ));
        });
        (seen, r.iter().map(Result::is_ok).collect::<Vec<_>>())
    };
    // Every function known: the GPU's own call answers, before it returns.
    let (seen, r) = run(&[launch(fill), launch(fill)]);
    assert_eq!(seen, vec![(false, vec![true, true])]);
    assert_eq!(r, vec![true, true]);
    assert!(get(&m, b, 4096).iter().all(|v| *v == 2));
    // One unknown: answered once, after the GPU's call, with its error in place.
    let (seen, r) = run(&[launch(fill), launch(fill + 1000)]);
    assert_eq!(seen, vec![(true, vec![true, false])]);
    assert_eq!(r, vec![true, false]);
}
