//! The reserved device address ranges of the cuda backend's memory (`memory.rs`): a
//! vGPU's own range, listed in [`HOMES`] so that a migration target in the same process
//! finds it, and a target's staging range.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys;

use super::super::driver::{check, Context, CuError};
use super::VA_ALIGN;
use crate::sync::lock;

/// The vGPU address ranges reserved in this process, by base address (see the module
/// doc: a migration target finds its vGPU's range here).
pub(super) static HOMES: Mutex<BTreeMap<u64, Weak<Reservation>>> = Mutex::new(BTreeMap::new());

/// A reserved address range; freed when the last user is gone.
#[derive(Debug)]
pub(super) struct Reservation {
    pub(super) base: u64,
    pub(super) size: u64,
    pub(super) ctx: Arc<Context>,
    /// The GPU whose memory is mapped in it now (a vGPU's range: changes at a switch).
    pub(super) ordinal: AtomicI32,
    /// Listed in [`HOMES`].
    pub(super) home: bool,
}

impl Reservation {
    /// Reserves `size` bytes at `at` (0: wherever the driver likes); the address it got.
    pub(super) fn reserve(
        ctx: &Arc<Context>,
        ordinal: i32,
        at: u64,
        size: u64,
    ) -> std::result::Result<Self, CuError> {
        let mut got: sys::CUdeviceptr = 0;
        check(
            // SAFETY: writes one device address into `got`; reserves address space only.
            unsafe { sys::cuMemAddressReserve(&mut got, size as usize, VA_ALIGN as usize, at, 0) },
            "cuMemAddressReserve",
        )?;
        Ok(Self {
            base: got,
            size,
            ctx: ctx.clone(),
            ordinal: AtomicI32::new(ordinal),
            home: false,
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.home {
            let mut homes = lock(&HOMES);
            if homes.get(&self.base).is_some_and(|w| w.upgrade().is_none()) {
                homes.remove(&self.base);
            }
        }
        if self.ctx.bind().is_err() {
            return;
        }
        if let Err(e) = check(
            // SAFETY: frees a range reserved in `Reservation::reserve`; every allocation mapped
            // in it holds an Arc of a Space that holds this reservation, so none is mapped now.
            unsafe { sys::cuMemAddressFree(self.base, self.size as usize) },
            "cuMemAddressFree",
        ) {
            tracing::warn!(error = %e, "freeing a device address range failed");
        }
    }
}
