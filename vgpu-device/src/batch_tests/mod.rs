//! Batched launches through the vhost-user path: a ring with many launches posted at once,
//! served by `VgpuVhostBackend` over the sim backend, with a gate that counts grants and a
//! backend wrapper that records how the launches reached it.

use std::fs::File;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use vgpu_backend::{
    ArgValue, Backend, BackendError, BackendInfo, FunctionInfo, Launch, LaunchOne, LaunchStats,
    ModuleImage, Modules, SimConfig, SimGpu,
};
use vgpu_grant::{Gate, Permit, Resource};
use vgpu_proto::args::module_kind;
use vgpu_proto::*;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::{BatchLimits, DeviceConfig, GuestMem, Vgpu, VgpuVhostBackend};

const MIB: u64 = 1 << 20;
const RAM: u64 = 16 * MIB;
const QSIZE: u16 = 256;

/// Counts grants per resource and keeps each compute grant's estimate.
#[derive(Default)]
struct Counting {
    compute: AtomicUsize,
    copy: AtomicUsize,
    expects: Mutex<Vec<u64>>,
}

impl Gate for Counting {
    fn acquire(&self, resource: Resource) -> Permit<'_> {
        self.acquire_for(resource, 0)
    }
    fn acquire_for(&self, resource: Resource, expect_ns: u64) -> Permit<'_> {
        match resource {
            Resource::Compute => {
                self.compute.fetch_add(1, Ordering::SeqCst);
                self.expects.lock().expect("lock").push(expect_ns);
            }
            Resource::Copy => {
                self.copy.fetch_add(1, Ordering::SeqCst);
            }
        }
        Permit::ungated(resource)
    }
}

/// The sim backend, recording the size of every backend launch call (1: a lone launch);
/// `lose_context`: after a kernel fault in a batch, the later items fail as on a GPU whose
/// context is lost. It claims parameter blobs for a function with one 12-byte parameter,
/// whose launches it records instead of running.
struct Recording {
    sim: SimGpu,
    info: BackendInfo,
    calls: Mutex<Vec<usize>>,
    /// The thread each launch call came on.
    threads: Mutex<Vec<String>>,
    blobs: Mutex<Vec<Vec<u8>>>,
    lose_context: bool,
    /// The guest memory and its used ring's address, and the used index read there each
    /// time a `launch_then` caller's `ended` returned (what the guest could see before the
    /// call's own cleanup).
    used_ring: Mutex<Option<(GuestMemoryAtomic<GuestMem>, u64)>>,
    used_at_end: Mutex<Vec<u16>>,
}

impl Recording {
    /// One launch: a blob launch recorded, any other run on the sim.
    fn run(&self, l: &Launch<'_>) -> vgpu_backend::Result<LaunchStats> {
        if let Some(ArgValue::Blob { offset, len }) = l.args.first().copied() {
            let (o, n) = (offset as usize, len as usize);
            self.blobs
                .lock()
                .expect("lock")
                .push(l.blob.get(o..o + n).expect("blob inside").to_vec());
            return Ok(LaunchStats { device_ns: 1 });
        }
        self.sim.launch_one(l.function, &l.config, l.args)
    }
}

