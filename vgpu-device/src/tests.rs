//! Request parsing and execution on `virtio_queue::mock::MockSplitQueue`: the happy path,
//! every malformed case, and that the next valid request on the same queue succeeds.

use std::sync::Arc;

use vgpu_backend::{SimConfig, SimGpu};
use vgpu_proto::args::module_kind;
use vgpu_proto::*;
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use crate::{DeviceConfig, GuestMem, Vgpu};

const MIB: u64 = 1 << 20;
const RAM: u64 = 16 * MIB;
const BUF_BASE: u64 = MIB;

/// A data or response descriptor: (guest address, length, device-writable).
#[derive(Clone, Copy)]
struct D(u64, u32, bool);

fn r(addr: u64, len: usize) -> D {
    D(addr, len as u32, false)
}
fn w(addr: u64, len: usize) -> D {
    D(addr, len as u32, true)
}

fn new_vgpu(share: u64) -> Vgpu {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let cfg = DeviceConfig {
        vgpu_id: 7,
        num_queues: 2,
        queue_size: 64,
        memory_share: share,
        compute_share: 600,
        copy_share: 400,
        batch: crate::BatchLimits::default(),
    };
    Vgpu::new(cfg, Arc::new(sim)).expect("vgpu")
}

struct Harness<'a> {
    mem: &'a GuestMem,
    vq: MockSplitQueue<'a, GuestMem>,
    q: Queue,
    vgpu: Vgpu,
    bump: u64,
    next_id: u64,
    completed: u16,
}

impl<'a> Harness<'a> {
    fn new(mem: &'a GuestMem, share: u64) -> Self {
        Self::with_vgpu(mem, new_vgpu(share))
    }

    fn with_vgpu(mem: &'a GuestMem, vgpu: Vgpu) -> Self {
        let vq = MockSplitQueue::new(mem, 64);
        let q: Queue = vq.create_queue().expect("queue");
        Self {
            mem,
            vq,
            q,
            vgpu,
            bump: BUF_BASE,
            next_id: 1,
            completed: 0,
        }
    }

    fn space(&mut self, len: usize) -> u64 {
        let a = self.bump;
        self.bump += (len as u64).div_ceil(64) * 64 + 64;
        assert!(self.bump < RAM, "test guest RAM exhausted");
        a
    }

    fn put(&mut self, bytes: &[u8]) -> u64 {
        let a = self.space(bytes.len());
        self.mem
            .write_slice(bytes, GuestAddress(a))
            .expect("guest write");
        a
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(&mut v, GuestAddress(addr))
            .expect("guest read");
        v
    }

