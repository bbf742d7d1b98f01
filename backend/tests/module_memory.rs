//! Module memory is device memory: each loaded module's footprint (image and declared
//! globals, whole pages) is charged before it is compiled, shows in `memory_usage`, is
//! refused at the capacity and the module limits, and comes back at unload. And what
//! unmodified programs need of modules: parameter layouts and raw-bytes arguments. Runs on
//! sim and, where a CUDA GPU is present, on cuda (with `VGPU_REQUIRE_CUDA=1` a missing GPU
//! fails the suite).

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_backend::{
    module_footprint, one_result, Access, ArgValue, Backend, CudaConfig, CudaGpu, Launch,
    LaunchConfig, LaunchOne, LaunchStats, ModuleImage, SimConfig, SimGpu, DEFAULT_VA_BASE,
    MAX_MODULE_MEMORY, MODULE_PAGE,
};
use vgpu_proto::{features, KernelArg, Status};

const MIB: u64 = 1 << 20;

/// One launch with by-value parameters in `blob`.
fn launch_blob(
    b: &dyn Backend,
    function: u64,
    config: &LaunchConfig,
    args: &[ArgValue],
    blob: &[u8],
) -> vgpu_backend::Result<LaunchStats> {
    let launch = Launch {
        function,
        config: *config,
        cluster: vgpu_backend::NO_CLUSTER,
        args,
        blob,
    };
    one_result(b.launch(&[launch]))
}

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
            // `memory` beside the context's reserve, which the share holds too.
            let reserve = CudaGpu::context_reserve_of(0, &Default::default())
                .expect("context reserve")
                .total()
                .expect("reserve fits u64");
            let cuda = CudaGpu::new(CudaConfig {
                ordinal: 0,
                memory: memory + reserve,
                // Clear of conformance.rs's ranges.
                va_base: DEFAULT_VA_BASE + (k + 40) * (64 << 30),
                va_size: 16 << 30,
                ..CudaConfig::default()
            })
            .expect("cuda backend");
            f("cuda", &cuda);
        }
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
            );
            eprintln!("SKIPPED (cuda): {why}")
        }
    }
}

