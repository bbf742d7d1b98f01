//! The sim device's memory: one reserved host address range per vGPU address space, and
//! one memfd per allocation mapped into it at the allocation's offset.
//!
//! Device address `va_base + off` lives at host address `reservation + off`. An allocation
//! is a memfd (so another process can map the same bytes: shared device memory, or a
//! migration target) mapped `MAP_SHARED | MAP_FIXED` over its part of the reservation; the
//! rest of the reservation stays `PROT_NONE`. Freed ranges go back to `PROT_NONE` and are
//! reused only once nothing uses the allocation any more.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};
use std::sync::Arc;

use vm_memory::VolatileSlice;

use crate::error::{BackendError, Result};
use crate::space::{AllocTable, Extent, Ledger};
use crate::virt::{MapGuard, Vmm};

mod holes;
mod vmm;
use crate::MemoryUsage;
pub(crate) use vmm::SimPhys;

/// Host page size used for charging and mapping.
pub const PAGE: u64 = 4096;
/// Alignment of every allocation's device address.
pub const VA_ALIGN: u64 = vgpu_proto::DEVICE_ALLOC_ALIGN;

fn round_up(v: u64, align: u64) -> Option<u64> {
    v.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// A `PROT_NONE` host address range, unmapped on drop.
#[derive(Debug)]
struct Reservation {
    host: usize,
    size: usize,
}

impl Reservation {
    fn new(size: u64) -> Result<Self> {
        let size = usize::try_from(size).map_err(|_| {
            BackendError::InvalidArgument(format!(
                "address space of {size} bytes does not fit this host"
            ))
        })?;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing; it
        // overlaps nothing we own and we check the result.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(BackendError::os(
                "reserving the device address space (mmap PROT_NONE)",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Self {
            host: p as usize,
            size,
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the range is the one mmap returned in `new`; every allocation mapped into
        // it holds an Arc that keeps this reservation alive, so none is left when we get here.
        let rc = unsafe { libc::munmap(self.host as *mut libc::c_void, self.size) };
        if rc != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "munmap of the device address space failed");
        }
    }
}

/// State shared by the address space and its allocations.
#[derive(Debug)]
struct Space {
    res: Reservation,
    va_base: u64,
    /// Holes (offsets and lengths multiples of `VA_ALIGN`), charge and count.
    ledger: Ledger,
}

/// One live allocation: a memfd mapped at its place in the reservation.
#[derive(Debug)]
pub struct Allocation {
    addr: u64,
    size: u64,
    charged: u64,
    va_len: u64,
    host: usize,
    memfd: OwnedFd,
    /// Mapped from a shared object another process owns (shm): not charged here, never
    /// decommitted here.
    imported: bool,
    /// Mapped `PROT_READ` (a read-only attachment of a shared object): every write path
    /// checks this before touching the bytes, since a write would fault the process.
    read_only: bool,
    /// A module's variables (charged with the module's footprint): `free` refuses it,
    /// the module's unload releases it.
    module: bool,
    /// A mapping of a physical allocation (virtual memory management): not charged here
    /// (the physical allocation is), never decommitted, `free` refuses it; its range
    /// belongs to its reserved range, not to the free holes.
    vmm: Option<MapGuard>,
    /// Its decommitted (swapped-out) ranges: an access to one is refused.
    holes: holes::Holes,
    space: Arc<Space>,
}

impl Extent for Allocation {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

/// An atomic word type kernels may view device memory as.
pub trait Word: Sized {
    /// Bytes per word (also its alignment).
    const SIZE: u64;
}
impl Word for AtomicU8 {
    const SIZE: u64 = 1;
}
impl Word for AtomicU32 {
    const SIZE: u64 = 4;
}
impl Word for AtomicU64 {
    const SIZE: u64 = 8;
}

impl Allocation {
    /// Requested size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The memfd holding the bytes (offset 0 = `addr`).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// The host address of `[off, off + len)`: inside the allocation and in none of its
    /// decommitted ranges (those are mapped `PROT_NONE`; touching one would fault the
    /// process). A range is decommitted or recommitted only while no operation uses its
    /// allocation (the pager evicts idle allocations; a migration mirrors swapped-out
    /// ranges on a target before it serves), so one check before the access holds for it.
    fn check(&self, off: u64, len: u64) -> Result<usize> {
        match off.checked_add(len) {
            Some(end) if end <= self.size => {}
            _ => {
                return Err(BackendError::BadPointer {
                    addr: self.addr.wrapping_add(off),
                    len,
                })
            }
        }
        if let Some((start, end)) = self.holes.touched(off, len) {
            return Err(BackendError::Device(format!(
                "device memory {:#x}..{:#x} is swapped out and was not brought back before \
                 this access; the vGPU's memory bookkeeping is inconsistent: retry, and report \
                 it if it persists",
                self.addr.wrapping_add(start),
                self.addr.wrapping_add(end)
            )));
        }
        Ok(self.host + off as usize)
    }

