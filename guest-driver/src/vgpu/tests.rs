//! The request API against a small vGPU model behind the fake virtio device: it parses
//! chains with vgpu-proto exactly as the real device does and serves a subset of opcodes
//! from host memory, answering at QueueNotify time.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_proto::{
    features, parse_request, Access, DeviceInfo, KernelArg, Opcode, Request, Response, Status,
    VgpuConfig, PROTOCOL_VERSION, VIRTIO_ID_VGPU,
};

use super::{launch_1d, Stream, StreamOptions, VgpuDevice};
use crate::fake::{read_bytes, write_bytes, FakeDevice, FakeTransport};
use crate::spec::{feature, ring, status};
use crate::{Buffer, Error};

const VA_BASE: u64 = 0x7_0000_0000;
const MODULE: u64 = 0x11;
const VECTOR_ADD: u64 = 0x22;

/// Device model state.
#[derive(Default)]
struct Gpu {
    allocs: BTreeMap<u64, Vec<u8>>,
    next: u64,
    clock: u64,
    /// Answer nothing (a hung device).
    silent: bool,
    /// Tamper with the next response.
    tamper: Option<Tamper>,
}

#[derive(Clone, Copy)]
enum Tamper {
    NoResponse,
    WrongId,
    UnknownStatus,
    /// The used length of a full response, and nothing written.
    Unwritten,
}

impl Gpu {
    /// The allocation holding `addr..addr + len`, and the offset of `addr` in it.
    fn range(&mut self, addr: u64, len: u64) -> Option<(&mut Vec<u8>, usize)> {
        let (&base, mem) = self.allocs.range_mut(..=addr).next_back()?;
        let off = addr - base;
        (off + len <= mem.len() as u64).then_some((mem, off as usize))
    }

    /// Serves one request; returns (status, result words, bytes written to data).
    fn serve(
        &mut self,
        header: &[u8],
        data: &[crate::fake::Desc],
    ) -> (u64, Status, [u64; 4], usize) {
        let (h, req) = match parse_request(header) {
            Ok(ok) => ok,
            Err((h, e)) => return (h.map_or(0, |h| h.id), e.status(), [0; 4], 0),
        };
        let readable: Vec<u8> = data
            .iter()
            .filter(|d| d.flags & ring::DESC_F_WRITE == 0)
            .flat_map(|d| read_bytes(d.addr, d.len as usize))
            .collect();
        let ok = |r: [u64; 4]| (h.id, Status::Ok, r, 0);
        let err = |s: Status| (h.id, s, [0; 4], 0);
        match req {
            Request::GetInfo => {
                let info = DeviceInfo {
                    version: PROTOCOL_VERSION,
                    vgpu_id: 9,
                    num_queues: 2,
                    va_base: VA_BASE,
                    name: DeviceInfo::pad_name("fake"),
                    ..DeviceInfo::default()
                };
                write_bytes(data[0].addr, &info.to_bytes());
                (h.id, Status::Ok, [128, 0, 0, 0], 128)
            }
            Request::Alloc(a) => {
                let addr = VA_BASE + self.next;
                self.next += a.size.div_ceil(2 << 20) * (2 << 20);
                self.allocs.insert(addr, vec![0; a.size as usize]);
                ok([addr, a.size, 0, 0])
            }
            Request::Free(a) => match self.allocs.remove(&a.addr) {
                Some(_) => ok([0; 4]),
                None => err(Status::BadDevicePointer),
            },
            Request::MemcpyHtoD(a) if readable.len() as u64 == a.size => {
                match self.range(a.dst, a.size) {
                    Some((mem, off)) => {
                        mem[off..off + readable.len()].copy_from_slice(&readable);
                        ok([a.size, 0, 0, 0])
                    }
                    None => err(Status::BadDevicePointer),
                }
            }
            Request::MemcpyDtoH(a) => match self.range(a.src, a.size) {
                Some((mem, off)) => {
                    let bytes = mem[off..off + a.size as usize].to_vec();
                    let mut at = 0;
                    for d in data {
                        write_bytes(d.addr, &bytes[at..at + d.len as usize]);
                        at += d.len as usize;
                    }
                    (h.id, Status::Ok, [a.size, 0, 0, 0], at)
                }
                None => err(Status::BadDevicePointer),
            },
            Request::ModuleLoad(_) if readable == b"builtin" => ok([MODULE, 0, 0, 0]),
            Request::GetFunction(a) if a.module == MODULE && readable == b"vector_add" => {
                ok([VECTOR_ADD, 4, 0, 0])
            }
            Request::GetFunction(_) => err(Status::UnknownFunction),
            Request::Launch(l) if l.launch.function == VECTOR_ADD => {
                let a: Vec<KernelArg> = l.args.iter().collect();
                let n = a[3].value as usize;
                let word = |g: &mut Gpu, p: u64, i: usize| {
                    let (m, o) = g.range(p + 4 * i as u64, 4).expect("in range");
                    f32::from_le_bytes(m[o..o + 4].try_into().expect("4 bytes"))
                };
                for i in 0..n {
                    let v = word(self, a[0].value, i) + word(self, a[1].value, i);
                    let (m, o) = self.range(a[2].value + 4 * i as u64, 4).expect("in range");
                    m[o..o + 4].copy_from_slice(&v.to_le_bytes());
                }
                ok([1000, 0, 0, 0])
            }
            // 132 SMs in clusters of the asked size, for a question the device would answer.
            Request::ClusterOccupancy(q) if q.function == VECTOR_ADD && q.check().is_ok() => {
                ok([132 / q.cluster_blocks().max(1), 0, 0, 0])
            }
            Request::ClusterOccupancy(_) => err(Status::InvalidArgument),
            Request::StreamSync => ok([0; 4]),
            Request::EventRecord(_) => {
                self.clock += 10;
                ok([self.clock, 0, 0, 0])
            }
            Request::EventQuery(e) if e.event == 404 => err(Status::NotReady),
            _ => err(Status::NotSupported),
        }
    }

