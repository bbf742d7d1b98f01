//! The vhost-user half of a migration, against real vhost-user backends (the
//! `vhost-user-backend` crate's daemon, as `vgpu-worker` uses it): a driver activates a
//! vGPU's virtio-mmio transport, the source stops its rings and reads their bases
//! (`GET_VRING_BASE`), and a transport on a second backend (the destination's) restores
//! from the snapshot: memory table, ring addresses, `SET_VRING_BASE`. The destination
//! backend then reports the same bases.

mod common;
use common::vhost::{connect, serve, w};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm::migration::snapshot::VringSnapshot;
use vmm::virtio::mmio::{reg, MmioTransport};
use vmm::virtio::{status, Interrupt, VIRTIO_F_VERSION_1};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

const QUEUES: usize = 2;

/// A backend that serves rings and never touches a request.
struct Idle;

impl VhostUserBackend for Idle {
    type Bitmap = ();
    type Vring = VringRwLock;
    fn num_queues(&self) -> usize {
        QUEUES
    }
    fn max_queue_size(&self) -> usize {
        256
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | (1 << 30)
    }
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
    }
    fn set_event_idx(&self, _enabled: bool) {}
    fn update_memory(&self, _mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        Ok(())
    }
    fn handle_event(
        &self,
        _device_event: u16,
        _evset: EventSet,
        _vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        Ok(())
    }
}

fn backend(path: &Path) {
    serve(path, "test-backend", Arc::new(Idle));
}

fn dir() -> PathBuf {
    common::vhost::dir("vring")
}

#[test]
fn vring_bases_move_from_one_backend_to_another() {
    let d = dir();
    let (src_sock, dst_sock, third) = (d.join("src.sock"), d.join("dst.sock"), d.join("3.sock"));
    backend(&src_sock);
    backend(&dst_sock);
    backend(&third);
    let mem = vmm::memory::create_guest_memory(16 << 20).expect("guest ram");
    let irq = || {
        Arc::new(Interrupt::new(
            EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
        ))
    };

    // The guest driver brings the device up on the source.
    let mut src = MmioTransport::new(connect(&src_sock), mem.clone(), irq());
    w(&mut src, reg::STATUS, status::ACKNOWLEDGE);
    w(&mut src, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(&mut src, reg::DRIVER_FEATURES_SEL, 1);
    w(
        &mut src,
        reg::DRIVER_FEATURES,
        (VIRTIO_F_VERSION_1 >> 32) as u32,
    );
    let ok = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    w(&mut src, reg::STATUS, ok);
    for q in 0..QUEUES as u32 {
        let base = 0x10_0000 + u32::from(q as u16) * 0x1_0000;
        w(&mut src, reg::QUEUE_SEL, q);
        w(&mut src, reg::QUEUE_NUM, 128);
        w(&mut src, reg::QUEUE_DESC_LOW, base);
        w(&mut src, reg::QUEUE_DRIVER_LOW, base + 0x4000);
        w(&mut src, reg::QUEUE_DEVICE_LOW, base + 0x8000);
        w(&mut src, reg::QUEUE_READY, 1);
    }
    w(&mut src, reg::STATUS, ok | status::DRIVER_OK);
    assert!(src.snapshot().active, "the device did not activate");

    // As a destination would: rings restarted at given bases; the backend reports them.
    let set = [
        VringSnapshot { index: 0, base: 17 },
        VringSnapshot { index: 1, base: 42 },
    ];
    assert_eq!(
        src.pause_device().expect("stop"),
        vec![
            VringSnapshot { index: 0, base: 0 },
            VringSnapshot { index: 1, base: 0 }
        ]
    );
    src.resume_device(&set).expect("restart at the bases");

    // The migration: stop the source's rings, read the bases, snapshot the transport.
    let bases = src.pause_device().expect("GET_VRING_BASE");
    assert_eq!(bases, set);
    let snap = src.snapshot();

    // The destination's transport on its own backend.
    let mut dst = MmioTransport::new(connect(&dst_sock), mem.clone(), irq());
    dst.restore(&snap, &bases).expect("restore");
    assert_eq!(dst.snapshot(), snap);
    assert_eq!(dst.pause_device().expect("GET_VRING_BASE"), set);

    // A snapshot that does not fit this device is refused.
    let mut bad = snap.clone();
    bad.queues.pop();
    let mut other = MmioTransport::new(connect(&third), mem, irq());
    assert!(other.restore(&bad, &bases).is_err());
    let _ = std::fs::remove_dir_all(&d);
}
