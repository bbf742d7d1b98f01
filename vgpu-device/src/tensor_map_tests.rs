//! `ENCODE_TENSOR_MAP` through the queue: refused on the sim device (no TMA), and on a
//! device whose backend encodes, malformed parameters and foreign addresses refused before
//! the backend is asked.

use std::sync::atomic::{AtomicUsize, Ordering};

use vgpu_backend::{Backend, BackendInfo, Launch, LaunchStats, Modules};

use super::*;

/// The sim backend with an encoder in place of a GPU driver: it counts the maps it is
/// asked for and answers each map's argument bytes as its "descriptor", so the test sees
/// which parameters reached it and that the device returns its bytes unchanged.
struct Encoder {
    sim: SimGpu,
    info: BackendInfo,
    asked: AtomicUsize,
}

impl Backend for Encoder {
    fn info(&self) -> &BackendInfo {
        &self.info
    }
    fn launch(&self, launches: &[Launch<'_>]) -> Vec<vgpu_backend::Result<LaunchStats>> {
        self.sim.launch(launches)
    }
    fn modules(&self) -> &dyn Modules {
        self
    }
    vgpu_backend::forward_backend!(sim:
        memory_usage, alloc, free, check_range, copy_htod, copy_dtoh, copy_dtod, memset,
        synchronize, paging, relocation, shared_memory, host_memory, virtual_memory
    );
}

impl Modules for Encoder {
    fn module_load(&self, image: vgpu_backend::ModuleImage<'_>) -> vgpu_backend::Result<u64> {
        self.sim.modules().module_load(image)
    }
    fn module_unload(&self, module: u64) -> vgpu_backend::Result<()> {
        self.sim.modules().module_unload(module)
    }
    fn get_function(
        &self,
        module: u64,
        name: &[u8],
    ) -> vgpu_backend::Result<vgpu_backend::FunctionInfo> {
        self.sim.modules().get_function(module, name)
    }
    fn param_layout(&self, function: u64) -> vgpu_backend::Result<ParamLayout> {
        self.sim.modules().param_layout(function)
    }
    fn encode_tensor_map(
        &self,
        map: &TensorMapArgs,
    ) -> vgpu_backend::Result<[u8; TENSOR_MAP_BYTES]> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let mut out = [0u8; TENSOR_MAP_BYTES];
        out.copy_from_slice(&map.to_bytes()[..TENSOR_MAP_BYTES]);
        Ok(out)
    }
}

fn encoder() -> Arc<Encoder> {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let mut info = sim.info().clone();
    info.features |= features::TENSOR_MAPS;
    Arc::new(Encoder {
        sim,
        info,
        asked: AtomicUsize::new(0),
    })
}

fn vgpu_on(backend: Arc<dyn Backend>) -> Vgpu {
    let cfg = DeviceConfig {
        vgpu_id: 7,
        num_queues: 2,
        queue_size: 64,
        memory_share: 32 * MIB,
        compute_share: 600,
        copy_share: 400,
        batch: crate::BatchLimits::default(),
    };
    Vgpu::new(cfg, backend).expect("vgpu")
}

/// A 256 x 64 f32 matrix at `addr` (64 KiB), 32 x 32 boxes swizzled 128B.
fn matrix(addr: u64) -> TensorMapArgs {
    TensorMapArgs {
        kind: tensor_map_kind::TILED,
        data_type: 7,
        rank: 2,
        swizzle: 3,
        global_address: addr,
        global_dim: [64, 256, 0, 0, 0],
        global_strides: [256, 0, 0, 0],
        box_dim: [32, 32, 0, 0, 0],
        element_strides: [1, 1, 0, 0, 0],
        ..TensorMapArgs::default()
    }
}

impl Harness<'_> {
    fn encode(&mut self, map: TensorMapArgs) -> (Response, Vec<u8>) {
        let out = self.space(TENSOR_MAP_BYTES);
        let resp = self.send(Request::EncodeTensorMap(map), &[w(out, TENSOR_MAP_BYTES)]);
        (resp, self.read(out, TENSOR_MAP_BYTES))
    }
}

#[test]
fn the_sim_device_has_no_tensor_maps() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_eq!(h.vgpu.config_space().features & features::TENSOR_MAPS, 0);
    let a = h.alloc(64 << 10);
    let (resp, _) = h.encode(matrix(a));
    assert_eq!(resp.status(), Some(Status::NotSupported));
    h.still_works();
}