    fn on_notify(&mut self, dev: &mut FakeDevice, q: u32) {
        if self.silent {
            return;
        }
        let q = q as usize;
        for head in dev.take_avail(q) {
            let chain = dev.chain(q, head);
            let Some((resp, rest)) = chain.split_last() else {
                continue;
            };
            if resp.flags & ring::DESC_F_WRITE == 0 || resp.len < 48 || rest.is_empty() {
                dev.push_used(q, u32::from(head), 0);
                continue;
            }
            let header = read_bytes(rest[0].addr, rest[0].len as usize);
            let (id, status, result, written) = self.serve(&header, &rest[1..]);
            let mut r = Response {
                status: status as u32,
                reserved: 0,
                id,
                result,
            };
            let mut used = written as u32 + 48;
            let mut write = true;
            match self.tamper.take() {
                Some(Tamper::NoResponse) => used = 0,
                Some(Tamper::WrongId) => r.id += 1000,
                Some(Tamper::UnknownStatus) => r.status = 999,
                Some(Tamper::Unwritten) => write = false,
                None => {}
            }
            if write {
                write_bytes(resp.addr, &r.to_bytes());
            }
            dev.push_used(q, u32::from(head), used);
        }
        // Ask for a notification on the next request, as an EVENT_IDX device does.
        let next = dev.queues[q].last_avail;
        dev.set_avail_event(q, next);
    }
}

static CLOCK: AtomicU64 = AtomicU64::new(0);

/// Advances 1 ms per read, so timeouts expire after a bounded number of polls.
fn fake_now() -> u64 {
    CLOCK.fetch_add(1_000_000, Ordering::Relaxed)
}

const OPTS: StreamOptions = StreamOptions {
    queue_size: 16,
    now_ns: fake_now,
    timeout_ns: 1_000_000_000,
    relax: crate::vgpu::spin_relax,
    wake_after_ns: u64::MAX,
    learn: crate::vgpu::no_learning,
};

