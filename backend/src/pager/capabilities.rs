//! What the pager offers above it: every capability of the backend it wraps, through its
//! own bookkeeping where it tracks what the capability touches. Decommitting a range swaps
//! it out to host memory (its bytes are kept) and recommitting restores it; an allocation
//! placed at a given address is adopted (charged, tracked, evictable); a copy to a
//! migration peer restores the range first; an imported object is tracked and never
//! swapped; module memory counts against the share.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use vgpu_scheduler::memory::Tier;

use super::entry::Entry;
use super::Pager;
use crate::sync::read;
use crate::{
    require_relocation, require_shared_memory, Allocated, Backend, BackendError, Created,
    DeviceWindow, Modules, Paging, Relocatable, Result, SharedMemory, VirtualMemory,
};

impl Pager {
    /// The allocation that starts at `addr` (not a shared mapping: those are never
    /// swapped).
    fn own_entry(&self, addr: u64) -> Result<std::sync::Arc<Entry>> {
        read(&self.entries)
            .get(&addr)
            .filter(|e| !e.shared)
            .cloned()
            .ok_or(BackendError::NotAllocated { addr })
    }
}

/// Swapping through the pager: what a decommit gives back is saved first, so the range
/// reads the same after [`Paging::recommit`] (stronger than the trait asks).
impl Paging for Pager {
    fn commit_granule(&self) -> u64 {
        self.granule
    }

    fn decommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let e = self.own_entry(addr)?;
        if off.checked_add(len).is_none_or(|end| end > e.charged) {
            return Err(BackendError::BadPointer { addr, len });
        }
        let _swapping = crate::sync::lock(&self.swapping);
        let mut pieces = e.lock();
        if e.pinned() {
            return Err(BackendError::InvalidArgument(format!(
                "allocation {addr:#x} is in use; decommit it once its operations finished"
            )));
        }
        let range = e.pieces_of(off, len);
        let resident: u64 = range
            .clone()
            .filter(|i| matches!(pieces[*i], super::entry::Piece::Resident))
            .map(|i| e.piece(i).1)
            .sum();
        let freed = self.evict_pieces(&e, &mut pieces, range, resident, Tier::Host);
        drop(pieces);
        self.report();
        if freed < resident {
            return Err(BackendError::Device(format!(
                "only {freed} of {resident} bytes at {addr:#x} could be swapped out"
            )));
        }
        Ok(())
    }

    fn recommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let e = self.own_entry(addr)?;
        if off.checked_add(len).is_none_or(|end| end > e.charged) {
            return Err(BackendError::BadPointer { addr, len });
        }
        self.make_resident(&e, off, len, None)
    }
}

/// Relocation of the wrapped backend, with the pager's bookkeeping.
impl Relocatable for Pager {
    fn alloc_at(&self, addr: u64, size: u64) -> Result<Allocated> {
        let a = require_relocation(&*self.inner)?.alloc_at(addr, size)?;
        if let Err(e) = self.adopt(a.addr, size, a.charged) {
            let _ = self.inner.free(a.addr);
            return Err(e);
        }
        Ok(a)
    }

    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> Result<u64> {
        let (pin, off) = self.pin(addr, len)?;
        self.make_resident(&pin.0, off, len, None)?;
        crate::copy_to_peer(&*self.inner, peer, addr, len)
    }

    /// None: the pager may swap any range out at any time, so no window stays valid.
    fn device_window(&self, _addr: u64, _len: u64) -> Option<DeviceWindow> {
        None
    }

    fn vacate_addresses(&self) -> Result<()> {
        require_relocation(&*self.inner)?.vacate_addresses()
    }

    fn reoccupy_addresses(&self) -> Result<()> {
        require_relocation(&*self.inner)?.reoccupy_addresses()
    }

    fn occupy_addresses(&self) -> Result<()> {
        require_relocation(&*self.inner)?.occupy_addresses()
    }
}

