//! Pager tests on the sim backend: every byte survives evictions to both tiers, restores
//! are driven by what each operation touches, and refusals leave everything else alone.

use std::sync::Arc;

use vgpu_proto::{Access, ArgValue};
use vm_memory::VolatileSlice;

use super::*;
use crate::{LaunchConfig, LaunchOne, ModuleImage, SimConfig, SimGpu};

const MIB: u64 = 1 << 20;

fn sim(memory: u64) -> Arc<dyn Backend> {
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

/// A pager for member `id` of `broker`, allowed `share` bytes.
fn pager(broker: &Arc<LocalBroker>, id: u32, priority: i32, share: u64) -> Arc<Pager> {
    let p = Arc::new(Pager::new(
        sim(share + 64 * MIB),
        broker.member(id, priority),
        share,
    ));
    broker.attach(id, &p);
    p
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn put(b: &dyn Backend, addr: u64, bytes: &[u8]) -> Result<u64> {
    let mut buf = bytes.to_vec();
    b.copy_htod(addr, &VolatileSlice::from(&mut buf[..]))
}

fn get(b: &dyn Backend, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut buf[..]))
        .expect("dtoh");
    buf
}

#[test]
fn oversubscribed_twice_every_byte_survives_evictions() {
    // 8 MiB of device memory, 16 MiB of data: every pass evicts and restores.
    let broker = LocalBroker::new(8 * MIB, 2 * MIB);
    let p = pager(&broker, 1, 0, 16 * MIB);
    let size = 3 * MIB + 4096 + 17;
    let bufs: Vec<u64> = (0..5).map(|_| p.alloc(size).expect("alloc").addr).collect();
    for (i, a) in bufs.iter().enumerate() {
        put(&*p, *a, &pattern(i as u64, size as usize)).expect("fill");
    }
    for round in 0..3 {
        for (i, a) in bufs.iter().enumerate() {
            assert_eq!(
                get(&*p, *a, size as usize),
                pattern(i as u64 + round * 10, size as usize),
                "buffer {i} after round {round}"
            );
            put(
                &*p,
                *a,
                &pattern(i as u64 + (round + 1) * 10, size as usize),
            )
            .expect("refill");
        }
    }
    let s = p.state();
    assert!(s.evictions > 0 && s.restores > 0, "{s:?}");
    assert!(s.resident <= 8 * MIB, "resident within the pool: {s:?}");
    assert_eq!(s.resident + s.device_swap + s.host_swap, s.used, "{s:?}");
    assert!(broker.planner().resident() <= 8 * MIB);
}

#[test]
fn reads_of_swapped_memory_restore_nothing_and_overwrites_read_nothing_back() {
    let broker = LocalBroker::new(4 * MIB, 0);
    let p = pager(&broker, 1, 0, 8 * MIB);
    let a = p.alloc(4 * MIB).expect("a").addr;
    put(&*p, a, &pattern(1, 4 << 20)).expect("fill a");
    let b = p.alloc(4 * MIB).expect("b: evicts a").addr;
    let s0 = p.state();
    assert_eq!(s0.host_swap, 4 * MIB, "no swap area: a went to host memory");
    assert_eq!(get(&*p, a, 4 << 20), pattern(1, 4 << 20), "read from host");
    assert_eq!(p.state().restores, s0.restores, "a read restores nothing");
    // A partial read across a piece boundary.
    let mid = get(&*p, a + 2 * MIB - 8, 16);
    assert_eq!(mid, pattern(1, 4 << 20)[(2 << 20) - 8..(2 << 20) + 8]);
    // Overwriting a whole swapped piece gets memory back without reading it.
    put(&*p, a, &vec![7u8; 2 << 20]).expect("overwrite first piece");
    let s1 = p.state();
    assert_eq!(s1.swap_in_bytes, s0.swap_in_bytes, "nothing read back");
    assert_eq!(s1.restores, s0.restores + 1, "one piece restored");
    let whole = get(&*p, a, 4 << 20);
    assert!(whole[..2 << 20].iter().all(|v| *v == 7));
    assert_eq!(whole[2 << 20..], pattern(1, 4 << 20)[2 << 20..]);
    let _ = b;
}