#[test]
fn modules_are_charged_refused_at_the_capacity_and_returned_at_unload() {
    // 2 MiB for an allocation and ten pages for modules.
    let capacity = 2 * MIB + 10 * MODULE_PAGE;
    each(capacity, |name, b| {
        // The context reserve (cuda; 0 on sim) is charged from the start.
        let base = b.memory_usage().used;
        let page = module_footprint(&ModuleImage::Builtin(b"builtin"));
        assert_eq!(page, MODULE_PAGE);
        let a = b.alloc(2 * MIB).expect("alloc");
        assert_eq!(b.memory_usage().used, base + 2 * MIB, "{name}");
        let mut loaded = Vec::new();
        for i in 0..10 {
            loaded.push(
                b.modules()
                    .module_load(ModuleImage::Builtin(b"builtin"))
                    .unwrap_or_else(|e| panic!("{name}: module {i}: {e}")),
            );
        }
        let u = b.memory_usage();
        assert_eq!(
            u.used,
            base + capacity,
            "{name}: modules count in memory_usage"
        );
        let e = b
            .modules()
            .module_load(ModuleImage::Builtin(b"builtin"))
            .expect_err("over the capacity");
        assert_eq!(e.status(), Status::OutOfMemory, "{name}: {e}");
        assert!(e.to_string().contains("module memory"), "{name}: {e}");
        // A refused load charged nothing; allocations see the modules too.
        assert_eq!(b.memory_usage().used, base + capacity, "{name}");
        assert_eq!(
            b.alloc(MODULE_PAGE).expect_err("full").status(),
            Status::OutOfMemory
        );
        // Unloading gives the pages back.
        b.modules()
            .module_unload(loaded.pop().expect("one"))
            .expect("unload");
        assert_eq!(b.memory_usage().used, base + capacity - page, "{name}");
        loaded.push(
            b.modules()
                .module_load(ModuleImage::Builtin(b"builtin"))
                .expect("room again"),
        );
        for m in loaded {
            b.modules().module_unload(m).expect("unload");
        }
        b.free(a.addr).expect("free");
        assert_eq!(b.memory_usage().used, base, "{name}");
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
        let base = b.memory_usage().used;
        let e = b
            .modules()
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
                .modules()
                .module_load(ModuleImage::Ptx(half.as_bytes()))
                .expect("fits");
            assert!(b.memory_usage().used >= base + 32 * MIB, "{name}");
            b.alloc(30 * MIB).expect("alloc beside it");
            assert_eq!(
                b.modules()
                    .module_load(ModuleImage::Ptx(half.as_bytes()))
                    .expect_err("share")
                    .status(),
                Status::OutOfMemory,
                "{name}"
            );
            b.modules().module_unload(m).expect("unload");
        }
        // Cubin and fatbin images: loaded natively where the device has a GPU, a clear
        // NOT_SUPPORTED elsewhere.
        let e = b
            .modules()
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

/// `pack(out, h, s)`: writes the 16-bit `h` and the 8-byte struct `s` (a u32 and two u16)
/// to `out` as bytes 0..2 and 4..12.
const PACK_PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .entry pack(.param .u64 out, .param .b16 h, .param .align 4 .b8 s[8])
{
    .reg .b16 %h<3>;
    .reg .b32 %r<1>;
    .reg .b64 %d<2>;
    ld.param.u64 %d0, [out];
    cvta.to.global.u64 %d1, %d0;
    ld.param.b16 %h0, [h];
    st.global.b16 [%d1], %h0;
    ld.param.b32 %r0, [s];
    st.global.b32 [%d1+4], %r0;
    ld.param.b16 %h1, [s+4];
    st.global.b16 [%d1+8], %h1;
    ld.param.b16 %h2, [s+6];
    st.global.b16 [%d1+10], %h2;
    ret;
}
"#;

#[test]
fn parameter_layouts_and_raw_bytes_arguments() {
    each(16 * MIB, |name, b| {
        assert_ne!(b.info().features & features::PARAM_LAYOUT, 0, "{name}");
        // Built-ins: the layout the CUDA library passes (8-byte pointers and counts).
        let m = b
            .modules()
            .module_load(ModuleImage::Builtin(b"builtin"))
            .expect("builtin");
        let f = b.modules().get_function(m, b"saxpy").expect("saxpy");
        let l = b.modules().param_layout(f.handle).expect("layout");
        let got: Vec<_> = (0..4).filter_map(|i| l.get(i)).collect();
        assert_eq!(got, [(0, 4), (8, 8), (16, 8), (24, 8)], "{name}");
        assert_eq!(l.get(4), Some((0, 0)), "{name}");
        // Raw bytes are no built-in's parameter.
        let a = b.alloc(4096).expect("alloc");
        let raw = KernelArg::bytes(&[1, 2])
            .expect("bytes")
            .typed()
            .expect("typed");
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
        };
        let fill = b.modules().get_function(m, b"fill").expect("fill");
        let e = b
            .launch_one(
                fill.handle,
                &cfg,
                &[
                    ArgValue::Ptr {
                        addr: a.addr,
                        access: Access::Write,
                    },
                    raw,
                    ArgValue::U64(1),
                ],
            )
            .expect_err("raw bytes to a built-in");
        assert_eq!(e.status(), Status::BadArgType, "{name}: {e}");
        assert_eq!(
            b.modules()
                .param_layout(0xdead)
                .expect_err("unknown")
                .status(),
            Status::UnknownFunction
        );
        if b.info().features & features::PTX == 0 {
            return;
        }
        // PTX: the driver's layout, and 16-bit and struct parameters as raw bytes.
        let pm = b
            .modules()
            .module_load(ModuleImage::Ptx(PACK_PTX.as_bytes()))
            .expect("pack");
        let pf = b.modules().get_function(pm, b"pack").expect("pack");
        let l = b.modules().param_layout(pf.handle).expect("layout");
        let got: Vec<_> = (0..3).filter_map(|i| l.get(i)).collect();
        assert_eq!(got, [(0, 8), (8, 2), (12, 8)], "{name}");
        let h = KernelArg::bytes(&0xbeefu16.to_le_bytes()).expect("h");
        let st: Vec<u8> = [0x0102_0304u32.to_le_bytes().as_slice(), &[5, 6, 7, 8]].concat();
        let s = KernelArg::bytes(&st).expect("s");
        let args = [
            ArgValue::Ptr {
                addr: a.addr,
                access: Access::Write,
            },
            h.typed().expect("h"),
            s.typed().expect("s"),
        ];
        b.launch_one(pf.handle, &cfg, &args).expect("pack launch");
        let mut out = [0u8; 12];
        let slice = vm_memory::VolatileSlice::from(&mut out[..]);
        b.copy_dtoh(a.addr, &slice).expect("dtoh");
        assert_eq!(&out[0..2], &0xbeefu16.to_le_bytes(), "{name}");
        assert_eq!(&out[4..12], st.as_slice(), "{name}");
        // A raw argument of the wrong size is refused before the launch.
        let short = KernelArg::bytes(&[1])
            .expect("1 byte")
            .typed()
            .expect("typed");
        assert_eq!(
            b.launch_one(pf.handle, &cfg, &[args[0], short, args[2]])
                .expect_err("size")
                .status(),
            Status::BadArgType
        );
    });
}

/// A module variable read by a kernel that also takes a 24-byte struct and a 64-byte
/// array of floats by value: `out` gets scale[0], s[4..8], s[16..24] and v[15].
const GLOBALS_PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .global .align 8 .u32 scale[8];
.visible .entry apply(.param .u64 out, .param .align 8 .b8 s[24], .param .align 4 .b8 v[64])
{
    .reg .b32 %r<3>;
    .reg .b64 %d<3>;
    ld.param.u64 %d0, [out];
    cvta.to.global.u64 %d1, %d0;
    ld.global.u32 %r0, [scale];
    st.global.u32 [%d1], %r0;
    ld.param.b32 %r1, [s+4];
    st.global.b32 [%d1+4], %r1;
    ld.param.b64 %d2, [s+16];
    st.global.b64 [%d1+8], %d2;
    ld.param.b32 %r2, [v+60];
    st.global.b32 [%d1+16], %r2;
    ret;
}
"#;

#[test]
fn module_variables_and_by_value_structs() {
    each(16 * MIB, |name, b| {
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
        };
        let blob_args = [
            ArgValue::Blob { offset: 0, len: 24 },
            ArgValue::Blob {
                offset: 24,
                len: 64,
            },
        ];
        assert_ne!(b.info().features & features::GLOBALS, 0, "{name}");
        if b.info().features & features::PTX == 0 {
            // No guest code: the built-in module's variables, no by-value structs.
            let m = b
                .modules()
                .module_load(ModuleImage::Builtin(b"builtin"))
                .expect("builtin");
            let e = b
                .modules()
                .module_global(m, b"scale")
                .expect_err("not a built-in variable");
            assert_eq!(e.status(), Status::UnknownFunction, "{name}: {e}");
            let (addr, size) = b.modules().module_global(m, b"counter").expect("counter");
            assert_eq!(size, 8, "{name}");
            b.check_range(addr, 8).expect("inside");
            b.check_range(addr, 9).expect_err("past its end");
            b.memset(addr, 0x5a, 1, 8).expect("memset");
            let mut back = [0u8; 8];
            b.copy_dtoh(addr, &vm_memory::VolatileSlice::from(&mut back[..]))
                .expect("dtoh from the variable");
            assert_eq!(back, [0x5a; 8], "{name}");
            b.free(addr).expect_err("free of a module variable");
            let listed = b.modules().module_globals(m).expect("list");
            assert_eq!(listed.len(), 2, "{name}: {listed:?}");
            assert!(
                listed.iter().any(|g| (g.addr, g.size) == (addr, 8)),
                "{name}"
            );
            let spin = b.modules().get_function(m, b"spin").expect("spin");
            let e =
                launch_blob(b, spin.handle, &cfg, &blob_args, &[0; 88]).expect_err("no structs");
            assert_eq!(e.status(), Status::NotSupported, "{name}: {e}");
            // Unloaded, the variable's range is gone.
            b.modules().module_unload(m).expect("unload");
            b.check_range(addr, 8).expect_err("gone with its module");
            return;
        }
        assert_ne!(b.info().features & features::PARAM_BLOBS, 0, "{name}");
        let m = b
            .modules()
            .module_load(ModuleImage::Ptx(GLOBALS_PTX.as_bytes()))
            .expect("globals module");
        // Every variable its PTX defines is listed (what a migration carries).
        let listed = b.modules().module_globals(m).expect("list");
        assert_eq!(listed.len(), 1, "{name}: {listed:?}");
        assert_eq!((&listed[0].name[..], listed[0].size), (&b"scale"[..], 32));
        let (addr, size) = b.modules().module_global(m, b"scale").expect("scale");
        assert_eq!(size, 32, "{name}");
        assert_eq!(addr, listed[0].addr, "{name}");
        assert_eq!(
            b.modules()
                .module_global(m, b"nothing")
                .expect_err("unknown")
                .status(),
            Status::UnknownFunction
        );
        // The variable is a copy and memset target, within its size only.
        b.check_range(addr, 32).expect("inside");
        b.check_range(addr, 33).expect_err("past its end");
        b.memset(addr, 0, 4, 8).expect("memset");
        let mut four = 41u32.to_le_bytes();
        b.copy_htod(addr, &vm_memory::VolatileSlice::from(&mut four[..]))
            .expect("htod to the variable");
        let mut back = [0u8; 32];
        b.copy_dtoh(addr, &vm_memory::VolatileSlice::from(&mut back[..]))
            .expect("dtoh from the variable");
        assert_eq!(&back[..4], &41u32.to_le_bytes(), "{name}");
        // The module owns it: not an allocation to free.
        b.free(addr).expect_err("free of a module variable");
        // A kernel reads it and two structs passed by value.
        let out = b.alloc(4096).expect("alloc");
        let f = b.modules().get_function(m, b"apply").expect("apply");
        let l = b.modules().param_layout(f.handle).expect("layout");
        let got: Vec<_> = (0..3).filter_map(|i| l.get(i)).collect();
        assert_eq!(got, [(0, 8), (8, 24), (32, 64)], "{name}");
        let mut blob = [0u8; 88];
        blob[4..8].copy_from_slice(&0x0a0b_0c0du32.to_le_bytes());
        blob[16..24].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        blob[84..88].copy_from_slice(&2.5f32.to_le_bytes());
        let ptr = ArgValue::Ptr {
            addr: out.addr,
            access: Access::Write,
        };
        let args = [ptr, blob_args[0], blob_args[1]];
        launch_blob(b, f.handle, &cfg, &args, &blob).expect("launch with structs");
        let mut res = [0u8; 20];
        b.copy_dtoh(out.addr, &vm_memory::VolatileSlice::from(&mut res[..]))
            .expect("dtoh");
        assert_eq!(&res[0..4], &41u32.to_le_bytes(), "{name}: the variable");
        assert_eq!(&res[4..8], &blob[4..8], "{name}: the struct");
        assert_eq!(&res[8..16], &blob[16..24], "{name}: the struct");
        assert_eq!(&res[16..20], &2.5f32.to_le_bytes(), "{name}: the floats");
        // A blob whose size differs from the parameter's, or outside the blob: refused.
        let short = [ptr, ArgValue::Blob { offset: 0, len: 16 }, blob_args[1]];
        assert_eq!(
            launch_blob(b, f.handle, &cfg, &short, &blob)
                .expect_err("size mismatch")
                .status(),
            Status::BadArgType
        );
        assert_eq!(
            launch_blob(b, f.handle, &cfg, &args, &blob[..80])
                .expect_err("outside the blob")
                .status(),
            Status::BadArgType
        );
        // The variable's pointer is a valid kernel pointer too (the kernel writes 20 of
        // its 32 bytes).
        let onto = [
            ArgValue::Ptr {
                addr,
                access: Access::Write,
            },
            blob_args[0],
            blob_args[1],
        ];
        launch_blob(b, f.handle, &cfg, &onto, &blob).expect("kernel writing the variable");
        b.modules().module_unload(m).expect("unload");
        b.check_range(addr, 4).expect_err("gone with its module");
        b.free(out.addr).expect("free");
    });
}

