//! The Linux transport against fakes: a regular file laid out like `/dev/mem` (offset =
//! physical address) and one laid out like `/proc/self/pagemap`; and end to end, the
//! self-test against the real vgpu-device backend (sim GPU) serving queues from the same
//! fake physical memory.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::{SimConfig, SimGpu};
use vgpu_device::{DeviceConfig, GuestMem, Vgpu};
use vgpu_proto::VIRTIO_ID_VGPU;
use virtio_queue::{Queue, QueueT};
use vm_memory::{FileOffset, GuestAddress};

use super::pagemap::decode;
use super::*;
use crate::spec::reg;

const MIB: u64 = 1 << 20;

/// A temporary file removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, len: u64) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "gd-linux-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        File::create(&p).unwrap().set_len(len).unwrap();
        TempFile(p)
    }
    fn write_at(&self, off: u64, bytes: &[u8]) {
        let f = File::options().write(true).open(&self.0).unwrap();
        f.write_all_at(bytes, off).unwrap();
    }
    fn read_at(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        File::open(&self.0)
            .unwrap()
            .read_exact_at(&mut v, off)
            .unwrap();
        v
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn paths(mem: &TempFile, pagemap: &TempFile) -> Paths {
    Paths {
        mem: mem.0.clone(),
        pagemap: pagemap.0.clone(),
        cmdline: "/nonexistent/cmdline".into(),
    }
}

#[test]
fn pagemap_entries_decode() {
    let present = 1u64 << 63;
    assert_eq!(
        decode(present | 0x1234, 0x7f00_0abc, 4096).unwrap(),
        0x123_4abc
    );
    assert!(matches!(
        decode(0, 0x1000, 4096),
        Err(LinuxError::NotPresent(0x1000))
    ));
    assert!(matches!(
        decode(1 << 62, 0x1000, 4096),
        Err(LinuxError::Swapped(_))
    ));
    assert!(matches!(
        decode(present, 0x1000, 4096),
        Err(LinuxError::NoPfn)
    ));
    // Flag bits above the frame number (soft-dirty, exclusive, file-mapped) are ignored.
    let flags = (1 << 55) | (1 << 56) | (1 << 61);
    assert_eq!(decode(present | flags | 2, 0x10, 4096).unwrap(), 0x2010);
}

#[test]
fn pagemap_file_lookups() {
    let pm = TempFile::new("pagemap", 0);
    let present = 1u64 << 63;
    // Page 0x7f000 (vaddr 0x7f00_0000) at frame 0x42; page 0x7f001 not present.
    pm.write_at(0x7f000 * 8, &(present | 0x42).to_le_bytes());
    pm.write_at(0x7f001 * 8, &0u64.to_le_bytes());
    let map = Pagemap::open(&pm.0, 4096).unwrap();
    assert_eq!(map.translate(0x7f00_0010).unwrap(), 0x42_010);
    assert!(matches!(
        map.translate(0x7f00_1000),
        Err(LinuxError::NotPresent(_))
    ));
    // Past the end of the file: a short read, reported, not a panic.
    assert!(matches!(
        map.translate(0x7f00_2000),
        Err(LinuxError::PagemapRead { .. })
    ));
    // The highest addresses overflow the offset computation cleanly.
    assert!(map.translate(u64::MAX).is_err());
    assert!(matches!(
        Pagemap::open(&pm.0, 3000),
        Err(LinuxError::BadPageSize(3000))
    ));
    assert!(matches!(
        Pagemap::open(std::path::Path::new("/nonexistent/pagemap"), 4096),
        Err(LinuxError::Open { .. })
    ));
}

#[test]
fn cmdline_device_parsing() {
    let d = cmdline_devices(
        "console=ttyS0 virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=1M@4096:6:3",
    )
    .unwrap();
    assert_eq!(
        d,
        vec![
            MmioDevice {
                base: 0xd000_0000,
                size: 4096,
                irq: 5
            },
            MmioDevice {
                base: 4096,
                size: 1 << 20,
                irq: 6
            }
        ]
    );
    assert!(cmdline_devices("quiet").unwrap().is_empty());
    for bad in [
        "4K",
        "4K@zz:5",
        "4K@0x1000",
        "4Q@0x1000:5",
        "@0x1000:5",
        "4K@0x1000:x",
    ] {
        assert!(
            matches!(
                cmdline_devices(&format!("virtio_mmio.device={bad}")),
                Err(LinuxError::BadDeviceSpec(_))
            ),
            "{bad}"
        );
    }
    assert_eq!(parse_u64("0X10"), Some(16));
}

#[test]
fn registers_through_a_fake_dev_mem() {
    let mem = TempFile::new("mem", 4 * MIB);
    let pm = TempFile::new("pagemap", 0);
    // The window need not be page aligned: 0x2100.
    mem.write_at(0x2100, &0x7472_6976u32.to_le_bytes());
    mem.write_at(0x2100 + 0x100, &[1, 2, 3, 4]);
    let t = LinuxTransport::open(
        &paths(&mem, &pm),
        &Registers::DevMem { base: 0x2100 },
        &DmaSource::Reserved {
            phys: MIB,
            len: MIB as usize,
        },
    )
    .unwrap();
    assert_eq!(t.read32(reg::MAGIC), 0x7472_6976);
    assert_eq!(t.read8(0x101), 2);
    assert_eq!(t.read16(0x102), 0x0403);
    t.write32(reg::STATUS, 0xabcd_0123);
    t.write16(0x104, 0xbeef);
    t.write8(0x106, 0x5a);
    assert_eq!(mem.read_at(0x2100 + 0x70, 4), 0xabcd_0123u32.to_le_bytes());
    assert_eq!(mem.read_at(0x2100 + 0x104, 3), [0xef, 0xbe, 0x5a]);
    // Outside the 4 KiB window, or misaligned: reads give all ones, writes do nothing.
    assert_eq!(t.read32(0x1000), u32::MAX);
    assert_eq!(t.read32(usize::MAX - 1), u32::MAX);
    assert_eq!(t.read16(0x101), u16::MAX);
    assert_eq!(t.read32(0x102), u32::MAX);
    t.write32(0x1000, 1);
    t.write32(0x72, 1);
    assert_eq!(mem.read_at(0x2100 + 0x1000, 4), [0; 4]);
    assert_eq!(mem.read_at(0x2100 + 0x70, 4), 0xabcd_0123u32.to_le_bytes());
}

#[test]
fn registers_through_a_fake_uio_device() {
    let uio = TempFile::new("uio0", 4096);
    let mem = TempFile::new("mem", 4 * MIB);
    let pm = TempFile::new("pagemap", 0);
    uio.write_at(8, &VIRTIO_ID_VGPU.to_le_bytes());
    let t = LinuxTransport::open(
        &paths(&mem, &pm),
        &Registers::Uio {
            path: uio.0.clone(),
        },
        &DmaSource::Reserved { phys: 0, len: 4096 },
    )
    .unwrap();
    assert_eq!(t.read32(reg::DEVICE_ID), VIRTIO_ID_VGPU);
}

#[test]
fn reserved_dma_memory_allocates_translates_and_frees() {
    let mem = TempFile::new("mem", 4 * MIB);
    let pm = TempFile::new("pagemap", 0);
    let t = LinuxTransport::open(
        &paths(&mem, &pm),
        &Registers::DevMem { base: 0 },
        &DmaSource::Reserved {
            phys: 2 * MIB,
            len: 64 * 1024,
        },
    )
    .unwrap();
    let mut a = t.dma_alloc(100, 64).unwrap();
    let b = t.dma_alloc(4096, 4096).unwrap();
    assert_eq!(a.phys(), 2 * MIB);
    assert_eq!(b.phys() % 4096, 0);
    assert!(b.phys() >= a.phys() + 100);
    assert_eq!(t.virt_to_phys(a.virt().as_ptr()).unwrap(), a.phys());
    // SAFETY: test-only pointer arithmetic inside the 100-byte region.
    let inside = unsafe { a.virt().as_ptr().add(99) };
    assert_eq!(t.virt_to_phys(inside).unwrap(), a.phys() + 99);
    // What the CPU writes, the device sees at the physical address (the file offset).
    a.as_mut_slice()[..4].copy_from_slice(b"vgpu");
    assert_eq!(mem.read_at(2 * MIB, 4), b"vgpu");
    // Memory that is not DMA memory has no device address.
    let stack = [0u8; 4];
    assert_eq!(
        t.virt_to_phys(stack.as_ptr()),
        Err(Error::AddressNotTranslatable)
    );
    // Exhaustion is an error, and freeing makes room again (zeroed).
    assert_eq!(
        t.dma_alloc(64 * 1024, 64).unwrap_err(),
        Error::OutOfDmaMemory
    );
    assert_eq!(t.dma_alloc(64, 3).unwrap_err(), Error::OutOfDmaMemory);
    let before = t.dma_free_bytes();
    // SAFETY: no device uses these regions.
    unsafe {
        t.dma_free(a);
        t.dma_free(b);
    }
    assert_eq!(t.dma_free_bytes(), 64 * 1024);
    assert!(t.dma_free_bytes() > before);
    let all = t.dma_alloc(64 * 1024, 4096).unwrap();
    assert_eq!(all.phys(), 2 * MIB);
    assert_eq!(&all.as_slice()[..4], &[0; 4], "handed out zeroed");
}

#[test]
fn bad_setups_are_errors() {
    let mem = TempFile::new("mem", MIB);
    let pm = TempFile::new("pagemap", 0);
    let p = paths(&mem, &pm);
    let regs = Registers::DevMem { base: 0 };
    // A reserved region that is not page aligned.
    assert!(matches!(
        LinuxTransport::open(
            &p,
            &regs,
            &DmaSource::Reserved {
                phys: 0x10,
                len: 4096
            }
        ),
        Err(LinuxError::BadOffset(0x10))
    ));
    assert!(matches!(
        LinuxTransport::open(&p, &regs, &DmaSource::Reserved { phys: 0, len: 0 }),
        Err(LinuxError::BadOffset(0))
    ));
    assert!(matches!(
        LinuxTransport::open(
            &p,
            &regs,
            &DmaSource::Reserved {
                phys: !0xfff,
                len: 4096
            }
        ),
        Err(LinuxError::BadOffset(_))
    ));
    let missing = Paths {
        mem: "/nonexistent/mem".into(),
        ..p.clone()
    };
    assert!(matches!(
        LinuxTransport::open(&missing, &regs, &DmaSource::Reserved { phys: 0, len: 4096 }),
        Err(LinuxError::Open { .. })
    ));
    assert!(matches!(
        LinuxTransport::first_device(&p),
        Err(LinuxError::Open { .. })
    ));
    let cmdline = TempFile::new("cmdline", 0);
    cmdline.write_at(0, b"console=ttyS0\n");
    let with_cmdline = Paths {
        cmdline: cmdline.0.clone(),
        ..p
    };
    assert!(matches!(
        LinuxTransport::first_device(&with_cmdline),
        Err(LinuxError::NoDevice)
    ));
    cmdline.write_at(0, b"virtio_mmio.device=4K@0xd0000000:5\n");
    assert_eq!(
        LinuxTransport::first_device(&with_cmdline).unwrap().base,
        0xd000_0000
    );
}

/// Fake physical memory: registers at `REGS`, DMA memory from `DMA`.
const REGS: u64 = 0x1000;
const DMA: u64 = MIB;
const PHYS_SIZE: u64 = 24 * MIB;

/// The device side: the real vgpu-device request handling on a sim GPU, serving queue 0
/// once the driver sets it ready, reading the rings from the same file the transport maps.
/// Registers are plain memory here, so the values a device would show are written first.
fn serve(mem_file: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .unwrap();
    let vgpu = Vgpu::new(
        DeviceConfig {
            vgpu_id: 3,
            num_queues: 1,
            queue_size: 64,
            memory_share: 32 * MIB,
            compute_share: 500,
            copy_share: 500,
            batch: vgpu_device::BatchLimits::default(),
        },
        Arc::new(sim),
    )
    .unwrap();
    let f = File::options()
        .read(true)
        .write(true)
        .open(&mem_file)
        .unwrap();
    let w32 = |off: usize, v: u32| f.write_all_at(&v.to_le_bytes(), REGS + off as u64).unwrap();
    w32(reg::MAGIC, 0x7472_6976);
    w32(reg::VERSION, 2);
    w32(reg::DEVICE_ID, VIRTIO_ID_VGPU);
    // One cell answers for both feature words: bit 0 low, VERSION_1 (bit 32) high.
    w32(reg::DEVICE_FEATURES, 1);
    w32(reg::QUEUE_NUM_MAX, 64);
    f.write_all_at(&vgpu.config_space().to_bytes(), REGS + reg::CONFIG as u64)
        .unwrap();
    let gm = GuestMem::from_ranges_with_files([(
        GuestAddress(0),
        PHYS_SIZE as usize,
        Some(FileOffset::new(f.try_clone().unwrap(), 0)),
    )])
    .unwrap();
    std::thread::spawn(move || {
        let r32 = |off: usize| {
            let mut b = [0u8; 4];
            f.read_exact_at(&mut b, REGS + off as u64).unwrap();
            u32::from_le_bytes(b)
        };
        while r32(reg::QUEUE_READY) == 0 {
            if stop.load(Ordering::SeqCst) {
                return 0;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut q = Queue::new(64).unwrap();
        q.set_size(r32(reg::QUEUE_NUM) as u16);
        q.set_desc_table_address(
            Some(r32(reg::QUEUE_DESC_LOW)),
            Some(r32(reg::QUEUE_DESC_HIGH)),
        );
        q.set_avail_ring_address(
            Some(r32(reg::QUEUE_DRIVER_LOW)),
            Some(r32(reg::QUEUE_DRIVER_HIGH)),
        );
        q.set_used_ring_address(
            Some(r32(reg::QUEUE_DEVICE_LOW)),
            Some(r32(reg::QUEUE_DEVICE_HIGH)),
        );
        q.set_ready(true);
        assert!(q.is_valid(&gm), "the driver programmed a valid queue");
        let mut served = 0;
        while !stop.load(Ordering::SeqCst) {
            let mut any = false;
            while let Some(chain) = q.pop_descriptor_chain(&gm) {
                let head = chain.head_index();
                let used = vgpu.process_chain(0, &gm, chain);
                q.add_used(&gm, head, used).unwrap();
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

#[test]
fn selftest_runs_against_the_real_device_backend() {
    let mem = TempFile::new("physmem", PHYS_SIZE);
    let pm = TempFile::new("pagemap", 0);
    let stop = Arc::new(AtomicBool::new(false));
    let device = serve(mem.0.clone(), stop.clone());
    let t = LinuxTransport::open(
        &paths(&mem, &pm),
        &Registers::DevMem { base: REGS },
        &DmaSource::Reserved {
            phys: DMA,
            len: (16 * MIB) as usize,
        },
    )
    .unwrap();
    let result = selftest::open(t.clone())
        .map_err(|e| e.to_string())
        .and_then(|(gpu, mut s)| {
            assert_eq!(gpu.config().vgpu_id, 3);
            selftest::run(&mut s, &t, 10_000, 256 * 1024, 4)
        });
    stop.store(true, Ordering::SeqCst);
    let served = device.join().unwrap();
    let report = result.unwrap();
    assert_eq!(report.info.vgpu_id, 3);
    assert_eq!(report.vecadd_elements, 10_000);
    assert!(report.htod_mb_s > 0.0 && report.dtoh_mb_s > 0.0);
    assert!(
        served >= 15,
        "the real backend served the requests ({served})"
    );
    let _ = std::io::stderr().flush();
}