#[test]
fn launches_restore_what_their_pointers_reach() {
    let broker = LocalBroker::new(4 * MIB, 4 * MIB);
    let p = pager(&broker, 1, 0, 16 * MIB);
    let n = (1 << 20) / 4;
    let x = p.alloc(4 * n).expect("x").addr;
    let y = p.alloc(4 * n).expect("y").addr;
    let xs: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    put(&*p, x, &xs).expect("x");
    put(&*p, y, &vec![0u8; 4 * n as usize]).expect("y");
    // Two more megabyte-sized buffers push x and y out.
    let _c = p.alloc(2 * MIB).expect("c");
    let _d = p.alloc(2 * MIB).expect("d");
    assert!(p.state().device_swap > 0, "{:?}", p.state());
    let m = p
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    let f = p.modules().get_function(m, b"saxpy").expect("saxpy").handle;
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
    };
    p.launch_one(
        f,
        &cfg,
        &[
            ArgValue::F32(2.0),
            ArgValue::Ptr {
                addr: x,
                access: Access::Read,
            },
            ArgValue::Ptr {
                addr: y,
                access: Access::ReadWrite,
            },
            ArgValue::U64(n),
        ],
    )
    .expect("saxpy over swapped buffers");
    let out = get(&*p, y, 4 * n as usize);
    for (i, c) in out.chunks_exact(4).enumerate().step_by(997) {
        assert_eq!(f32::from_le_bytes([c[0], c[1], c[2], c[3]]), 2.0 * i as f32);
    }
}

#[test]
fn a_batch_restores_what_it_reaches_and_runs_one_by_one_when_it_cannot_all_fit() {
    let broker = LocalBroker::new(4 * MIB, 4 * MIB);
    let p = pager(&broker, 1, 0, 16 * MIB);
    let n = (3 << 20) / 4;
    let a = p.alloc(4 * n).expect("a").addr;
    let b = p.alloc(4 * n).expect("b").addr;
    let m = p
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    let fill = p.modules().get_function(m, b"fill").expect("fill").handle;
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
    };
    let to = |addr| ArgValue::Ptr {
        addr,
        access: Access::Write,
    };
    let (fa, fb) = (
        [to(a), ArgValue::U32(1), ArgValue::U64(n)],
        [to(b), ArgValue::U32(2), ArgValue::U64(n)],
    );
    let item = |args| crate::Launch {
        function: fill,
        config: cfg,
        cluster: crate::NO_CLUSTER,
        args,
        blob: &[],
    };
    // Both 3 MiB buffers cannot be resident at once on 4 MiB: one by one.
    let r = p.launch(&[item(&fa), item(&fb)]);
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    // One buffer twice: pinned once for the whole batch.
    let fb2 = [to(b), ArgValue::U32(3), ArgValue::U64(n)];
    let r = p.launch(&[item(&fb), item(&fb2)]);
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    for (addr, want) in [(a, 1u8), (b, 3)] {
        let v = get(&*p, addr, 4 * n as usize);
        assert!(v.chunks_exact(4).all(|c| c == [want, 0, 0, 0]), "{addr:#x}");
    }
}

#[test]
fn three_vgpus_share_a_pool_and_priorities_choose_the_victim() {
    let broker = LocalBroker::new(8 * MIB, 2 * MIB);
    let low = pager(&broker, 1, 0, 8 * MIB);
    let mid = pager(&broker, 2, 1, 8 * MIB);
    let high = pager(&broker, 3, 2, 8 * MIB);
    let l = low.alloc(4 * MIB).expect("low").addr;
    put(&*low, l, &pattern(1, 4 << 20)).expect("fill");
    let m = mid.alloc(4 * MIB).expect("mid").addr;
    put(&*mid, m, &pattern(2, 4 << 20)).expect("fill");
    let h = high.alloc(4 * MIB).expect("high: evicts low").addr;
    assert_eq!(low.state().resident, 0, "{:?}", low.state());
    assert_eq!(
        mid.state().resident,
        4 * MIB,
        "the mid-priority vGPU kept its memory"
    );
    put(&*high, h, &pattern(3, 4 << 20)).expect("fill");
    // The low-priority vGPU cannot take memory back from higher ones.
    let e = put(&*low, l, &pattern(4, 4 << 20)).expect_err("no room for low");
    assert!(matches!(e, BackendError::MemoryPressure { .. }), "{e}");
    assert_eq!(
        get(&*low, l, 4 << 20),
        pattern(1, 4 << 20),
        "low's bytes intact"
    );
    assert_eq!(get(&*mid, m, 4 << 20), pattern(2, 4 << 20));
    assert_eq!(get(&*high, h, 4 << 20), pattern(3, 4 << 20));
    // Once the high one frees, low gets its memory back.
    high.free(h).expect("free");
    put(&*low, l, &pattern(4, 4 << 20)).expect("room again");
    assert_eq!(get(&*low, l, 4 << 20), pattern(4, 4 << 20));
}