/// A broker that grants everything (module memory never asks it).
struct Unlimited;

impl vgpu_backend::pager::Broker for Unlimited {
    fn reserve(&self, _bytes: u64) -> Result<(), String> {
        Ok(())
    }
    fn report(&self, _state: vgpu_backend::pager::MemState) {}
}

#[test]
fn the_pager_counts_module_memory_against_the_share() {
    let share = 2 * MIB + 4 * MODULE_PAGE;
    let sim: std::sync::Arc<dyn Backend> = std::sync::Arc::new(
        SimGpu::new(SimConfig {
            memory: share,
            va_size: 16 << 30,
            threads: 1,
            ..SimConfig::default()
        })
        .expect("sim"),
    );
    let p = vgpu_backend::pager::Pager::new(sim, std::sync::Arc::new(Unlimited), share);
    p.alloc(2 * MIB).expect("alloc");
    let mut loaded = Vec::new();
    for _ in 0..4 {
        loaded.push(
            p.modules()
                .module_load(ModuleImage::Builtin(b"builtin"))
                .expect("module"),
        );
    }
    assert_eq!(
        p.memory_usage().used,
        share,
        "modules count in memory_usage"
    );
    let e = p
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect_err("over the share");
    assert_eq!(e.status(), Status::OutOfMemory, "{e}");
    assert_eq!(
        p.alloc(MODULE_PAGE).expect_err("full").status(),
        Status::OutOfMemory
    );
    p.modules()
        .module_unload(loaded.pop().expect("one"))
        .expect("unload");
    assert_eq!(p.memory_usage().used, share - MODULE_PAGE);
    p.alloc(MODULE_PAGE).expect("room again");
}