    /// `len` bytes at offset `off` as a volatile slice.
    pub fn volatile(&self, off: u64, len: u64) -> Result<VolatileSlice<'_>> {
        let p = self.check(off, len)?;
        // SAFETY: `check` keeps [p, p + len) inside this allocation's live MAP_SHARED
        // mapping, which stays mapped while `self` is borrowed (Drop unmaps it). Other users
        // of these bytes (kernels, copies on other queues, other processes mapping the
        // memfd) access them only through volatile or atomic operations.
        Ok(unsafe { VolatileSlice::new(p as *mut u8, len as usize) })
    }

    /// `count` words at offset `off` as atomics. `off` must be aligned to the word.
    pub fn words<T: Word>(&self, off: u64, count: u64) -> Result<&[T]> {
        let len = count.checked_mul(T::SIZE).ok_or(BackendError::BadPointer {
            addr: self.addr.wrapping_add(off),
            len: u64::MAX,
        })?;
        let p = self.check(off, len)?;
        if (p as u64) % T::SIZE != 0 {
            return Err(BackendError::Misaligned {
                addr: self.addr.wrapping_add(off),
                align: T::SIZE,
            });
        }
        // SAFETY: [p, p + len) lies inside this allocation's mapping (checked above), which
        // lives as long as the borrow of `self`; `p` is aligned for `T`; the atomic types have
        // the size and alignment of their integers, any bit pattern is valid, and concurrent
        // access from other threads or processes through atomics is sound.
        Ok(unsafe { std::slice::from_raw_parts(p as *const T, count as usize) })
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: [host, host + va_len) is this allocation's part of the reservation; putting
        // PROT_NONE anonymous memory back over it (MAP_FIXED) only replaces our own mapping.
        let p = unsafe {
            libc::mmap(
                self.host as *mut libc::c_void,
                self.va_len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        let hole = if self.vmm.is_some() {
            // The reserved range owns these addresses (the guard gives them back to it).
            None
        } else if p == libc::MAP_FAILED {
            // Leave the range out of the free list: never hand out a range still mapped.
            tracing::error!(addr = self.addr, error = %std::io::Error::last_os_error(),
                "could not unmap a freed allocation; its address range is retired");
            None
        } else {
            Some((self.host as u64 - self.space.res.host as u64, self.va_len))
        };
        self.space.ledger.released(hole, self.charged);
        tracing::trace!(addr = self.addr, size = self.size, "allocation released");
    }
}

/// A vGPU's device address space and its allocation table.
#[derive(Debug)]
pub struct DeviceMemory {
    space: Arc<Space>,
    table: AllocTable<Allocation>,
    vmm: Vmm<SimPhys>,
}

impl DeviceMemory {
    /// An empty address space `[va_base, va_base + va_size)` holding at most `capacity`
    /// bytes.
    pub fn new(va_base: u64, va_size: u64, capacity: u64) -> Result<Self> {
        crate::space::check_layout(va_base, va_size)?;
        let res = Reservation::new(va_size)?;
        Ok(Self {
            space: Arc::new(Space {
                res,
                va_base,
                ledger: Ledger::new(va_size, capacity),
            }),
            table: AllocTable::default(),
            vmm: Vmm::default(),
        })
    }

    /// The address space's accounts.
    pub fn usage(&self) -> MemoryUsage {
        self.space.ledger.usage()
    }

    /// The address space's accounts, which loaded modules are charged to as well.
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.space.ledger
    }

    /// Allocates `size` zero-filled bytes; returns (address, bytes charged).
    pub fn alloc(&self, size: u64) -> Result<(u64, u64)> {
        self.alloc_where(size, None, false)
    }

    /// Places `size` zero-filled bytes of a module's variables at a fresh address; nothing
    /// is charged (the module's footprint covers them) and [`free`](Self::free) refuses
    /// them: [`free_module`](Self::free_module) releases them with the module.
    pub fn alloc_module(&self, size: u64) -> Result<u64> {
        self.alloc_where(size, None, true).map(|(addr, _)| addr)
    }

    /// Releases the variables of an unloaded module ([`alloc_module`](Self::alloc_module)).
    pub fn free_module(&self, addr: u64) -> Result<()> {
        self.table.remove(addr).map(|_| ())
    }

    /// Allocates `size` zero-filled bytes at exactly `addr` (a migrated allocation keeps
    /// its address); returns (address, bytes charged).
    pub fn alloc_at(&self, addr: u64, size: u64) -> Result<(u64, u64)> {
        self.alloc_where(size, Some(addr), false)
    }

    fn alloc_where(&self, size: u64, at: Option<u64>, module: bool) -> Result<(u64, u64)> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        let too_big = || self.space.ledger.out_of_memory(size);
        let mapped = round_up(size, PAGE).ok_or_else(too_big)?;
        let charged = if module { 0 } else { mapped };
        let va_len = round_up(size, VA_ALIGN).ok_or_else(too_big)?;
        let map_len = usize::try_from(mapped).map_err(|_| too_big())?;
        self.space.ledger.charge(charged)?;
        let off = match at {
            None => self.space.ledger.take_hole(va_len),
            Some(addr) => addr
                .checked_sub(self.space.va_base)
                .filter(|off| off % VA_ALIGN == 0 && self.space.ledger.take_hole_at(*off, va_len)),
        };
        let Some(off) = off else {
            self.space.ledger.uncharge(charged);
            return Err(match at {
                None => BackendError::AddressSpaceFull { requested: size },
                Some(addr) => BackendError::InvalidArgument(format!(
                    "device range {addr:#x}+{size:#x} is not free in this address space"
                )),
            });
        };
        let addr = self.space.va_base + off;
        let host = self.space.res.host + off as usize;
        match map_memfd(host, map_len, addr) {
            Ok(memfd) => {
                self.space.ledger.added();
                let a = Arc::new(Allocation {
                    addr,
                    size,
                    charged,
                    va_len,
                    host,
                    memfd,
                    imported: false,
                    read_only: false,
                    module,
                    vmm: None,
                    holes: Default::default(),
                    space: self.space.clone(),
                });
                self.table.insert(addr, a);
                tracing::debug!(addr, size, charged, "allocated");
                Ok((addr, charged))
            }
            Err((e, clobbered)) => {
                if clobbered {
                    // A failed MAP_FIXED may have unmapped part of the reservation; never
                    // hand that range out again.
                    tracing::error!(addr, error = %e, "device memory mapping failed; address range retired");
                } else {
                    self.space.ledger.give_hole(off, va_len);
                }
                self.space.ledger.uncharge(charged);
                Err(e)
            }
        }
    }

