//! A vGPU in this test process reached over guest-driver's Linux transport, as a program
//! in a VM reaches its vGPU: registers and DMA memory through a physical-memory file (a
//! regular file laid out like `/dev/mem`, offset = physical address, with the DMA memory a
//! reserved region of it), and behind it the real vgpu-device request handling on the
//! backend a test gives, serving the rings from the same file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::Backend;
use vgpu_device::{DeviceConfig, GuestMem, Vgpu};
use vgpu_proto::VIRTIO_ID_VGPU;
use virtio_queue::{Queue, QueueT};
use vm_memory::{FileOffset, GuestAddress};

pub const MIB: u64 = 1 << 20;
/// Fake physical memory: registers at `REGS`, the reserved DMA region from `DMA`.
pub const REGS: u64 = 0x1000;
pub const DMA: u64 = MIB;
pub const DMA_LEN: u64 = 32 * MIB;
pub const PHYS_SIZE: u64 = DMA + DMA_LEN;

// virtio-mmio register offsets (virtio 1.x, 4.2.2).
const MAGIC: u64 = 0x000;
const VERSION: u64 = 0x004;
const DEVICE_ID: u64 = 0x008;
const DEVICE_FEATURES: u64 = 0x010;
const QUEUE_NUM_MAX: u64 = 0x034;
const QUEUE_NUM: u64 = 0x038;
const QUEUE_READY: u64 = 0x044;
const QUEUE_DESC_LOW: u64 = 0x080;
const QUEUE_DESC_HIGH: u64 = 0x084;
const QUEUE_DRIVER_LOW: u64 = 0x090;
const QUEUE_DRIVER_HIGH: u64 = 0x094;
const QUEUE_DEVICE_LOW: u64 = 0x0a0;
const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
const CONFIG: u64 = 0x100;

/// A temporary file removed on drop.
pub struct TempFile(pub PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The device side: vgpu-device on `backend` with one queue, serving it once the driver
/// set it ready. Registers are plain memory in the file, so the values a device shows are
/// written first (one cell answers both feature words: bit 0 low, VERSION_1 high).
pub fn serve(
    mem_file: PathBuf,
    stop: Arc<AtomicBool>,
    backend: Arc<dyn Backend>,
) -> std::thread::JoinHandle<u64> {
    let vgpu = Vgpu::new(
        DeviceConfig {
            vgpu_id: 5,
            num_queues: 1,
            queue_size: 64,
            memory_share: 32 * MIB,
            compute_share: 500,
            copy_share: 500,
            batch: vgpu_device::BatchLimits::default(),
        },
        backend,
    )
    .expect("vgpu");
    let f = File::options()
        .read(true)
        .write(true)
        .open(&mem_file)
        .expect("physical memory file");
    let w32 = |off: u64, v: u32| f.write_all_at(&v.to_le_bytes(), REGS + off).expect("write");
    w32(MAGIC, 0x7472_6976);
    w32(VERSION, 2);
    w32(DEVICE_ID, VIRTIO_ID_VGPU);
    w32(DEVICE_FEATURES, 1);
    w32(QUEUE_NUM_MAX, 64);
    f.write_all_at(&vgpu.config_space().to_bytes(), REGS + CONFIG)
        .expect("config space");
    let gm = GuestMem::from_ranges_with_files([(
        GuestAddress(0),
        PHYS_SIZE as usize,
        Some(FileOffset::new(f.try_clone().expect("clone"), 0)),
    )])
    .expect("guest memory");
    std::thread::spawn(move || {
        let r32 = |off: u64| {
            let mut b = [0u8; 4];
            f.read_exact_at(&mut b, REGS + off).expect("read");
            u32::from_le_bytes(b)
        };
        while r32(QUEUE_READY) == 0 {
            if stop.load(Ordering::SeqCst) {
                return 0;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut q = Queue::new(64).expect("queue");
        q.set_size(r32(QUEUE_NUM) as u16);
        q.set_desc_table_address(Some(r32(QUEUE_DESC_LOW)), Some(r32(QUEUE_DESC_HIGH)));
        q.set_avail_ring_address(Some(r32(QUEUE_DRIVER_LOW)), Some(r32(QUEUE_DRIVER_HIGH)));
        q.set_used_ring_address(Some(r32(QUEUE_DEVICE_LOW)), Some(r32(QUEUE_DEVICE_HIGH)));
        q.set_ready(true);
        assert!(q.is_valid(&gm), "the library programmed a valid queue");
        let mut served = 0;
        while !stop.load(Ordering::SeqCst) {
            let mut any = false;
            while let Some(chain) = q.pop_descriptor_chain(&gm) {
                let head = chain.head_index();
                let used = vgpu.process_chain(0, &gm, chain);
                q.add_used(&gm, head, used).expect("used ring");
                served += 1;
                any = true;
            }
            if !any {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        served
    })
}

/// A zeroed physical-memory file for this test process, removed on drop.
pub fn physical_memory(tag: &str) -> TempFile {
    let mem = TempFile(
        std::env::temp_dir().join(format!("vgpu-cuda-{tag}-{}-physmem", std::process::id())),
    );
    File::create(&mem.0)
        .and_then(|f| f.set_len(PHYS_SIZE))
        .expect("physical memory file");
    mem
}

/// Points the library (not loaded yet) at the vGPU behind `mem` over the Linux transport.
pub fn use_linux_transport(mem: &Path) {
    // SAFETY: set before the library reads the environment, while the test is the only
    // thread that touches it.
    unsafe {
        std::env::remove_var("VGPU_SOCKET");
        std::env::set_var("VGPU_DEV_MEM", mem);
        std::env::set_var("VGPU_MMIO_BASE", format!("{REGS:#x}"));
        std::env::set_var("VGPU_DMA_RESERVED", format!("{}M@{DMA:#x}", DMA_LEN >> 20));
    }
}
