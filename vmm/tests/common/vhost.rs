//! A vhost-user backend served on a thread, and the vmm's side connected to it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vhost_user_backend::bitmap::BitmapReplace;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon};
use vm_memory::bitmap::NewBitmap;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm::devices::vhost_user::VhostUserDevice;
use vmm::virtio::mmio::MmioTransport;

/// Serves `backend` on `path` from a thread; returns once the socket is there.
pub fn serve<T>(path: &Path, name: &str, backend: T)
where
    T: VhostUserBackend + Clone + Send + 'static,
    T::Bitmap: BitmapReplace + NewBitmap + Clone + Send + Sync,
    T::Vring: Clone + Send + Sync,
{
    let (p, name) = (path.to_owned(), name.to_owned());
    std::thread::spawn(move || {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = VhostUserDaemon::new(name, backend, mem).expect("daemon");
        let _ = daemon.serve(&p);
    });
    let t = Instant::now();
    while !path.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "backend never listened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The vmm's vhost-user device connected to `path` (retried for up to 10 s).
pub fn connect(path: &Path) -> VhostUserDevice {
    let t = Instant::now();
    loop {
        match VhostUserDevice::connect(path, vmm::VGPU_DEVICE_ID) {
            Ok(d) => return d,
            Err(e) if t.elapsed() > Duration::from_secs(10) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Writes `v` to transport register `r`.
pub fn w(t: &mut MmioTransport<VhostUserDevice>, r: u64, v: u32) {
    vmm::devices::bus::BusDevice::write(t, r, &v.to_le_bytes());
}

/// A fresh directory for this test process, `tag` in its name.
pub fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}