fn config(version: u32, queues: u32) -> Vec<u8> {
    VgpuConfig {
        version,
        vgpu_id: 9,
        num_queues: queues,
        max_kernel_args: 32,
        features: features::BUILTIN_KERNELS | features::EVENTS,
        memory_share: 1 << 30,
        compute_share: 500,
        copy_share: 500,
        va_base: VA_BASE,
        va_size: 1 << 40,
    }
    .to_bytes()
    .to_vec()
}

fn fake_device(version: u32) -> (FakeTransport, Rc<RefCell<Gpu>>) {
    let mut d = FakeDevice::new(feature::VERSION_1 | feature::RING_EVENT_IDX, 16);
    d.device_id = VIRTIO_ID_VGPU;
    d.config = config(version, 2);
    let gpu = Rc::new(RefCell::new(Gpu::default()));
    let g = gpu.clone();
    d.on_notify = Some(Box::new(move |dev, q| g.borrow_mut().on_notify(dev, q)));
    (FakeTransport::new(d), gpu)
}

fn started() -> (Stream<FakeTransport, 16>, FakeTransport, Rc<RefCell<Gpu>>) {
    let (t, gpu) = fake_device(PROTOCOL_VERSION);
    let mut dev = VgpuDevice::probe(t.clone()).expect("probe");
    let s = dev.open_stream::<16>(0, OPTS).expect("stream");
    dev.start().expect("start");
    (s, t, gpu)
}

#[test]
fn probe_reads_config_and_negotiates() {
    let (t, _) = fake_device(PROTOCOL_VERSION);
    let mut dev = VgpuDevice::probe(t.clone()).expect("probe");
    assert_eq!(dev.config().vgpu_id, 9);
    assert_eq!(dev.num_queues(), 2);
    assert_eq!(
        t.dev.borrow().driver_features,
        feature::VERSION_1 | feature::RING_EVENT_IDX
    );
    assert_eq!(
        dev.open_stream::<16>(2, OPTS).err(),
        Some(Error::NoSuchQueue(2))
    );
    let s1 = dev.open_stream::<16>(1, OPTS).expect("stream 1");
    assert_eq!((s1.index(), s1.queue_size(), s1.capacity()), (1, 16, 8));
    dev.start().expect("start");
    assert_ne!(t.dev.borrow().status & status::DRIVER_OK, 0);
}

#[test]
fn probe_refuses_other_devices_and_majors() {
    let (t, _) = fake_device(2 << 16);
    assert_eq!(
        VgpuDevice::probe(t.clone()).err(),
        Some(Error::IncompatibleDevice { version: 2 << 16 })
    );
    assert_ne!(t.dev.borrow().status & status::FAILED, 0);
    // A newer minor is fine.
    let (t, _) = fake_device(PROTOCOL_VERSION + 5);
    assert!(VgpuDevice::probe(t).is_ok());
    let (t, _) = fake_device(PROTOCOL_VERSION);
    t.dev.borrow_mut().device_id = 1;
    assert_eq!(
        VgpuDevice::probe(t).err(),
        Some(Error::WrongDevice {
            expected: VIRTIO_ID_VGPU,
            found: 1
        })
    );
}

#[test]
fn memory_round_trip_and_errors() {
    let (mut s, _t, gpu) = started();
    let a = s.alloc(10_000).expect("alloc");
    assert_eq!(a, VA_BASE);
    let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    s.memcpy_htod(a, &src).expect("htod");
    let mut back = vec![0u8; 10_000];
    s.memcpy_dtoh(&mut back, a).expect("dtoh");
    assert_eq!(src, back);
    assert_eq!(gpu.borrow().allocs[&a][..10_000], src[..]);
    // Past the end of the allocation: the device's error comes back typed.
    assert_eq!(
        s.memcpy_htod(a + 9_999, &src[..2]),
        Err(Error::Device {
            opcode: Opcode::MemcpyHtoD as u32,
            status: Status::BadDevicePointer
        })
    );
    s.free(a).expect("free");
    assert_eq!(
        s.free(a),
        Err(Error::Device {
            opcode: Opcode::Free as u32,
            status: Status::BadDevicePointer
        })
    );
    // The stream keeps working after errors, and no slot leaked.
    assert_eq!(s.outstanding(), 0);
    s.stream_sync().expect("sync");
}

