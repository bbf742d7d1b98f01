//! The cuda backend's swapping ([`Paging`]) and migration ([`Relocatable`]) capabilities:
//! decommit and recommit pieces of the virtual-memory mappings, place allocations at given
//! addresses, copy to a peer GPU in this process (`cuMemcpyPeerAsync` into its
//! [`DeviceWindow`], else through host memory), and hand the vGPU's address range over at
//! a switch (`memory.rs` does the mapping work).

use cudarc::driver::sys;
use vgpu_proto::backend_kind;

use super::driver::check;
use super::CudaGpu;
use crate::error::{BackendError, Result};
use crate::{Allocated, Backend, DeviceWindow, Paging, Relocatable};

impl Paging for CudaGpu {
    fn decommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        self.enter()?;
        // Nothing may still run on the memory that goes away.
        self.synchronize();
        self.mem.decommit(addr, off, len)
    }

    fn recommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        self.enter()?;
        self.mem.recommit(addr, off, len)
    }
}

impl Relocatable for CudaGpu {
    fn alloc_at(&self, addr: u64, size: u64) -> Result<Allocated> {
        self.enter()?;
        let a = self.mem.create_at(addr, size)?;
        self.clear_and_publish(a, size)
    }

    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> Result<u64> {
        let Some(w) = peer
            .relocation()
            .and_then(|r| r.device_window(addr, len))
            .filter(|w| w.kind == backend_kind::CUDA)
        else {
            return crate::copy_through_host(self, peer, addr, len);
        };
        let _op = self.inflight.begin();
        self.enter()?;
        let (a, off) = self.mem.resolve(addr, len)?;
        let src = a.va().ok_or(BackendError::BadPointer { addr, len })? + off;
        let n = usize::try_from(len).map_err(|_| BackendError::BadPointer { addr, len })?;
        let lane = self.lanes.take().map_err(|e| self.cuda_err(e))?;
        if n > 0 {
            let rc = check(
                // SAFETY: [src, src + n) lies in our live allocation `a` (held); the peer
                // guarantees [w.ptr, w.ptr + n) is its live mapping of the same range and
                // `w.context` its live context (device_window's contract); waited for below.
                unsafe {
                    sys::cuMemcpyPeerAsync(
                        w.ptr,
                        w.context as sys::CUcontext,
                        src,
                        self.ctx.raw(),
                        n,
                        lane.stream.raw(),
                    )
                },
                "cuMemcpyPeerAsync",
            );
            if let Err(e) = rc {
                if e.is_sticky() {
                    return Err(self.cuda_err(e));
                }
                // A driver that cannot copy between these mappings directly: the bytes
                // still move, through host memory.
                tracing::warn!(error = %e, "peer copy refused; copying through host memory");
                drop(lane);
                return crate::copy_through_host(self, peer, addr, len);
            }
        }
        lane.stream.synchronize().map_err(|e| self.cuda_err(e))?;
        drop(a);
        Ok(len)
    }

    fn device_window(&self, addr: u64, len: u64) -> Option<DeviceWindow> {
        Some(DeviceWindow {
            kind: backend_kind::CUDA,
            ptr: self.mem.window(addr, len)?,
            context: self.ctx.raw() as usize,
        })
    }

    fn vacate_addresses(&self) -> Result<()> {
        self.enter()?;
        self.synchronize();
        self.mem.vacate()
    }

    fn reoccupy_addresses(&self) -> Result<()> {
        self.enter()?;
        self.mem.reoccupy()
    }

    fn occupy_addresses(&self) -> Result<()> {
        self.enter()?;
        self.mem.occupy()
    }
}