/// Module memory counts against the share; module variables stay outside the swapping.
impl Modules for Pager {
    fn module_load(&self, image: crate::ModuleImage<'_>) -> Result<u64> {
        let footprint = crate::module_footprint(&image);
        let used = self.state().used.saturating_add(self.fixed_bytes());
        if used.saturating_add(footprint) > self.share {
            return Err(BackendError::ModuleLimit {
                requested: footprint,
                why: format!(
                    "the vGPU's memory share has {} of {} bytes free",
                    self.share.saturating_sub(used),
                    self.share
                ),
            });
        }
        let handle = self.inner.modules().module_load(image)?;
        self.module_bytes.fetch_add(footprint, Ordering::AcqRel);
        crate::sync::lock(&self.modules).insert(handle, footprint);
        Ok(handle)
    }

    fn module_unload(&self, module: u64) -> Result<()> {
        self.inner.modules().module_unload(module)?;
        crate::sync::lock(&self.globals).retain(|_, (_, m)| *m != module);
        if let Some(bytes) = crate::sync::lock(&self.modules).remove(&module) {
            self.module_bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
        Ok(())
    }

    fn get_function(&self, module: u64, name: &[u8]) -> Result<crate::FunctionInfo> {
        self.inner.modules().get_function(module, name)
    }

    fn param_layout(&self, function: u64) -> Result<crate::ParamLayout> {
        self.inner.modules().param_layout(function)
    }

    fn function_attributes(&self, function: u64) -> Result<vgpu_proto::FunctionAttributes> {
        self.inner.modules().function_attributes(function)
    }

    fn encode_tensor_map(
        &self,
        map: &vgpu_proto::TensorMapArgs,
    ) -> Result<[u8; vgpu_proto::TENSOR_MAP_BYTES]> {
        self.inner.modules().encode_tensor_map(map)
    }

    fn cluster_occupancy(&self, q: &vgpu_proto::ClusterOccupancyArgs) -> Result<u64> {
        self.inner.modules().cluster_occupancy(q)
    }

    fn module_global(&self, module: u64, name: &[u8]) -> Result<(u64, u64)> {
        let (addr, size) = self.inner.modules().module_global(module, name)?;
        if size > 0 {
            crate::sync::lock(&self.globals).insert(addr, (size, module));
        }
        Ok((addr, size))
    }

    fn module_globals(&self, module: u64) -> Result<Vec<crate::ModuleGlobal>> {
        let all = self.inner.modules().module_globals(module)?;
        let mut globals = crate::sync::lock(&self.globals);
        for g in all.iter().filter(|g| g.size > 0) {
            globals.insert(g.addr, (g.size, module));
        }
        Ok(all)
    }
}

/// An imported object is an allocation the pager never swaps (and never charges).
impl SharedMemory for Pager {
    fn export(&self, size: u64) -> Result<OwnedFd> {
        require_shared_memory(&*self.inner)?.export(size)
    }

    fn import(&self, handle: OwnedFd, size: u64, read_only: bool) -> Result<u64> {
        let addr = require_shared_memory(&*self.inner)?.import(handle, size, read_only)?;
        self.insert(Entry::new(addr, size, 0, 0, true));
        Ok(addr)
    }
}

impl Pager {
    /// Bytes charged beside the allocations and never swapped: the modules' footprints and
    /// the physical allocations of the virtual memory management API.
    pub(super) fn fixed_bytes(&self) -> u64 {
        self.module_bytes
            .load(Ordering::Acquire)
            .saturating_add(self.vmm_bytes())
    }

    /// Bytes the physical allocations of the virtual memory API hold.
    pub(super) fn vmm_bytes(&self) -> u64 {
        self.inner.virtual_memory().map_or(0, |v| v.charged())
    }

    /// Whether `addr` starts a mapping of a physical allocation.
    pub(super) fn is_mapping(&self, addr: u64) -> bool {
        read(&self.entries)
            .get(&addr)
            .is_some_and(|e| e.shared && e.mapping)
    }