#[test]
fn get_info_is_decoded_from_the_slot() {
    let (mut s, _t, _gpu) = started();
    let info = s.get_info().expect("info");
    assert_eq!(
        (info.vgpu_id, info.num_queues, info.va_base),
        (9, 2, VA_BASE)
    );
    assert_eq!(info.name_str(), "fake");
}

#[test]
fn vector_add_through_module_function_launch() {
    let (mut s, _t, _gpu) = started();
    let n = 100usize;
    let bytes =
        |f: &dyn Fn(usize) -> f32| -> Vec<u8> { (0..n).flat_map(|i| f(i).to_le_bytes()).collect() };
    let (a, b) = (bytes(&|i| i as f32), bytes(&|i| 2.0 * i as f32));
    let [da, db, dc] = [0; 3].map(|_| s.alloc(4 * n as u64).expect("alloc"));
    s.memcpy_htod(da, &a).expect("htod a");
    s.memcpy_htod(db, &b).expect("htod b");
    let module = s.load_builtin().expect("module");
    let f = s.get_function(module, "vector_add").expect("function");
    assert_eq!(f.params, 4);
    assert_eq!(
        s.get_function(module, "nope"),
        Err(Error::Device {
            opcode: Opcode::GetFunction as u32,
            status: Status::UnknownFunction
        })
    );
    let args = [
        KernelArg::ptr(da, Access::Read),
        KernelArg::ptr(db, Access::Read),
        KernelArg::ptr(dc, Access::Write),
        KernelArg::u64(n as u64),
    ];
    assert_eq!(
        s.launch(&launch_1d(f.handle, n as u64, 64), &args),
        Ok(1000)
    );
    let mut c = vec![0u8; 4 * n];
    s.memcpy_dtoh(&mut c, dc).expect("dtoh");
    for i in 0..n {
        let v = f32::from_le_bytes(c[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        assert_eq!(v, 3.0 * i as f32);
    }
}

#[test]
fn a_batch_rings_one_doorbell() {
    let (mut s, t, _gpu) = started();
    let before = t.dev.borrow().notifies.len();
    let tickets: Vec<_> = (0..8)
        .map(|_| s.enqueue_alloc(4096).expect("enqueue"))
        .collect();
    assert_eq!(s.outstanding(), 8);
    assert!(s.submit());
    assert_eq!(t.dev.borrow().notifies.len(), before + 1);
    let addrs: Vec<u64> = tickets
        .into_iter()
        .map(|tk| s.wait(tk).expect("alloc")[0])
        .collect();
    assert!(addrs.windows(2).all(|w| w[1] == w[0] + (2 << 20)));
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn capacity_is_bounded_and_tickets_are_checked() {
    let (mut s, _t, _gpu) = started();
    let mut tickets = Vec::new();
    for _ in 0..s.capacity() {
        tickets.push(s.enqueue_stream_sync().expect("enqueue"));
    }
    assert_eq!(s.enqueue_stream_sync(), Err(Error::QueueFull));
    // Not yet submitted: nothing to take.
    assert_eq!(s.try_take(tickets[0]), Ok(None));
    s.submit();
    assert_eq!(s.try_take(tickets[0]), Ok(Some([0; 4])));
    assert_eq!(s.wait(tickets[0]), Err(Error::UnknownTicket));
    s.wait_all().expect("all");
    assert_eq!(s.outstanding(), 0);
    assert_eq!(s.wait(tickets[1]), Err(Error::UnknownTicket));
}

#[test]
fn bad_responses_are_reported_not_trusted() {
    let (mut s, _t, gpu) = started();
    gpu.borrow_mut().tamper = Some(Tamper::NoResponse);
    assert_eq!(
        s.stream_sync(),
        Err(Error::NoResponse {
            opcode: Opcode::StreamSync as u32,
            used_len: 0
        })
    );
    gpu.borrow_mut().tamper = Some(Tamper::WrongId);
    assert!(matches!(
        s.stream_sync(),
        Err(Error::ResponseMismatch { .. })
    ));
    gpu.borrow_mut().tamper = Some(Tamper::UnknownStatus);
    assert_eq!(
        s.stream_sync(),
        Err(Error::UnknownStatus {
            opcode: Opcode::StreamSync as u32,
            code: 999
        })
    );
    s.stream_sync().expect("still works");
    // The slot still holds the answer before: refused for its id, not taken as this one's.
    gpu.borrow_mut().tamper = Some(Tamper::Unwritten);
    assert!(matches!(
        s.stream_sync(),
        Err(Error::ResponseMismatch { .. })
    ));
    s.stream_sync().expect("still works");
}

#[test]
fn a_silent_device_times_out_and_is_reset() {
    let (mut s, t, gpu) = started();
    gpu.borrow_mut().silent = true;
    assert_eq!(s.stream_sync(), Err(Error::Timeout));
    assert_eq!(t.dev.borrow().status, 0, "the device was reset");
    assert_eq!(s.stream_sync(), Err(Error::Broken));
}

#[test]
fn cluster_occupancy_answers_the_first_result_word() {
    let (mut s, _t, _gpu) = started();
    let q = vgpu_proto::ClusterOccupancyArgs {
        function: VECTOR_ADD,
        block: [128, 1, 1],
        shared_bytes: 1024,
        cluster: [2, 2, 1],
        ..Default::default()
    };
    assert_eq!(s.cluster_occupancy(&q), Ok(33));
    let bad = vgpu_proto::ClusterOccupancyArgs {
        cluster: [0, 1, 1],
        ..q
    };
    assert_eq!(
        s.cluster_occupancy(&bad),
        Err(Error::Device {
            opcode: Opcode::ClusterOccupancy as u32,
            status: Status::InvalidArgument
        })
    );
}

#[test]
fn events_and_unsupported_ops() {
    let (mut s, _t, _gpu) = started();
    let t0 = s.event_record(1).expect("record");
    let t1 = s.event_record(2).expect("record");
    assert!(t1 > t0);
    assert_eq!(s.event_query(404), Ok(None));
    assert_eq!(
        s.shm_get(1, 4096, 1),
        Err(Error::Device {
            opcode: Opcode::ShmGet as u32,
            status: Status::NotSupported
        })
    );
}

#[test]
fn malformed_headers_and_raw_chains() {
    let (mut s, _t, _gpu) = started();
    // An unknown opcode, echoed id: the device's parser answers UNKNOWN_OPCODE.
    // SAFETY: no data buffers.
    let t = unsafe {
        s.enqueue_encoded(
            0xdead,
            |id, out| {
                out[..4].copy_from_slice(&0xdeadu32.to_le_bytes());
                out[4..8].fill(0);
                out[8..16].copy_from_slice(&id.to_le_bytes());
                Some(16)
            },
            &[],
        )
    }
    .expect("enqueue");
    s.submit();
    assert_eq!(
        s.wait(t),
        Err(Error::Device {
            opcode: 0xdead,
            status: Status::UnknownOpcode
        })
    );
    // A chain without a response descriptor comes back with used length 0.
    let hdr = [0u8; 16];
    // SAFETY: the device only reads `hdr`, which outlives the wait below.
    let t =
        unsafe { s.enqueue_raw_chain(&[Buffer::readable(hdr.as_ptr() as u64, 16)]) }.expect("raw");
    s.submit();
    assert_eq!(s.wait(t), Ok([0; 4]));
    s.stream_sync().expect("still works");
}

#[test]
fn an_unreadable_header_error_is_reported_with_id_zero() {
    let (mut s, _t, _gpu) = started();
    // SAFETY: no data buffers.
    let t = unsafe { s.enqueue_encoded(0, |_, _| Some(8), &[]) }.expect("enqueue");
    s.submit();
    assert_eq!(
        s.wait(t),
        Err(Error::Device {
            opcode: 0,
            status: Status::BadLength
        })
    );
}

#[test]
fn a_corrupt_used_ring_resets_the_device() {
    let (mut s, t, gpu) = started();
    gpu.borrow_mut().silent = true;
    let tk = s.enqueue_stream_sync().expect("enqueue");
    s.submit();
    // The device returns a head that was never handed out.
    t.dev.borrow_mut().push_used(0, 15, 48);
    assert_eq!(s.wait(tk), Err(Error::BadUsedId(15)));
    assert_eq!(t.dev.borrow().status, 0, "the device was reset");
    assert_eq!(s.wait(tk), Err(Error::Broken));
    assert_eq!(s.wait_all(), Err(Error::Broken));
}

thread_local! {
    /// The device a relax function looks at (and answers for, late), and the used_event
    /// values it saw.
    static WATCHED: RefCell<Option<(FakeTransport, Rc<RefCell<Gpu>>)>> = const { RefCell::new(None) };
    static SEEN: RefCell<Vec<(u64, u16)>> = const { RefCell::new(Vec::new()) };
    /// The wait lengths the stream reported.
    static LEARNED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn learning(waited_ns: u64) {
    LEARNED.with(|l| l.borrow_mut().push(waited_ns));
}

/// Records used_event; once the wait lasted 20 ms, lets the silent device answer.
fn watching_relax(waited_ns: u64) {
    WATCHED.with(|w| {
        if let Some((t, gpu)) = w.borrow().as_ref() {
            let e = t.dev.borrow().used_event(0);
            SEEN.with(|s| s.borrow_mut().push((waited_ns, e)));
            if waited_ns >= 20_000_000 && gpu.borrow().silent {
                gpu.borrow_mut().silent = false;
                gpu.borrow_mut().on_notify(&mut t.dev.borrow_mut(), 0);
            }
        }
    });
}

#[test]
fn a_long_wait_asks_for_an_interrupt_and_a_short_one_does_not() {
    let (t, gpu) = fake_device(PROTOCOL_VERSION);
    let mut dev = VgpuDevice::probe(t.clone()).expect("probe");
    let opts = StreamOptions {
        relax: watching_relax,
        wake_after_ns: 5_000_000,
        learn: learning,
        ..OPTS
    };
    let mut s = dev.open_stream::<16>(0, opts).expect("stream");
    dev.start().expect("start");
    WATCHED.with(|w| *w.borrow_mut() = Some((t.clone(), gpu.clone())));
    // Answered at once: no interrupt asked for (used_event stays at least a quarter of the
    // index space ahead of the next used index, 1, and is not rewritten for each request).
    let far_ahead = |e: u16| e.wrapping_sub(1) >= 0x4000;
    s.stream_sync().expect("sync");
    assert_eq!(t.dev.borrow().used_event(0), 0x8000);
    assert!(
        LEARNED.with(|l| l.borrow().is_empty()),
        "a short wait teaches nothing"
    );
    // A device that answers late: interrupts are off while the wait is short, on (at the
    // next used entry) once it waited 5 ms, and off again when the wait ends.
    gpu.borrow_mut().silent = true;
    s.stream_sync().expect("answered late");
    let seen = SEEN.with(|s| s.take());
    assert!(seen
        .iter()
        .filter(|(w, _)| *w < 5_000_000)
        .all(|&(_, e)| far_ahead(e)));
    let late: Vec<u16> = seen
        .iter()
        .filter(|(w, _)| *w >= 5_000_000)
        .map(|&(_, e)| e)
        .collect();
    assert!(
        !late.is_empty() && late[..late.len() - 1].iter().all(|&e| e == 1),
        "{late:?}"
    );
    assert_eq!(t.dev.borrow().used_event(0), 0x8002, "suppressed again");
    // The long wait's length went to the wait policy: at least the 20 ms the device kept
    // silent (the fake clock moves 1 ms per read).
    let learned = LEARNED.with(|l| l.take());
    assert!(matches!(learned[..], [w] if w >= 20_000_000), "{learned:?}");
    WATCHED.with(|w| *w.borrow_mut() = None);
}
