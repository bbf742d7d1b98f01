//! Function attributes, cache preferences and occupancy.
//!
//! What the library knows of a function: its parameters, its name, its module's PTX
//! version, the attributes a program set, and its registers, static shared, constant and
//! local memory as the device reports them (`GET_FUNCTION_LAYOUT` on a device with
//! `features::FUNCTION_ATTRIBUTES`; a device without answers `CUDA_ERROR_NOT_SUPPORTED`
//! for those). Occupancy is computed from them, the block's threads and dynamic shared
//! memory, and the device's limits.

use std::ffi::{c_char, c_int, c_uint};

use vgpu_proto::{DeviceAttributes, FunctionAttributes, MAX_SHARED_BYTES};

use crate::driver::{self, Driver, Function, Res};
use crate::types::{res, CUfunction, CUmodule, CUresult};
use crate::{guard, out};

/// `CUfunction_attribute` values.
pub mod fattr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 0;
    pub const SHARED_SIZE_BYTES: i32 = 1;
    pub const CONST_SIZE_BYTES: i32 = 2;
    pub const LOCAL_SIZE_BYTES: i32 = 3;
    pub const NUM_REGS: i32 = 4;
    pub const PTX_VERSION: i32 = 5;
    pub const BINARY_VERSION: i32 = 6;
    pub const CACHE_MODE_CA: i32 = 7;
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: i32 = 9;
    pub const CLUSTER_SIZE_MUST_BE_SET: i32 = 10;
    pub const REQUIRED_CLUSTER_WIDTH: i32 = 11;
    pub const REQUIRED_CLUSTER_HEIGHT: i32 = 12;
    pub const REQUIRED_CLUSTER_DEPTH: i32 = 13;
    pub const NON_PORTABLE_CLUSTER_SIZE_ALLOWED: i32 = 14;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: i32 = 15;
}

/// Shared memory a block may use without opting in.
const DEFAULT_SHARED: u32 = 48 << 10;

/// Dynamic shared memory a function may use without opting in (the driver's default):
/// 48 KiB less its static shared memory.
pub fn default_dynamic_shared(attrs: Option<&FunctionAttributes>) -> i32 {
    let fixed = attrs.map_or(0, |a| a.static_shared_bytes);
    DEFAULT_SHARED.saturating_sub(fixed) as i32
}

/// A function's register and static shared memory needs, for occupancy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    pub regs: u32,
    pub static_shared: u32,
    pub max_threads: u32,
}

impl Needs {
    fn of(f: &Function) -> Needs {
        f.attrs.map_or(Needs::default(), |a| Needs {
            regs: a.num_regs,
            static_shared: a.static_shared_bytes,
            max_threads: a.max_threads_per_block,
        })
    }
}
/// Shared memory the system reserves per block (`RESERVED_SHARED_MEMORY_PER_BLOCK`).
const RESERVED_SHARED_PER_BLOCK: u64 = 1024;
/// `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`, the one occupancy flag.
const CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE: c_uint = 1;
/// `CU_FUNC_CACHE_PREFER_*` (0 to 3) and `CU_SHARED_MEM_CONFIG_*` (0 to 2).
const MAX_CACHE_CONFIG: c_int = 3;
const MAX_SHARED_CONFIG: c_int = 2;

/// The function behind a handle (a `CUfunction` or a `CUkernel`; a kernel's library loads
/// on this first use).
pub(crate) fn function(d: &mut Driver, f: CUfunction) -> Res<&Function> {
    super::library::resolve(d, f as u64)?;
    lookup(d, f)
}

/// The function behind a handle already resolved (see [`function`]).
pub(crate) fn lookup(d: &Driver, f: CUfunction) -> Res<&Function> {
    d.functions.get(&(f as u64)).ok_or(res::INVALID_HANDLE)
}

/// The `.version X.Y` of a PTX module as X * 10 + Y.
fn ptx_version(ptx: &str) -> Option<c_int> {
    let line = ptx
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(".version"))?;
    let (major, minor) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some(major.trim().parse::<c_int>().ok()? * 10 + minor.trim().parse::<c_int>().ok()?)
}

/// A function attribute, as far as the library knows it.
pub(crate) fn get_attribute(d: &mut Driver, f: CUfunction, attrib: c_int) -> Res<c_int> {
    let v = attribute_of(d, f, attrib);
    tracing::trace!(function = f as u64, attribute = attrib, value = ?v, "function attribute");
    v
}

