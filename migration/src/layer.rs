//! [`Migratable`] as a [`Backend`]: every operation goes to the backend serving now, under
//! the dispatch lock a migration's stop phase takes, and records what a migration needs
//! (allocations and what may have written them, modules and functions by stable handles,
//! imported objects, guest RAM regions, swapped-out ranges). Every capability of the
//! backend serving now is offered through it.

use std::os::fd::OwnedFd;

use std::sync::Arc;
use vgpu_backend::sync::lock;
use vgpu_backend::{
    copy_to_peer, require_paging, require_relocation, require_shared_memory, Allocated, Backend,
    BackendError, BackendInfo, Created, DeviceWindow, FunctionInfo, HostMemory, HostRegion, Launch,
    LaunchStats, MemoryUsage, ModuleImage, Modules, Paging, Relocatable, Result, SharedMemory,
    VirtualMemory,
};
use vm_memory::VolatileSlice;

use crate::migratable::{Func, Image, Migratable, Module};

impl Backend for Migratable {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn memory_usage(&self) -> MemoryUsage {
        self.current().memory_usage()
    }

    fn alloc(&self, size: u64) -> Result<Allocated> {
        let (_g, b) = self.enter();
        let a = b.alloc(size)?;
        self.track(&a, size);
        Ok(a)
    }

    fn free(&self, addr: u64) -> Result<()> {
        let (_g, b) = self.enter();
        if lock(&self.vars).contains_key(&addr) {
            // A module's variable (its module's memory), not an allocation.
            return Err(BackendError::NotAllocated { addr });
        }
        // Out of the table before the memory goes: a pre-copy that fails to read it then
        // finds it freed, not a live allocation it could not read.
        let removed = lock(&self.allocs).remove(&addr);
        if let Err(e) = b.free(addr) {
            if let Some(a) = removed {
                lock(&self.allocs).insert(addr, a);
            }
            return Err(e);
        }
        lock(&self.imported).remove(&addr);
        Ok(())
    }

    fn check_range(&self, addr: u64, len: u64) -> Result<()> {
        self.current().check_range(self.real_addr(addr, len), len)
    }

    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> Result<u64> {
        let (_g, b) = self.enter();
        self.mark(dst);
        let r = b.copy_htod(self.real_addr(dst, src.len() as u64), src);
        self.mark(dst);
        r
    }