impl Backend for Recording {
    fn info(&self) -> &BackendInfo {
        &self.info
    }
    fn launch(&self, launches: &[Launch<'_>]) -> Vec<vgpu_backend::Result<LaunchStats>> {
        self.calls.lock().expect("lock").push(launches.len());
        let thread = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().expect("lock").push(thread);
        let mut lost = false;
        launches
            .iter()
            .map(|l| {
                if lost {
                    return Err(BackendError::Device("the context is lost".into()));
                }
                let r = self.run(l);
                lost = self.lose_context && matches!(r, Err(BackendError::KernelFault(_)));
                r
            })
            .collect()
    }
    fn launch_then(
        &self,
        launches: &[Launch<'_>],
        ended: &mut dyn FnMut(&[vgpu_backend::Result<LaunchStats>]),
    ) -> Vec<vgpu_backend::Result<LaunchStats>> {
        let results = self.launch(launches);
        ended(&results);
        if let Some((mem, used)) = &*self.used_ring.lock().expect("lock") {
            let idx: u16 = mem
                .memory()
                .read_obj(GuestAddress(used + 2))
                .expect("used idx");
            self.used_at_end.lock().expect("lock").push(idx);
        }
        results
    }
    fn modules(&self) -> &dyn Modules {
        self
    }
    vgpu_backend::forward_backend!(sim:
        memory_usage, alloc, free, check_range, copy_htod, copy_dtoh, copy_dtod, memset,
        synchronize, paging, relocation, shared_memory, host_memory, virtual_memory
    );
}

/// The sim's modules, every function with one 12-byte parameter.
impl Modules for Recording {
    fn module_load(&self, image: ModuleImage<'_>) -> vgpu_backend::Result<u64> {
        self.sim.modules().module_load(image)
    }
    fn module_unload(&self, module: u64) -> vgpu_backend::Result<()> {
        self.sim.modules().module_unload(module)
    }
    fn get_function(&self, module: u64, name: &[u8]) -> vgpu_backend::Result<FunctionInfo> {
        self.sim.modules().get_function(module, name)
    }
    fn param_layout(&self, _function: u64) -> vgpu_backend::Result<ParamLayout> {
        let mut l = ParamLayout::default();
        l.set(0, 0, 12);
        Ok(l)
    }
}

/// A data or response descriptor: (guest address, length, device-writable).
#[derive(Clone, Copy)]
struct D(u64, u32, bool);

/// A vGPU served over a vring, requests posted in rounds (one kick each).
struct Ring {
    mem: GuestMemoryAtomic<GuestMem>,
    vq: MockSplitQueue<'static, GuestMem>,
    vring: VringRwLock<GuestMemoryAtomic<GuestMem>>,
    be: VgpuVhostBackend,
    backend: Arc<Recording>,
    gate: Arc<Counting>,
    _call: EventFd,
    bump: u64,
    next_id: u64,
    /// The round being posted: its descriptors and each chain's head index, response
    /// address (0: none) and id.
    posted: Vec<RawDescriptor>,
    pending: Vec<(u16, u64, u64)>,
    completed: u16,
}

impl Ring {
    fn new(batch: BatchLimits, lose_context: bool) -> Self {
        let ram = GuestMem::from_ranges(&[(GuestAddress(0), RAM as usize)]).expect("ram");
        let mem = GuestMemoryAtomic::new(ram);
        // The mock queue borrows the memory for its life; the test's memory lives as long.
        let leaked: &'static GuestMem = Box::leak(Box::new((*mem.memory()).clone()));
        let vq = MockSplitQueue::new(leaked, QSIZE);
        let sim = SimGpu::new(SimConfig {
            memory: 64 * MIB,
            va_size: 1 << 30,
            threads: 1,
            ..SimConfig::default()
        })
        .expect("sim");
        let mut info = sim.info().clone();
        info.features |= features::PARAM_BLOBS;
        let backend = Arc::new(Recording {
            sim,
            info,
            calls: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            blobs: Mutex::new(Vec::new()),
            lose_context,
            used_ring: Mutex::new(Some((mem.clone(), vq.used_addr().0))),
            used_at_end: Mutex::new(Vec::new()),
        });
        let gate = Arc::new(Counting::default());
        let cfg = DeviceConfig {
            vgpu_id: 5,
            num_queues: 1,
            queue_size: QSIZE,
            memory_share: 32 * MIB,
            compute_share: 500,
            copy_share: 500,
            batch,
        };
        let vgpu = Vgpu::new(cfg, backend.clone())
            .expect("vgpu")
            .with_gate(gate.clone());
        let be = VgpuVhostBackend::new(Arc::new(vgpu), mem.clone());
        be.set_event_idx(true);
        let vring = VringRwLock::new(mem.clone(), QSIZE).expect("vring");
        vring.set_queue_size(QSIZE);
        vring
            .set_queue_info(vq.desc_table_addr().0, vq.avail_addr().0, vq.used_addr().0)
            .expect("queue info");
        vring.set_queue_event_idx(true);
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        let call = EventFd::new(EFD_NONBLOCK).expect("eventfd");
        let fd = call.try_clone().expect("dup").into_raw_fd();
        // SAFETY: `fd` is a fresh duplicate we own; the File takes it over.
        vring.set_call(Some(unsafe { File::from_raw_fd(fd) }));
        Self {
            mem,
            vq,
            vring,
            be,
            backend,
            gate,
            _call: call,
            bump: MIB,
            next_id: 1,
            posted: Vec::new(),
            pending: Vec::new(),
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
            .memory()
            .write_slice(bytes, GuestAddress(a))
            .expect("guest write");
        a
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .memory()
            .read_slice(&mut v, GuestAddress(addr))
            .expect("guest read");
        v
    }

    /// Adds a chain (header, `data`, then a response descriptor unless `respond` is false)
    /// to this round; returns its id.
    fn post_raw(&mut self, header: &[u8], data: &[D], respond: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let h = self.put(header);
        let resp = self.space(Response::SIZE);
        self.mem
            .memory()
            .write_slice(&[0xee; 48], GuestAddress(resp))
            .expect("poison");
        let mut descs = vec![D(h, header.len() as u32, false)];
        descs.extend_from_slice(data);
        if respond {
            descs.push(D(resp, Response::SIZE as u32, true));
        }
        let base = self.posted.len() as u16;
        for (i, d) in descs.iter().enumerate() {
            let mut flags = if d.2 { VRING_DESC_F_WRITE as u16 } else { 0 };
            if i + 1 < descs.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.posted.push(RawDescriptor::from(SplitDescriptor::new(
                d.0,
                d.1,
                flags,
                base + i as u16 + 1,
            )));
        }
        self.pending
            .push((base, if respond { resp } else { 0 }, id));
        id
    }

    fn post(&mut self, req: Request<'_>, data: &[D]) -> u64 {
        let mut buf = [0u8; 1024];
        let n = req.encode(self.next_id, &mut buf).expect("encode");
        self.post_raw(&buf[..n], data, true)
    }

    fn post_launch(&mut self, la: LaunchArgs, args: &[KernelArg], blob: &[u8]) -> u64 {
        let mut buf = [0u8; 8192];
        let n =
            encode_launch_with_blob(&mut buf, self.next_id, &la, args, &[], blob).expect("encode");
        self.post_raw(&buf[..n], &[], true)
    }

    /// Kicks the queue once for everything posted; returns each request's response (None
    /// for a chain without one), in posting order, checking the used ring took every
    /// chain in order.
    fn kick(&mut self) -> Vec<Option<Response>> {
        self.vq.add_desc_chains(&self.posted, 0).expect("chains");
        self.be
            .handle_event(0, EventSet::IN, std::slice::from_ref(&self.vring), 0)
            .expect("handle");
        let n = self.pending.len() as u16;
        assert_eq!(
            self.vq.used().idx().load(),
            self.completed.wrapping_add(n),
            "every request completed"
        );
        for (k, (head, _, _)) in self.pending.iter().enumerate() {
            let e = self
                .vq
                .used()
                .ring()
                .ref_at(usize::from(self.completed.wrapping_add(k as u16) % QSIZE))
                .expect("used elem")
                .load();
            assert_eq!(e.id(), u32::from(*head), "completed in ring order");
        }
        self.completed = self.completed.wrapping_add(n);
        self.posted.clear();
        let pending = std::mem::take(&mut self.pending);
        pending
            .into_iter()
            .map(|(_, resp, id)| {
                (resp != 0).then(|| {
                    let r = Response::decode(&self.read(resp, Response::SIZE)).expect("response");
                    assert_eq!(r.id, id, "id echoed");
                    r
                })
            })
            .collect()
    }

    /// One request in a round of its own; its result, checked OK.
    fn ok(&mut self, req: Request<'_>, data: &[D]) -> [u64; 4] {
        self.post(req, data);
        let r = self.kick().remove(0).expect("response");
        assert_eq!(r.status(), Some(Status::Ok));
        r.result
    }

    fn alloc(&mut self, size: u64) -> u64 {
        self.ok(Request::Alloc(AllocArgs { size, flags: 0 }), &[])[0]
    }

    fn dtoh_words(&mut self, src: u64, n: usize) -> Vec<u32> {
        let a = self.space(n * 4);
        self.ok(
            Request::MemcpyDtoH(MemcpyDtoHArgs {
                src,
                size: (n * 4) as u64,
            }),
            &[D(a, (n * 4) as u32, true)],
        );
        self.read(a, n * 4)
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("word")))
            .collect()
    }

    fn function(&mut self, name: &str) -> u64 {
        let m = self.put(b"builtin");
        let module = self.ok(
            Request::ModuleLoad(ModuleLoadArgs {
                kind: module_kind::BUILTIN,
                flags: 0,
                size: 7,
            }),
            &[D(m, 7, false)],
        )[0];
        let a = self.put(name.as_bytes());
        self.ok(
            Request::GetFunction(GetFunctionArgs {
                module,
                name_len: name.len() as u64,
            }),
            &[D(a, name.len() as u32, false)],
        )[0]
    }

    fn compute_grants(&self) -> usize {
        self.gate.compute.load(Ordering::SeqCst)
    }

    fn calls(&self) -> Vec<usize> {
        self.backend.calls.lock().expect("lock").clone()
    }
}

fn la(function: u64) -> LaunchArgs {
    LaunchArgs {
        function,
        grid: [1, 1, 1],
        block: [64, 1, 1],
        ..Default::default()
    }
}

/// `fill(dst, value, n)`.
fn fill_args(dst: u64, value: u32, n: u32) -> [KernelArg; 3] {
    [
        KernelArg::ptr(dst, Access::Write),
        KernelArg::u32(value),
        KernelArg::u32(n),
    ]
}

fn wide_window() -> BatchLimits {
    BatchLimits {
        max_launches: 32,
        max_expected_ns: 10_000_000_000,
    }
}

#[test]
fn thirty_two_launches_posted_at_once_run_in_order_under_one_grant() {
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(32 * 16 * 4);
    let fill = ring.function("fill");
    // The kernel is timed once first: a kernel with no time yet runs alone.
    ring.post_launch(la(fill), &fill_args(buf, 99, 16), &[]);
    assert_eq!(ring.kick()[0].expect("r").status(), Some(Status::Ok));
    let (grants, calls) = (ring.compute_grants(), ring.calls().len());
    for i in 0..32u32 {
        ring.post_launch(la(fill), &fill_args(buf + u64::from(i) * 64, i, 16), &[]);
    }
    let busy = ring.be.vgpu().stats().busy_ns;
    let t = std::time::Instant::now();
    let out = ring.kick();
    let wall = t.elapsed().as_nanos() as u64;
    let busy = ring.be.vgpu().stats().busy_ns - busy;
    assert!(
        busy <= wall,
        "the batch counts once in the busy time: {busy} ns in {wall} ns"
    );
    assert_eq!(out.len(), 32);
    for r in &out {
        let r = r.expect("response");
        assert_eq!(r.status(), Some(Status::Ok));
    }
    assert_eq!(ring.compute_grants() - grants, 1, "one grant for the batch");
    assert_eq!(&ring.calls()[calls..], &[32], "one backend call of 32");
    assert!(
        ring.gate.expects.lock().expect("lock").last().copied() > Some(0),
        "the grant carries the batch's estimate"
    );
    let words = ring.dtoh_words(buf, 32 * 16);
    for (i, w) in words.iter().enumerate() {
        assert_eq!(*w, (i / 16) as u32, "word {i}");
    }
    let s = ring.be.vgpu().stats();
    assert_eq!(s.kernels, 33);
}

#[test]
fn an_invalid_launch_in_a_batch_gets_its_error_and_its_neighbours_run() {
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(8 * 64);
    let fill = ring.function("fill");
    ring.post_launch(la(fill), &fill_args(buf, 7, 16), &[]);
    ring.kick();
    let grants = ring.compute_grants();
    ring.post_launch(la(fill), &fill_args(buf, 1, 16), &[]);
    // The device's own checks: a zero block.
    let bad_geometry = LaunchArgs {
        block: [0, 1, 1],
        ..la(fill)
    };
    ring.post_launch(bad_geometry, &fill_args(buf, 2, 16), &[]);
    ring.post_launch(la(fill), &fill_args(buf + 64, 3, 16), &[]);
    // The backend's checks: a pointer outside every allocation.
    ring.post_launch(la(fill), &fill_args(0x10, 4, 16), &[]);
    // An unknown function.
    ring.post_launch(la(0xdead_0001), &fill_args(buf, 5, 16), &[]);
    ring.post_launch(la(fill), &fill_args(buf + 128, 6, 16), &[]);
    let out: Vec<Status> = ring
        .kick()
        .into_iter()
        .map(|r| r.expect("response").status().expect("status"))
        .collect();
    assert_eq!(out[0], Status::Ok);
    assert_eq!(out[1], Status::InvalidArgument);
    assert_eq!(out[2], Status::Ok);
    assert_ne!(out[3], Status::Ok);
    assert_ne!(out[4], Status::Ok);
    assert_eq!(out[5], Status::Ok);
    // The unknown function has no usual time: like a kernel not timed yet it fills a
    // batch's window, so it runs alone between two batches.
    assert_eq!(ring.compute_grants() - grants, 3);
    assert_eq!(ring.calls()[1..], [3, 1, 1]);
    let words = ring.dtoh_words(buf, 48);
    assert!(words[..16].iter().all(|w| *w == 1));
    assert!(words[16..32].iter().all(|w| *w == 3));
    assert!(words[32..].iter().all(|w| *w == 6));
}

#[test]
fn a_request_between_launches_is_served_in_order() {
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(64);
    let fill = ring.function("fill");
    ring.post_launch(la(fill), &fill_args(buf, 0, 16), &[]);
    ring.kick();
    let grants = ring.compute_grants();
    let copies = ring.gate.copy.load(Ordering::SeqCst);
    for v in 1..=3 {
        ring.post_launch(la(fill), &fill_args(buf, v, 16), &[]);
    }
    let seen = ring.space(64);
    ring.post(
        Request::MemcpyDtoH(MemcpyDtoHArgs { src: buf, size: 64 }),
        &[D(seen, 64, true)],
    );
    for v in 4..=6 {
        ring.post_launch(la(fill), &fill_args(buf, v, 16), &[]);
    }
    let out = ring.kick();
    assert!(out
        .iter()
        .all(|r| r.expect("response").status() == Some(Status::Ok)));
    let words: Vec<u32> = ring
        .read(seen, 64)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("word")))
        .collect();
    assert!(
        words.iter().all(|w| *w == 3),
        "the copy saw the launches before it and none after: {words:?}"
    );
    assert!(ring.dtoh_words(buf, 16).iter().all(|w| *w == 6));
    assert_eq!(ring.compute_grants() - grants, 2, "a batch on each side");
    assert_eq!(ring.gate.copy.load(Ordering::SeqCst) - copies, 2);
}

