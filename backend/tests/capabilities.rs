//! No wrapper hides a capability: a stack of every wrapper in this crate (the pager, fault
//! injection, the failing migration target) over a GPU that has every capability offers
//! each one at every layer, and what a caller does through the top reaches the GPU.

use std::sync::{Arc, Mutex};

use vgpu_backend::faults::{FailingTarget, Faults, Faulty};
use vgpu_backend::pager::{LocalBroker, Pager, GRANULE};
use vgpu_backend::{
    forward_backend, Backend, HostMemory, HostRegion, LaunchConfig, LaunchOne, ModuleImage,
    SimConfig, SimGpu,
};
use vgpu_proto::{Access, ArgValue};

const MIB: u64 = 1 << 20;

/// A sim GPU that also takes host memory registrations (sim itself has nothing to prepare,
/// so it offers no [`HostMemory`]; this one records what it is given), so that the stack
/// has all five capabilities to hide.
struct Registering {
    sim: SimGpu,
    registered: Mutex<Vec<HostRegion>>,
}

impl Backend for Registering {
    fn host_memory(&self) -> Option<&dyn HostMemory> {
        Some(self)
    }
    forward_backend!(sim:
        info, memory_usage, alloc, free, check_range, copy_htod, copy_dtoh, copy_dtod, memset,
        launch, synchronize, modules, paging, relocation, shared_memory, virtual_memory
    );
}

impl HostMemory for Registering {
    fn register(&self, regions: &[HostRegion]) -> vgpu_backend::Result<()> {
        self.registered
            .lock()
            .expect("lock")
            .extend_from_slice(regions);
        Ok(())
    }
    fn unregister(&self, regions: &[HostRegion]) {
        self.registered
            .lock()
            .expect("lock")
            .retain(|r| !regions.contains(r));
    }
}

/// Which capabilities `b` offers: paging, relocation, shared memory, host memory,
/// virtual memory.
fn offered(b: &dyn Backend) -> [bool; 5] {
    [
        b.paging().is_some(),
        b.relocation().is_some(),
        b.shared_memory().is_some(),
        b.host_memory().is_some(),
        b.virtual_memory().is_some(),
    ]
}

#[test]
fn every_layer_of_the_stack_offers_every_capability_of_the_gpu_beneath() {
    let gpu = Arc::new(Registering {
        sim: SimGpu::new(SimConfig {
            memory: 64 * MIB,
            va_size: 1 << 30,
            threads: 1,
            ..SimConfig::default()
        })
        .expect("sim"),
        registered: Mutex::new(Vec::new()),
    });
    assert_eq!(offered(&*gpu), [true; 5], "the GPU beneath has them all");
    let broker = LocalBroker::new(64 * MIB, 0);
    let pager = Arc::new(Pager::new(gpu.clone(), broker.member(1, 0), 32 * MIB));
    broker.attach(1, &pager);
    let faulty: Arc<dyn Backend> =
        Arc::new(Faulty::new(pager.clone(), Arc::new(Faults::default())));
    let target = FailingTarget(faulty.clone());
    let layers: [(&str, &dyn Backend); 3] = [
        ("pager", &*pager),
        ("fault injection", &*faulty),
        ("failing target", &target),
    ];
    for (name, b) in layers {
        assert_eq!(offered(b), [true; 5], "{name} hides a capability");
    }

    // What goes in at the top reaches the GPU.
    let top: &dyn Backend = &target;
    let region = HostRegion {
        addr: 0x1000,
        len: 4096,
    };
    top.host_memory()
        .expect("host memory")
        .register(&[region])
        .expect("register");
    assert_eq!(*gpu.registered.lock().expect("lock"), [region]);
    top.host_memory()
        .expect("host memory")
        .unregister(&[region]);
    assert!(gpu.registered.lock().expect("lock").is_empty());

    // Paging through the stack goes through the pager: a decommitted range is swapped
    // out (and the pager knows it), a recommitted one reads as it was.
    let paging = top.paging().expect("paging");
    assert_eq!(paging.commit_granule(), GRANULE, "the sim's own granule");
    let swapped = top.alloc(2 * GRANULE).expect("alloc").addr;
    top.memset(swapped, 0x5a, 1, 2 * GRANULE).expect("memset");
    paging.decommit(swapped, 0, GRANULE).expect("decommit");
    assert_eq!(pager.state().host_swap, GRANULE, "swapped out by the pager");
    paging.recommit(swapped, 0, GRANULE).expect("recommit");
    assert_eq!(pager.state().host_swap, 0, "restored by the pager");
    let mut back = vec![0u8; 2 * GRANULE as usize];
    top.copy_dtoh(swapped, &vm_memory::VolatileSlice::from(&mut back[..]))
        .expect("read back");
    assert!(back.iter().all(|b| *b == 0x5a), "the bytes survive");
    paging
        .decommit(swapped + GRANULE, 0, GRANULE)
        .expect_err("not an allocation's start");

    let shared = top.shared_memory().expect("shared memory");
    let object = shared.export(MIB).expect("export");
    let mapped = shared.import(object, MIB, false).expect("import");
    top.check_range(mapped, MIB)
        .expect("the mapping is device memory");

    let placed = gpu.sim.info().va_base + 512 * MIB;
    let a = top
        .relocation()
        .expect("relocation")
        .alloc_at(placed, MIB)
        .expect("alloc_at");
    assert_eq!(a.addr, placed);
    top.check_range(placed, MIB)
        .expect("placed where asked, and tracked by the pager");
    assert_eq!(
        pager.state().used,
        2 * GRANULE + a.charged,
        "charged to the share"
    );

    // Virtual memory through every layer: a mapping is device memory the pager tracks.
    let v = top.virtual_memory().expect("virtual memory");
    let va = v.reserve(2 * MIB, 0, 0).expect("reserve");
    let h = v.create(2 * MIB).expect("create").handle;
    v.map(va, 2 * MIB, 0, h).expect("map");
    top.check_range(va, 2 * MIB)
        .expect("the mapping is device memory at every layer");
    v.unmap(va, 2 * MIB).expect("unmap");
    v.release(h).expect("release");
    v.free_range(va, 2 * MIB).expect("free");

    // The code path through every layer: the sim's built-in module runs a kernel.
    let m = top
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("module");
    let fill = top.modules().get_function(m, b"fill").expect("fill").handle;
    let buf = top.alloc(MIB).expect("alloc").addr;
    let cfg = LaunchConfig {
        grid: [1; 3],
        block: [1; 3],
        shared_bytes: 0,
    };
    let args = [
        ArgValue::Ptr {
            addr: buf,
            access: Access::Write,
        },
        ArgValue::U32(7),
        ArgValue::U64(16),
    ];
    top.launch_one(fill, &cfg, &args).expect("fill");
    let mut out = [0u8; 4];
    top.copy_dtoh(buf, &vm_memory::VolatileSlice::from(&mut out[..]))
        .expect("read back");
    assert_eq!(u32::from_le_bytes(out), 7);
}
