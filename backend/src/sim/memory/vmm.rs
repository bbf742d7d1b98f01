//! The virtual memory management API on the sim device: a physical allocation is a memfd
//! with its memory committed, a mapping maps it at its place in the address space's host
//! reservation (an allocation-table entry like any other), so two mappings of one
//! allocation see the same bytes and the bytes survive an unmap while a handle holds them.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::{make_memfd, map_shared, Allocation, DeviceMemory, Space};
use crate::error::{BackendError, Result};
use crate::virt::{MapGuard, Physical, Vmm, VmmHost};

/// A physical allocation of the virtual memory management API: a memfd with its memory
/// committed, charged to the address space until the last handle and mapping let go.
#[derive(Debug)]
pub(crate) struct SimPhys {
    memfd: OwnedFd,
    size: u64,
    space: Arc<Space>,
}

impl Physical for SimPhys {
    fn size(&self) -> u64 {
        self.size
    }

    fn charged(&self) -> u64 {
        self.size
    }
}

impl Drop for SimPhys {
    fn drop(&mut self) {
        self.space.ledger.uncharge(self.size);
        tracing::trace!(size = self.size, "physical allocation released");
    }
}

impl VmmHost for DeviceMemory {
    type Phys = SimPhys;

    fn space(&self) -> (u64, u64) {
        (self.space.va_base, self.space.res.size as u64)
    }

    fn take_hole_at(&self, off: u64, len: u64) -> bool {
        self.space.ledger.take_hole_at(off, len)
    }

    fn take_hole_aligned(&self, len: u64, align: u64) -> Option<u64> {
        self.space
            .ledger
            .take_hole_aligned(self.space.va_base, len, align)
    }

    fn give_hole_later(&self, off: u64, len: u64) -> Box<dyn FnOnce() + Send> {
        let space = self.space.clone();
        Box::new(move || space.ledger.give_hole(off, len))
    }

    fn create_phys(&self, size: u64) -> Result<SimPhys> {
        let len = usize::try_from(size).map_err(|_| self.space.ledger.out_of_memory(size))?;
        self.space.ledger.charge(size)?;
        match make_memfd(len) {
            Ok(memfd) => Ok(SimPhys {
                memfd,
                size,
                space: self.space.clone(),
            }),
            Err(e) => {
                self.space.ledger.uncharge(size);
                Err(e)
            }
        }
    }

    fn place(&self, addr: u64, len: u64, phys: &Arc<SimPhys>, guard: MapGuard) -> Result<()> {
        let off = addr - self.space.va_base;
        let host = self.space.res.host + off as usize;
        let memfd = phys
            .memfd
            .try_clone()
            .map_err(|e| BackendError::os("duplicating a physical allocation's memfd", e))?;
        // Not populated: the memfd's pages are committed already (no SIGBUS later), and a
        // framework maps its whole pool at once (XLA: most of the share), which populating
        // would make take seconds.
        map_shared(
            host,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            &phys.memfd,
            false,
        )?;
        self.space.ledger.added();
        let a = Arc::new(Allocation {
            addr,
            size: len,
            charged: 0,
            va_len: len,
            host,
            memfd,
            imported: false,
            read_only: false,
            module: false,
            vmm: Some(guard),
            holes: Default::default(),
            space: self.space.clone(),
        });
        self.table.insert(addr, a);
        Ok(())
    }

    fn remove(&self, addr: u64) -> Result<()> {
        if self.table.exact(addr)?.vmm.is_none() {
            return Err(BackendError::NotAllocated { addr });
        }
        self.table.remove(addr).map(drop)
    }
}

impl DeviceMemory {
    /// The virtual memory book-keeping of this address space.
    pub(crate) fn vmm(&self) -> &Vmm<SimPhys> {
        &self.vmm
    }
}