    /// Removes the allocation starting at `addr` from the table. The bytes are released
    /// when the last user (a running kernel or copy) lets go.
    pub fn free(&self, addr: u64) -> Result<()> {
        let a = self.table.exact(addr)?;
        if a.module || a.vmm.is_some() {
            // A module's variable (it goes when its module is unloaded) or a mapping (it
            // goes with MEM_UNMAP), not an allocation.
            return Err(BackendError::NotAllocated { addr });
        }
        drop(a);
        let a = self.table.remove(addr)?;
        tracing::debug!(addr, size = a.size, "freed");
        Ok(())
    }

    /// Maps a shared object's memfd (`size` bytes, page-rounded length) at a fresh device
    /// address; nothing is charged to this address space. `read_only` maps it without write
    /// access (a kernel writing it faults in this process only).
    pub fn import(&self, memfd: OwnedFd, size: u64, read_only: bool) -> Result<u64> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        let bad = || BackendError::InvalidArgument(format!("shared object of {size} bytes"));
        let map_len = round_up(size, PAGE).ok_or_else(bad)?;
        let va_len = round_up(size, VA_ALIGN).ok_or_else(bad)?;
        let file_len = fd_len(&memfd)?;
        if file_len < map_len {
            return Err(BackendError::InvalidArgument(format!(
                "shared object memfd holds {file_len} bytes, fewer than its size {size}"
            )));
        }
        let off = self
            .space
            .ledger
            .take_hole(va_len)
            .ok_or(BackendError::AddressSpaceFull { requested: size })?;
        let addr = self.space.va_base + off;
        let host = self.space.res.host + off as usize;
        let prot = if read_only {
            libc::PROT_READ
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        if let Err(e) = map_at(host, 0, map_len as usize, prot, &memfd) {
            tracing::error!(addr, error = %e, "mapping a shared object failed; address range retired");
            return Err(e);
        }
        self.space.ledger.added();
        let a = Arc::new(Allocation {
            addr,
            size,
            charged: 0,
            va_len,
            host,
            memfd,
            imported: true,
            read_only,
            module: false,
            vmm: None,
            holes: Default::default(),
            space: self.space.clone(),
        });
        self.table.insert(addr, a);
        tracing::debug!(addr, size, read_only, "shared object mapped");
        Ok(addr)
    }

