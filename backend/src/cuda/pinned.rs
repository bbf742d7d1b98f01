//! Guest RAM pinned into the CUDA context (`cuMemHostRegister`), once per process and
//! reference-counted, so copies to and from it run at the GPU's DMA speed.
//!
//! A process tenant's DMA pool may also be *device-mapped* (`HOST_MAP`, docs/protocol.md):
//! the device maps it a second time at the tenant's own addresses and this module registers
//! that mapping with `DEVICEMAP | PORTABLE`, keeping it only when the driver's device
//! pointer is the host address itself. Memsets, copies and kernel pointers may then name
//! ranges inside it ([`CudaGpu::reach`]), as CUDA reaches pinned host memory under unified
//! addressing.

use std::ffi::c_void;
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use cudarc::driver::sys;

use super::driver::{check, CuError};
use super::modules::{self, Held};
use super::CudaGpu;
use crate::error::{BackendError, Result};
use crate::sync::{lock, read, write};
use crate::HostRegion;

/// Guest RAM regions pinned with `cuMemHostRegister`.
#[derive(Debug, Default)]
pub(super) struct Pinned {
    pub(super) regions: RwLock<Vec<HostRegion>>,
    /// Host ranges the GPU reaches at their host address (device-mapped pool regions).
    pub(super) device: RwLock<Vec<HostRegion>>,
}

/// Host ranges registered in this process, with how many backends use each. A range is
/// registered once (portable: every context of the process sees it pinned), so a
/// migration target in the same worker shares the source's registration, and the source
/// letting go after the switch does not unpin what the target copies from.
static PINS: Mutex<std::collections::BTreeMap<(usize, usize), usize>> =
    Mutex::new(std::collections::BTreeMap::new());

/// Takes a reference on `r`'s registration, registering it with `flags` (and
/// `CU_MEMHOSTREGISTER_PORTABLE`) if it is the first.
pub(super) fn pin(r: &HostRegion, flags: u32) -> std::result::Result<bool, CuError> {
    let mut pins = lock(&PINS);
    if let Some(n) = pins.get_mut(&(r.addr, r.len)) {
        *n += 1;
        return Ok(false);
    }
    // SAFETY: the caller keeps [addr, addr + len) mapped until it unregisters it (trait
    // contract); the driver pins those pages and only DMA's to them when a copy names them.
    let rc = unsafe {
        sys::cuMemHostRegister_v2(
            r.addr as *mut c_void,
            r.len,
            sys::CU_MEMHOSTREGISTER_PORTABLE | flags,
        )
    };
    check(rc, "cuMemHostRegister")?;
    pins.insert((r.addr, r.len), 1);
    Ok(true)
}

/// Drops a reference on `r`'s registration, unregistering it with the last.
pub(super) fn unpin(r: &HostRegion) {
    let mut pins = lock(&PINS);
    let Some(n) = pins.get_mut(&(r.addr, r.len)) else {
        return;
    };
    *n -= 1;
    if *n > 0 {
        return;
    }
    pins.remove(&(r.addr, r.len));
    // SAFETY: unregisters a range registered in `pin` that no backend uses any more.
    let rc = unsafe { sys::cuMemHostUnregister(r.addr as *mut c_void) };
    if let Err(e) = check(rc, "cuMemHostUnregister") {
        tracing::warn!(addr = format_args!("{:#x}", r.addr), error = %e, "unpinning guest memory failed");
    } else {
        tracing::debug!(
            addr = format_args!("{:#x}", r.addr),
            len = r.len,
            "guest memory unpinned"
        );
    }
}

impl Pinned {
    pub(super) fn covers(regions: &[HostRegion], addr: usize, len: usize) -> bool {
        regions
            .iter()
            .any(|r| addr >= r.addr && addr.checked_add(len).is_some_and(|e| e <= r.addr + r.len))
    }