fn attribute_of(d: &mut Driver, f: CUfunction, attrib: c_int) -> Res<c_int> {
    super::library::resolve(d, f as u64)?;
    let d = &*d;
    let func = lookup(d, f)?;
    let g = &d.attributes;
    let binary = (g.cc_major * 10 + g.cc_minor) as c_int;
    let module = d.modules.get(&func.module);
    let reported = |v: fn(&FunctionAttributes) -> u32| match func.attrs.as_ref() {
        Some(a) => Ok(v(a) as c_int),
        None => {
            crate::api::stubs::log_once(
                "cuFuncGetAttribute (registers, static shared, constant or local memory) on a \
                 device that does not report them",
            );
            Err(res::NOT_SUPPORTED)
        }
    };
    Ok(match attrib {
        fattr::MAX_THREADS_PER_BLOCK => match func.attrs {
            Some(a) if a.max_threads_per_block > 0 => a.max_threads_per_block as c_int,
            _ => vgpu_proto::MAX_THREADS_PER_BLOCK as c_int,
        },
        fattr::PTX_VERSION => match module.and_then(|m| m.ptx.as_deref()) {
            Some(ptx) => ptx_version(ptx).unwrap_or(binary),
            // Built-in kernels and binary images: the device's own code.
            None => binary,
        },
        fattr::BINARY_VERSION => binary,
        fattr::CACHE_MODE_CA => 0,
        fattr::MAX_DYNAMIC_SHARED_SIZE_BYTES => func.max_dynamic_shared,
        fattr::PREFERRED_SHARED_MEMORY_CARVEOUT => func.carveout,
        fattr::CLUSTER_SIZE_MUST_BE_SET => 0,
        fattr::REQUIRED_CLUSTER_WIDTH => func.cluster.dims[0] as c_int,
        fattr::REQUIRED_CLUSTER_HEIGHT => func.cluster.dims[1] as c_int,
        fattr::REQUIRED_CLUSTER_DEPTH => func.cluster.dims[2] as c_int,
        fattr::NON_PORTABLE_CLUSTER_SIZE_ALLOWED => c_int::from(func.cluster.non_portable),
        fattr::CLUSTER_SCHEDULING_POLICY_PREFERENCE => func.cluster.policy,
        fattr::SHARED_SIZE_BYTES => reported(|a| a.static_shared_bytes)?,
        fattr::CONST_SIZE_BYTES => reported(|a| a.const_bytes)?,
        fattr::LOCAL_SIZE_BYTES => reported(|a| a.local_bytes)?,
        fattr::NUM_REGS => reported(|a| a.num_regs)?,
        _ => return Err(res::INVALID_VALUE),
    })
}

/// Sets a function attribute a program may set.
pub(crate) fn set_attribute(d: &mut Driver, f: CUfunction, attrib: c_int, value: c_int) -> Res<()> {
    tracing::trace!(
        function = f as u64,
        attribute = attrib,
        value,
        "set function attribute"
    );
    super::library::resolve(d, f as u64)?;
    let optin = d
        .attributes
        .max_shared_per_block_optin
        .min(MAX_SHARED_BYTES);
    let clusters = d.info.features & vgpu_proto::features::CLUSTERS != 0;
    let func = d
        .functions
        .get_mut(&(f as u64))
        .ok_or(res::INVALID_HANDLE)?;
    match attrib {
        fattr::MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            let fixed = func.attrs.map_or(0, |a| a.static_shared_bytes);
            if value < 0 || value as u32 > optin.saturating_sub(fixed) {
                return Err(res::INVALID_VALUE);
            }
            func.max_dynamic_shared = value;
        }
        fattr::PREFERRED_SHARED_MEMORY_CARVEOUT => {
            if !(-1..=100).contains(&value) {
                return Err(res::INVALID_VALUE);
            }
            func.carveout = value;
        }
        // The cluster every launch of the function uses unless it names its own: each
        // dimension set alone, checked whole at launch (all zero or all positive, as the
        // driver checks them).
        fattr::REQUIRED_CLUSTER_WIDTH
        | fattr::REQUIRED_CLUSTER_HEIGHT
        | fattr::REQUIRED_CLUSTER_DEPTH => {
            if !(0..=vgpu_proto::MAX_CLUSTER_BLOCKS as i32).contains(&value) {
                return Err(res::INVALID_VALUE);
            }
            if value != 0 && !clusters {
                crate::api::stubs::log_once("thread block clusters on this vGPU");
                return Err(res::NOT_SUPPORTED);
            }
            func.cluster.dims[(attrib - fattr::REQUIRED_CLUSTER_WIDTH) as usize] = value as u32;
        }
        // Permissions and preferences for cluster launches (cuBLAS sets them on its
        // kernels): kept and answered; the worker allows a cluster above the portable 8
        // blocks itself, and schedules clusters as the GPU prefers.
        fattr::NON_PORTABLE_CLUSTER_SIZE_ALLOWED => {
            if !(0..=1).contains(&value) {
                return Err(res::INVALID_VALUE);
            }
            func.cluster.non_portable = value == 1;
        }
        fattr::CLUSTER_SCHEDULING_POLICY_PREFERENCE => {
            if !(0..=2).contains(&value) {
                return Err(res::INVALID_VALUE);
            }
            func.cluster.policy = value;
        }
        0..=7 | fattr::CLUSTER_SIZE_MUST_BE_SET => return Err(res::INVALID_VALUE),
        _ => return Err(res::INVALID_VALUE),
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    hfunc: CUfunction,
) -> CUresult {
    guard("cuFuncGetAttribute", || {
        let v = driver::with(|d| get_attribute(d, hfunc, attrib))?;
        // SAFETY: a writable int from the caller (NULL refused).
        unsafe { out(pi, v) }
    })
}