    /// Submits one chain (descriptors in this order) and serves the queue. Returns the used
    /// length the device reported, checking that the used ring advanced by exactly one.
    fn submit(&mut self, descs: &[D]) -> u32 {
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut flags = if d.2 { VRING_DESC_F_WRITE as u16 } else { 0 };
                if i + 1 < descs.len() {
                    flags |= VRING_DESC_F_NEXT as u16;
                }
                RawDescriptor::from(SplitDescriptor::new(d.0, d.1, flags, i as u16 + 1))
            })
            .collect();
        self.vq.add_desc_chains(&raw, 0).expect("add chain");
        let mut lens = Vec::new();
        while let Some(chain) = self.q.pop_descriptor_chain(self.mem) {
            let head = chain.head_index();
            let used = self.vgpu.process_chain(0, self.mem, chain);
            self.q.add_used(self.mem, head, used).expect("add_used");
            lens.push(used);
        }
        assert_eq!(lens.len(), 1, "exactly one chain served");
        self.completed = self.completed.wrapping_add(1);
        let used_idx = self.vq.used().idx().load();
        assert_eq!(used_idx, self.completed, "used ring advanced");
        let elem = self
            .vq
            .used()
            .ring()
            .ref_at(usize::from(used_idx.wrapping_sub(1)) % 64)
            .expect("elem")
            .load();
        assert_eq!(elem.id(), 0);
        assert_eq!(elem.len(), lens[0]);
        lens[0]
    }

    /// Sends header bytes + data descriptors + a 48-byte response; returns the response.
    fn send_raw(&mut self, header: &[u8], data: &[D]) -> (Response, u32) {
        let h = self.put(header);
        let resp = self.space(Response::SIZE);
        self.mem
            .write_slice(&[0xee; 48], GuestAddress(resp))
            .expect("poison response");
        let mut descs = vec![r(h, header.len())];
        descs.extend_from_slice(data);
        descs.push(w(resp, Response::SIZE));
        let used = self.submit(&descs);
        let response = Response::decode(&self.read(resp, Response::SIZE)).expect("response");
        (response, used)
    }

    fn send(&mut self, req: Request<'_>, data: &[D]) -> Response {
        let id = self.next_id;
        self.next_id += 1;
        let mut buf = [0u8; 1024];
        let n = req.encode(id, &mut buf).expect("encode");
        let (resp, _) = self.send_raw(&buf[..n], data);
        assert_eq!(resp.id, id, "id echoed");
        resp
    }

    fn ok(&mut self, req: Request<'_>, data: &[D]) -> [u64; 4] {
        let op = req.opcode();
        let resp = self.send(req, data);
        assert_eq!(resp.status(), Some(Status::Ok), "{op:?}");
        resp.result
    }

    fn status(&mut self, req: Request<'_>, data: &[D]) -> Status {
        self.send(req, data).status().expect("known status")
    }

    fn alloc(&mut self, size: u64) -> u64 {
        self.ok(Request::Alloc(AllocArgs { size, flags: 0 }), &[])[0]
    }

    fn htod(&mut self, dst: u64, bytes: &[u8]) {
        let a = self.put(bytes);
        let n = bytes.len() as u64;
        assert_eq!(
            self.ok(
                Request::MemcpyHtoD(MemcpyHtoDArgs { dst, size: n }),
                &[r(a, bytes.len())]
            )[0],
            n
        );
    }

    fn dtoh(&mut self, src: u64, len: usize) -> Vec<u8> {
        let a = self.space(len);
        self.ok(
            Request::MemcpyDtoH(MemcpyDtoHArgs {
                src,
                size: len as u64,
            }),
            &[w(a, len)],
        );
        self.read(a, len)
    }

    fn builtin(&mut self) -> u64 {
        let name = self.put(b"builtin");
        self.ok(
            Request::ModuleLoad(ModuleLoadArgs {
                kind: module_kind::BUILTIN,
                flags: 0,
                size: 7,
            }),
            &[r(name, 7)],
        )[0]
    }

    fn get_function(&mut self, module: u64, name: &str) -> [u64; 4] {
        let a = self.put(name.as_bytes());
        self.ok(
            Request::GetFunction(GetFunctionArgs {
                module,
                name_len: name.len() as u64,
            }),
            &[r(a, name.len())],
        )
    }

    fn launch(&mut self, function: u64, args: &[KernelArg]) -> Response {
        let id = self.next_id;
        self.next_id += 1;
        let la = LaunchArgs {
            function,
            grid: [1, 1, 1],
            block: [256, 1, 1],
            ..Default::default()
        };
        let mut buf = [0u8; 1024];
        let n = encode_launch(&mut buf, id, &la, args, &[]).expect("encode");
        self.send_raw(&buf[..n], &[]).0
    }

    /// The "next valid request on the same queue succeeds" check.
    fn still_works(&mut self) {
        let info = self.space(DeviceInfo::SIZE);
        assert_eq!(
            self.ok(Request::GetInfo, &[w(info, DeviceInfo::SIZE)])[0],
            DeviceInfo::SIZE as u64
        );
    }
}

