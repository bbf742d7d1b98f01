//! The vhost-user path: `VgpuVhostBackend` serving a real `VringRwLock` set up like a
//! frontend would, with EVENT_IDX and a call eventfd.

use std::fs::File;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::Arc;

use vgpu_backend::{SimConfig, SimGpu};
use vgpu_proto::{DeviceInfo, Opcode, RequestHeader, Response, Status, VgpuConfig};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::{DeviceConfig, GuestMem, Vgpu, VgpuVhostBackend};

fn backend(mem: &GuestMemoryAtomic<GuestMem>, queues: u16) -> VgpuVhostBackend {
    let sim = SimGpu::new(SimConfig {
        memory: 16 << 20,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let cfg = DeviceConfig {
        vgpu_id: 3,
        num_queues: queues,
        queue_size: 256,
        memory_share: 8 << 20,
        compute_share: 500,
        copy_share: 500,
        batch: crate::BatchLimits::default(),
    };
    VgpuVhostBackend::new(
        Arc::new(Vgpu::new(cfg, Arc::new(sim)).expect("vgpu")),
        mem.clone(),
    )
}

#[test]
fn features_config_and_threads() {
    let mem =
        GuestMemoryAtomic::new(GuestMem::from_ranges(&[(GuestAddress(0), 1 << 20)]).expect("ram"));
    let be = backend(&mem, 4);
    assert_eq!(be.num_queues(), 4);
    assert_eq!(be.max_queue_size(), 256);
    let f = be.features();
    assert_ne!(f & (1 << 32), 0, "VIRTIO_F_VERSION_1");
    assert_ne!(f & (1 << 29), 0, "VIRTIO_RING_F_EVENT_IDX");
    assert_ne!(f & (1 << 30), 0, "VHOST_USER_F_PROTOCOL_FEATURES");
    let pf = be.protocol_features();
    assert!(pf.contains(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ));
    assert_eq!(be.queues_per_thread(), vec![1, 2, 4, 8]);
    let cfg = VgpuConfig::decode(&be.get_config(0, VgpuConfig::SIZE as u32)).expect("config");
    assert_eq!(
        (cfg.vgpu_id, cfg.num_queues, cfg.memory_share),
        (3, 4, 8 << 20)
    );
    assert_eq!(be.get_config(4, 4), 3u32.to_le_bytes());
    assert!(be.get_config(1000, 4).is_empty());
    assert_eq!(be.get_config(52, 100).len(), 4);
    assert!(be.set_config(0, &[1, 2, 3]).is_err());
    assert!(be.exit_event(0).is_some());
}

#[test]
fn serves_a_vring_in_order_and_signals_the_call_eventfd() {
    let ram = GuestMem::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("ram");
    let mem = GuestMemoryAtomic::new(ram);
    let be = backend(&mem, 2);
    let guard = mem.memory();
    let vq = MockSplitQueue::new(&*guard, 256);

    let vring = VringRwLock::new(mem.clone(), 256).expect("vring");
    vring.set_queue_size(256);
    vring
        .set_queue_info(vq.desc_table_addr().0, vq.avail_addr().0, vq.used_addr().0)
        .expect("queue info");
    vring.set_queue_event_idx(true);
    be.set_event_idx(true);
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    let call = EventFd::new(EFD_NONBLOCK).expect("eventfd");
    let fd = call.try_clone().expect("dup").into_raw_fd();
    // SAFETY: `fd` is a fresh duplicate we own; the File takes it over.
    vring.set_call(Some(unsafe { File::from_raw_fd(fd) }));

    // Two requests in one batch: GET_INFO (3 descriptors) and an unknown opcode (2).
    let base = 1u64 << 20;
    let h1 = RequestHeader {
        opcode: Opcode::GetInfo as u32,
        flags: 0,
        id: 11,
    }
    .to_bytes();
    let h2 = RequestHeader {
        opcode: 0xffff,
        flags: 0,
        id: 12,
    }
    .to_bytes();
    guard.write_slice(&h1, GuestAddress(base)).expect("w");
    guard
        .write_slice(&h2, GuestAddress(base + 0x100))
        .expect("w");
    let (info, r1, r2) = (base + 0x1000, base + 0x2000, base + 0x3000);
    let d = |addr: u64, len: u32, flags: u32, next: u16| {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
    };
    let chain = [
        d(base, 16, VRING_DESC_F_NEXT, 1),
        d(info, 128, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2),
        d(r1, 48, VRING_DESC_F_WRITE, 0),
        d(base + 0x100, 16, VRING_DESC_F_NEXT, 4),
        d(r2, 48, VRING_DESC_F_WRITE, 0),
    ];
    vq.add_desc_chains(&chain, 0).expect("chains");

    be.handle_event(0, EventSet::IN, std::slice::from_ref(&vring), 1)
        .expect("handle");

    assert_eq!(vq.used().idx().load(), 2);
    let e0 = vq.used().ring().ref_at(0).expect("e0").load();
    let e1 = vq.used().ring().ref_at(1).expect("e1").load();
    assert_eq!((e0.id(), e0.len()), (0, 128 + 48), "in order");
    assert_eq!((e1.id(), e1.len()), (3, 48));
    let mut b = [0u8; 48];
    guard.read_slice(&mut b, GuestAddress(r1)).expect("r");
    assert_eq!(Response::decode(&b).expect("r1").status(), Some(Status::Ok));
    guard.read_slice(&mut b, GuestAddress(r2)).expect("r");
    let resp = Response::decode(&b).expect("r2");
    assert_eq!((resp.status(), resp.id), (Some(Status::UnknownOpcode), 12));
    let mut ib = [0u8; 128];
    guard.read_slice(&mut ib, GuestAddress(info)).expect("r");
    assert_eq!(DeviceInfo::decode(&ib).expect("info").vgpu_id, 3);
    assert!(call.read().expect("the guest was notified") >= 1);
    assert_eq!(be.vgpu().stats().requests, 2);

    // A disabled vring event type is ignored without error.
    be.handle_event(0, EventSet::OUT, std::slice::from_ref(&vring), 1)
        .expect("ignored");
    be.handle_event(5, EventSet::IN, std::slice::from_ref(&vring), 1)
        .expect("unknown vring ignored");
}

/// A vring with EVENT_IDX set up like a frontend would, over `mem`'s guest RAM.
fn ready_vring(
    mem: &GuestMemoryAtomic<GuestMem>,
    vq: &MockSplitQueue<'_, GuestMem>,
) -> VringRwLock<GuestMemoryAtomic<GuestMem>> {
    let vring = VringRwLock::new(mem.clone(), 256).expect("vring");
    vring.set_queue_size(256);
    vring
        .set_queue_info(vq.desc_table_addr().0, vq.avail_addr().0, vq.used_addr().0)
        .expect("queue info");
    vring.set_queue_event_idx(true);
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    vring
}

#[test]
fn a_polling_queue_serves_a_request_that_arrives_without_a_kick() {
    for poll_ms in [0u64, 1000] {
        let ram = GuestMem::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("ram");
        let mem = GuestMemoryAtomic::new(ram);
        let be = backend(&mem, 1).with_poll(std::time::Duration::from_millis(poll_ms));
        be.set_event_idx(true);
        let guard = mem.memory();
        let vq = MockSplitQueue::new(&*guard, 256);
        let vring = ready_vring(&mem, &vq);
        let base = 1u64 << 20;
        let h = RequestHeader {
            opcode: Opcode::GetInfo as u32,
            flags: 0,
            id: 7,
        }
        .to_bytes();
        guard.write_slice(&h, GuestAddress(base)).expect("w");
        let d = |addr: u64, len: u32, flags: u32, next: u16| {
            RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
        };
        let chain = [
            d(base, 16, VRING_DESC_F_NEXT, 1),
            d(
                base + 0x1000,
                128,
                VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
                2,
            ),
            d(base + 0x2000, 48, VRING_DESC_F_WRITE, 0),
        ];
        vq.add_desc_chains(&chain, 0).expect("chain");
        // Unpublish it; a "guest" thread publishes it 200 ms into the call, without a kick.
        let idx = GuestAddress(vq.avail_addr().0 + 2);
        guard.write_obj(0u16, idx).expect("avail idx");
        let publisher = {
            let mem = mem.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(200));
                mem.memory().write_obj(1u16, idx).expect("publish");
            })
        };
        be.handle_event(0, EventSet::IN, std::slice::from_ref(&vring), 0)
            .expect("handle");
        let served = vq.used().idx().load();
        publisher.join().expect("publisher");
        if poll_ms == 0 {
            assert_eq!(
                served, 0,
                "without polling the thread sleeps until the next kick"
            );
        } else {
            assert_eq!(served, 1, "the polling thread served the late request");
            assert_eq!(be.vgpu().stats().requests, 1);
        }
    }
}