    /// The bytes of `[addr, addr + len)` (inside one allocation) as a volatile slice,
    /// with the allocation that keeps them mapped.
    pub fn view(&self, addr: u64, len: u64) -> Result<(Arc<Allocation>, u64)> {
        self.resolve(addr, len)
    }

    /// The live allocation that starts exactly at `addr`.
    fn exact(&self, addr: u64) -> Result<Arc<Allocation>> {
        self.table.exact(addr)
    }

    /// Checks that `[off, off + len)` is a page-aligned range of the owned allocation at
    /// `addr`; returns it.
    fn commit_range(&self, addr: u64, off: u64, len: u64) -> Result<Arc<Allocation>> {
        let a = self.exact(addr)?;
        if a.imported || a.vmm.is_some() {
            return Err(BackendError::NotSupported(
                "shared objects and mapped physical allocations stay resident; only owned allocations are swapped".into(),
            ));
        }
        let ok = off % PAGE == 0
            && len % PAGE == 0
            && len > 0
            && off.checked_add(len).is_some_and(|end| end <= a.charged);
        if !ok {
            return Err(BackendError::BadPointer {
                addr: addr.wrapping_add(off),
                len,
            });
        }
        Ok(a)
    }

    /// Gives the host pages behind `[off, off + len)` of the allocation at `addr` back to
    /// the host and makes the range inaccessible; its addresses stay taken.
    pub fn decommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let a = self.commit_range(addr, off, len)?;
        let host = a.host + off as usize;
        // Refused from here on: once the mapping below is replaced the range faults, and a
        // replacement that fails may have removed the old mapping already; so even on
        // failure it stays refused (an error to whoever touches it, never a fault).
        a.holes.add(off, len);
        // SAFETY: [host, host + len) lies inside this allocation's part of the reservation
        // (checked by commit_range); MAP_FIXED replaces only our own mapping of it.
        let p = unsafe {
            libc::mmap(
                host as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(BackendError::os(
                "decommitting device memory (mmap PROT_NONE)",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: plain syscall on the allocation's own memfd, inside its size.
        let rc = unsafe {
            libc::fallocate(
                a.memfd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(BackendError::os(
                "releasing device memory (fallocate PUNCH_HOLE)",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Backs `[off, off + len)` of the allocation at `addr` with fresh zeroed pages again,
    /// at the same addresses.
    pub fn recommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        let a = self.commit_range(addr, off, len)?;
        commit(&a.memfd, off, len)?;
        map_at(
            a.host + off as usize,
            off,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            &a.memfd,
        )?;
        a.holes.remove(off, len);
        Ok(())
    }

    /// The allocation holding all of `[addr, addr + len)`, and the offset of `addr` in it.
    /// A zero-length range must still start inside an allocation.
    pub fn resolve(&self, addr: u64, len: u64) -> Result<(Arc<Allocation>, u64)> {
        self.table.resolve(addr, len)
    }

    /// Like [`resolve`](Self::resolve), for a range about to be written: a read-only
    /// mapping is refused (`BAD_DEVICE_POINTER`) before any byte is touched, since the
    /// `PROT_READ` mapping would fault the worker.
    pub fn resolve_write(&self, addr: u64, len: u64) -> Result<(Arc<Allocation>, u64)> {
        self.table.resolve_write(addr, len)
    }

    /// Refuses the launch of a kernel with a pointer argument it may write through (`WRITE`
    /// or `READ_WRITE`) into a read-only mapping.
    pub fn check_kernel_writes(&self, args: &[vgpu_proto::ArgValue]) -> Result<()> {
        self.table.check_kernel_writes(args)
    }
}

/// Creates a memfd of `len` bytes, commits its memory, and maps it at `host` (inside our
/// reservation). On error, the flag says whether the reservation at `host` may have been
/// disturbed.
fn map_memfd(
    host: usize,
    len: usize,
    addr: u64,
) -> std::result::Result<OwnedFd, (BackendError, bool)> {
    let memfd = make_memfd(len).map_err(|e| (e, false))?;
    // SAFETY: [host, host + len) is part of our PROT_NONE reservation and not used by any
    // live allocation (the hole allocator handed it to us); MAP_FIXED replaces only that.
    let p = unsafe {
        libc::mmap(
            host as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            // Populated now: device memory is resident once allocated, as on a GPU, so a
            // copy or kernel never pays the first-touch page faults.
            libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
            memfd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err((
            BackendError::os("mapping device memory", std::io::Error::last_os_error()),
            true,
        ));
    }
    tracing::trace!(addr, len, "memfd mapped");
    Ok(memfd)
}

/// A memfd of `len` bytes with its memory committed.
fn make_memfd(len: usize) -> Result<OwnedFd> {
    make_memfd_flags(len, libc::MFD_CLOEXEC)
}

/// [`make_memfd`] with these `memfd_create` flags.
fn make_memfd_flags(len: usize, flags: libc::c_uint) -> Result<OwnedFd> {
    let name = c"vgpu-sim-mem";
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(BackendError::os(
            "memfd_create for device memory",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` is a fresh descriptor we own and nothing else refers to.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let off_len = libc::off_t::try_from(len).map_err(|_| {
        BackendError::InvalidArgument(format!("allocation of {len} bytes is too large"))
    })?;
    // SAFETY: plain syscalls on our own descriptor.
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), off_len) } != 0 {
        return Err(BackendError::os(
            "sizing device memory (ftruncate)",
            std::io::Error::last_os_error(),
        ));
    }
    // Commit the pages now, so running out of host memory is an allocation error here and
    // not a SIGBUS in a kernel later.
    // SAFETY: plain syscall on our own descriptor.
    if unsafe { libc::fallocate(memfd.as_raw_fd(), 0, 0, off_len) } != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::ENOMEM) => Err(BackendError::HostOutOfMemory {
                requested: len as u64,
            }),
            _ => Err(BackendError::os("committing device memory (fallocate)", e)),
        };
    }
    Ok(memfd)
}

/// Maps `len` bytes of `memfd` from `file_off` at `host` (inside our reservation),
/// populated.
fn map_at(host: usize, file_off: u64, len: usize, prot: i32, memfd: &OwnedFd) -> Result<()> {
    map_from(host, file_off, len, prot, memfd, true)
}

/// Maps `len` bytes of `memfd` from its start at `host` (inside our reservation),
/// populated or not.
fn map_shared(host: usize, len: usize, prot: i32, memfd: &OwnedFd, populate: bool) -> Result<()> {
    map_from(host, 0, len, prot, memfd, populate)
}

fn map_from(
    host: usize,
    file_off: u64,
    len: usize,
    prot: i32,
    memfd: &OwnedFd,
    populate: bool,
) -> Result<()> {
    let off = libc::off_t::try_from(file_off)
        .map_err(|_| BackendError::InvalidArgument(format!("offset {file_off} too large")))?;
    let populate = if populate { libc::MAP_POPULATE } else { 0 };
    // SAFETY: callers pass a range of our PROT_NONE reservation that belongs to one
    // allocation of theirs; MAP_FIXED replaces only that range.
    let p = unsafe {
        libc::mmap(
            host as *mut libc::c_void,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED | populate,
            memfd.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(BackendError::os(
            "mapping device memory",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Commits `[off, off + len)` of `memfd`'s pages.
fn commit(memfd: &OwnedFd, off: u64, len: u64) -> Result<()> {
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::fallocate(memfd.as_raw_fd(), 0, off as libc::off_t, len as libc::off_t) } != 0
    {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::ENOMEM) => {
                Err(BackendError::HostOutOfMemory { requested: len })
            }
            _ => Err(BackendError::os("committing device memory (fallocate)", e)),
        };
    }
    Ok(())
}

/// The size of the file behind `fd`.
fn fd_len(fd: &OwnedFd) -> Result<u64> {
    // SAFETY: an all-zero stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes to `st`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(BackendError::os(
            "inspecting a shared object (fstat)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

/// The seals of a shared object's memfd: its size is fixed for good, so no holder of the
/// descriptor can shrink it under another mapper (a SIGBUS there).
pub const SHARED_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A sealed memfd of `size` bytes (page-rounded) with its memory committed: a shared device
/// memory object of the sim backend ([`SharedMemory::export`](crate::SharedMemory::export)).
pub fn shared_object(size: u64) -> Result<OwnedFd> {
    let len = round_up(size, PAGE)
        .and_then(|l| usize::try_from(l).ok())
        .filter(|l| *l > 0)
        .ok_or_else(|| BackendError::InvalidArgument(format!("shared object of {size} bytes")))?;
    let memfd = make_memfd_flags(len, libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)?;
    // SAFETY: plain fcntl on our own descriptor.
    if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, SHARED_SEALS) } != 0 {
        return Err(BackendError::os(
            "sealing a shared object (F_ADD_SEALS)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(memfd)
}