fn ram() -> GuestMem {
    GuestMem::from_ranges(&[(GuestAddress(0), RAM as usize)]).expect("guest ram")
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn get_info_and_config_space() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let a = h.space(256);
    let res = h.ok(Request::GetInfo, &[w(a, 256)]);
    assert_eq!(res[0], 128);
    let info = DeviceInfo::decode(&h.read(a, 128)).expect("info");
    assert_eq!(info.version, PROTOCOL_VERSION);
    assert_eq!(
        (
            info.vgpu_id,
            info.num_queues,
            info.compute_share,
            info.copy_share
        ),
        (7, 2, 600, 400)
    );
    assert_eq!(info.memory_share, 32 * MIB);
    assert_eq!(info.backend, backend_kind::SIM);
    assert_eq!(
        info.features & features::BUILTIN_KERNELS,
        features::BUILTIN_KERNELS
    );
    assert_eq!(info.features & features::PTX, 0);
    assert_eq!(info.name_str(), "vgpu-sim");
    let cs = h.vgpu.config_space();
    assert_eq!(
        (cs.vgpu_id, cs.num_queues, cs.memory_share),
        (7, 2, 32 * MIB)
    );
    assert_eq!(cs.va_base, info.va_base);
}

#[test]
fn vecadd_end_to_end_with_scatter_gather() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let n = 10_000usize;
    let bytes = (n * 4) as u64;
    let (a, b, c) = (h.alloc(bytes), h.alloc(bytes), h.alloc(bytes));
    let va: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let vb: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
    h.htod(a, &f32s(&va));
    // b arrives in three guest buffers of odd sizes.
    let bb = f32s(&vb);
    let (p1, p2, p3) = (
        h.put(&bb[..1001]),
        h.put(&bb[1001..30_000]),
        h.put(&bb[30_000..]),
    );
    h.ok(
        Request::MemcpyHtoD(MemcpyHtoDArgs {
            dst: b,
            size: bytes,
        }),
        &[r(p1, 1001), r(p2, 30_000 - 1001), r(p3, bb.len() - 30_000)],
    );
    let m = h.builtin();
    let f = h.get_function(m, "vector_add");
    assert_eq!(f[1], 4, "parameter count");
    let resp = h.launch(
        f[0],
        &[
            KernelArg::ptr(a, Access::Read),
            KernelArg::ptr(b, Access::Read),
            KernelArg::ptr(c, Access::Write),
            KernelArg::u32(n as u32),
        ],
    );
    assert_eq!(resp.status(), Some(Status::Ok));
    // c comes back in two guest buffers.
    let (o1, o2) = (h.space(5000), h.space(bytes as usize - 5000));
    let res = h.ok(
        Request::MemcpyDtoH(MemcpyDtoHArgs {
            src: c,
            size: bytes,
        }),
        &[w(o1, 5000), w(o2, bytes as usize - 5000)],
    );
    assert_eq!(res[0], bytes);
    let mut got = h.read(o1, 5000);
    got.extend(h.read(o2, bytes as usize - 5000));
    let want: Vec<f32> = va.iter().zip(&vb).map(|(x, y)| x + y).collect();
    assert_eq!(got, f32s(&want));
    let s = h.vgpu.stats();
    assert_eq!(
        (s.bytes_htod, s.bytes_dtoh, s.kernels, s.errors),
        (2 * bytes, bytes, 1, 0)
    );
}

#[test]
fn used_length_covers_writable_data_and_response() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(100);
    let hdr = Request::MemcpyDtoH(MemcpyDtoHArgs { src: d, size: 100 });
    let mut buf = [0u8; 64];
    let n = hdr.encode(9, &mut buf).expect("encode");
    let out = h.space(100);
    let (resp, used) = h.send_raw(&buf[..n], &[w(out, 100)]);
    assert_eq!(resp.status(), Some(Status::Ok));
    assert_eq!(used, 148);
}

#[test]
fn share_limits_allocations() {
    let mem = ram();
    let mut h = Harness::new(&mem, 8 * MIB);
    let a = h.alloc(6 * MIB);
    assert_eq!(
        h.status(
            Request::Alloc(AllocArgs {
                size: 4 * MIB,
                flags: 0
            }),
            &[]
        ),
        Status::OutOfMemory
    );
    assert_eq!(
        h.status(
            Request::Alloc(AllocArgs {
                size: u64::MAX,
                flags: 0
            }),
            &[]
        ),
        Status::OutOfMemory
    );
    assert_eq!(
        h.status(Request::Alloc(AllocArgs { size: 0, flags: 0 }), &[]),
        Status::InvalidArgument
    );
    assert_eq!(
        h.status(Request::Alloc(AllocArgs { size: 1, flags: 1 }), &[]),
        Status::InvalidArgument
    );
    h.ok(Request::Free(FreeArgs { addr: a }), &[]);
    h.alloc(8 * MIB);
}