/// A memfd of `len` bytes with `seals` added, as one guest RAM region at 0.
fn memfd_ram(len: u64, seals: i32) -> GuestMem {
    // SAFETY: a valid NUL-terminated name and valid flags.
    let fd = unsafe {
        libc::memfd_create(
            c"vhost-test".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len).expect("size");
    if seals != 0 {
        // SAFETY: F_ADD_SEALS on our own memfd with valid bits.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }, 0);
    }
    GuestMem::from_ranges_with_files([(
        GuestAddress(0),
        len as usize,
        Some(vm_memory::FileOffset::new(file, 0)),
    )])
    .expect("map")
}

#[test]
fn a_memory_table_of_unsealed_memfds_or_plain_files_is_refused_and_the_queue_keeps_serving() {
    use std::os::fd::AsRawFd;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

    let sealed = memfd_ram(4 << 20, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
    let mem = GuestMemoryAtomic::new(GuestMem::new());
    let be = backend(&mem, 1);
    // What vhost-user-backend does on SET_MEM_TABLE: swap the table in, then tell us.
    mem.lock().expect("lock").replace(sealed);
    be.update_memory(mem.clone())
        .expect("a sealed memfd is accepted");

    let path = std::env::temp_dir().join(format!("vgpu-vhost-plain-{}", std::process::id()));
    let plain = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("plain file");
    std::fs::remove_file(&path).ok();
    plain.set_len(4 << 20).expect("size");
    let plain = GuestMem::from_ranges_with_files([(
        GuestAddress(0),
        4 << 20,
        Some(vm_memory::FileOffset::new(plain, 0)),
    )])
    .expect("map");
    for (offered, want) in [
        (memfd_ram(4 << 20, 0), "F_SEAL_SHRINK"),
        (plain, "not a sealable memfd"),
    ] {
        mem.lock().expect("lock").replace(offered);
        let e = be.update_memory(mem.clone()).expect_err("refused");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains(want), "{e}");
        // The accepted table is back in place.
        let guard = mem.memory();
        let region = GuestMemoryBackend::iter(&*guard).next().expect("a region");
        let fd = region.file_offset().expect("file").file().as_raw_fd();
        // SAFETY: F_GET_SEALS on an open descriptor; no memory is passed.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        assert_ne!(seals & libc::F_SEAL_SHRINK, 0, "the sealed table is back");
    }

    // The queue still serves requests from the accepted memory.
    be.set_event_idx(true);
    let guard = mem.memory();
    let vq = MockSplitQueue::new(&*guard, 256);
    let vring = ready_vring(&mem, &vq);
    let base = 1u64 << 20;
    let h = RequestHeader {
        opcode: Opcode::GetInfo as u32,
        flags: 0,
        id: 9,
    }
    .to_bytes();
    guard.write_slice(&h, GuestAddress(base)).expect("w");
    let d = |addr: u64, len: u32, flags: u32, next: u16| {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
    };
    let chain = [
        d(base, 16, VRING_DESC_F_NEXT, 1),
        d(
            base + 0x1000,
            128,
            VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
            2,
        ),
        d(base + 0x2000, 48, VRING_DESC_F_WRITE, 0),
    ];
    vq.add_desc_chains(&chain, 0).expect("chain");
    be.handle_event(0, EventSet::IN, std::slice::from_ref(&vring), 0)
        .expect("handle");
    assert_eq!(vq.used().idx().load(), 1);
    let mut b = [0u8; 48];
    guard
        .read_slice(&mut b, GuestAddress(base + 0x2000))
        .expect("r");
    assert_eq!(
        Response::decode(&b).expect("resp").status(),
        Some(Status::Ok)
    );
}

/// What a move's stop waits for: a queue is quiet when nothing it took off its ring is
/// unanswered and, unless the ring is stopped, nothing is left on it to take.
#[test]
fn a_queue_is_quiet_only_with_nothing_in_hand_and_nothing_to_take() {
    use virtio_queue::QueueT;
    let ram = GuestMem::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("ram");
    let mem = GuestMemoryAtomic::new(ram);
    let be = backend(&mem, 1);
    be.set_event_idx(true);
    let guard = mem.memory();
    let vq = MockSplitQueue::new(&*guard, 256);
    let vring = ready_vring(&mem, &vq);
    assert!(be.quiet(&vring), "an empty ring");
    let base = 1u64 << 20;
    let d = |addr: u64, len: u32, flags: u32, next: u16| {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
    };
    let mut chains = Vec::new();
    for (i, id) in [(0u64, 21u64), (1, 22)] {
        let at = base + i * 0x4000;
        let h = RequestHeader {
            opcode: Opcode::GetInfo as u32,
            flags: 0,
            id,
        }
        .to_bytes();
        guard.write_slice(&h, GuestAddress(at)).expect("w");
        let first = (i * 3) as u16;
        chains.extend([
            d(at, 16, VRING_DESC_F_NEXT, first + 1),
            d(
                at + 0x1000,
                128,
                VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
                first + 2,
            ),
            d(at + 0x2000, 48, VRING_DESC_F_WRITE, 0),
        ]);
    }
    vq.add_desc_chains(&chains, 0).expect("chains");
    assert!(!be.quiet(&vring), "two requests wait to be taken");
    // Take one off the ring without answering it: a request in hand.
    let taken = vring
        .get_mut()
        .get_queue_mut()
        .pop_descriptor_chain(guard.clone())
        .expect("a chain");
    vring.set_queue_ready(false);
    assert!(!be.quiet(&vring), "stopped, but a request is in hand");
    vring
        .get_mut()
        .get_queue_mut()
        .add_used(&*guard, taken.head_index(), 0)
        .expect("answered");
    assert!(
        be.quiet(&vring),
        "stopped with nothing in hand: the untaken request goes with the ring"
    );
    vring.set_queue_ready(true);
    assert!(!be.quiet(&vring), "running, with one request still to take");
    be.handle_event(0, EventSet::IN, std::slice::from_ref(&vring), 0)
        .expect("handle");
    assert_eq!(vq.used().idx().load(), 2);
    assert!(be.quiet(&vring), "everything answered");
}