#[test]
fn concurrent_vgpus_lose_no_byte() {
    let broker = LocalBroker::new(12 * MIB, 4 * MIB);
    let threads: Vec<_> = (0..3u32)
        .map(|id| {
            let p = pager(&broker, id, 0, 8 * MIB);
            std::thread::spawn(move || {
                let size = 2 * MIB;
                let bufs: Vec<u64> = (0..4).map(|_| p.alloc(size).expect("alloc").addr).collect();
                let mut version = [0u64; 4];
                for (i, a) in bufs.iter().enumerate() {
                    put(
                        &*p,
                        *a,
                        &pattern(u64::from(id) * 100 + i as u64, size as usize),
                    )
                    .expect("fill");
                    version[i] = u64::from(id) * 100 + i as u64;
                }
                for round in 0..12u64 {
                    let i = (round as usize * 3 + id as usize) % 4;
                    assert_eq!(
                        get(&*p, bufs[i], size as usize),
                        pattern(version[i], size as usize),
                        "vGPU {id} buffer {i} round {round}"
                    );
                    version[i] += 1000;
                    put(&*p, bufs[i], &pattern(version[i], size as usize)).expect("write");
                }
                for (i, a) in bufs.iter().enumerate() {
                    assert_eq!(
                        get(&*p, *a, size as usize),
                        pattern(version[i], size as usize)
                    );
                }
                p.state()
            })
        })
        .collect();
    let states: Vec<MemState> = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    assert!(
        states.iter().map(|s| s.evictions).sum::<u64>() > 0,
        "{states:?}"
    );
}

#[test]
fn shares_are_hard_limits_and_bad_sizes_fail() {
    let broker = LocalBroker::new(64 * MIB, 0);
    let p = pager(&broker, 1, 0, 4 * MIB);
    assert!(matches!(p.alloc(0), Err(BackendError::ZeroSize)));
    assert!(matches!(
        p.alloc(u64::MAX),
        Err(BackendError::OutOfMemory { .. })
    ));
    let a = p.alloc(4 * MIB).expect("whole share");
    assert!(matches!(p.alloc(1), Err(BackendError::OutOfMemory { .. })));
    assert!(matches!(
        p.free(a.addr + 1),
        Err(BackendError::NotAllocated { .. })
    ));
    p.free(a.addr).expect("free");
    assert!(matches!(
        p.free(a.addr),
        Err(BackendError::NotAllocated { .. })
    ));
    assert_eq!(p.state().used, 0);
    assert!(p.check_range(a.addr, 1).is_err(), "freed range is gone");
}

#[test]
fn busy_allocations_are_not_evicted() {
    let broker = LocalBroker::new(4 * MIB, 0);
    let p = pager(&broker, 1, 0, 8 * MIB);
    let a = p.alloc(4 * MIB).expect("a").addr;
    let (pin, _) = p.pin(a, 1).expect("pin");
    assert_eq!(p.evict(4 * MIB, Tier::Host), 0, "pinned: nothing to evict");
    assert!(matches!(
        p.alloc(MIB),
        Err(BackendError::MemoryPressure { .. })
    ));
    drop(pin);
    p.alloc(MIB).expect("idle now: evicted");
}

#[test]
fn shared_objects_map_and_stay_resident() {
    let broker = LocalBroker::new(4 * MIB, 0);
    let p = pager(&broker, 1, 0, 8 * MIB);
    let fd = crate::sim::shared_object(MIB).expect("memfd");
    let addr = p
        .shared_memory()
        .expect("shared memory")
        .import(fd, MIB, false)
        .expect("import");
    put(&*p, addr, &pattern(9, 1 << 20)).expect("write shared");
    assert_eq!(get(&*p, addr, 1 << 20), pattern(9, 1 << 20));
    assert_eq!(
        p.state().used,
        0,
        "shared objects are not charged to the vGPU"
    );
    let _ = p.alloc(4 * MIB).expect("alloc");
    assert_eq!(
        p.evict(8 * MIB, Tier::Host),
        4 * MIB,
        "only the owned allocation goes"
    );
    assert_eq!(
        get(&*p, addr, 1 << 20),
        pattern(9, 1 << 20),
        "the shared object stayed"
    );
    p.free(addr).expect("detach");
    assert!(p.check_range(addr, 1).is_err());
}