#[test]
fn copies_memset_dtod() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(256);
    h.htod(d, &(0..=255u8).collect::<Vec<_>>());
    h.ok(
        Request::MemcpyDtoD(MemcpyDtoDArgs {
            dst: d + 128,
            src: d,
            size: 64,
        }),
        &[],
    );
    h.ok(
        Request::Memset(MemsetArgs {
            dst: d,
            count: 4,
            value: 0xabcd,
            elem_size: 2,
        }),
        &[],
    );
    let got = h.dtoh(d, 256);
    assert_eq!(&got[..8], &[0xcd, 0xab, 0xcd, 0xab, 0xcd, 0xab, 0xcd, 0xab]);
    assert_eq!(&got[128..192], &(0..64u8).collect::<Vec<_>>()[..]);
    assert_eq!(
        h.status(
            Request::Memset(MemsetArgs {
                dst: d,
                count: 1,
                value: 0,
                elem_size: 8
            }),
            &[]
        ),
        Status::InvalidArgument
    );
    // Zero-byte copies are fine.
    h.ok(Request::MemcpyHtoD(MemcpyHtoDArgs { dst: d, size: 0 }), &[]);
}

#[test]
fn events_streams_fence() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_eq!(
        h.status(Request::EventQuery(EventArgs { event: 1 }), &[]),
        Status::UnknownEvent
    );
    let t1 = h.ok(Request::EventRecord(EventArgs { event: 1 }), &[])[0];
    let m = h.builtin();
    let spin = h.get_function(m, "spin")[0];
    assert_eq!(
        h.launch(spin, &[KernelArg::u32(2000)]).status(),
        Some(Status::Ok)
    );
    let t2 = h.ok(Request::EventRecord(EventArgs { event: 2 }), &[])[0];
    assert!(t2 >= t1 + 2_000_000);
    assert_eq!(
        h.ok(Request::EventQuery(EventArgs { event: 2 }), &[])[..2],
        [1, t2]
    );
    let el = h.ok(
        Request::EventElapsed(EventElapsedArgs { start: 1, end: 2 }),
        &[],
    );
    assert_eq!(el[0], t2 - t1);
    assert_eq!(el[1], (t2 - t1) / 1000);
    assert_eq!(
        h.ok(
            Request::EventElapsed(EventElapsedArgs { start: 2, end: 1 }),
            &[]
        )[0],
        0
    );
    h.ok(Request::EventDestroy(EventArgs { event: 1 }), &[]);
    assert_eq!(
        h.status(
            Request::EventElapsed(EventElapsedArgs { start: 1, end: 2 }),
            &[]
        ),
        Status::UnknownEvent
    );
    assert_eq!(
        h.status(Request::EventDestroy(EventArgs { event: 1 }), &[]),
        Status::UnknownEvent
    );
    h.ok(Request::StreamSync, &[]);
    h.ok(Request::Fence, &[]);
}

#[test]
fn not_yet_supported_opcodes() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let reqs = [
        Request::ShmGet(ShmGetArgs {
            key: 1,
            size: 4096,
            flags: shm_flags::CREATE,
        }),
        Request::ShmAt(ShmAtArgs { shmid: 1, flags: 0 }),
        Request::ShmDt(ShmDtArgs { addr: 1 }),
        Request::ShmCtl(ShmCtlArgs {
            shmid: 1,
            cmd: shm_cmd::RMID,
            flags: 0,
        }),
        Request::StorageAttach(StorageAttachArgs {
            namespace: 1,
            flags: 0,
        }),
    ];
    for req in reqs {
        assert_eq!(h.status(req, &[]), Status::NotSupported);
    }
    h.still_works();
}

