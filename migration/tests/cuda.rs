//! Live migration on real GPUs: a vGPU served by the cuda backend moves
//! between GPUs in one process, the way a worker moves it, while a guest thread keeps
//! copying and launching. With two GPUs it moves 0 -> 1 -> 1 -> 0 -> 0 -> 1 -> 0 (across and
//! onto the same GPU); with one it moves onto the same GPU through the same code path.
//! Every byte is checked after every move; a module's variables keep their values and the
//! addresses the guest was given.
//!
//! Without a CUDA GPU every test prints `SKIPPED (cuda): why` and passes; with
//! `VGPU_REQUIRE_CUDA=1` a missing GPU fails them, so a run on the GPU machine cannot
//! pass by skipping.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vgpu_backend::pager::{LocalBroker, Pager};
use vgpu_backend::{
    Access, ArgValue, Backend, CudaConfig, CudaGpu, HostRegion, LaunchConfig, LaunchOne,
    ModuleImage, DEFAULT_VA_BASE,
};
use vgpu_migration::{Migratable, MigrateOptions, Mode};
use vm_memory::VolatileSlice;

const MIB: u64 = 1 << 20;
const VA_SIZE: u64 = 16 << 30;

/// The number of GPUs, or None (after saying why) when cuda cannot run here.
fn gpus() -> Option<i32> {
    match CudaGpu::probe() {
        Ok(p) => {
            eprintln!("cuda: {} device(s), {}", p.devices, p.name);
            Some(p.devices)
        }
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
            );
            eprintln!("SKIPPED (cuda): {why}");
            None
        }
    }
}

/// A fresh address range per test (tests run in parallel in one process).
fn va_base() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    DEFAULT_VA_BASE + (NEXT.fetch_add(1, Ordering::Relaxed) + 1) * (64 << 30)
}

/// What GPU `ordinal`'s context reserves at the default limits (charged to every share).
fn context_reserve(ordinal: i32) -> u64 {
    CudaGpu::context_reserve_of(ordinal, &vgpu_backend::cuda::ContextLimits::default())
        .expect("context reserve")
        .total()
        .expect("reserve fits u64")
}

fn gpu(ordinal: i32, va_base: u64, target: bool) -> Arc<dyn Backend> {
    Arc::new(
        CudaGpu::new(CudaConfig {
            ordinal,
            memory: 1 << 30,
            va_base,
            va_size: VA_SIZE,
            migration_target: target,
            ..CudaConfig::default()
        })
        .expect("cuda backend"),
    )
}

/// The GPUs a vGPU on GPU 0 visits: across and onto the same GPU where there are two.
fn tour(n: i32) -> Vec<i32> {
    if n >= 2 {
        vec![1, 1, 0, 0, 1, 0]
    } else {
        vec![0; 4]
    }
}

fn put(b: &dyn Backend, addr: u64, bytes: &[u8]) {
    let mut v = bytes.to_vec();
    b.copy_htod(addr, &VolatileSlice::from(&mut v[..]))
        .expect("htod");
}

fn get(b: &dyn Backend, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut v[..]))
        .expect("dtoh");
    v
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed ^ (i >> 12) as u8)
        })
        .collect()
}

fn opts(mode: Mode) -> MigrateOptions {
    MigrateOptions {
        mode,
        max_downtime: Duration::from_millis(5),
        max_rounds: 8,
    }
}