    fn copy_dtoh(&self, src: u64, dst: &VolatileSlice<'_>) -> Result<u64> {
        let (_g, b) = self.enter();
        b.copy_dtoh(self.real_addr(src, dst.len() as u64), dst)
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<u64> {
        let (_g, b) = self.enter();
        self.mark(dst);
        let r = b.copy_dtod(self.real_addr(dst, len), self.real_addr(src, len), len);
        self.mark(dst);
        r
    }

    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<u64> {
        let (_g, b) = self.enter();
        self.mark(dst);
        let len = count.saturating_mul(u64::from(elem_size));
        let r = b.memset(self.real_addr(dst, len), value, elem_size, count);
        self.mark(dst);
        r
    }

    fn launch(&self, items: &[Launch<'_>]) -> Vec<Result<LaunchStats>> {
        self.launch_then(items, &mut |_| {})
    }

    fn launch_then(
        &self,
        items: &[Launch<'_>],
        ended: &mut dyn FnMut(&[Result<LaunchStats>]),
    ) -> Vec<Result<LaunchStats>> {
        let (_g, b) = self.enter();
        // Each launch's handle translated; an unknown one fails alone, the others run as one
        // call on the GPU behind.
        let real: Vec<Option<u64>> = {
            let functions = lock(&self.functions);
            items
                .iter()
                .map(|i| functions.get(&i.function).map(|f| f.real))
                .collect()
        };
        // Pointers into module variables that moved, translated.
        let args: Vec<Option<Vec<vgpu_backend::ArgValue>>> =
            items.iter().map(|i| self.real_args(i.args)).collect();
        let known: Vec<Launch<'_>> = items
            .iter()
            .zip(&real)
            .zip(&args)
            .filter_map(|((i, r), a)| {
                r.map(|function| Launch {
                    function,
                    args: a.as_deref().unwrap_or(i.args),
                    ..*i
                })
            })
            .collect();
        for i in &known {
            self.mark_launch(i.args);
        }
        // Every launch known: the GPU's results are the answers, and the caller may answer
        // from them before the GPU's cleanup (the marks below still come before a
        // migration can stop the vGPU: it waits for this call's guard).
        let all_known = known.len() == items.len();
        let mut ran = if all_known {
            b.launch_then(&known, ended)
        } else {
            b.launch(&known)
        }
        .into_iter();
        for i in &known {
            self.mark_launch(i.args);
        }
        let results: Vec<_> = items
            .iter()
            .zip(real)
            .map(|(i, r)| match r {
                Some(_) => ran.next().unwrap_or_else(|| {
                    Err(BackendError::Device(
                        "the GPU's batch answered fewer launches than it was given".into(),
                    ))
                }),
                None => Err(BackendError::UnknownFunction(format!("{}", i.function))),
            })
            .collect();
        if !all_known {
            ended(&results);
        }
        results
    }

    fn synchronize(&self) {
        self.current().synchronize()
    }

    fn modules(&self) -> &dyn Modules {
        self
    }

    fn paging(&self) -> Option<&dyn Paging> {
        Some(self)
    }

    fn relocation(&self) -> Option<&dyn Relocatable> {
        self.current()
            .relocation()
            .map(|_| self as &dyn Relocatable)
    }

    fn shared_memory(&self) -> Option<&dyn SharedMemory> {
        self.current()
            .shared_memory()
            .map(|_| self as &dyn SharedMemory)
    }

    fn host_memory(&self) -> Option<&dyn HostMemory> {
        Some(self)
    }

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.current()
            .virtual_memory()
            .map(|_| self as &dyn VirtualMemory)
    }
}

/// Virtual memory management of the backend serving now. A migration inside this process
/// rebuilds its objects on the target at the switch (same addresses, same handles); a
/// move to another host does not carry them: one of a vGPU that holds any is refused
/// ([`MigrationError::VirtualMemory`](crate::MigrationError::VirtualMemory)), and while
/// such a move runs, new objects are refused.
impl Migratable {
    fn vmm_enter(
        &self,
        creates: bool,
    ) -> Result<(std::sync::RwLockReadGuard<'_, ()>, Arc<dyn Backend>)> {
        let (g, b) = self.enter();
        if creates && self.vmm_frozen.load(std::sync::atomic::Ordering::Acquire) {
            return Err(BackendError::NotSupported(
                "this vGPU is being sent to another host, which does not carry virtual memory objects; retry once the move ended".into(),
            ));
        }
        if b.virtual_memory().is_none() {
            return Err(BackendError::NotSupported(
                "the GPU serving this vGPU has no virtual memory management".into(),
            ));
        }
        Ok((g, b))
    }
}

/// Reaches the virtual memory of `b` (checked present by `vmm_enter`).
fn vmm(b: &Arc<dyn Backend>) -> Result<&dyn VirtualMemory> {
    b.virtual_memory().ok_or_else(|| {
        BackendError::NotSupported(
            "the GPU serving this vGPU has no virtual memory management".into(),
        )
    })
}

impl VirtualMemory for Migratable {
    fn reserve(&self, size: u64, align: u64, hint: u64) -> Result<u64> {
        let (_g, b) = self.vmm_enter(true)?;
        vmm(&b)?.reserve(size, align, hint)
    }

    fn free_range(&self, addr: u64, size: u64) -> Result<()> {
        let (_g, b) = self.vmm_enter(false)?;
        vmm(&b)?.free_range(addr, size)
    }

    fn create(&self, size: u64) -> Result<Created> {
        let (_g, b) = self.vmm_enter(true)?;
        vmm(&b)?.create(size)
    }

    fn release(&self, handle: u64) -> Result<()> {
        let (_g, b) = self.vmm_enter(false)?;
        vmm(&b)?.release(handle)
    }

    fn map(&self, addr: u64, size: u64, offset: u64, handle: u64) -> Result<()> {
        let (_g, b) = self.vmm_enter(true)?;
        vmm(&b)?.map(addr, size, offset, handle)
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<()> {
        let (_g, b) = self.vmm_enter(false)?;
        vmm(&b)?.unmap(addr, size)
    }

    fn retain(&self, addr: u64) -> Result<[u64; 4]> {
        let (_g, b) = self.vmm_enter(true)?;
        vmm(&b)?.retain(addr)
    }

    fn objects(&self) -> usize {
        self.current().virtual_memory().map_or(0, |v| v.objects())
    }

    fn charged(&self) -> u64 {
        self.current().virtual_memory().map_or(0, |v| v.charged())
    }

    fn snapshot(&self) -> Result<vgpu_backend::VmmSnapshot> {
        let (_g, b) = self.vmm_enter(false)?;
        vmm(&b)?.snapshot()
    }

    fn restore(&self, snapshot: &vgpu_backend::VmmSnapshot) -> Result<()> {
        let (_g, b) = self.vmm_enter(true)?;
        vmm(&b)?.restore(snapshot)
    }
}

/// Stable module and function handles over the backend serving now (a migration loads
/// the modules again on the target and maps the handles to the target's).
impl Modules for Migratable {
    fn module_load(&self, image: ModuleImage<'_>) -> Result<u64> {
        let (_g, b) = self.enter();
        let real = b.modules().module_load(image)?;
        let image = match image {
            ModuleImage::Builtin(n) => Image::Builtin(n.to_vec()),
            ModuleImage::Ptx(p) => Image::Ptx(p.to_vec()),
            ModuleImage::Binary(p) => Image::Binary(p.to_vec()),
        };
        let h = self.handle();
        lock(&self.modules).insert(h, Module { image, real });
        Ok(h)
    }

    fn module_unload(&self, module: u64) -> Result<()> {
        let (_g, b) = self.enter();
        let real = lock(&self.modules)
            .get(&module)
            .map(|m| m.real)
            .ok_or_else(|| BackendError::UnknownModule(format!("{module}")))?;
        b.modules().module_unload(real)?;
        lock(&self.modules).remove(&module);
        self.forget_vars(&*b, module);
        lock(&self.functions).retain(|_, f| f.module != module);
        Ok(())
    }

    fn get_function(&self, module: u64, name: &[u8]) -> Result<FunctionInfo> {
        let (_g, b) = self.enter();
        let real_module = lock(&self.modules)
            .get(&module)
            .map(|m| m.real)
            .ok_or_else(|| BackendError::UnknownModule(format!("{module}")))?;
        let f = b.modules().get_function(real_module, name)?;
        let h = self.handle();
        lock(&self.functions).insert(
            h,
            Func {
                module,
                name: name.to_vec(),
                real: f.handle,
            },
        );
        Ok(FunctionInfo {
            handle: h,
            param_count: f.param_count,
        })
    }

    fn param_layout(&self, function: u64) -> Result<vgpu_proto::ParamLayout> {
        let (_g, b) = self.enter();
        let real = lock(&self.functions)
            .get(&function)
            .map(|f| f.real)
            .ok_or_else(|| BackendError::UnknownFunction(format!("handle {function:#x}")))?;
        b.modules().param_layout(real)
    }

    fn function_attributes(&self, function: u64) -> Result<vgpu_proto::FunctionAttributes> {
        let (_g, b) = self.enter();
        let real = lock(&self.functions)
            .get(&function)
            .map(|f| f.real)
            .ok_or_else(|| BackendError::UnknownFunction(format!("handle {function:#x}")))?;
        b.modules().function_attributes(real)
    }

    /// Answered by the backend serving now, for its handle of the function.
    fn cluster_occupancy(&self, q: &vgpu_proto::ClusterOccupancyArgs) -> Result<u64> {
        let (_g, b) = self.enter();
        let real = lock(&self.functions)
            .get(&q.function)
            .map(|f| f.real)
            .ok_or_else(|| BackendError::UnknownFunction(format!("handle {:#x}", q.function)))?;
        b.modules()
            .cluster_occupancy(&vgpu_proto::ClusterOccupancyArgs {
                function: real,
                ..*q
            })
    }

    /// Encoded by the backend serving now: the tensor's address is the vGPU's, the same on
    /// every GPU it moves to.
    fn encode_tensor_map(
        &self,
        map: &vgpu_proto::TensorMapArgs,
    ) -> Result<[u8; vgpu_proto::TENSOR_MAP_BYTES]> {
        let (_g, b) = self.enter();
        b.modules().encode_tensor_map(map)
    }

    fn module_global(&self, module: u64, name: &[u8]) -> Result<(u64, u64)> {
        let (_g, b) = self.enter();
        let real = lock(&self.modules)
            .get(&module)
            .map(|m| m.real)
            .ok_or_else(|| BackendError::UnknownModule(format!("{module}")))?;
        let (addr, size) = b.modules().module_global(real, name)?;
        Ok((self.guest_var(module, name, addr, size), size))
    }

    fn module_globals(&self, module: u64) -> Result<Vec<vgpu_backend::ModuleGlobal>> {
        let (_g, b) = self.enter();
        let real = lock(&self.modules)
            .get(&module)
            .map(|m| m.real)
            .ok_or_else(|| BackendError::UnknownModule(format!("{module}")))?;
        let mut all = b.modules().module_globals(real)?;
        for g in &mut all {
            g.addr = self.guest_var(module, &g.name, g.addr, g.size);
        }
        Ok(all)
    }
}

/// Imported objects stay on their GPU; the migration counts them.
impl SharedMemory for Migratable {
    fn export(&self, size: u64) -> Result<OwnedFd> {
        let (_g, b) = self.enter();
        require_shared_memory(&*b)?.export(size)
    }

    fn import(&self, handle: OwnedFd, size: u64, read_only: bool) -> Result<u64> {
        let (_g, b) = self.enter();
        let addr = require_shared_memory(&*b)?.import(handle, size, read_only)?;
        lock(&self.imported).insert(addr);
        Ok(addr)
    }
}

/// Guest RAM regions, recorded so that a migration target that prepares them gets them at
/// the switch; passed on to the backend serving now where it prepares them.
impl HostMemory for Migratable {
    fn register(&self, regions: &[HostRegion]) -> Result<()> {
        let (_g, b) = self.enter();
        if let Some(h) = b.host_memory() {
            h.register(regions)?;
        }
        lock(&self.regions).extend_from_slice(regions);
        Ok(())
    }

    fn unregister(&self, regions: &[HostRegion]) {
        let (_g, b) = self.enter();
        if let Some(h) = b.host_memory() {
            h.unregister(regions);
        }
        lock(&self.regions).retain(|r| !regions.contains(r));
    }

    fn map_for_device(&self, region: HostRegion) -> Result<()> {
        let (_g, b) = self.enter();
        match b.host_memory() {
            Some(h) => h.map_for_device(region)?,
            None => {
                return Err(vgpu_backend::BackendError::NotSupported(
                    "this backend cannot map host memory for the device".into(),
                ))
            }
        }
        lock(&self.device_mapped).push(region);
        Ok(())
    }

    fn unmap_for_device(&self, region: HostRegion) {
        let (_g, b) = self.enter();
        if let Some(h) = b.host_memory() {
            h.unmap_for_device(region);
        }
        lock(&self.device_mapped).retain(|r| *r != region);
    }
}

/// The relocation of the backend serving now; allocations placed through it are tracked
/// like any other.
impl Relocatable for Migratable {
    fn alloc_at(&self, addr: u64, size: u64) -> Result<Allocated> {
        let (_g, b) = self.enter();
        let a = require_relocation(&*b)?.alloc_at(addr, size)?;
        self.track(&a, size);
        Ok(a)
    }

    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> Result<u64> {
        let (_g, b) = self.enter();
        copy_to_peer(&*b, peer, addr, len)
    }

    fn device_window(&self, addr: u64, len: u64) -> Option<DeviceWindow> {
        let (_g, b) = self.enter();
        b.relocation()?.device_window(addr, len)
    }

    fn vacate_addresses(&self) -> Result<()> {
        let (_g, b) = self.enter();
        require_relocation(&*b)?.vacate_addresses()
    }

    fn reoccupy_addresses(&self) -> Result<()> {
        let (_g, b) = self.enter();
        require_relocation(&*b)?.reoccupy_addresses()
    }

    fn occupy_addresses(&self) -> Result<()> {
        let (_g, b) = self.enter();
        require_relocation(&*b)?.occupy_addresses()
    }
}

/// Swapping through the backend serving now, recording which ranges are swapped out (a
/// migration copies no bytes for them and gives the target's memory back for them too).
/// Without paging in the backend serving now, every call fails as not supported.
impl Paging for Migratable {
    fn commit_granule(&self) -> u64 {
        self.current().paging().map_or(0, |p| p.commit_granule())
    }

    fn decommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let (_g, b) = self.enter();
        let d = lock(&self.allocs).get(&addr).map(|a| a.decommitted.clone());
        let Some(d) = d else {
            return require_paging(&*b)?.decommit(addr, off, len);
        };
        // Held across the call: a pre-copy never reads a range while it goes away.
        let mut d = lock(&d);
        require_paging(&*b)?.decommit(addr, off, len)?;
        d.insert(off, len);
        drop(d);
        // A change of what is committed, like a write: a migration running now carries
        // it at its stop (the target gives the range back too).
        self.mark(addr);
        Ok(())
    }

    fn recommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let (_g, b) = self.enter();
        let d = lock(&self.allocs).get(&addr).map(|a| a.decommitted.clone());
        let Some(d) = d else {
            return require_paging(&*b)?.recommit(addr, off, len);
        };
        let mut d = lock(&d);
        require_paging(&*b)?.recommit(addr, off, len)?;
        d.remove(&off);
        drop(d);
        // The pager writes the piece's bytes back in a call of its own, and a migration's
        // stop may fall between the two: marked here, the stop recommits the range on the
        // target before the bytes go there (unmarked, the target kept it decommitted and
        // that write faulted the worker).
        self.mark(addr);
        Ok(())
    }
}