#[test]
fn the_expected_time_window_splits_a_batch() {
    let mut ring = Ring::new(
        BatchLimits {
            max_launches: 32,
            max_expected_ns: 2_500_000,
        },
        false,
    );
    let buf = ring.alloc(64);
    let fill = ring.function("fill");
    // A kernel not timed yet counts as the whole window: the first runs alone.
    for v in 0..3 {
        ring.post_launch(la(fill), &fill_args(buf, v, 16), &[]);
    }
    assert!(ring
        .kick()
        .iter()
        .all(|r| r.expect("r").status() == Some(Status::Ok)));
    assert_eq!(ring.calls()[0], 1, "the untimed kernel ran alone");
    // Taken to run 1 ms each (the running average brought there): two fit in 2.5 ms,
    // the third starts the next batch.
    for _ in 0..60 {
        ring.be.vgpu().kernel_times.record(fill, 1_000_000);
    }
    let calls = ring.calls().len();
    let grants = ring.compute_grants();
    for v in 0..6 {
        ring.post_launch(la(fill), &fill_args(buf, v, 16), &[]);
    }
    assert!(ring
        .kick()
        .iter()
        .all(|r| r.expect("r").status() == Some(Status::Ok)));
    let after = ring.calls();
    assert_eq!(after[calls], 2, "the first batch holds two 1 ms kernels");
    assert_eq!(after[calls..].iter().sum::<usize>(), 6);
    assert!(ring.compute_grants() - grants >= 2);
    assert!(ring.dtoh_words(buf, 16).iter().all(|w| *w == 5));
}