fn one_d() -> LaunchConfig {
    LaunchConfig {
        grid: [4, 1, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

#[test]
fn a_running_vgpu_tours_the_gpus_and_every_byte_arrives() {
    let Some(n) = gpus() else { return };
    let base = va_base();
    let m = Arc::new(Migratable::new(gpu(0, base, false)));
    let sizes = [64 * MIB, 8 * MIB, 8 * MIB + 4096, 2 * MIB, 4096];
    let bufs: Vec<u64> = sizes
        .iter()
        .map(|s| m.alloc(*s).expect("alloc").addr)
        .collect();
    for (i, (a, s)) in bufs.iter().zip(sizes).enumerate() {
        put(&*m, *a, &pattern(i as u8, s as usize));
    }
    let module = m
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    let fill = m
        .modules()
        .get_function(module, b"fill")
        .expect("fill")
        .handle;
    // The guest: uploads from registered (pinned) memory into `hot` and launches `fill`
    // into `out`, checking both, while the vGPU moves.
    let hot = m.alloc(MIB).expect("hot").addr;
    let out = m.alloc(MIB).expect("out").addr;
    let staging = Arc::new(Mutex::new(vec![0u8; MIB as usize]));
    let region = {
        let v = staging.lock().expect("staging");
        HostRegion {
            addr: v.as_ptr() as usize,
            len: v.len(),
        }
    };
    m.host_memory()
        .expect("host memory")
        .register(&[region])
        .expect("pin");
    let stop = Arc::new(AtomicBool::new(false));
    let guest = {
        let (m, stop, staging) = (m.clone(), stop.clone(), staging.clone());
        std::thread::spawn(move || {
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let v = (round % 251) as u8;
                {
                    let mut s = staging.lock().expect("staging");
                    s.fill(v);
                    m.copy_htod(hot, &VolatileSlice::from(&mut s[..]))
                        .expect("guest upload");
                }
                assert!(get(&*m, hot, 4096).iter().all(|b| *b == v), "round {round}");
                m.launch_one(
                    fill,
                    &one_d(),
                    &[
                        ArgValue::Ptr {
                            addr: out,
                            access: Access::Write,
                        },
                        ArgValue::U32(round),
                        ArgValue::U64(MIB / 4),
                    ],
                )
                .expect("guest launch");
                let w = get(&*m, out + MIB - 8, 8);
                assert_eq!(w[..4], round.to_le_bytes(), "round {round}");
            }
            round
        })
    };
    for (k, t) in tour(n).into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(30));
        let mode = if k % 3 == 2 {
            Mode::StopCopy
        } else {
            Mode::Precopy
        };
        let r = m
            .migrate(gpu(t, base, true), &opts(mode), |_| {})
            .unwrap_or_else(|e| panic!("move {k} to GPU {t}: {e}"));
        eprintln!(
            "move {k} -> GPU {t} ({mode:?}): {} rounds, {} bytes, downtime {:.2} ms, total {:.1} ms",
            r.rounds,
            r.precopy_bytes + r.stop_bytes,
            r.downtime.as_secs_f64() * 1e3,
            r.elapsed.as_secs_f64() * 1e3
        );
        for (i, (a, s)) in bufs.iter().zip(sizes).enumerate() {
            assert!(
                get(&*m, *a, s as usize) == pattern(i as u8, s as usize),
                "buffer {i} after move {k}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = guest.join().expect("the guest saw every byte right");
    assert!(rounds > 0);
    // New allocations land in free space of the same address range.
    let c = m.alloc(4 * MIB).expect("fresh").addr;
    assert!(c >= base && c < base + VA_SIZE && !bufs.contains(&c));
    put(&*m, c, &pattern(9, 4 << 20));
    assert_eq!(get(&*m, c, 4 << 20), pattern(9, 4 << 20));
    m.host_memory().expect("host memory").unregister(&[region]);
    for a in bufs {
        m.free(a).expect("free");
    }
}

#[test]
fn swapped_out_memory_moves_swapped_and_comes_back_intact() {
    let Some(n) = gpus() else { return };
    let base = va_base();
    let broker = LocalBroker::new(16 * MIB, 0);
    let mig = Arc::new(Migratable::new(gpu(0, base, false)));
    // 32 MiB beside the context reserve the GPU charged at start.
    let share = 32 * MIB + mig.memory_usage().used;
    let pager = Arc::new(Pager::new(mig.clone(), broker.member(1, 0), share));
    broker.attach(1, &pager);
    let bufs: Vec<u64> = (0..4)
        .map(|_| pager.alloc(8 * MIB).expect("alloc").addr)
        .collect();
    for (i, a) in bufs.iter().enumerate() {
        put(&*pager, *a, &pattern(i as u8 + 7, 8 << 20));
    }
    let before = pager.state();
    assert!(
        before.host_swap >= 16 * MIB,
        "half is swapped out: {before:?}"
    );
    for t in tour(n).into_iter().take(3) {
        mig.migrate(gpu(t, base, true), &opts(Mode::Precopy), |_| {})
            .expect("migrate");
        assert_eq!(pager.state().host_swap, before.host_swap, "still swapped");
    }
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(
            get(&*pager, *a, 8 << 20),
            pattern(i as u8 + 7, 8 << 20),
            "buffer {i}"
        );
    }
    for (i, a) in bufs.iter().enumerate() {
        put(&*pager, *a, &pattern(i as u8 + 9, 8 << 20));
    }
    for (i, a) in bufs.iter().enumerate() {
        assert_eq!(get(&*pager, *a, 8 << 20), pattern(i as u8 + 9, 8 << 20));
    }
}

#[test]
fn a_target_too_small_rolls_back_and_the_vgpu_stays_whole() {
    let Some(n) = gpus() else { return };
    let base = va_base();
    let m = Migratable::new(gpu(0, base, false));
    let a = m.alloc(64 * MIB).expect("a").addr;
    put(&m, a, &pattern(3, 64 << 20));
    let small: Arc<dyn Backend> = Arc::new(
        CudaGpu::new(CudaConfig {
            ordinal: n - 1,
            // 32 MiB beside the context's reserve, which the share holds too.
            memory: 32 * MIB + context_reserve(n - 1),
            va_base: base,
            va_size: VA_SIZE,
            migration_target: true,
            ..CudaConfig::default()
        })
        .expect("small target"),
    );
    let e = m
        .migrate(small, &opts(Mode::Precopy), |_| {})
        .expect_err("the target is too small");
    assert!(e.to_string().contains("target GPU"), "{e}");
    assert_eq!(get(&m, a, 64 << 20), pattern(3, 64 << 20), "still whole");
    put(&m, a, &pattern(4, 64 << 20));
    m.migrate(gpu(n - 1, base, true), &opts(Mode::StopCopy), |_| {})
        .expect("a later migration works");
    assert_eq!(get(&m, a, 64 << 20), pattern(4, 64 << 20));
}

/// A module keeping state in variables: `counter` (bumped by its first thread) and
/// `table`; `store` writes a value through a pointer argument.
const VARS_PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .global .align 8 .u64 counter;
.visible .global .align 4 .u32 table[256];
.visible .entry bump()
{
    .reg .pred %p<1>;
    .reg .b32 %r<1>;
    .reg .b64 %d<2>;
    mov.u32 %r0, %tid.x;
    setp.ne.u32 %p0, %r0, 0;
    @%p0 bra DONE;
    ld.global.u64 %d0, [counter];
    add.u64 %d1, %d0, 1;
    st.global.u64 [counter], %d1;
DONE:
    ret;
}
.visible .entry store(.param .u64 p, .param .u64 v)
{
    .reg .b64 %d<3>;
    ld.param.u64 %d0, [p];
    ld.param.u64 %d1, [v];
    cvta.to.global.u64 %d2, %d0;
    st.global.u64 [%d2], %d1;
    ret;
}
"#;

#[test]
fn module_variables_keep_their_values_and_addresses_across_moves() {
    let Some(n) = gpus() else { return };
    let base = va_base();
    let m = Migratable::new(gpu(0, base, false));
    let module = m
        .modules()
        .module_load(ModuleImage::Ptx(VARS_PTX.as_bytes()))
        .expect("module");
    let f = |name: &[u8]| {
        m.modules()
            .get_function(module, name)
            .expect("function")
            .handle
    };
    let (bump, store) = (f(b"bump"), f(b"store"));
    let (counter, size) = m
        .modules()
        .module_global(module, b"counter")
        .expect("counter");
    assert_eq!(size, 8);
    let (table, size) = m.modules().module_global(module, b"table").expect("table");
    assert_eq!(size, 1024);
    let one = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
    };
    let mut want = 0x5eed_0000_0000_0000u64;
    put(&m, counter, &want.to_le_bytes());
    put(&m, table, &pattern(3, 1024));
    for (k, t) in tour(n).into_iter().enumerate() {
        // A kernel by name and a copy advance the counter before each move.
        m.launch_one(bump, &one, &[]).expect("bump");
        want += 1;
        assert_eq!(get(&m, counter, 8), want.to_le_bytes(), "move {k}: bumped");
        let mode = if k % 2 == 1 {
            Mode::StopCopy
        } else {
            Mode::Precopy
        };
        m.migrate(gpu(t, base, true), &opts(mode), |_| {})
            .unwrap_or_else(|e| panic!("move {k} to GPU {t}: {e}"));
        // The addresses the guest holds reach the variables, with their values.
        assert_eq!(get(&m, counter, 8), want.to_le_bytes(), "move {k}: counter");
        assert_eq!(get(&m, table, 1024), pattern(3, 1024), "move {k}: table");
        assert_eq!(
            m.modules()
                .module_global(module, b"counter")
                .expect("again"),
            (counter, 8)
        );
        // A pointer argument at the guest's address reaches the variable too.
        want += 100;
        m.launch_one(
            store,
            &one,
            &[
                ArgValue::Ptr {
                    addr: counter,
                    access: Access::Write,
                },
                ArgValue::U64(want),
            ],
        )
        .expect("store");
        assert_eq!(get(&m, counter, 8), want.to_le_bytes(), "move {k}: stored");
    }
    m.modules().module_unload(module).expect("unload");
}

#[test]
fn virtual_memory_tours_the_gpus_at_its_addresses() {
    let Some(n) = gpus() else { return };
    let base = va_base();
    let mig = Migratable::new(gpu(0, base, false));
    let v = mig.virtual_memory().expect("virtual memory on the GPU");
    let va = v.reserve(32 * MIB, 0, 0).expect("reserve");
    let a = v.create(8 * MIB).expect("create a");
    let b = v.create(4 * MIB).expect("create b");
    v.map(va, 8 * MIB, 0, a.handle).expect("map a");
    v.map(va + 8 * MIB, 4 * MIB, 0, b.handle).expect("map b");
    v.map(va + 16 * MIB, 4 * MIB, 0, b.handle)
        .expect("map b a second time");
    v.release(b.handle).expect("only the mappings hold b");
    put(&mig, va, &pattern(21, 8 << 20));
    put(&mig, va + 8 * MIB, &pattern(22, 4 << 20));
    let used = mig.memory_usage().used;
    for (i, t) in tour(n).into_iter().take(3).enumerate() {
        let mode = if i % 2 == 0 {
            Mode::Precopy
        } else {
            Mode::StopCopy
        };
        mig.migrate(gpu(t, base, true), &opts(mode), |_| {})
            .expect("migrate");
        assert_eq!(mig.memory_usage().used, used, "move {i}: charged the same");
        assert_eq!(get(&mig, va, 8 << 20), pattern(21, 8 << 20), "move {i}: a");
        assert_eq!(
            get(&mig, va + 16 * MIB, 4 << 20),
            pattern(22, 4 << 20),
            "move {i}: b at its second address"
        );
    }
    // Still one allocation behind b's two mappings, and the handles work.
    put(&mig, va + 8 * MIB, &[0x5a; 64]);
    assert_eq!(get(&mig, va + 16 * MIB, 64), vec![0x5a; 64]);
    let v = mig.virtual_memory().expect("virtual memory");
    assert_eq!(v.retain(va + 16 * MIB).expect("retain")[0], b.handle);
    v.release(b.handle).expect("release b");
    v.release(a.handle).expect("release a");
    v.unmap(va, 32 * MIB).expect("unmap");
    v.free_range(va, 32 * MIB).expect("free");
    mig.synchronize();
    assert_eq!(v.objects(), 0);
}
