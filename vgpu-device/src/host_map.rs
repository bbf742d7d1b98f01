//! `HOST_MAP` (since 1.7, capability `HOST_MAP`): a process frontend's DMA memory made
//! reachable by the GPU at the frontend's own virtual addresses (docs/protocol.md).
//!
//! The frontend names a range of its memory table (guest-physical) and the address it has
//! that range at. The device maps the region's file a second time into the worker at
//! exactly that address (`MAP_FIXED_NOREPLACE`: nothing of the worker is ever replaced; an
//! address already in use answers `NOT_SUPPORTED`, and the frontend keeps its memory
//! host-only) and hands the mapping to the backend ([`HostMemory::map_for_device`]), which
//! makes the GPU reach it at the same address. Only the frontend's own memory-table memory
//! is ever mapped, at most [`MAX_HOST_MAPS`] ranges that never overlap; they stay until the
//! vGPU goes.

use std::ffi::c_void;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use vgpu_backend::sync::lock;
use vgpu_backend::{Backend, HostRegion};
use vgpu_proto::{features, HostMapArgs, Opcode};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::chain::GuestMem;
use crate::device::{Outcome, Vgpu};
use crate::error::RequestError;

/// Most ranges one vGPU may have mapped (the process transport's memory table holds at
/// most 32 regions).
pub const MAX_HOST_MAPS: usize = 32;
/// Alignment of `HOST_MAP`'s addresses and length.
const PAGE: u64 = 4096;
/// End of the user half of a 64-bit Linux address space (47 bits).
const USER_END: u64 = 1 << 47;

/// One range mapped at the frontend's address; unmapped on drop.
#[derive(Debug)]
struct FixedMap {
    region: HostRegion,
}