#[test]
fn max_launches_bounds_a_batch_and_one_turns_batching_off() {
    for (max, want) in [(4u16, vec![4, 4, 2]), (1, vec![1; 10])] {
        let mut ring = Ring::new(
            BatchLimits {
                max_launches: max,
                max_expected_ns: 10_000_000_000,
            },
            false,
        );
        let buf = ring.alloc(64);
        let fill = ring.function("fill");
        ring.post_launch(la(fill), &fill_args(buf, 0, 16), &[]);
        ring.kick();
        let calls = ring.calls().len();
        for v in 0..10 {
            ring.post_launch(la(fill), &fill_args(buf, v, 16), &[]);
        }
        assert!(ring
            .kick()
            .iter()
            .all(|r| r.expect("r").status() == Some(Status::Ok)));
        assert_eq!(ring.calls()[calls..], want[..], "max_launches {max}");
    }
}

/// `gather(src, idx, dst, n, src_len)` of one word, from index `at`.
fn gather(ring: &mut Ring, f: u64, bufs: (u64, u64, u64), at: u32) -> u64 {
    let (src, idx, dst) = bufs;
    ring.post(
        Request::Memset(MemsetArgs {
            dst: idx,
            value: at,
            elem_size: 4,
            count: 1,
        }),
        &[],
    );
    ring.kick();
    ring.post_launch(
        la(f),
        &[
            KernelArg::ptr(src, Access::Read),
            KernelArg::ptr(idx, Access::Read),
            KernelArg::ptr(dst, Access::Write),
            KernelArg::u32(1),
            KernelArg::u32(4),
        ],
        &[],
    )
}

