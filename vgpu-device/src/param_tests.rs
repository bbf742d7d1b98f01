//! `GET_GLOBAL` and `BLOB` kernel arguments through the queue: the sim device's built-in
//! variables, blobs refused on it (no guest code), both served through a backend that
//! claims them, hostile forms refused.

use std::sync::Mutex;

use vgpu_backend::{Backend, BackendInfo, Launch, LaunchOne, LaunchStats, Modules};

use super::*;

/// The sim backend claiming module variables and parameter blobs: `module_global`
/// answers `counter` at a fixed range, every function has the layout of [`LAYOUT`], and a
/// launch with `Blob` arguments records their bytes instead of running.
struct Claims {
    sim: SimGpu,
    info: BackendInfo,
    seen: Mutex<Vec<Vec<u8>>>,
}

const COUNTER: (u64, u64) = (0x7f00_0000_1000, 16);
/// (offset, size) of each parameter: a 24-byte struct, a u32, 64 bytes of floats.
const LAYOUT: [(u32, u32); 3] = [(0, 24), (24, 4), (32, 64)];

impl Backend for Claims {
    fn info(&self) -> &BackendInfo {
        &self.info
    }
    fn launch(&self, launches: &[Launch<'_>]) -> Vec<vgpu_backend::Result<LaunchStats>> {
        launches.iter().map(|l| self.run(l)).collect()
    }
    fn modules(&self) -> &dyn Modules {
        self
    }
    vgpu_backend::forward_backend!(sim:
        memory_usage, alloc, free, check_range, copy_htod, copy_dtoh, copy_dtod, memset,
        synchronize, paging, relocation, shared_memory, host_memory, virtual_memory
    );
}

impl Claims {
    /// One launch: the blob bytes of each `Blob` argument recorded, a launch without
    /// blobs run on the sim.
    fn run(&self, l: &Launch<'_>) -> vgpu_backend::Result<LaunchStats> {
        if !l.args.iter().any(|a| matches!(a, ArgValue::Blob { .. })) {
            return self.sim.launch_one(l.function, &l.config, l.args);
        }
        let mut seen = self.seen.lock().expect("lock");
        for a in l.args {
            if let ArgValue::Blob { offset, len } = *a {
                let (o, n) = (offset as usize, len as usize);
                seen.push(l.blob[o..o + n].to_vec());
            }
        }
        Ok(LaunchStats { device_ns: 1 })
    }
}

impl Modules for Claims {
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
    fn module_global(&self, module: u64, name: &[u8]) -> vgpu_backend::Result<(u64, u64)> {
        self.sim.modules().get_function(module, b"fill")?;
        if name == b"counter" {
            Ok(COUNTER)
        } else {
            Err(vgpu_backend::BackendError::UnknownFunction(
                "no such variable".into(),
            ))
        }
    }
    fn param_layout(&self, _function: u64) -> vgpu_backend::Result<ParamLayout> {
        let mut l = ParamLayout::default();
        for (i, (off, size)) in LAYOUT.iter().enumerate() {
            l.set(i, *off, *size);
        }
        Ok(l)
    }
}

fn claims() -> Arc<Claims> {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let mut info = sim.info().clone();
    info.features |= features::GLOBALS | features::PARAM_BLOBS;
    Arc::new(Claims {
        sim,
        info,
        seen: Mutex::new(Vec::new()),
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

impl Harness<'_> {
    fn get_global(&mut self, module: u64, name: &[u8]) -> Response {
        let a = self.put(name);
        self.send(
            Request::GetGlobal(GetGlobalArgs {
                module,
                name_len: name.len() as u64,
            }),
            &[r(a, name.len())],
        )
    }

    fn launch_blob(&mut self, function: u64, args: &[KernelArg], blob: &[u8]) -> Response {
        let id = self.next_id;
        self.next_id += 1;
        let la = LaunchArgs {
            function,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            ..Default::default()
        };
        let mut buf = vec![0u8; 8192];
        let n = encode_launch_with_blob(&mut buf, id, &la, args, &[], blob).expect("encode");
        self.send_raw(&buf[..n], &[]).0
    }
}

#[test]
fn sim_answers_its_builtin_variables_and_not_supported_to_blobs() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let space = h.vgpu.config_space();
    assert_eq!(space.version, PROTOCOL_VERSION);
    assert_eq!(
        space.features & (features::GLOBALS | features::PARAM_BLOBS),
        features::GLOBALS
    );
    let m = h.builtin();
    let resp = h.get_global(m, b"counter");
    assert_eq!(resp.status(), Some(Status::Ok));
    let (addr, size) = (resp.result[0], resp.result[1]);
    assert_eq!(size, 8);
    // The variable is zero at load and holds what is written; a second lookup answers the
    // same range.
    assert_eq!(h.dtoh(addr, 8), [0; 8]);
    h.htod(addr, &42u64.to_le_bytes());
    assert_eq!(h.dtoh(addr, 8), 42u64.to_le_bytes());
    let again = h.get_global(m, b"counter");
    assert_eq!((again.result[0], again.result[1]), (addr, size));
    assert_eq!(
        h.get_global(m, b"missing").status(),
        Some(Status::UnknownFunction)
    );
    // A copy running past the variable is refused.
    let past = vec![0u8; 9];
    let a = h.put(&past);
    let req = Request::MemcpyHtoD(MemcpyHtoDArgs { dst: addr, size: 9 });
    assert_ne!(h.status(req, &[r(a, 9)]), Status::Ok);
    // It is the module's memory: FREE refuses it.
    assert_ne!(h.status(Request::Free(FreeArgs { addr }), &[]), Status::Ok);
    let f = h.get_function(m, "spin")[0];
    let blob = [1u8; 24];
    let resp = h.launch_blob(f, &[KernelArg::blob(0, 24).expect("24")], &blob);
    assert_eq!(resp.status(), Some(Status::NotSupported));
    h.still_works();
}

#[test]
fn get_global_answers_the_backends_range() {
    let mem = ram();
    let backend = claims();
    let mut h = Harness::with_vgpu(&mem, vgpu_on(backend));
    assert_ne!(h.vgpu.config_space().features & features::GLOBALS, 0);
    let m = h.builtin();
    let resp = h.get_global(m, b"counter");
    assert_eq!(resp.status(), Some(Status::Ok));
    assert_eq!((resp.result[0], resp.result[1]), COUNTER);
    assert_eq!(
        h.get_global(m, b"missing").status(),
        Some(Status::UnknownFunction)
    );
    assert_eq!(
        h.get_global(m + 100, b"counter").status(),
        Some(Status::UnknownModule)
    );
    // A 1 000-byte name (a C++ template's) reaches the backend; one past the bound, a
    // zero length and data not adding up to the name are refused.
    let templated = vec![b'x'; 1000];
    assert_eq!(
        h.get_global(m, &templated).status(),
        Some(Status::UnknownFunction)
    );
    let long = vec![b'x'; MAX_SYMBOL_LEN as usize + 1];
    assert_eq!(
        h.get_global(m, &long).status(),
        Some(Status::InvalidArgument)
    );
    let a = h.put(b"counter");
    let req = Request::GetGlobal(GetGlobalArgs {
        module: m,
        name_len: 7,
    });
    assert_eq!(h.status(req, &[r(a, 6)]), Status::BadLength);
    assert_eq!(h.status(req, &[w(a, 7)]), Status::BadDescriptor);
    h.still_works();
}

#[test]
fn blob_arguments_reach_the_backend_and_hostile_ones_are_refused() {
    let mem = ram();
    let backend = claims();
    let mut h = Harness::with_vgpu(&mem, vgpu_on(backend.clone()));
    let m = h.builtin();
    let f = h.get_function(m, "spin")[0];
    let mut blob = vec![0u8; 88];
    for (i, b) in blob.iter_mut().enumerate() {
        *b = i as u8;
    }
    // A 24-byte struct and a 64-byte array of floats.
    let args = [
        KernelArg::blob(0, 24).expect("24"),
        KernelArg::u32(3),
        KernelArg::blob(24, 64).expect("64"),
    ];
    let resp = h.launch_blob(f, &args, &blob);
    assert_eq!(resp.status(), Some(Status::Ok));
    {
        let seen = backend.seen.lock().expect("lock");
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], blob[..24]);
        assert_eq!(seen[1], blob[24..88]);
    }
    let refused = |h: &mut Harness<'_>, args: &[KernelArg], blob: &[u8]| {
        let resp = h.launch_blob(f, args, blob);
        assert_eq!(resp.status(), Some(Status::BadArgType), "{args:?}");
    };
    // A blob whose length differs from its parameter's size in the layout.
    let mismatch = [
        KernelArg::blob(0, 16).expect("16"),
        KernelArg::u32(3),
        KernelArg::blob(24, 64).expect("64"),
    ];
    refused(&mut h, &mismatch, &blob);
    // Offset past the end, offset + length past the end, offset beyond 32 bits.
    refused(&mut h, &[KernelArg::blob(88, 8).expect("ok")], &blob);
    refused(&mut h, &[KernelArg::blob(80, 16).expect("ok")], &blob);
    let far = KernelArg {
        kind: ArgKind::Blob as u32,
        access: 8,
        value: u64::MAX - 3,
    };
    refused(&mut h, &[far], &blob);
    // Length 0, over the limit, and u32::MAX (an overflowing end).
    for len in [0, MAX_PARAM_BLOB_BYTES + 1, u32::MAX] {
        let bad = KernelArg {
            kind: ArgKind::Blob as u32,
            access: len,
            value: 8,
        };
        refused(&mut h, &[bad], &blob);
    }
    // No blob after the arguments at all.
    refused(&mut h, &[KernelArg::blob(0, 24).expect("ok")], &[]);
    // Arguments adding up to more than the limit (overlapping on purpose).
    let big = vec![7u8; MAX_PARAM_BLOB_BYTES as usize];
    refused(
        &mut h,
        &[
            KernelArg::blob(0, MAX_PARAM_BLOB_BYTES).expect("ok"),
            KernelArg::blob(0, 8).expect("ok"),
        ],
        &big,
    );
    // A blob longer than the limit: only its first MAX_PARAM_BLOB_BYTES count.
    let longer = vec![1u8; MAX_PARAM_BLOB_BYTES as usize + 64];
    refused(
        &mut h,
        &[KernelArg::blob(MAX_PARAM_BLOB_BYTES, 8).expect("ok")],
        &longer,
    );
    assert_eq!(
        backend.seen.lock().expect("lock").len(),
        2,
        "none reached it"
    );
    h.still_works();
}