#[test]
fn every_kernel_through_the_queue() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let m = h.builtin();
    let buf = h.alloc(4096);
    let out = h.alloc(8);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 256) as u8).collect();
    h.htod(buf, &data);
    let f = h.get_function(m, "checksum")[0];
    let resp = h.launch(
        f,
        &[
            KernelArg::ptr(buf, Access::Read),
            KernelArg::u64(4096),
            KernelArg::ptr(out, Access::Write),
        ],
    );
    assert_eq!(resp.status(), Some(Status::Ok));
    let got = u64::from_le_bytes(h.dtoh(out, 8).try_into().expect("8 bytes"));
    assert_eq!(got, builtin::fnv1a64(builtin::FNV_OFFSET, &data));
    let f = h.get_function(m, "reduce_sum")[0];
    h.htod(buf, &f32s(&[1.5; 1024]));
    let resp = h.launch(
        f,
        &[
            KernelArg::ptr(buf, Access::Read),
            KernelArg::ptr(out, Access::Write),
            KernelArg::u32(1024),
        ],
    );
    assert_eq!(resp.status(), Some(Status::Ok));
    assert_eq!(h.dtoh(out, 4), 1536.0f32.to_le_bytes());
    let f = h.get_function(m, "gather")[0];
    let idx = h.alloc(16);
    h.htod(idx, &[3, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 1, 0, 0, 0]);
    let resp = h.launch(
        f,
        &[
            KernelArg::ptr(buf, Access::Read),
            KernelArg::ptr(idx, Access::Read),
            KernelArg::ptr(out, Access::Write),
            KernelArg::u32(2),
            KernelArg::u32(1024),
        ],
    );
    assert_eq!(resp.status(), Some(Status::Ok));
    // Third index is huge: the kernel faults, the vGPU keeps working.
    let resp = h.launch(
        f,
        &[
            KernelArg::ptr(buf, Access::Read),
            KernelArg::ptr(idx, Access::Read),
            KernelArg::ptr(idx, Access::Write),
            KernelArg::u32(3),
            KernelArg::u32(1024),
        ],
    );
    assert_eq!(resp.status(), Some(Status::KernelFault));
    h.still_works();
}

#[test]
fn storage_attach_through_a_storage_host() {
    use vgpu_backend::storage::{NamespaceSpec, StorageSet};
    let file = std::env::temp_dir().join(format!("vgpu-device-storage-{}", std::process::id()));
    std::fs::write(&file, vec![5u8; 8192]).expect("write");
    let spec = |id, path: std::path::PathBuf| NamespaceSpec {
        id,
        path,
        read_only: true,
    };
    let set = Arc::new(
        StorageSet::new(vec![
            spec(1, file.clone()),
            spec(2, file.with_extension("gone")),
        ])
        .expect("set"),
    );
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_eq!(h.vgpu.config_space().features & features::STORAGE, 0);
    h.vgpu = new_vgpu(32 * MIB).with_storage(set);
    assert_ne!(h.vgpu.config_space().features & features::STORAGE, 0);
    let attach = |namespace, flags| Request::StorageAttach(StorageAttachArgs { namespace, flags });
    assert_eq!(h.ok(attach(1, 0), &[]), [1, 8192, 512, 1]);
    assert_eq!(h.ok(attach(1, 0), &[]), [1, 8192, 512, 1], "idempotent");
    assert_eq!(
        h.status(attach(2, 0), &[]),
        Status::DeviceError,
        "file gone"
    );
    assert_eq!(h.status(attach(3, 0), &[]), Status::InvalidArgument);
    assert_eq!(h.status(attach(1 << 40, 0), &[]), Status::InvalidArgument);
    assert_eq!(h.status(attach(1, 1), &[]), Status::InvalidArgument);
    h.still_works();
    let _ = std::fs::remove_file(file);
}

#[path = "malformed_tests.rs"]
mod malformed;

#[path = "module_tests.rs"]
mod modules;

#[path = "occupancy_tests.rs"]
mod occupancy;

#[path = "param_tests.rs"]
mod params;

#[path = "tensor_map_tests.rs"]
mod tensor_maps;

#[path = "vmm_tests.rs"]
mod virtual_memory;

#[path = "host_map_tests.rs"]
mod host_maps;
