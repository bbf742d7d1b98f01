//! The library over guest-driver's Linux transport, as a program in a VM reaches its vGPU:
//! registers and DMA memory through a physical-memory file (here a regular file laid out
//! like `/dev/mem`, offset = physical address, with the DMA memory a reserved region of
//! it), and behind it the real vgpu-device request handling on a sim GPU, serving the
//! rings from the same file. One test per file: the library is one per process.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::cuda::*;
use vgpu_backend::{SimConfig, SimGpu};
use vgpu_device::{DeviceConfig, GuestMem, Vgpu};
use vgpu_proto::VIRTIO_ID_VGPU;
use virtio_queue::{Queue, QueueT};
use vm_memory::{FileOffset, GuestAddress};

const MIB: u64 = 1 << 20;
/// Fake physical memory: registers at `REGS`, the reserved DMA region from `DMA`.
const REGS: u64 = 0x1000;
const DMA: u64 = MIB;
const DMA_LEN: u64 = 32 * MIB;
const PHYS_SIZE: u64 = DMA + DMA_LEN;

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
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The device side: vgpu-device on a sim GPU with one queue, serving it once the driver
/// set it ready. Registers are plain memory in the file, so the values a device shows are
/// written first (one cell answers both feature words: bit 0 low, VERSION_1 high).
fn serve(mem_file: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let sim = SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    })
    .expect("sim");
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
        Arc::new(sim),
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

#[test]
fn the_library_runs_over_the_linux_transport() {
    let mem = TempFile(
        std::env::temp_dir().join(format!("vgpu-cuda-linux-{}-physmem", std::process::id())),
    );
    File::create(&mem.0)
        .and_then(|f| f.set_len(PHYS_SIZE))
        .expect("physical memory file");
    let stop = Arc::new(AtomicBool::new(false));
    let device = serve(mem.0.clone(), stop.clone());
    // SAFETY: set before the library reads the environment, while this test is the only
    // thread that touches it.
    unsafe {
        std::env::remove_var("VGPU_SOCKET");
        std::env::set_var("VGPU_DEV_MEM", &mem.0);
        std::env::set_var("VGPU_MMIO_BASE", format!("{REGS:#x}"));
        std::env::set_var("VGPU_DMA_RESERVED", format!("{}M@{DMA:#x}", DMA_LEN >> 20));
    }
    let cu = Cuda::load();

    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let mut name = [0 as c_char; 64];
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetName",
            fn(*mut c_char, c_int, c_int),
            name.as_mut_ptr(),
            64,
            0
        ),
        OK
    );
    // SAFETY: the library wrote a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) };
    assert!(name.to_str().expect("utf-8").contains("vGPU"), "{name:?}");
    cu.primary_context(0);

    // Pageable copies (through the library's bounce buffers) and a built-in kernel.
    let n = 1usize << 16;
    let bytes = n * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    let ha: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    for (d, h) in [(a, &ha), (b, &hb)] {
        assert_eq!(
            call!(
                cu,
                "cuMemcpyHtoD",
                fn(u64, *const c_void, usize),
                d,
                h.as_ptr().cast(),
                bytes
            ),
            OK
        );
    }
    let mut module: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut module,
            c"vgpu:builtin".as_ptr().cast()
        ),
        OK
    );
    let mut vadd: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const c_char),
            &mut vadd,
            module,
            c"vector_add".as_ptr()
        ),
        OK
    );
    let mut count = n as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut count as *mut u64).cast(),
    ];
    assert_eq!(
        call!(
            cu,
            "cuLaunchKernel",
            fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
                *mut Ptr,
            ),
            vadd,
            (n / 256) as c_uint,
            1,
            1,
            256,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut()
        ),
        OK
    );
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), OK);

    // The result into pinned memory (DMA memory of the reserved region: no bounce).
    let mut pinned: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuMemAllocHost",
            fn(*mut Ptr, usize),
            &mut pinned,
            bytes
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            pinned,
            c,
            bytes
        ),
        OK
    );
    // SAFETY: `pinned` holds `bytes` bytes the library allocated for us.
    let out = unsafe { std::slice::from_raw_parts(pinned.cast::<f32>(), n) };
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, 1.5 * i as f32, "element {i}");
    }
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), OK);
    for p in [a, b, c] {
        assert_eq!(call!(cu, "cuMemFree", fn(u64), p), OK);
    }
    assert_eq!(call!(cu, "cuModuleUnload", fn(Ptr), module), OK);

    stop.store(true, Ordering::SeqCst);
    let served = device.join().expect("device thread");
    assert!(
        served >= 10,
        "the device served the library's requests ({served})"
    );
}
