//! Device-mapped host memory on the sim GPU (`HostMemory::map_for_device`): sim's "device"
//! is this process's CPU, so a host range the device layer mapped at the tenant's address
//! is reachable as it is. Memsets, device-to-device copies and range checks accept ranges
//! inside one such region; built-in kernels keep to allocations.

use std::sync::RwLock;

use vm_memory::VolatileSlice;

use super::SimGpu;
use crate::error::{BackendError, Result};
use crate::sync::{read, write};
use crate::{HostMemory, HostRegion};

/// The host regions the sim GPU reaches at their host address.
#[derive(Debug, Default)]
pub(super) struct HostMapped {
    regions: RwLock<Vec<HostRegion>>,
}

impl HostMapped {
    /// `[addr, addr + len)` as a slice when it lies inside one device-mapped region. The
    /// region stays mapped while the vGPU lives (the device layer unmaps it only after
    /// `synchronize`), so the slice outlives every operation that takes it.
    pub(super) fn slice(&self, addr: u64, len: u64) -> Option<VolatileSlice<'static>> {
        let (a, l) = (usize::try_from(addr).ok()?, usize::try_from(len).ok()?);
        let end = a.checked_add(l)?;
        read(&self.regions)
            .iter()
            .any(|r| a >= r.addr && end <= r.addr + r.len)
            // SAFETY: [a, end) lies inside a region the caller of `map_for_device` keeps
            // mapped (read-write, shared) until `unmap_for_device`, which it calls only
            // once nothing runs on the vGPU any more.
            .then(|| unsafe { VolatileSlice::new(a as *mut u8, l) })
    }
}

/// Fills `dst` with the little-endian `elem_size`-byte `value` repeated (`dst` starts at
/// an element boundary).
pub(super) fn fill(dst: &VolatileSlice<'_>, value: u32, elem_size: u32) -> Result<()> {
    let bytes = value.to_le_bytes();
    let elem = bytes
        .get(..elem_size as usize)
        .ok_or(BackendError::InvalidArgument(format!(
            "element size {elem_size}"
        )))?;
    let mut piece = [0u8; 4096];
    for (i, b) in piece.iter_mut().enumerate() {
        *b = elem[i % elem.len()];
    }
    let mut off = 0;
    while off < dst.len() {
        let n = piece.len().min(dst.len() - off);
        let d = dst
            .subslice(off, n)
            .map_err(|e| BackendError::Device(format!("host slice: {e}")))?;
        d.copy_from(&piece[..n]);
        off += n;
    }
    Ok(())
}

/// Sim copies with the CPU: registering guest RAM prepares nothing; device-mapped regions
/// are recorded so that the data path accepts them.
impl HostMemory for SimGpu {
    fn register(&self, _regions: &[HostRegion]) -> Result<()> {
        Ok(())
    }

    fn unregister(&self, _regions: &[HostRegion]) {}

    fn map_for_device(&self, region: HostRegion) -> Result<()> {
        let mut regions = write(&self.host.regions);
        let end = region.addr.checked_add(region.len);
        let overlaps = regions
            .iter()
            .any(|r| end.is_some_and(|e| region.addr < r.addr + r.len && r.addr < e));
        if region.len == 0 || end.is_none() || overlaps {
            return Err(BackendError::BadPointer {
                addr: region.addr as u64,
                len: region.len as u64,
            });
        }
        regions.push(region);
        Ok(())
    }

    fn unmap_for_device(&self, region: HostRegion) {
        write(&self.host.regions).retain(|r| *r != region);
    }
}