impl Drop for FixedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map_fixed` created; the backend let go of it
        // first and nothing else of the worker lives there (MAP_FIXED_NOREPLACE).
        if unsafe { libc::munmap(self.region.addr as *mut c_void, self.region.len) } != 0 {
            tracing::warn!(
                addr = format_args!("{:#x}", self.region.addr),
                error = %std::io::Error::last_os_error(),
                "cannot unmap device-mapped host memory"
            );
        }
    }
}

/// The ranges of one vGPU mapped at its frontend's addresses.
pub(crate) struct HostMaps {
    backend: Arc<dyn Backend>,
    maps: Mutex<Vec<FixedMap>>,
}

impl std::fmt::Debug for HostMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMaps")
            .field("maps", &self.maps)
            .finish()
    }
}

impl HostMaps {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            maps: Mutex::new(Vec::new()),
        }
    }
}

impl Drop for HostMaps {
    fn drop(&mut self) {
        let maps = std::mem::take(&mut *lock(&self.maps));
        if maps.is_empty() {
            return;
        }
        // Nothing may still run on the memory when the GPU lets go of it.
        self.backend.synchronize();
        for m in maps {
            if let Some(h) = self.backend.host_memory() {
                h.unmap_for_device(m.region);
            }
            drop(m);
        }
    }
}

fn invalid(what: impl Into<String>) -> RequestError {
    RequestError::invalid(Opcode::HostMap, what)
}

fn off(why: &'static str) -> RequestError {
    RequestError::NotSupported {
        opcode: Opcode::HostMap.name(),
        why,
    }
}

/// Checks `a` against the memory table: the file and file offset of the range.
fn locate(mem: &GuestMem, a: &HostMapArgs) -> Result<(std::fs::File, u64), RequestError> {
    if a.len == 0 || a.gpa % PAGE != 0 || a.len % PAGE != 0 || a.addr % PAGE != 0 {
        return Err(invalid(format!(
            "gpa {:#x}, len {:#x} and addr {:#x} must be multiples of {PAGE} and len not 0",
            a.gpa, a.len, a.addr
        )));
    }
    let (Some(gpa_end), Some(addr_end)) = (a.gpa.checked_add(a.len), a.addr.checked_add(a.len))
    else {
        return Err(invalid("the range wraps around the address space"));
    };
    if a.addr == 0 || addr_end > USER_END {
        return Err(invalid(format!(
            "addr {:#x}..{addr_end:#x} is not a user-space address",
            a.addr
        )));
    }
    let region = mem
        .find_region(GuestAddress(a.gpa))
        .filter(|r| gpa_end <= r.start_addr().0.saturating_add(r.len()))
        .ok_or_else(|| {
            invalid(format!(
                "guest-physical {:#x}..{gpa_end:#x} is not inside one region of the memory table",
                a.gpa
            ))
        })?;
    let fo = region
        .file_offset()
        .ok_or_else(|| invalid("the region has no file behind it"))?;
    let offset = fo
        .start()
        .checked_add(a.gpa - region.start_addr().0)
        .filter(|o| o % PAGE == 0)
        .ok_or_else(|| invalid("the region's file offset is not page-aligned"))?;
    let file = fo
        .file()
        .try_clone()
        .map_err(|e| invalid(format!("cannot reopen the region's file: {e}")))?;
    Ok((file, offset))
}

/// Maps `len` bytes of `file` from `offset` at exactly `addr`, replacing nothing.
fn map_fixed(
    file: &std::fs::File,
    offset: u64,
    addr: u64,
    len: u64,
) -> Result<FixedMap, RequestError> {
    let (Ok(at), Ok(n), Ok(off_t)) = (
        usize::try_from(addr),
        usize::try_from(len),
        libc::off_t::try_from(offset),
    ) else {
        return Err(invalid(
            "the range does not fit this worker's address space",
        ));
    };
    // SAFETY: a fresh shared mapping of the frontend's sealed file (it can never shrink:
    // memtable.rs) at an address MAP_FIXED_NOREPLACE guarantees holds nothing of ours.
    let got = unsafe {
        libc::mmap(
            at as *mut c_void,
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
            file.as_raw_fd(),
            off_t,
        )
    };
    if got == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        tracing::info!(addr = format_args!("{addr:#x}"), len, error = %e,
            "the frontend's address is taken in the worker; its pinned memory stays host-only");
        return Err(off(
            "the address range is already in use in the worker: this vGPU's pinned host memory stays host-only",
        ));
    }
    let region = FixedMap {
        region: HostRegion {
            addr: got as usize,
            len: n,
        },
    };
    if got as usize != at {
        // A kernel without MAP_FIXED_NOREPLACE took the address as a hint.
        return Err(off(
            "the worker's kernel cannot map at a fixed address without replacing: this vGPU's pinned host memory stays host-only",
        ));
    }
    Ok(region)
}

impl Vgpu {
    /// Serves `HOST_MAP`: result[0] = the mapped address.
    pub(crate) fn host_map(&self, mem: &GuestMem, a: &HostMapArgs) -> Outcome {
        let (file, offset) = locate(mem, a)?;
        let maps = &self.host_maps;
        let mut held = lock(&maps.maps);
        if held.len() >= MAX_HOST_MAPS {
            return Err(invalid(format!(
                "this vGPU has {MAX_HOST_MAPS} ranges mapped already"
            )));
        }
        let info = self.backend.info();
        let va_end = info.va_base.saturating_add(info.va_size);
        if a.addr < va_end && info.va_base < a.addr + a.len {
            return Err(invalid(format!(
                "addr {:#x}..{:#x} overlaps the vGPU's device addresses {:#x}..{va_end:#x}",
                a.addr,
                a.addr + a.len,
                info.va_base
            )));
        }
        let (addr, len) = (a.addr as usize, a.len as usize);
        if held
            .iter()
            .any(|m| addr < m.region.addr + m.region.len && m.region.addr < addr + len)
        {
            return Err(invalid(format!(
                "addr {:#x}..{:#x} overlaps a range mapped already",
                a.addr,
                a.addr + a.len
            )));
        }
        let host = self
            .backend
            .host_memory()
            .filter(|_| self.space.features & features::HOST_MAP != 0)
            .ok_or_else(|| {
                off("this device cannot map host memory for the GPU (capability bit HOST_MAP is clear)")
            })?;
        let fixed = map_fixed(&file, offset, a.addr, a.len)?;
        if let Err(e) = host.map_for_device(fixed.region) {
            tracing::warn!(
                vgpu = self.config.vgpu_id,
                addr = format_args!("{:#x}", a.addr),
                len = a.len,
                error = %e,
                "the GPU cannot reach the frontend's DMA memory at its address; it stays host-only"
            );
            return Err(e.into());
        }
        tracing::info!(
            vgpu = self.config.vgpu_id,
            addr = format_args!("{:#x}", a.addr),
            len = a.len,
            "DMA memory mapped for the GPU at the frontend's address"
        );
        held.push(fixed);
        Ok([a.addr, 0, 0, 0])
    }
}