#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(hfunc: CUfunction, attrib: c_int, value: c_int) -> CUresult {
    guard("cuFuncSetAttribute", || {
        driver::with(|d| set_attribute(d, hfunc, attrib, value))
    })
}

/// Cache and shared memory bank preferences are hints the device may ignore; the vGPU
/// does (the checks are the driver's).
fn hint(f: CUfunction, value: c_int, max: c_int) -> Res<()> {
    driver::with(|d| function(d, f).map(drop))?;
    if !(0..=max).contains(&value) {
        return Err(res::INVALID_VALUE);
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuFuncSetCacheConfig(hfunc: CUfunction, config: c_int) -> CUresult {
    guard("cuFuncSetCacheConfig", || {
        hint(hfunc, config, MAX_CACHE_CONFIG)
    })
}

#[no_mangle]
pub extern "C" fn cuFuncSetSharedMemConfig(hfunc: CUfunction, config: c_int) -> CUresult {
    guard("cuFuncSetSharedMemConfig", || {
        hint(hfunc, config, MAX_SHARED_CONFIG)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, hfunc: CUfunction) -> CUresult {
    guard("cuFuncGetName", || {
        if name.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let p = driver::with(|d| {
            // A kernel whose library is not loaded yet has its name already.
            if let Some((_, n)) = d.extra.lazy_kernels.get(&(hfunc as u64)) {
                return Ok(crate::api::library::name_ptr(n));
            }
            Ok(crate::api::library::name_ptr(&function(d, hfunc)?.name))
        })?;
        // SAFETY: checked non-null; a writable `const char*` from the caller.
        unsafe { out(name, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(hmod: *mut CUmodule, hfunc: CUfunction) -> CUresult {
    guard("cuFuncGetModule", || {
        let m = driver::with(|d| Ok(function(d, hfunc)?.module))?;
        // SAFETY: a writable CUmodule from the caller (NULL refused).
        unsafe { out(hmod, m as CUmodule) }
    })
}

/// Blocks of `block` threads with `dynamic` bytes of shared memory each that one
/// multiprocessor holds at once, by threads, blocks, registers and shared memory.
pub fn blocks_per_sm(g: &DeviceAttributes, n: Needs, block: u64, dynamic: u64) -> u64 {
    let warp = u64::from(g.warp_size.max(1));
    let max_threads = match n.max_threads {
        0 => u64::from(g.max_threads_per_block),
        m => u64::from(m).min(u64::from(g.max_threads_per_block)),
    };
    if block == 0 || block > max_threads {
        return 0;
    }
    let optin = u64::from(g.max_shared_per_block_optin.min(MAX_SHARED_BYTES));
    let shared = dynamic + u64::from(n.static_shared);
    if shared > optin {
        return 0;
    }
    let warps = block.div_ceil(warp);
    let by_threads = u64::from(g.max_threads_per_sm) / (warps * warp);
    let by_shared = u64::from(g.max_shared_per_sm) / (shared + RESERVED_SHARED_PER_BLOCK);
    // Registers are allocated per warp, 256 at a time.
    let by_regs = match n.regs {
        0 => u64::MAX,
        r => {
            let per_warp = (u64::from(r) * warp).div_ceil(256) * 256;
            if per_warp * warps > u64::from(g.max_registers_per_block) {
                return 0;
            }
            u64::from(g.max_registers_per_sm) / per_warp / warps
        }
    };
    by_threads
        .min(by_shared)
        .min(by_regs)
        .min(u64::from(g.max_blocks_per_sm))
}

pub(crate) fn occupancy_checks(d: &mut Driver, f: CUfunction, flags: c_uint) -> Res<Needs> {
    d.current_ctx()?;
    let needs = Needs::of(function(d, f)?);
    if flags & !CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE != 0 {
        return Err(res::INVALID_VALUE);
    }
    Ok(needs)
}

fn max_active_blocks(
    num_blocks: *mut c_int,
    f: CUfunction,
    block: c_int,
    dynamic: usize,
    flags: c_uint,
) -> Res<()> {
    let n = driver::with(|d| {
        let needs = occupancy_checks(d, f, flags)?;
        if block <= 0 {
            return Err(res::INVALID_VALUE);
        }
        let n = blocks_per_sm(&d.attributes, needs, block as u64, dynamic as u64);
        tracing::trace!(?needs, block, dynamic, blocks = n, "occupancy");
        Ok(n)
    })?;
    // SAFETY: a writable int from the caller (NULL refused).
    unsafe { out(num_blocks, n as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    num_blocks: *mut c_int,
    f: CUfunction,
    block: c_int,
    dynamic: usize,
) -> CUresult {
    guard("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        max_active_blocks(num_blocks, f, block, dynamic, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    num_blocks: *mut c_int,
    f: CUfunction,
    block: c_int,
    dynamic: usize,
    flags: c_uint,
) -> CUresult {
    guard(
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        || max_active_blocks(num_blocks, f, block, dynamic, flags),
    )
}

/// `size_t (*)(int blockSize)`: dynamic shared memory a block size needs.
pub type BlockToSmem = Option<unsafe extern "C" fn(c_int) -> usize>;

/// The block size with the most resident threads per multiprocessor (the largest such),
/// and the grid that fills the device with it.
fn potential_block_size(
    g: &DeviceAttributes,
    n: Needs,
    to_smem: BlockToSmem,
    dynamic: usize,
    limit: c_int,
) -> (u64, u64) {
    let warp = u64::from(g.warp_size.max(1));
    let mut max = u64::from(g.max_threads_per_block);
    if n.max_threads > 0 {
        max = max.min(u64::from(n.max_threads));
    }
    if limit > 0 {
        max = max.min(limit as u64);
    }
    let (mut best, mut best_blocks, mut best_threads) = (0u64, 0u64, 0u64);
    let mut block = max.div_ceil(warp) * warp;
    while block > 0 {
        let b = block.min(max);
        let smem = match to_smem {
            // SAFETY: the program's callback, called with a block size as documented.
            Some(cb) => (unsafe { cb(b as c_int) }) as u64,
            None => dynamic as u64,
        };
        let blocks = blocks_per_sm(g, n, b, smem);
        if blocks * b > best_threads {
            (best, best_blocks, best_threads) = (b, blocks, blocks * b);
        }
        block -= warp;
    }
    (best, best_blocks * u64::from(g.sm_count.max(1)))
}

fn max_potential(
    min_grid: *mut c_int,
    block_size: *mut c_int,
    f: CUfunction,
    to_smem: BlockToSmem,
    dynamic: usize,
    limit: c_int,
    flags: c_uint,
) -> Res<()> {
    if min_grid.is_null() || block_size.is_null() {
        return Err(res::INVALID_VALUE);
    }
    let (g, needs) = driver::with(|d| {
        let needs = occupancy_checks(d, f, flags)?;
        Ok((d.attributes, needs))
    })?;
    let (block, grid) = potential_block_size(&g, needs, to_smem, dynamic, limit);
    // SAFETY: both checked non-null; writable ints from the caller.
    unsafe {
        out(min_grid, grid.min(i32::MAX as u64) as c_int)?;
        out(block_size, block as c_int)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block_size: *mut c_int,
    f: CUfunction,
    to_smem: BlockToSmem,
    dynamic: usize,
    limit: c_int,
) -> CUresult {
    guard("cuOccupancyMaxPotentialBlockSize", || {
        max_potential(min_grid, block_size, f, to_smem, dynamic, limit, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block_size: *mut c_int,
    f: CUfunction,
    to_smem: BlockToSmem,
    dynamic: usize,
    limit: c_int,
    flags: c_uint,
) -> CUresult {
    guard("cuOccupancyMaxPotentialBlockSizeWithFlags", || {
        max_potential(min_grid, block_size, f, to_smem, dynamic, limit, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    smem: *mut usize,
    f: CUfunction,
    num_blocks: c_int,
    block: c_int,
) -> CUresult {
    guard("cuOccupancyAvailableDynamicSMemPerBlock", || {
        let v = driver::with(|d| {
            let needs = occupancy_checks(d, f, 0)?;
            if num_blocks <= 0 || block <= 0 {
                return Err(res::INVALID_VALUE);
            }
            let g = &d.attributes;
            // The blocks must fit by threads, registers and block count first.
            if blocks_per_sm(g, needs, block as u64, 0) < num_blocks as u64 {
                return Ok(0);
            }
            let per_block = u64::from(g.max_shared_per_sm) / num_blocks as u64;
            let optin = u64::from(g.max_shared_per_block_optin.min(MAX_SHARED_BYTES));
            let fixed = u64::from(needs.static_shared);
            let v = per_block
                .saturating_sub(RESERVED_SHARED_PER_BLOCK + fixed)
                .min(optin.saturating_sub(fixed));
            tracing::trace!(
                ?needs,
                num_blocks,
                block,
                smem = v,
                "available dynamic shared memory"
            );
            Ok(v)
        })?;
        // SAFETY: a writable size_t from the caller (NULL refused).
        unsafe { out(smem, v as usize) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_follows_threads_blocks_registers_and_shared_memory() {
        let g = DeviceAttributes::SIM;
        let none = Needs::default();
        // 2048 threads per SM: two blocks of 1024, 32 (the block limit) of 32.
        assert_eq!(blocks_per_sm(&g, none, 1024, 0), 2);
        assert_eq!(blocks_per_sm(&g, none, 32, 0), 32);
        // Partial warps count whole.
        assert_eq!(blocks_per_sm(&g, none, 1000, 0), 2);
        // 228 KiB per SM: 100 KiB (+1 KiB reserved) blocks, two at once.
        assert_eq!(blocks_per_sm(&g, none, 128, 100 << 10), 2);
        // More than a block may have, or too many threads: none.
        assert_eq!(blocks_per_sm(&g, none, 128, 300 << 10), 0);
        assert_eq!(blocks_per_sm(&g, none, 1025, 0), 0);
        // 64 registers a thread: 2048 a warp, 32 warps of the SM's 65536.
        let regs = Needs { regs: 64, ..none };
        assert_eq!(blocks_per_sm(&g, regs, 256, 0), 4);
        // 255 registers (8192 a warp after rounding): a 1024-thread block needs more than
        // a block may have.
        let heavy = Needs { regs: 255, ..none };
        assert_eq!(blocks_per_sm(&g, heavy, 1024, 0), 0);
        assert_eq!(blocks_per_sm(&g, heavy, 64, 0), 4);
        // Static shared memory counts beside the dynamic.
        let fixed = Needs {
            static_shared: 100 << 10,
            ..none
        };
        assert_eq!(blocks_per_sm(&g, fixed, 128, 100 << 10), 1);
        assert_eq!(blocks_per_sm(&g, fixed, 128, 200 << 10), 0);
        // A launch bound below the device's.
        let bound = Needs {
            max_threads: 256,
            ..none
        };
        assert_eq!(blocks_per_sm(&g, bound, 512, 0), 0);
        let (block, grid) = potential_block_size(&g, none, None, 0, 0);
        assert_eq!((block, grid), (1024, 2));
        let (block, _) = potential_block_size(&g, bound, None, 0, 0);
        assert_eq!(block, 256);
        let (block, _) = potential_block_size(&g, none, None, 0, 200);
        // 128 threads fill the SM (16 blocks of 2048 threads); 192 leave 128 idle.
        assert_eq!(block, 128, "the most resident threads under the limit");
        assert_eq!(ptx_version(".version 8.5\n.target sm_90"), Some(85));
        assert_eq!(default_dynamic_shared(None), 48 << 10);
        let attrs = FunctionAttributes {
            static_shared_bytes: 8 << 10,
            ..FunctionAttributes::default()
        };
        assert_eq!(default_dynamic_shared(Some(&attrs)), 40 << 10);
    }
}
