//! Module memory is device memory: each loaded module's footprint (image and declared
//! globals, whole pages) is charged before it is compiled, shows in `memory_usage`, is
//! refused at the capacity and the module limits, and comes back at unload. Runs on sim and,
//! where a CUDA GPU is present, on cuda.

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_backend::{
    module_footprint, Backend, CudaConfig, CudaGpu, ModuleImage, SimConfig, SimGpu,
    DEFAULT_VA_BASE, MAX_MODULE_MEMORY, MODULE_PAGE,
};
use vgpu_proto::{features, Status};

const MIB: u64 = 1 << 20;

fn each(memory: u64, f: impl Fn(&str, &dyn Backend)) {
    let sim = SimGpu::new(SimConfig {
        memory,
        va_size: 16 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim backend");
    f("sim", &sim);
    match CudaGpu::probe() {
        Ok(_) => {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let k = NEXT.fetch_add(1, Ordering::Relaxed);
            let cuda = CudaGpu::new(CudaConfig {
                ordinal: 0,
                memory,
                // Clear of conformance.rs's ranges.
                va_base: DEFAULT_VA_BASE + (k + 40) * (64 << 30),
                va_size: 16 << 30,
                ..CudaConfig::default()
            })
            .expect("cuda backend");
            f("cuda", &cuda);
        }
        Err(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

#[test]
fn modules_are_charged_refused_at_the_capacity_and_returned_at_unload() {
    // 2 MiB for an allocation and ten pages for modules.
    let capacity = 2 * MIB + 10 * MODULE_PAGE;
    each(capacity, |name, b| {
        let page = module_footprint(&ModuleImage::Builtin(b"builtin"));
        assert_eq!(page, MODULE_PAGE);
        let a = b.alloc(2 * MIB).expect("alloc");
        assert_eq!(b.memory_usage().used, 2 * MIB, "{name}");
        let mut loaded = Vec::new();
        for i in 0..10 {
            loaded.push(
                b.module_load(ModuleImage::Builtin(b"builtin"))
                    .unwrap_or_else(|e| panic!("{name}: module {i}: {e}")),
            );
        }
        let u = b.memory_usage();
        assert_eq!(u.used, capacity, "{name}: modules count in memory_usage");
        let e = b
            .module_load(ModuleImage::Builtin(b"builtin"))
            .expect_err("over the capacity");
        assert_eq!(e.status(), Status::OutOfMemory, "{name}: {e}");
        assert!(e.to_string().contains("module memory"), "{name}: {e}");
        // A refused load charged nothing; allocations see the modules too.
        assert_eq!(b.memory_usage().used, capacity, "{name}");
        assert_eq!(
            b.alloc(MODULE_PAGE).expect_err("full").status(),
            Status::OutOfMemory
        );
        // Unloading gives the pages back.
        b.module_unload(loaded.pop().expect("one")).expect("unload");
        assert_eq!(b.memory_usage().used, capacity - page, "{name}");
        loaded.push(
            b.module_load(ModuleImage::Builtin(b"builtin"))
                .expect("room again"),
        );
        for m in loaded {
            b.module_unload(m).expect("unload");
        }
        b.free(a.addr).expect("free");
        assert_eq!(b.memory_usage().used, 0, "{name}");
    });
}

#[test]
fn declared_globals_are_charged_before_compiling_and_the_module_cap_holds() {
    // More declared global memory than any vGPU may hold in modules: refused before the
    // driver sees the PTX, on every backend that takes PTX.
    let huge = format!(
        ".version 7.8\n.target sm_90\n.address_size 64\n.global .align 8 .b8 hog[{}];\n",
        MAX_MODULE_MEMORY
    );
    let fp = module_footprint(&ModuleImage::Ptx(huge.as_bytes()));
    assert!(fp > MAX_MODULE_MEMORY);
    each(64 * MIB, |name, b| {
        let e = b
            .module_load(ModuleImage::Ptx(huge.as_bytes()))
            .expect_err("refused");
        if b.info().features & features::PTX == 0 {
            assert_eq!(e.status(), Status::NotSupported, "{name}: {e}");
        } else {
            assert_eq!(e.status(), Status::OutOfMemory, "{name}: {e}");
            assert!(e.to_string().contains("module memory"), "{name}: {e}");
        }
        // 32 MiB of globals in a 64 MiB share loads once (where PTX runs) and is charged;
        // a second copy does not fit.
        let half =
            ".version 7.8\n.target sm_90\n.address_size 64\n.global .align 8 .b8 hog[33554432];\n";
        if b.info().features & features::PTX != 0 {
            let m = b
                .module_load(ModuleImage::Ptx(half.as_bytes()))
                .expect("fits");
            assert!(b.memory_usage().used >= 32 * MIB, "{name}");
            b.alloc(30 * MIB).expect("alloc beside it");
            assert_eq!(
                b.module_load(ModuleImage::Ptx(half.as_bytes()))
                    .expect_err("share")
                    .status(),
                Status::OutOfMemory,
                "{name}"
            );
            b.module_unload(m).expect("unload");
        }
        // Cubin and fatbin images: loaded natively where the device has a GPU, a clear
        // NOT_SUPPORTED elsewhere.
        let e = b
            .module_load(ModuleImage::Binary(b"\x7fELF not really"))
            .expect_err("no image");
        if b.info().features & features::BINARY_MODULES == 0 {
            assert_eq!(e.status(), Status::NotSupported, "{name}: {e}");
            assert!(e.to_string().contains("cubin"), "{name}: {e}");
        } else {
            assert_eq!(e.status(), Status::InvalidArgument, "{name}: {e}");
        }
    });
}