    /// Pins `regions` (guest RAM) for direct copies; see `HostMemory::register`.
    pub(super) fn register(&self, regions: &[HostRegion]) -> Result<()> {
        let mut pinned = write(&self.regions);
        let mut first_err = None;
        for r in regions {
            if r.len == 0 || pinned.contains(r) {
                continue;
            }
            let t = Instant::now();
            match pin(r, 0) {
                Ok(fresh) => {
                    tracing::info!(
                        addr = format_args!("{:#x}", r.addr),
                        len = r.len,
                        ms = t.elapsed().as_secs_f64() * 1e3,
                        shared = !fresh,
                        "guest memory pinned for direct copies"
                    );
                    pinned.push(*r);
                }
                Err(e) => {
                    tracing::warn!(addr = format_args!("{:#x}", r.addr), len = r.len, error = %e,
                        "cannot pin guest memory; copies from it go through the driver's staging (slower)");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(BackendError::Device(format!(
                "{e}; copies still work, at pageable-memory speed"
            ))),
        }
    }

    /// Lets `regions` go; see `HostMemory::unregister`. The caller's context is
    /// current.
    pub(super) fn unregister(&self, regions: &[HostRegion]) {
        // Taking the write lock waits for copies that use the regions.
        let mut pinned = write(&self.regions);
        for r in regions {
            if let Some(i) = pinned.iter().position(|p| p == r) {
                pinned.swap_remove(i);
                // No copy of ours uses it (write lock).
                unpin(r);
            }
        }
    }
}

impl Pinned {
    /// Whether `[addr, addr + len)` lies inside one device-mapped region.
    pub(super) fn device_covers(&self, addr: u64, len: u64) -> bool {
        let (Ok(a), Ok(l)) = (usize::try_from(addr), usize::try_from(len)) else {
            return false;
        };
        Self::covers(&read(&self.device), a, l)
    }
}

impl CudaGpu {
    /// Checks that `[addr, addr + len)` lies inside one live allocation (writable when
    /// `write`), one module variable, or one device-mapped host region; returns what keeps
    /// it alive (a device-mapped region stays until the vGPU goes: nothing to hold).
    pub(super) fn reach(&self, addr: u64, len: u64, write: bool) -> Result<Held> {
        match modules::resolve(&self.mem, &self.modules, addr, len, write) {
            Ok(h) => Ok(h),
            Err(e) if self.pinned.device_covers(addr, len) => {
                tracing::trace!(addr, len, refused = %e, "device-mapped host memory");
                Ok(Held::Host)
            }
            Err(e) => Err(e),
        }
    }

    /// See [`crate::HostMemory::map_for_device`].
    pub(super) fn map_device(&self, r: HostRegion) -> Result<()> {
        self.enter()?;
        let mut device = write(&self.pinned.device);
        if r.len == 0 || r.addr.checked_add(r.len).is_none() {
            return Err(BackendError::BadPointer {
                addr: r.addr as u64,
                len: r.len as u64,
            });
        }
        if device
            .iter()
            .any(|d| r.addr < d.addr + d.len && d.addr < r.addr + r.len)
        {
            return Err(BackendError::BadPointer {
                addr: r.addr as u64,
                len: r.len as u64,
            });
        }
        let off = |why: String| {
            BackendError::NotSupported(format!(
                "the GPU cannot reach host memory at {:#x} at that address ({why}); pinned host \
             memory stays host-only on this vGPU",
                r.addr
            ))
        };
        pin(&r, sys::CU_MEMHOSTREGISTER_DEVICEMAP).map_err(|e| off(e.to_string()))?;
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `r.addr` starts a range registered with DEVICEMAP just above; writes one
        // pointer.
        let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, r.addr as *mut c_void, 0) };
        match check(rc, "cuMemHostGetDevicePointer") {
            Ok(()) if d == r.addr as u64 => {}
            Ok(()) => {
                unpin(&r);
                return Err(off(format!("the driver maps it at {d:#x}")));
            }
            Err(e) => {
                unpin(&r);
                return Err(off(e.to_string()));
            }
        }
        device.push(r);
        tracing::info!(
            addr = format_args!("{:#x}", r.addr),
            len = r.len,
            "host memory mapped for the GPU at its host address"
        );
        Ok(())
    }

    /// See [`crate::HostMemory::unmap_for_device`].
    pub(super) fn unmap_device(&self, r: HostRegion) {
        if self.ctx.bind().is_err() {
            return;
        }
        let mut device = write(&self.pinned.device);
        if let Some(i) = device.iter().position(|d| *d == r) {
            device.swap_remove(i);
            unpin(&r);
        }
    }
}