#[test]
fn a_kernel_fault_fails_its_launch_and_on_a_lost_context_the_later_ones() {
    for lose_context in [false, true] {
        let mut ring = Ring::new(wide_window(), lose_context);
        let (src, idx, dst) = (ring.alloc(64), ring.alloc(64), ring.alloc(64));
        let buf = ring.alloc(64);
        let g = ring.function("gather");
        let fill = ring.function("fill");
        gather(&mut ring, g, (src, idx, dst), 0);
        ring.post_launch(la(fill), &fill_args(buf, 0, 16), &[]);
        ring.kick();
        // idx[0] = 9 is past src_len = 4: the gather faults.
        ring.post(
            Request::Memset(MemsetArgs {
                dst: idx,
                value: 9,
                elem_size: 4,
                count: 1,
            }),
            &[],
        );
        ring.kick();
        ring.post_launch(la(fill), &fill_args(buf, 1, 16), &[]);
        ring.post_launch(
            la(g),
            &[
                KernelArg::ptr(src, Access::Read),
                KernelArg::ptr(idx, Access::Read),
                KernelArg::ptr(dst, Access::Write),
                KernelArg::u32(1),
                KernelArg::u32(4),
            ],
            &[],
        );
        ring.post_launch(la(fill), &fill_args(buf, 2, 16), &[]);
        let out: Vec<Status> = ring
            .kick()
            .into_iter()
            .map(|r| r.expect("response").status().expect("status"))
            .collect();
        assert_eq!(out[0], Status::Ok);
        assert_eq!(out[1], Status::KernelFault);
        if lose_context {
            assert_eq!(out[2], Status::DeviceError, "after a lost context");
        } else {
            assert_eq!(out[2], Status::Ok, "the sim keeps its context");
        }
        assert_eq!(ring.calls().last(), Some(&3));
    }
}