#[test]
fn a_map_of_an_allocation_is_encoded_by_the_backend() {
    let mem = ram();
    let backend = encoder();
    let mut h = Harness::with_vgpu(&mem, vgpu_on(backend.clone()));
    assert_ne!(h.vgpu.config_space().features & features::TENSOR_MAPS, 0);
    let a = h.alloc(64 << 10);
    let map = matrix(a);
    let (resp, bytes) = h.encode(map);
    assert_eq!(resp.status(), Some(Status::Ok));
    assert_eq!(resp.result, [128, 0, 0, 0]);
    assert_eq!(bytes, map.to_bytes()[..TENSOR_MAP_BYTES].to_vec());
    assert_eq!(backend.asked.load(Ordering::SeqCst), 1);
    // A longer descriptor is fine: only 128 bytes are written.
    let out = h.space(256);
    let r0 = h.ok(Request::EncodeTensorMap(map), &[w(out, 256)]);
    assert_eq!(r0[0], 128);
    assert_eq!(backend.asked.load(Ordering::SeqCst), 2);
}

#[test]
fn malformed_maps_and_foreign_addresses_never_reach_the_backend() {
    let mem = ram();
    let backend = encoder();
    let mut h = Harness::with_vgpu(&mem, vgpu_on(backend.clone()));
    let a = h.alloc(64 << 10);
    let good = matrix(a);
    let bad: [(&str, TensorMapArgs, Status); 11] = [
        (
            "rank 0",
            TensorMapArgs { rank: 0, ..good },
            Status::InvalidArgument,
        ),
        (
            "rank 6",
            TensorMapArgs { rank: 6, ..good },
            Status::InvalidArgument,
        ),
        (
            "stride off 16",
            TensorMapArgs {
                global_strides: [260, 0, 0, 0],
                ..good
            },
            Status::InvalidArgument,
        ),
        (
            "box 257",
            TensorMapArgs {
                box_dim: [32, 257, 0, 0, 0],
                ..good
            },
            Status::InvalidArgument,
        ),
        (
            "element stride 9",
            TensorMapArgs {
                element_strides: [1, 9, 0, 0, 0],
                ..good
            },
            Status::InvalidArgument,
        ),
        (
            "swizzle 7",
            TensorMapArgs { swizzle: 7, ..good },
            Status::InvalidArgument,
        ),
        (
            "data type 16",
            TensorMapArgs {
                data_type: 16,
                ..good
            },
            Status::InvalidArgument,
        ),
        (
            "flags",
            TensorMapArgs { flags: 1, ..good },
            Status::InvalidArgument,
        ),
        (
            "an address outside every allocation",
            TensorMapArgs {
                global_address: a + (4 << 20),
                ..good
            },
            Status::BadDevicePointer,
        ),
        (
            "a tensor running past its allocation",
            TensorMapArgs {
                global_dim: [64, 257, 0, 0, 0],
                ..good
            },
            Status::BadDevicePointer,
        ),
        (
            "a tensor past 64 bits",
            TensorMapArgs {
                rank: 5,
                global_dim: [64, 1 << 32, 1 << 32, 1 << 32, 1 << 32],
                global_strides: [256, 1 << 39, 1 << 39, 1 << 39],
                box_dim: [32, 1, 1, 1, 1],
                element_strides: [1; 5],
                ..good
            },
            Status::BadDevicePointer,
        ),
    ];
    for (what, map, status) in bad {
        let (resp, _) = h.encode(map);
        assert_eq!(resp.status(), Some(status), "{what}");
        assert_eq!(resp.result, [0; 4], "{what}");
    }
    // Chain shapes: no room for the answer, a readable descriptor, none at all.
    let small = h.space(64);
    let req = Request::EncodeTensorMap(good);
    assert_eq!(h.status(req, &[w(small, 64)]), Status::BadLength);
    assert_eq!(h.status(req, &[r(small, 128)]), Status::BadDescriptor);
    assert_eq!(h.status(req, &[]), Status::BadDescriptor);
    assert_eq!(backend.asked.load(Ordering::SeqCst), 0);
    // Freed memory is foreign too.
    h.ok(Request::Free(FreeArgs { addr: a }), &[]);
    assert_eq!(h.encode(good).0.status(), Some(Status::BadDevicePointer));
    assert_eq!(backend.asked.load(Ordering::SeqCst), 0);
    h.still_works();
}
