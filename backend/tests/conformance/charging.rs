//! What a vGPU is charged: the context reserve, local memory, the storage setup.

use super::*;

#[test]
fn the_context_reserve_is_charged_from_the_start() {
    // Nothing to reserve on sim; the driver's stacks, heap and printf FIFO on cuda.
    let s = sim(8 * MIB);
    assert_eq!(s.memory_usage().used, 0, "sim: no context reserve");
    match cuda_skip() {
        None => {
            let reserve = cuda_reserve();
            let b = cuda_with(reserve + 4 * MIB, ContextLimits::default());
            let r = b.context_reserve();
            assert_eq!(r.total(), Some(reserve));
            assert_eq!(r.stack_bytes, vgpu_backend::cuda::DEFAULT_STACK);
            assert!(r.sms > 0 && r.threads_per_sm > 0, "{r:?}");
            let u = b.memory_usage();
            assert_eq!((u.used, u.allocations), (reserve, 0), "cuda: {r:?}");
            // Allocations see it: the share holds 4 MiB beside the reserve, no more.
            b.alloc(4 * MIB).expect("room beside the reserve");
            assert_eq!(status(b.alloc(1)), Status::OutOfMemory);
            eprintln!(
                "cuda: context reserve {} MiB ({})",
                reserve >> 20,
                r.detail()
            );
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

#[test]
fn a_share_below_the_context_reserve_is_refused_at_start() {
    match cuda_skip() {
        None => {
            let reserve = cuda_reserve();
            let e = try_cuda(reserve - 1, ContextLimits::default()).expect_err("too small");
            assert!(
                matches!(e, BackendError::ContextReserve { share, reserve: r, .. }
                    if share == reserve - 1 && r == reserve),
                "{e}"
            );
            assert_eq!(e.status(), Status::OutOfMemory);
            let m = e.to_string();
            for part in [reserve.to_string(), (reserve - 1).to_string()] {
                assert!(
                    m.contains(&part),
                    "the message names share and reserve: {m}"
                );
            }
            assert!(m.contains("--cuda-stack"), "{m}");
            // Exactly the reserve starts (with nothing left to allocate).
            let b = cuda_with(reserve, ContextLimits::default());
            assert_eq!(b.memory_usage().used, reserve);
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

/// PTX whose `big_local` keeps `words` u32s in a local array (16 KiB for 4096): it writes
/// buf[i] = i for i < n, then out[t] = buf[(t * 7) % n] for each thread t.
fn big_local_ptx(words: u32) -> String {
    format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n\
         .visible .entry big_local(.param .u64 o, .param .u32 n)\n{{\n\
         .local .align 4 .b8 buf[{}];\n\
         .reg .u64 %d<8>;\n.reg .u32 %r<10>;\n.reg .pred %p;\n\
         ld.param.u64 %d1, [o];\nld.param.u32 %r1, [n];\n\
         mov.u64 %d3, buf;\nmov.u32 %r2, 0;\n\
         L:\nsetp.ge.u32 %p, %r2, %r1;\n@%p bra E;\n\
         mul.wide.u32 %d2, %r2, 4;\nadd.u64 %d4, %d3, %d2;\nst.local.u32 [%d4], %r2;\n\
         add.u32 %r2, %r2, 1;\nbra L;\n\
         E:\nmov.u32 %r6, %tid.x;\nmul.lo.u32 %r7, %r6, 7;\nrem.u32 %r8, %r7, %r1;\n\
         mul.wide.u32 %d2, %r8, 4;\nadd.u64 %d4, %d3, %d2;\nld.local.u32 %r9, [%d4];\n\
         cvta.to.global.u64 %d7, %d1;\n\
         mul.wide.u32 %d5, %r6, 4;\nadd.u64 %d6, %d7, %d5;\nst.global.u32 [%d6], %r9;\n\
         ret;\n}}\n",
        words * 4
    )
}

#[test]
fn a_kernel_needing_more_local_memory_than_the_stack_is_refused_and_runs_within_it() {
    const WORDS: u32 = 4096;
    const THREADS: u32 = 128;
    let ptx = big_local_ptx(WORDS);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        shared_bytes: 0,
    };
    let run = |b: &dyn Backend| -> Result<Vec<u32>, BackendError> {
        let m = b.modules().module_load(ModuleImage::Ptx(ptx.as_bytes()))?;
        let f = b.modules().get_function(m, b"big_local")?.handle;
        let out = b.alloc(u64::from(THREADS) * 4)?.addr;
        b.launch_one(f, &cfg, &[w(out), ArgValue::U32(WORDS)])?;
        Ok(get_u32(b, out, THREADS as usize))
    };
    match cuda_skip() {
        None => {
            // The default 1 KiB stack: refused before the driver would grow every
            // thread's stack to 16 KiB behind the ledger's back.
            let b = cuda(64 * MIB);
            let e = run(&b).expect_err("over the stack");
            assert!(
                matches!(e, BackendError::LocalMemory { need, limit: 1024, .. } if need >= 16384),
                "{e}"
            );
            assert_eq!(e.status(), Status::OutOfMemory);
            let m = e.to_string();
            for part in ["big_local", "1024", "--cuda-stack"] {
                assert!(m.contains(part), "{m}");
            }
            let used = b.memory_usage().used;
            assert_eq!(
                run(&b).map(|_| ()).map_err(|e| e.status()),
                Err(Status::OutOfMemory)
            );
            assert!(b.memory_usage().used >= used, "the vGPU still serves");
            drop(b);
            // A stack that holds it: the reserve grows with it, and the kernel runs.
            let limits = ContextLimits {
                stack_bytes: 20 << 10,
                ..ContextLimits::default()
            };
            let reserve = CudaGpu::context_reserve_of(0, &limits)
                .expect("reserve")
                .total()
                .expect("fits");
            assert!(reserve > cuda_reserve(), "a larger stack reserves more");
            let b = cuda_with(reserve + 64 * MIB, limits);
            assert_eq!(b.memory_usage().used, reserve);
            let got = run(&b).expect("within the stack");
            let want: Vec<u32> = (0..THREADS).map(|t| (t * 7) % WORDS).collect();
            assert_eq!(got, want, "the local array kept every word");
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

/// A namespace file of `words` u64s (word i = i) for the storage charging case.
fn storage_file(tag: &str, words: u64) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "vgpu-conformance-storage-{}-{tag}",
        std::process::id()
    ));
    let b: Vec<u8> = (0..words).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(&p, b).expect("write namespace file");
    p
}

/// The storage kernels' setup of a namespace is charged once, on first use; refused (and
/// nothing left charged) when it does not fit the share.
fn storage_case(name: &str, b: &dyn Backend, small: &dyn Backend) {
    let scan = builtin(b, "storage_scan_sum");
    let out = b.alloc(8).expect("alloc").addr;
    let args = |out| {
        vec![
            ArgValue::U64(1),
            ArgValue::U64(0),
            ArgValue::U64(1024),
            ArgValue::U32(8),
            w(out),
        ]
    };
    let before = b.memory_usage().used;
    b.launch_one(scan, &CFG, &args(out)).expect("scan");
    let charged = b.memory_usage().used - before;
    if name == "sim" {
        let cache = (vgpu_backend::storage::CACHE_LINE * vgpu_backend::storage::CACHE_LINES) as u64;
        assert_eq!(charged, cache, "sim: the cache lines");
    } else {
        assert!(
            charged >= 64 * MIB,
            "cuda: region, block and doorbells: {charged}"
        );
    }
    b.launch_one(scan, &CFG, &args(out)).expect("scan again");
    assert_eq!(
        b.memory_usage().used,
        before + charged,
        "{name}: charged once"
    );
    eprintln!("{name}: storage setup charged {charged} bytes");

    let scan = builtin(small, "storage_scan_sum");
    let out = small.alloc(8).expect("alloc").addr;
    let before = small.memory_usage().used;
    let e = small
        .launch_one(scan, &CFG, &args(out))
        .expect_err("does not fit");
    assert_eq!(e.status(), Status::OutOfMemory, "{name}: {e}");
    assert_eq!(
        small.memory_usage().used,
        before,
        "{name}: nothing stays charged"
    );
    small.alloc(1).expect("the share still serves allocations");
}

#[test]
fn the_storage_setup_is_charged_once_and_refused_when_it_does_not_fit() {
    use std::sync::Arc;
    use vgpu_backend::storage::{NamespaceSpec, StorageSet};
    let path = storage_file("charge", 1 << 16);
    let set = || {
        let s = StorageSet::new(vec![NamespaceSpec {
            id: 1,
            path: path.clone(),
            read_only: true,
        }])
        .expect("set");
        s.attach(1).expect("attach");
        Arc::new(s)
    };
    storage_case(
        "sim",
        &sim(64 * MIB).with_storage(set()),
        &sim(2 * MIB).with_storage(set()),
    );
    match cuda_skip() {
        None => storage_case(
            "cuda",
            &cuda(256 * MIB).with_storage(set()),
            &cuda(8 * MIB).with_storage(set()),
        ),
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
    let _ = std::fs::remove_file(&path);
}