#[test]
fn blob_arguments_go_with_each_launch_of_a_batch() {
    let mut ring = Ring::new(wide_window(), false);
    let fill = ring.function("fill");
    ring.be.vgpu().kernel_times.record(fill, 1000);
    for k in 0..3u8 {
        let blob: Vec<u8> = (0..12).map(|b| b * 10 + k).collect();
        ring.post_launch(la(fill), &[KernelArg::blob(0, 12).expect("blob")], &blob);
    }
    assert!(ring
        .kick()
        .iter()
        .all(|r| r.expect("r").status() == Some(Status::Ok)));
    assert_eq!(ring.calls(), vec![3]);
    let seen = ring.backend.blobs.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3);
    for (k, b) in seen.iter().enumerate() {
        assert_eq!(b, &(0..12).map(|x| x * 10 + k as u8).collect::<Vec<u8>>());
    }
}

#[test]
fn malformed_launches_in_a_batch_get_errors_and_the_queue_keeps_serving() {
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(64);
    let fill = ring.function("fill");
    ring.be.vgpu().kernel_times.record(fill, 1000);
    ring.post_launch(la(fill), &fill_args(buf, 1, 16), &[]);
    // A LAUNCH header cut short.
    let short = RequestHeader {
        opcode: Opcode::Launch as u32,
        flags: 0,
        id: ring.next_id,
    }
    .to_bytes();
    ring.post_raw(&short, &[], true);
    // A launch without a response descriptor: returned with used length 0.
    let mut b = [0u8; 1024];
    let n = encode_launch(&mut b, ring.next_id, &la(fill), &fill_args(buf, 9, 16), &[])
        .expect("encode");
    ring.post_raw(&b[..n], &[], false);
    // A launch with a data descriptor it does not take.
    let n = encode_launch(&mut b, ring.next_id, &la(fill), &fill_args(buf, 9, 16), &[])
        .expect("encode");
    let d = ring.space(16);
    ring.post_raw(&b[..n], &[D(d, 16, false)], true);
    // Argument count above the limit, in a header that says so.
    let mut many = la(fill);
    many.arg_count = MAX_KERNEL_ARGS + 1;
    let n = encode_launch(&mut b, ring.next_id, &la(fill), &fill_args(buf, 9, 16), &[])
        .expect("encode");
    b[RequestHeader::SIZE..RequestHeader::SIZE + LaunchArgs::SIZE]
        .copy_from_slice(&many.to_bytes());
    ring.post_raw(&b[..n], &[], true);
    ring.post_launch(la(fill), &fill_args(buf, 2, 16), &[]);
    let out = ring.kick();
    assert_eq!(out[0].expect("r").status(), Some(Status::Ok));
    assert_ne!(out[1].expect("r").status(), Some(Status::Ok));
    assert!(out[2].is_none(), "no response descriptor");
    assert_ne!(out[3].expect("r").status(), Some(Status::Ok));
    assert_ne!(out[4].expect("r").status(), Some(Status::Ok));
    assert_eq!(out[5].expect("r").status(), Some(Status::Ok));
    assert!(ring.dtoh_words(buf, 16).iter().all(|w| *w == 2));
}

#[test]
fn a_guest_that_waits_for_each_launch_takes_a_grant_per_kernel_and_is_answered_at_once() {
    // What BAND sees of a one-stream guest: every kernel asks for the GPU on its own and
    // is answered before the next is posted; nothing is held back for a later doorbell.
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(64);
    let fill = ring.function("fill");
    let (grants, calls) = (ring.compute_grants(), ring.calls().len());
    for v in 0..5 {
        ring.post_launch(la(fill), &fill_args(buf, v, 16), &[]);
        let out = ring.kick();
        assert_eq!(out.len(), 1, "launch {v} answered on its own doorbell");
        assert_eq!(out[0].expect("response").status(), Some(Status::Ok));
        assert_eq!(
            ring.compute_grants() - grants,
            v as usize + 1,
            "a grant per launch"
        );
        assert_eq!(
            ring.dtoh_words(buf, 1),
            vec![v],
            "launch {v} ran before its answer"
        );
    }
    assert_eq!(ring.calls()[calls..], [1; 5], "one backend call per launch");
}

mod burst;
mod early;
