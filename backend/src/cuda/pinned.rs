//! Guest RAM pinned into the CUDA context (`cuMemHostRegister`), once per process and
//! reference-counted, so copies to and from it run at the GPU's DMA speed.

use std::ffi::c_void;
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use cudarc::driver::sys;

use super::driver::{check, CuError};
use crate::error::{BackendError, Result};
use crate::sync::{lock, write};
use crate::HostRegion;

/// Guest RAM regions pinned with `cuMemHostRegister`.
#[derive(Debug, Default)]
pub(super) struct Pinned {
    pub(super) regions: RwLock<Vec<HostRegion>>,
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