    fn require_vmm(&self) -> Result<&dyn VirtualMemory> {
        self.inner.virtual_memory().ok_or_else(|| {
            BackendError::NotSupported("this backend has no virtual memory management".into())
        })
    }
}

/// Virtual memory management above the pager: physical allocations count against the
/// share and are never swapped (like module memory), a mapping is an allocation the pager
/// tracks and never swaps (like a shared object's).
impl VirtualMemory for Pager {
    fn reserve(&self, size: u64, align: u64, hint: u64) -> Result<u64> {
        self.require_vmm()?.reserve(size, align, hint)
    }

    fn free_range(&self, addr: u64, size: u64) -> Result<()> {
        self.require_vmm()?.free_range(addr, size)
    }

    fn create(&self, size: u64) -> Result<Created> {
        let vmm = self.require_vmm()?;
        let used = self.state().used.saturating_add(self.fixed_bytes());
        if used.saturating_add(size) > self.share {
            return Err(BackendError::OutOfMemory {
                requested: size,
                available: self.share.saturating_sub(used),
                capacity: self.share,
            });
        }
        // Resident device memory at once, as an allocation's: the broker makes room.
        if let Err(why) = self.broker.reserve(size) {
            tracing::info!(
                size,
                why,
                "physical allocation refused by the memory broker"
            );
            self.report();
            return Err(BackendError::MemoryPressure {
                requested: size,
                why,
            });
        }
        let c = vmm.create(size);
        self.report();
        c
    }

    fn release(&self, handle: u64) -> Result<()> {
        self.require_vmm()?.release(handle)?;
        self.report();
        Ok(())
    }

    fn map(&self, addr: u64, size: u64, offset: u64, handle: u64) -> Result<()> {
        self.require_vmm()?.map(addr, size, offset, handle)?;
        let mut e = Entry::new(addr, size, 0, 0, true);
        e.mapping = true;
        self.insert(e);
        Ok(())
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<()> {
        self.require_vmm()?.unmap(addr, size)?;
        let end = addr.saturating_add(size);
        crate::sync::write(&self.entries).retain(|a, e| !(e.mapping && (addr..end).contains(a)));
        self.report();
        Ok(())
    }

    fn retain(&self, addr: u64) -> Result<[u64; 4]> {
        self.require_vmm()?.retain(addr)
    }

    fn objects(&self) -> usize {
        self.inner.virtual_memory().map_or(0, |v| v.objects())
    }

    fn charged(&self) -> u64 {
        self.inner.virtual_memory().map_or(0, |v| v.charged())
    }

    fn snapshot(&self) -> Result<crate::VmmSnapshot> {
        self.require_vmm()?.snapshot()
    }

    fn restore(&self, snapshot: &crate::VmmSnapshot) -> Result<()> {
        self.require_vmm()?.restore(snapshot)?;
        for &(addr, size, _) in &snapshot.maps {
            let mut e = Entry::new(addr, size, 0, 0, true);
            e.mapping = true;
            self.insert(e);
        }
        self.report();
        Ok(())
    }
}

/// Guest RAM goes to the wrapped backend as it is; device-mapped host memory too, recorded
/// so that copies and memsets on it pass the pager untouched (it is never swapped).
impl crate::HostMemory for Pager {
    fn register(&self, regions: &[crate::HostRegion]) -> Result<()> {
        match self.inner.host_memory() {
            Some(h) => h.register(regions),
            None => Ok(()),
        }
    }

    fn unregister(&self, regions: &[crate::HostRegion]) {
        if let Some(h) = self.inner.host_memory() {
            h.unregister(regions);
        }
    }

    fn map_for_device(&self, region: crate::HostRegion) -> Result<()> {
        let h = self.inner.host_memory().ok_or_else(|| {
            BackendError::NotSupported("this backend cannot map host memory for the device".into())
        })?;
        h.map_for_device(region)?;
        crate::sync::lock(&self.host_mapped).push(region);
        Ok(())
    }

    fn unmap_for_device(&self, region: crate::HostRegion) {
        if let Some(h) = self.inner.host_memory() {
            h.unmap_for_device(region);
        }
        crate::sync::lock(&self.host_mapped).retain(|r| *r != region);
    }
}
