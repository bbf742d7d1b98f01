//! The virtual memory opcodes (since 1.5, capability `VIRTUAL_MEMORY`): `VA_RESERVE`,
//! `VA_FREE`, `MEM_CREATE`, `MEM_RELEASE`, `MEM_MAP`, `MEM_UNMAP`, `MEM_RETAIN`, served by
//! the backend's [`VirtualMemory`](vgpu_backend::VirtualMemory) after the device's own
//! checks (flags, and the vGPU's memory share for a physical allocation, as `ALLOC`
//! checks it). Everything else (granularity, ranges, handles) the backend checks before it
//! changes anything (docs/protocol.md).

use vgpu_proto::{features, Opcode, Request};

use crate::device::{Outcome, Vgpu};
use crate::error::RequestError;
use vgpu_backend::sync::lock;

impl Vgpu {
    /// Serves one virtual memory request.
    pub(crate) fn vmm_request(&self, req: &Request<'_>) -> Outcome {
        let op = req.opcode();
        let Some(v) = self
            .backend
            .virtual_memory()
            .filter(|_| self.space.features & features::VIRTUAL_MEMORY != 0)
        else {
            return Err(RequestError::NotSupported {
                opcode: op.name(),
                why: "this device has no virtual memory management (capability bit VIRTUAL_MEMORY is clear)",
            });
        };
        match req {
            Request::VaReserve(a) => {
                if a.flags != 0 {
                    return Err(flags(op, a.flags));
                }
                Ok([v.reserve(a.size, a.align, a.hint)?, 0, 0, 0])
            }
            Request::VaFree(a) => v
                .free_range(a.addr, a.size)
                .map(|()| [0; 4])
                .map_err(Into::into),
            Request::MemCreate(a) => {
                if a.flags != 0 {
                    return Err(flags(op, a.flags));
                }
                // Serialised with ALLOC so two queues cannot both squeeze past the share.
                let _g = lock(&self.alloc_lock);
                let used = self.backend.memory_usage().used;
                let share = self.config.memory_share;
                if a.size.checked_add(used).is_none_or(|t| t > share) {
                    return Err(RequestError::ShareExhausted {
                        requested: a.size,
                        used,
                        share,
                    });
                }
                let c = v.create(a.size)?;
                Ok([c.handle, c.charged, 0, 0])
            }
            Request::MemRelease(a) => v.release(a.handle).map(|()| [0; 4]).map_err(Into::into),
            Request::MemMap(a) => v
                .map(a.addr, a.size, a.offset, a.handle)
                .map(|()| [0; 4])
                .map_err(Into::into),
            Request::MemUnmap(a) => v.unmap(a.addr, a.size).map(|()| [0; 4]).map_err(Into::into),
            Request::MemRetain(a) => Ok(v.retain(a.addr)?),
            _ => Err(RequestError::invalid(op, "not a virtual memory request")),
        }
    }
}

fn flags(op: Opcode, flags: u64) -> RequestError {
    RequestError::invalid(op, format!("flags {flags:#x} must be 0"))
}
