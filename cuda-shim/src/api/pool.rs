//! Stream-ordered allocation and memory pools. `cuMemAllocAsync` allocates at once from
//! the vGPU's share (the memory is usable in stream order, and before); `cuMemFreeAsync`
//! sends the free on the stream's queue, which the device runs after the stream's
//! earlier work. A pool keeps no memory in reserve: what is freed goes back to the share,
//! so a pool's reserved and used memory are the same, trimming has nothing to release,
//! and the release threshold and reuse policies are kept but change nothing.

use std::ffi::{c_int, c_ushort, c_void};

use crate::driver::{self, Alloc, Driver, Res};
use crate::extra::Pool;
use crate::types::{res, CUdeviceptr, CUresult, CUstream};
use crate::{guard, out};

pub type CUmemoryPool = *mut c_void;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemPoolProps`.
#[repr(C)]
pub struct PoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: c_ushort,
    pub reserved: [u8; 54],
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct AccessDesc {
    pub location: MemLocation,
    pub flags: c_int,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`,
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ALLOCATION_PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
const ACCESS_READWRITE: c_int = 3;

/// `CUmemPool_attribute`.
mod pattr {
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
    pub const RELEASE_THRESHOLD: i32 = 4;
    pub const RESERVED_MEM_CURRENT: i32 = 5;
    pub const RESERVED_MEM_HIGH: i32 = 6;
    pub const USED_MEM_CURRENT: i32 = 7;
    pub const USED_MEM_HIGH: i32 = 8;
}

/// The device's default pool, created on first use.
fn default_pool(d: &mut Driver) -> u64 {
    if d.extra.default_pool == 0 {
        let h = d.handle();
        d.extra.pools.insert(h, Pool::default());
        d.extra.default_pool = h;
    }
    d.extra.default_pool
}

fn check_device(dev: c_int) -> Res<()> {
    if dev == 0 {
        Ok(())
    } else {
        Err(res::INVALID_DEVICE)
    }
}

/// Recounts every pool's bytes from its live allocations: allocations freed any other
/// way (`cuMemFree`, with their context) leave its account here.
fn recount(d: &mut Driver) {
    let allocs = &d.allocs;
    d.extra
        .async_allocs
        .retain(|p, (_, _, id)| allocs.get(p).is_some_and(|a| a.id == *id));
    for pool in d.extra.pools.values_mut() {
        pool.used = 0;
    }
    for (pool, size, _) in d.extra.async_allocs.values() {
        if let Some(p) = d.extra.pools.get_mut(pool) {
            p.used += size;
        }
    }
}

fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<CUmemoryPool>,
    s: CUstream,
) -> Res<()> {
    let p = driver::with(|d| {
        let ctx = d.current_ctx()?;
        let h = s as usize;
        d.stream_queue(h)?;
        if dptr.is_null() || size == 0 {
            return Err(res::INVALID_VALUE);
        }
        let pool = match pool {
            Some(p) => {
                let p = p as u64;
                d.extra.pools.get(&p).ok_or(res::INVALID_VALUE)?;
                p
            }
            None if d.extra.current_pool != 0 => d.extra.current_pool,
            None => default_pool(d),
        };
        if d.extra.capturing.contains_key(&h) {
            crate::api::stubs::log_once("stream-ordered allocation during stream capture");
            return Err(res::NOT_SUPPORTED);
        }
        let over = |d: &Driver| {
            d.extra
                .pools
                .get(&pool)
                .is_some_and(|p| p.max_size != 0 && p.used.saturating_add(size as u64) > p.max_size)
        };
        if over(d) {
            recount(d);
            if over(d) {
                return Err(res::OUT_OF_MEMORY);
            }
        }
        let t = d.t.clone();
        let p = d.queue(0)?.call(&t, |st| st.alloc(size as u64))?;
        let id = d.handle();
        d.allocs.insert(
            p,
            Alloc {
                size: size as u64,
                ctx,
                id,
                module: 0,
                vmm: false,
            },
        );
        d.extra.async_allocs.insert(p, (pool, size as u64, id));
        if let Some(pl) = d.extra.pools.get_mut(&pool) {
            pl.used += size as u64;
            pl.used_high = pl.used_high.max(pl.used);
        }
        Ok(p)
    })?;
    // SAFETY: checked non-null; a writable CUdeviceptr from the caller.
    unsafe { out(dptr, p) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemAllocAsync", || alloc_async(dptr, size, None, s))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    guard("cuMemAllocFromPoolAsync", || {
        alloc_async(dptr, size, Some(pool), s)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    guard("cuMemFreeAsync", || {
        driver::with(|d| {
            d.current_ctx()?;
            let h = s as usize;
            d.stream_queue(h)?;
            // Only the start of an allocation; a module variable is its module's.
            if d.allocs.get(&dptr).is_none_or(|a| a.module != 0) {
                return Err(res::INVALID_VALUE);
            }
            if d.extra.capturing.contains_key(&h) {
                crate::api::stubs::log_once("stream-ordered free during stream capture");
                return Err(res::NOT_SUPPORTED);
            }
            let q = d.ordered_queue(h)?;
            d.allocs.remove(&dptr);
            if let Some((pool, size, _)) = d.extra.async_allocs.remove(&dptr) {
                if let Some(p) = d.extra.pools.get_mut(&pool) {
                    p.used = p.used.saturating_sub(size);
                }
            }
            let t = d.t.clone();
            let mut queue = d.queue(q)?;
            // The device runs a queue's requests in order: the free follows the
            // stream's earlier work.
            queue.enqueue(&t, |st| st.enqueue_free(dptr), None)?;
            queue.submit();
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    ppool: *mut CUmemoryPool,
    props: *const PoolProps,
) -> CUresult {
    guard("cuMemPoolCreate", || {
        if ppool.is_null() || props.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: a readable CUmemPoolProps from the caller.
        let p = unsafe { &*props };
        if p.alloc_type != ALLOCATION_PINNED || p.location.kind != LOCATION_DEVICE {
            return Err(res::INVALID_VALUE);
        }
        check_device(p.location.id)?;
        if p.handle_types != 0 {
            // Shareable handles are IPC, which a vGPU does not offer.
            crate::api::stubs::log_once("memory pools with shareable handles (IPC)");
            return Err(res::NOT_SUPPORTED);
        }
        let h = driver::with(|d| {
            d.current_ctx()?;
            let h = d.handle();
            d.extra.pools.insert(
                h,
                Pool {
                    max_size: p.max_size as u64,
                    ..Pool::default()
                },
            );
            Ok(h)
        })?;
        // SAFETY: checked non-null; a writable CUmemoryPool from the caller.
        unsafe { out(ppool, h as CUmemoryPool) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard("cuMemPoolDestroy", || {
        driver::with(|d| {
            let p = pool as u64;
            if p == d.extra.default_pool || !d.extra.pools.contains_key(&p) {
                return Err(res::INVALID_VALUE);
            }
            // Its allocations stay valid until freed, as with the driver.
            d.extra.pools.remove(&p);
            if d.extra.current_pool == p {
                d.extra.current_pool = 0;
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, _keep: usize) -> CUresult {
    guard("cuMemPoolTrimTo", || {
        // Nothing is kept in reserve: there is nothing to release.
        driver::with(|d| {
            d.extra
                .pools
                .get(&(pool as u64))
                .map(drop)
                .ok_or(res::INVALID_VALUE)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard("cuMemPoolSetAttribute", || {
        if value.is_null() {
            return Err(res::INVALID_VALUE);
        }
        driver::with(|d| {
            let p = d
                .extra
                .pools
                .get_mut(&(pool as u64))
                .ok_or(res::INVALID_VALUE)?;
            match attr {
                pattr::REUSE_FOLLOW_EVENT_DEPENDENCIES
                    ..=pattr::REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    // SAFETY: an int for the reuse attributes (API contract).
                    p.reuse[(attr - 1) as usize] =
                        unsafe { value.cast::<c_int>().read_unaligned() };
                }
                pattr::RELEASE_THRESHOLD => {
                    // SAFETY: a cuuint64_t (API contract).
                    p.release_threshold = unsafe { value.cast::<u64>().read_unaligned() };
                }
                pattr::RESERVED_MEM_HIGH | pattr::USED_MEM_HIGH => {
                    // SAFETY: a cuuint64_t (API contract); only 0 (a reset) is allowed.
                    if unsafe { value.cast::<u64>().read_unaligned() } != 0 {
                        return Err(res::INVALID_VALUE);
                    }
                    p.used_high = 0;
                }
                _ => return Err(res::INVALID_VALUE),
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard("cuMemPoolGetAttribute", || {
        if value.is_null() {
            return Err(res::INVALID_VALUE);
        }
        driver::with(|d| {
            let h = pool as u64;
            if !d.extra.pools.contains_key(&h) {
                return Err(res::INVALID_VALUE);
            }
            recount(d);
            let p = d.extra.pools.get_mut(&h).ok_or(res::INVALID_VALUE)?;
            let now = p.used;
            // SAFETY: `value` is non-null and points to the attribute's type (API
            // contract): an int for the reuse attributes, a cuuint64_t for the others.
            unsafe {
                match attr {
                    pattr::REUSE_FOLLOW_EVENT_DEPENDENCIES
                        ..=pattr::REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                        out(value.cast::<c_int>(), p.reuse[(attr - 1) as usize])
                    }
                    pattr::RELEASE_THRESHOLD => out(value.cast::<u64>(), p.release_threshold),
                    pattr::RESERVED_MEM_CURRENT | pattr::USED_MEM_CURRENT => {
                        out(value.cast::<u64>(), now)
                    }
                    pattr::RESERVED_MEM_HIGH | pattr::USED_MEM_HIGH => {
                        out(value.cast::<u64>(), p.used_high)
                    }
                    _ => Err(res::INVALID_VALUE),
                }
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    map: *const AccessDesc,
    count: usize,
) -> CUresult {
    guard("cuMemPoolSetAccess", || {
        if map.is_null() && count != 0 {
            return Err(res::INVALID_VALUE);
        }
        driver::with(|d| {
            d.extra
                .pools
                .get(&(pool as u64))
                .map(drop)
                .ok_or(res::INVALID_VALUE)
        })?;
        for i in 0..count {
            // SAFETY: `map` holds `count` descriptors (API contract).
            let a = unsafe { &*map.add(i) };
            if a.location.kind != LOCATION_DEVICE {
                return Err(res::INVALID_VALUE);
            }
            check_device(a.location.id)?;
            // The one device always reads and writes its pools.
            if a.flags != ACCESS_READWRITE {
                return Err(res::INVALID_VALUE);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_int,
    pool: CUmemoryPool,
    loc: *const MemLocation,
) -> CUresult {
    guard("cuMemPoolGetAccess", || {
        if loc.is_null() {
            return Err(res::INVALID_VALUE);
        }
        driver::with(|d| {
            d.extra
                .pools
                .get(&(pool as u64))
                .map(drop)
                .ok_or(res::INVALID_VALUE)
        })?;
        // SAFETY: a readable CUmemLocation from the caller.
        let l = unsafe { *loc };
        if l.kind != LOCATION_DEVICE {
            return Err(res::INVALID_VALUE);
        }
        check_device(l.id)?;
        // SAFETY: a writable flags value from the caller (NULL refused).
        unsafe { out(flags, ACCESS_READWRITE) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    ppool: *mut CUmemoryPool,
    dev: c_int,
) -> CUresult {
    guard("cuDeviceGetDefaultMemPool", || {
        if ppool.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let h = driver::with(|d| {
            check_device(dev)?;
            Ok(default_pool(d))
        })?;
        // SAFETY: checked non-null.
        unsafe { out(ppool, h as CUmemoryPool) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(ppool: *mut CUmemoryPool, dev: c_int) -> CUresult {
    guard("cuDeviceGetMemPool", || {
        if ppool.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let h = driver::with(|d| {
            check_device(dev)?;
            Ok(match d.extra.current_pool {
                0 => default_pool(d),
                p => p,
            })
        })?;
        // SAFETY: checked non-null.
        unsafe { out(ppool, h as CUmemoryPool) }
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceSetMemPool(dev: c_int, pool: CUmemoryPool) -> CUresult {
    guard("cuDeviceSetMemPool", || {
        driver::with(|d| {
            check_device(dev)?;
            let p = pool as u64;
            if !d.extra.pools.contains_key(&p) {
                return Err(res::INVALID_VALUE);
            }
            d.extra.current_pool = p;
            Ok(())
        })
    })
}
