//! The vhost-user dirty log of a whole-VM migration, against a real vhost-user backend
//! (the `vhost-user-backend` crate's daemon with its log-backed bitmap, as `vgpu-worker`
//! serves the vGPU): the vmm negotiates `LOG_SHMFD`, hands the backend its log
//! (`SET_LOG_BASE`, `LOG_ALL`), and a page only the backend wrote shows up in the log the
//! migration merges with KVM's, once; a page the vmm wrote itself does not.

mod common;
use common::vhost::{connect, serve, w};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::bitmap::BitmapMmapRegion;
use vhost_user_backend::{VhostUserBackend, VringRwLock};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion,
};
use vmm::migration::dirty_log::DirtyLog;
use vmm::migration::ram::{count_dirty, merge, PAGE};
use vmm::virtio::mmio::{reg, MmioTransport};
use vmm::virtio::{status, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};
use vmm::vm::Slot;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

type Mem = GuestMemoryAtomic<GuestMemoryMmap<BitmapMmapRegion>>;

/// Where the backend writes when kicked.
const BACKEND_PAGE: u64 = 0x30_0000;
const MARK: &[u8] = b"written by the backend";
/// Writes the backend has finished (bytes and their mark both done).
static WRITES: AtomicU32 = AtomicU32::new(0);
/// The backend writes only once the test has set the log (a ring's first event at its
/// start writes nothing).
static ARMED: AtomicBool = AtomicBool::new(false);

/// A backend that, on each kick, writes `MARK` into guest RAM (as the vGPU writes a
/// response or a device-to-guest copy), through its logged guest memory.
#[derive(Default)]
struct Writer {
    mem: Mutex<Option<Mem>>,
}

impl VhostUserBackend for Writer {
    type Bitmap = BitmapMmapRegion;
    type Vring = VringRwLock<Mem>;
    fn num_queues(&self) -> usize {
        1
    }
    fn max_queue_size(&self) -> usize {
        256
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::LOG_SHMFD
    }
    fn set_event_idx(&self, _enabled: bool) {}
    fn update_memory(&self, mem: Mem) -> std::io::Result<()> {
        *self.mem.lock().expect("lock") = Some(mem);
        Ok(())
    }
    fn handle_event(
        &self,
        _device_event: u16,
        _evset: EventSet,
        _vrings: &[VringRwLock<Mem>],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        if !ARMED.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(m) = &*self.mem.lock().expect("lock") {
            m.memory()
                .write_slice(MARK, GuestAddress(BACKEND_PAGE + 100))
                .map_err(std::io::Error::other)?;
            WRITES.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }
}

fn backend(path: &Path) {
    serve(path, "test-writer", Arc::new(Writer::default()));
}

fn dir() -> PathBuf {
    common::vhost::dir("dirty-log")
}

fn bit(maps: &[Vec<u64>], slots: &[Slot], gpa: u64) -> bool {
    slots.iter().zip(maps).any(|(s, m)| {
        if gpa < s.gpa || gpa >= s.gpa + s.len {
            return false;
        }
        let p = (gpa - s.gpa) / PAGE;
        m.get((p / 64) as usize)
            .is_some_and(|w| w >> (p % 64) & 1 == 1)
    })
}

#[test]
fn pages_only_the_backend_wrote_are_in_the_merged_log() {
    let d = dir();
    let sock = d.join("writer.sock");
    backend(&sock);
    let mem = vmm::memory::create_guest_memory(16 << 20).expect("guest ram");
    let slots: Vec<Slot> = mem
        .iter()
        .enumerate()
        .map(|(i, r)| Slot {
            slot: i as u32,
            gpa: r.start_addr().0,
            len: r.len(),
            hva: 0,
        })
        .collect();
    let irq = Arc::new(Interrupt::new(
        EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
    ));
    let mut t = MmioTransport::new(connect(&sock), mem.clone(), irq);
    assert!(
        t.device().logs_dirty(),
        "LOG_SHMFD and LOG_ALL not negotiated"
    );
    w(&mut t, reg::STATUS, status::ACKNOWLEDGE);
    w(&mut t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
    w(
        &mut t,
        reg::DRIVER_FEATURES,
        (VIRTIO_F_VERSION_1 >> 32) as u32,
    );
    let ok = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    w(&mut t, reg::STATUS, ok);
    w(&mut t, reg::QUEUE_SEL, 0);
    w(&mut t, reg::QUEUE_NUM, 128);
    w(&mut t, reg::QUEUE_DESC_LOW, 0x10_0000);
    w(&mut t, reg::QUEUE_DRIVER_LOW, 0x10_4000);
    w(&mut t, reg::QUEUE_DEVICE_LOW, 0x10_8000);
    w(&mut t, reg::QUEUE_READY, 1);
    w(&mut t, reg::STATUS, ok | status::DRIVER_OK);
    assert!(t.snapshot().active, "the device did not activate");
    // The guest never sees the vhost-user-only feature bits.
    assert_eq!(
        t.device().features() & VhostUserVirtioFeatures::LOG_ALL.bits(),
        0
    );

    let log = Arc::new(DirtyLog::new(16 << 20).expect("log"));
    t.device_mut()
        .start_dirty_log(log.clone())
        .expect("SET_LOG_BASE");
    assert_eq!(count_dirty(&log.take(&slots)), 0, "a fresh log is clean");

    // The vmm writes a page itself (KVM's log would have it, not the backend's); the
    // backend writes another when kicked.
    mem.write_slice(b"vmm", GuestAddress(0x20_0000))
        .expect("vmm write");
    let before = WRITES.load(Ordering::Acquire);
    ARMED.store(true, Ordering::Release);
    t.device().kick_fds()[0].write(1).expect("kick");
    // Once the request is done (as a ring's stop waits for it), its page is marked.
    let started = Instant::now();
    let mut got = [0u8; MARK.len()];
    loop {
        mem.read_slice(&mut got, GuestAddress(BACKEND_PAGE + 100))
            .expect("read");
        if got == MARK && WRITES.load(Ordering::Acquire) > before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the backend never wrote"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // As a migration round does: KVM's bitmaps (here: none) merged with the backend's log.
    let mut maps: Vec<Vec<u64>> = slots
        .iter()
        .map(|s| vec![0; (s.len / PAGE).div_ceil(64) as usize])
        .collect();
    merge(&mut maps, &log.take(&slots));
    assert!(
        bit(&maps, &slots, BACKEND_PAGE),
        "the backend's page is not in the log"
    );
    assert!(
        !bit(&maps, &slots, 0x20_0000),
        "a page the backend never wrote is in its log"
    );
    assert_eq!(count_dirty(&maps), 1);
    // Read-and-clear: the next round starts clean.
    assert_eq!(count_dirty(&log.take(&slots)), 0);

    // The stop: rings stopped, the log read once more; then logging off (rollback).
    t.pause_device().expect("GET_VRING_BASE");
    t.device_mut().stop_dirty_log();
    let _ = std::fs::remove_dir_all(&d);
}
