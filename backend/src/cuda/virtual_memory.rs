//! [`VirtualMemory`](crate::VirtualMemory) of the cuda backend: the shared book-keeping
//! (`virt.rs`) over the device memory's physical allocations and mappings
//! (`memory.rs`, `vmm_space.rs`), in the vGPU's context.

use super::CudaGpu;
use crate::error::Result;

/// Virtual memory management on the GPU: physical allocations are driver handles, mapped
/// at their place in the vGPU's own reserved range (`memory.rs`, `vmm_space.rs`).
impl crate::VirtualMemory for CudaGpu {
    fn reserve(&self, size: u64, align: u64, hint: u64) -> Result<u64> {
        self.mem.vmm().reserve(&self.mem, size, align, hint)
    }

    fn free_range(&self, addr: u64, size: u64) -> Result<()> {
        self.mem.vmm().free_range(addr, size)
    }

    fn create(&self, size: u64) -> Result<crate::Created> {
        self.enter()?;
        let (handle, charged) = self.mem.vmm().create(&self.mem, size)?;
        Ok(crate::Created { handle, charged })
    }

    fn release(&self, handle: u64) -> Result<()> {
        self.enter()?;
        self.mem.vmm().release(handle)
    }

    fn map(&self, addr: u64, size: u64, offset: u64, handle: u64) -> Result<()> {
        self.enter()?;
        self.mem.vmm().map(&self.mem, addr, size, offset, handle)
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<()> {
        self.enter()?;
        self.mem.vmm().unmap(&self.mem, addr, size)
    }

    fn retain(&self, addr: u64) -> Result<[u64; 4]> {
        self.mem.vmm().retain(addr)
    }

    fn objects(&self) -> usize {
        self.mem.vmm().objects()
    }

    fn charged(&self) -> u64 {
        self.mem.vmm().charged()
    }

    fn snapshot(&self) -> Result<crate::VmmSnapshot> {
        self.mem.vmm().snapshot()
    }

    /// On a migration target still staging, the mappings go to the staging range first
    /// and move to the vGPU's addresses with every allocation at the switch.
    fn restore(&self, snapshot: &crate::VmmSnapshot) -> Result<()> {
        self.enter()?;
        self.mem.vmm().restore(&self.mem, snapshot)
    }
}