#[test]
fn mapped_memory_counts_against_the_share_and_is_never_swapped() {
    let broker = LocalBroker::new(256 * MIB, 0);
    let p = pager(&broker, 1, 0, 16 * MIB);
    let v = p.virtual_memory().expect("the pager offers virtual memory");
    let va = v.reserve(8 * MIB, 0, 0).expect("reserve");
    let c = v.create(8 * MIB).expect("create");
    assert_eq!(p.memory_usage().used, 8 * MIB, "charged to the share");
    assert!(
        matches!(v.create(10 * MIB), Err(BackendError::OutOfMemory { .. })),
        "past the share"
    );
    assert!(matches!(
        p.alloc(10 * MIB),
        Err(BackendError::OutOfMemory { .. })
    ));
    v.map(va, 8 * MIB, 0, c.handle).expect("map");
    let data = pattern(3, 8 * MIB as usize);
    put(&*p, va, &data).expect("htod");
    // Eviction leaves the mapping where it is.
    p.evict(u64::MAX, Tier::Host);
    assert_eq!(get(&*p, va, data.len()), data);
    assert!(matches!(p.free(va), Err(BackendError::NotAllocated { .. })));
    p.check_range(va, 8 * MIB).expect("still mapped");
    v.unmap(va, 8 * MIB).expect("unmap");
    v.release(c.handle).expect("release");
    assert!(p.check_range(va, 1).is_err());
    assert_eq!(p.memory_usage().used, 0, "everything back");
    v.free_range(va, 8 * MIB).expect("free");
}

#[test]
fn physical_allocations_are_reserved_with_the_broker() {
    // A GPU of 8 MiB for a vGPU whose share is 16 MiB: the broker refuses more resident
    // memory than the GPU has, and counts what it granted.
    let broker = LocalBroker::new(8 * MIB, 0);
    let p = pager(&broker, 1, 0, 16 * MIB);
    let v = p.virtual_memory().expect("virtual memory");
    assert!(
        matches!(v.create(12 * MIB), Err(BackendError::MemoryPressure { .. })),
        "more than the GPU holds"
    );
    assert_eq!(p.memory_usage().used, 0, "nothing charged");
    let c = v.create(6 * MIB).expect("fits the GPU");
    assert!(
        p.alloc(4 * MIB).is_err(),
        "the physical allocation is resident: 4 MiB more do not fit the GPU"
    );
    v.release(c.handle).expect("release");
    p.alloc(4 * MIB).expect("room again");
}

#[test]
fn device_mapped_host_memory_passes_the_pager_and_is_never_swapped() {
    let broker = LocalBroker::new(8 * MIB, 2 * MIB);
    let p = pager(&broker, 1, 0, 8 * MIB);
    let host: &'static mut [u32] = Box::leak(vec![0u32; 1024].into_boxed_slice());
    let at = host.as_mut_ptr();
    let region = crate::HostRegion {
        addr: at as usize,
        len: 4096,
    };
    // Before it is mapped: no allocation of the pager's, refused.
    assert!(p.memset(region.addr as u64, 3, 4, 1).is_err());
    p.host_memory()
        .expect("host memory")
        .map_for_device(region)
        .expect("mapped");
    p.check_range(region.addr as u64, 4096).expect("in range");
    p.memset(region.addr as u64, 3, 4, 2).expect("memset");
    let d = p.alloc(MIB).expect("alloc").addr;
    put(&*p, d, &[9u8; 8]).expect("htod");
    p.copy_dtod(region.addr as u64 + 8, d, 8)
        .expect("device to host memory");
    // SAFETY: `at` points to 1024 leaked u32s; nothing runs on them now.
    let got: Vec<u32> = (0..4)
        .map(|i| unsafe { std::ptr::read_volatile(at.add(i)) })
        .collect();
    assert_eq!(got, [3, 3, 0x0909_0909, 0x0909_0909]);
    assert!(
        p.memset(region.addr as u64 + 4092, 0, 4, 2).is_err(),
        "past the region's end"
    );
}
