//! A real NVMe controller bound to vfio-pci: BAR0 mapped into our address space, bus
//! mastering on, host memory mapped through the IOMMU with VFIO_IOMMU_MAP_DMA. The
//! register programming on top is [`super::Driver`], the same code the emulated
//! controller and the register model run. No NVMe device was reachable where this was
//! written, so this file is compiled and reviewed but has not run against hardware.

use crate::bar::{Bar, DmaMapper, Doorbell};
use crate::error::{Error, Result};
use crate::memory::DmaRegion;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioOps};

const BAR0: u32 = 0;
const CONFIG_REGION: u32 = 7;
const PCI_COMMAND: u64 = 0x04;
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
const PCI_COMMAND_MASTER: u16 = 1 << 2;

struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: an MMIO mapping; accessed only with volatile/atomic 32-bit operations.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from our mmap of BAR0 and are unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// An NVMe controller behind VFIO: its BAR0 and its IOMMU mappings.
pub struct VfioController {
    bar0: Arc<Mapping>,
    container: Arc<VfioContainer>,
    _device: VfioDevice,
    mapped: Mutex<Vec<(u64, usize, Arc<DmaRegion>)>>,
}

fn vfio_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Vfio(format!("{what}: {e}"))
}

impl VfioController {
    /// Open `/sys/bus/pci/devices/<bdf>` (already bound to vfio-pci), map BAR0 and enable
    /// bus mastering.
    pub fn open(sysfs_path: &Path) -> Result<Arc<Self>> {
        let container =
            Arc::new(VfioContainer::new(None).map_err(|e| vfio_err("opening /dev/vfio/vfio", e))?);
        let ops: Arc<dyn VfioOps> = container.clone();
        let device = VfioDevice::new(sysfs_path, ops, false)
            .map_err(|e| vfio_err(&format!("opening {}", sysfs_path.display()), e))?;
        let len = device.get_region_size(BAR0) as usize;
        let offset = device.get_region_offset(BAR0);
        if len < 0x2000 {
            return Err(Error::Vfio(format!(
                "BAR0 is {len} bytes; not an NVMe controller"
            )));
        }
        // SAFETY: mapping a VFIO region of the device fd at the offset VFIO reported;
        // the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&device),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::io(
                "mmap of NVMe BAR0",
                std::io::Error::last_os_error(),
            ));
        }
        let mut cmd = [0u8; 2];
        device.region_read(CONFIG_REGION, &mut cmd, PCI_COMMAND);
        let v = u16::from_le_bytes(cmd) | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        device.region_write(CONFIG_REGION, &v.to_le_bytes(), PCI_COMMAND);
        Ok(Arc::new(VfioController {
            bar0: Arc::new(Mapping {
                ptr: ptr as *mut u8,
                len,
            }),
            container,
            _device: device,
            mapped: Mutex::new(Vec::new()),
        }))
    }
}

fn reg(m: &Mapping, offset: u64) -> Option<&AtomicU32> {
    if offset % 4 != 0 || offset as usize + 4 > m.len {
        return None;
    }
    // SAFETY: offset is 4-aligned and inside the mapping, which lives as long as `m`.
    Some(unsafe { AtomicU32::from_ptr(m.ptr.add(offset as usize) as *mut u32) })
}

impl Bar for VfioController {
    fn read32(&self, offset: u64) -> u32 {
        reg(&self.bar0, offset).map_or(u32::MAX, |r| r.load(Ordering::Acquire))
    }
    fn write32(&self, offset: u64, value: u32) {
        if let Some(r) = reg(&self.bar0, offset) {
            r.store(value, Ordering::Release);
        }
    }
    fn read64(&self, offset: u64) -> u64 {
        if offset % 8 != 0 || offset as usize + 8 > self.bar0.len {
            return u64::MAX;
        }
        // SAFETY: 8-aligned and inside the mapping; NVMe allows 64-bit access to CAP/ASQ/ACQ.
        unsafe { AtomicU64::from_ptr(self.bar0.ptr.add(offset as usize) as *mut u64) }
            .load(Ordering::Acquire)
    }
    fn doorbell(&self, offset: u64) -> Result<Doorbell> {
        let r = reg(&self.bar0, offset)
            .ok_or_else(|| Error::InvalidArgument(format!("doorbell {offset:#x} outside BAR0")))?;
        let keep: Arc<dyn Send + Sync> = self.bar0.clone();
        // SAFETY: `r` lies in the BAR0 mapping kept alive by `keep`.
        Ok(unsafe { Doorbell::new(r, None, keep) })
    }
}

impl DmaMapper for VfioController {
    fn map(&self, region: &Arc<DmaRegion>) -> Result<()> {
        let mut m = self
            .mapped
            .lock()
            .map_err(|_| Error::Vfio("DMA map table poisoned".into()))?;
        if m.iter().any(|(iova, _, _)| *iova == region.iova()) {
            return Ok(());
        }
        // SAFETY: the region stays allocated while we hold it in `mapped`; it is only
        // accessed through raw pointers (DmaRegion's contract), as VFIO requires.
        unsafe {
            self.container
                .vfio_dma_map(region.iova(), region.len(), region.as_ptr())
        }
        .map_err(|e| vfio_err("VFIO_IOMMU_MAP_DMA", e))?;
        m.push((region.iova(), region.len(), region.clone()));
        Ok(())
    }
}

impl Drop for VfioController {
    fn drop(&mut self) {
        if let Ok(m) = self.mapped.lock() {
            for (iova, len, _) in m.iter() {
                let _ = self.container.vfio_dma_unmap(*iova, *len);
            }
        }
    }
}
