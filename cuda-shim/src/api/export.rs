//! `cuGetExportTable`: the driver's private function tables, asked for by UUID. NVIDIA's
//! CUDA runtime (libcudart, static or shared) asks for them before anything else and
//! refuses to start without them: fat binary registration becomes module loads through
//! CUDART_INTERFACE, the runtime keeps its per-context state in CONTEXT_LOCAL_STORAGE, and
//! INTEGRITY_CHECK proves the driver is one it knows. Every table is built here, inside the
//! program's process: what they hold (addresses of this library's functions, the program's
//! own state) never goes to the worker. docs/cuda-api.md lists the tables and what each
//! slot answers.

use std::cell::UnsafeCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uchar, c_uint, c_void};
use std::sync::Mutex;

use super::device::{attribute, check_dev, uuid_of};
use crate::driver::{self, Res};
use crate::integrity::{self, DeviceIdentity};
use crate::types::{attr, res, CUcontext, CUdevice, CUmodule, CUresult, CUuuid, DRIVER_VERSION};
use crate::{guard, out};

pub(super) type Slot = *const c_void;

/// A table as the driver hands it out: an array of function addresses, most starting
/// with their own size in bytes.
#[repr(transparent)]
pub(super) struct Table<const N: usize>(pub(super) [Slot; N]);

// SAFETY: the tables are immutable after compilation: addresses of functions and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    pub(super) fn start(&'static self) -> Slot {
        self.0.as_ptr().cast()
    }
}

/// Slot 0 of most tables: the table's size in bytes.
pub(super) const fn size_of_table(n: usize) -> Slot {
    (n * std::mem::size_of::<usize>()) as Slot
}

const NULL: Slot = std::ptr::null();

/// A buffer the runtime's tool hooks write into (the driver owns it for the process's life).
struct HookBuffer<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the library never reads or writes the buffer; it only hands out its address, and
// the runtime serialises its own use of it.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}

static HOOK_BUFFER_1: HookBuffer<1024> = HookBuffer(UnsafeCell::new([0; 1024]));
static HOOK_BUFFER_2: HookBuffer<14> = HookBuffer(UnsafeCell::new([0; 14]));

// ---- CUDART_INTERFACE: fat binaries and the primary context ----

/// Slot 1: a module from a fat binary wrapper (`__fatBinC_Wrapper_t`, what
/// `__cudaRegisterFatBinary` was given): a module load on the vGPU.
unsafe extern "C" fn module_from_fatbin(pmod: *mut CUmodule, wrapper: *const c_void) -> CUresult {
    tracing::debug!(?wrapper, "cudart: module from a fat binary");
    // SAFETY: the runtime passes the wrapper nvcc emitted; cuModuleLoadData checks NULL and
    // reads the image as the driver does.
    unsafe { super::module::cuModuleLoadData(pmod, wrapper) }
}

/// Slot 6: slot 1 with extra arguments (NULL, NULL, 0 from every runtime seen).
unsafe extern "C" fn module_from_fatbin_ext(
    pmod: *mut CUmodule,
    wrapper: *const c_void,
    arg3: *mut c_void,
    arg4: *mut c_void,
    arg5: c_uint,
) -> CUresult {
    if !arg3.is_null() || !arg4.is_null() || arg5 != 0 {
        tracing::debug!(?arg3, ?arg4, arg5, "cudart: extra module arguments ignored");
    }
    // SAFETY: as module_from_fatbin.
    unsafe { module_from_fatbin(pmod, wrapper) }
}

/// Slot 8: a module from a fat binary itself (its header first), module pointer second.
unsafe extern "C" fn module_from_fatbin_header(
    fatbin: *const c_void,
    pmod: *mut CUmodule,
    arg3: *mut c_void,
    arg4: *mut c_void,
    arg5: c_uint,
) -> CUresult {
    // SAFETY: as module_from_fatbin; a bare fat binary is an image cuModuleLoadData reads.
    unsafe { module_from_fatbin_ext(pmod, fatbin, arg3, arg4, arg5) }
}

/// Slot 2: the device's primary context (not retained: the runtime retains it itself).
unsafe extern "C" fn primary_context(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard("cudart primary context", || {
        let h = driver::with(|d| {
            check_dev(dev)?;
            Ok(d.primary)
        })?;
        // SAFETY: a writable CUcontext from the runtime (NULL refused).
        unsafe { out(pctx, h as CUcontext) }
    })
}

/// Slot 7: called with a size at start-up; nothing to do.
extern "C" fn cudart_noop(_arg: usize) {}

/// Slot 12: loads the JIT compilers; the device compiles, so nothing to load.
extern "C" fn load_compilers() -> CUresult {
    res::SUCCESS
}

static CUDART_INTERFACE: Table<13> = Table([
    size_of_table(13),
    module_from_fatbin as Slot,
    primary_context as Slot,
    NULL,
    NULL,
    NULL,
    module_from_fatbin_ext as Slot,
    cudart_noop as Slot,
    module_from_fatbin_header as Slot,
    NULL,
    NULL,
    NULL,
    load_compilers as Slot,
]);

// ---- TOOLS_TLS and TOOLS_RUNTIME_CALLBACK_HOOKS: profiler hooks, none installed ----

extern "C" fn no_tool() -> usize {
    0
}

extern "C" fn no_tool_1(_a: *const c_void) -> usize {
    0
}

extern "C" fn no_tool_2(_a: *const c_void, _b: *const c_void) -> usize {
    0
}

unsafe fn hand_out<const N: usize>(
    buf: &'static HookBuffer<N>,
    ptr: *mut *mut c_void,
    size: *mut usize,
) {
    if !ptr.is_null() {
        // SAFETY: non-null, a writable pointer from the runtime.
        unsafe { ptr.write(buf.0.get().cast()) };
    }
    if !size.is_null() {
        // SAFETY: non-null, a writable size_t from the runtime.
        unsafe { size.write(N) };
    }
}

unsafe extern "C" fn hook_buffer_1(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: the runtime's pointers, checked inside.
    unsafe { hand_out(&HOOK_BUFFER_1, ptr, size) }
}

unsafe extern "C" fn hook_buffer_2(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: the runtime's pointers, checked inside.
    unsafe { hand_out(&HOOK_BUFFER_2, ptr, size) }
}

static TOOLS_TLS: Table<4> = Table([
    size_of_table(4),
    no_tool as Slot,
    no_tool_1 as Slot,
    no_tool_1 as Slot,
]);

static TOOLS_RUNTIME_CALLBACK_HOOKS: Table<7> = Table([
    size_of_table(7),
    no_tool_2 as Slot,
    hook_buffer_1 as Slot,
    no_tool_2 as Slot,
    no_tool_2 as Slot,
    no_tool_2 as Slot,
    hook_buffer_2 as Slot,
]);

// ---- CONTEXT_LOCAL_STORAGE: the runtime's per-context state ----

/// Called with (context, key, value) when the context is destroyed or reset.
type StorageDtor = unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void);

struct Stored {
    value: usize,
    dtor: Option<StorageDtor>,
}

static STORAGE: Mutex<Option<HashMap<(u64, usize), Stored>>> = Mutex::new(None);

fn storage<R>(f: impl FnOnce(&mut HashMap<(u64, usize), Stored>) -> R) -> R {
    let mut g = STORAGE.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// The live context `ctx` names (NULL: the current one).
fn storage_context(ctx: CUcontext) -> Res<u64> {
    driver::with(|d| {
        if ctx.is_null() {
            d.current_ctx()
        } else if d.contexts.contains_key(&(ctx as u64)) {
            Ok(ctx as u64)
        } else {
            Err(res::INVALID_CONTEXT)
        }
    })
}

unsafe extern "C" fn storage_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<StorageDtor>,
) -> CUresult {
    guard("context storage put", || {
        let h = storage_context(ctx)?;
        storage(|s| {
            s.insert(
                (h, key as usize),
                Stored {
                    value: value as usize,
                    dtor,
                },
            )
        });
        Ok(())
    })
}

unsafe extern "C" fn storage_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    guard("context storage delete", || {
        let h = storage_context(ctx)?;
        storage(|s| s.remove(&(h, key as usize)));
        Ok(())
    })
}

unsafe extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    guard("context storage get", || {
        if value.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let h = storage_context(ctx)?;
        let v = storage(|s| s.get(&(h, key as usize)).map(|e| e.value));
        // The runtime asks before it first puts: a missing key is an invalid handle.
        let v = v.ok_or(res::INVALID_HANDLE)?;
        // SAFETY: checked non-null; a writable pointer from the runtime.
        unsafe { out(value, v as *mut c_void) }
    })
}

static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    storage_put as Slot,
    storage_delete as Slot,
    storage_get as Slot,
    NULL,
]);

/// A context was destroyed (or the primary context reset): drops what the runtime stored
/// for it, calling each value's destructor. Called without the library's lock held (a
/// destructor may call back into the library).
pub fn context_destroyed(ctx: u64) {
    let gone: Vec<(usize, Stored)> = storage(|s| {
        let keys: Vec<(u64, usize)> = s.keys().filter(|k| k.0 == ctx).copied().collect();
        keys.into_iter()
            .filter_map(|k| s.remove(&k).map(|v| (k.1, v)))
            .collect()
    });
    for (key, stored) in gone {
        if let Some(dtor) = stored.dtor {
            // SAFETY: the destructor and its arguments are the ones the runtime stored.
            unsafe {
                dtor(
                    ctx as CUcontext,
                    key as *mut c_void,
                    stored.value as *mut c_void,
                )
            };
        }
    }
}

// ---- CTX_CREATE_BYPASS, HEAP_ACCESS, DEVICE_EXTENDED_RT, CONTEXT_CHECKS ----

unsafe extern "C" fn ctx_create_bypass(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: cuCtxCreate's contract; it checks the pointer.
    unsafe { super::context::cuCtxCreate_v2(pctx, flags, dev) }
}

static CTX_CREATE_BYPASS: Table<2> = Table([size_of_table(2), ctx_create_bypass as Slot]);

extern "C" fn heap_alloc(_record: *mut *const c_void, _a: usize, _b: usize) -> CUresult {
    super::stubs::log_once("the runtime's device heap (HEAP_ACCESS)");
    res::NOT_SUPPORTED
}

extern "C" fn heap_free(_record: *const c_void, _a: *mut usize) -> CUresult {
    super::stubs::log_once("the runtime's device heap (HEAP_ACCESS)");
    res::NOT_SUPPORTED
}

static HEAP_ACCESS: Table<3> = Table([size_of_table(3), heap_alloc as Slot, heap_free as Slot]);

/// Slot 5: a device attribute as two words (the value, 0).
unsafe extern "C" fn device_attribute_ext(
    dev: CUdevice,
    attribute_id: c_uint,
    _unknown: c_int,
    result: *mut [usize; 2],
) -> CUresult {
    guard("device attribute (extended)", || {
        let v = driver::with(|d| {
            check_dev(dev)?;
            attribute(
                d,
                c_int::try_from(attribute_id).map_err(|_| res::INVALID_VALUE)?,
            )
        })?;
        // SAFETY: a writable pair of words from the runtime (NULL refused).
        unsafe { out(result, [v as usize, 0]) }
    })
}

/// Slot 13: a per-device flag the driver answers 0 for on every GPU seen.
unsafe extern "C" fn device_flag(result: *mut c_uchar, dev: CUdevice) -> CUresult {
    guard("device flag (extended)", || {
        driver::with(|_| check_dev(dev))?;
        // SAFETY: a writable byte from the runtime (NULL refused).
        unsafe { out(result, 0) }
    })
}

static DEVICE_EXTENDED_RT: Table<26> = {
    let mut t = [NULL; 26];
    t[0] = size_of_table(26);
    t[5] = device_attribute_ext as Slot;
    t[13] = device_flag as Slot;
    Table(t)
};

/// Slot 1: a check the driver does not offer; the runtime then takes its other path.
extern "C" fn context_check_unsupported(
    _ctx: CUcontext,
    _flags: *mut c_uint,
    _extra: *mut *const c_void,
) -> CUresult {
    res::NOT_SUPPORTED
}

/// Slot 2: checks on a context; nothing is ever flagged on a vGPU. `extra` is the caller's
/// and stays as it was: the runtimes inside cuBLASLt (CUDA 13) pass a pointer there that
/// they read back, and a NULL written into it makes `cublasCreate` fail.
unsafe extern "C" fn context_check(
    _ctx: CUcontext,
    flags: *mut c_uint,
    _extra: *mut *const c_void,
) -> CUresult {
    if !flags.is_null() {
        // SAFETY: non-null, a writable unsigned int from the runtime.
        unsafe { flags.write(0) };
    }
    res::SUCCESS
}

extern "C" fn context_check_3() -> c_uint {
    0
}

/// 17 slots, as the CUDA 13 driver's table: the runtime reads the size in slot 0 and
/// looks no further than it.
static CONTEXT_CHECKS: Table<17> = {
    let mut t = [NULL; 17];
    t[0] = size_of_table(17);
    t[1] = context_check_unsupported as Slot;
    t[2] = context_check as Slot;
    t[3] = context_check_3 as Slot;
    Table(t)
};

// ---- INTEGRITY_CHECK ----

unsafe extern "C" fn integrity_check(
    version: c_uint,
    unix_seconds: u64,
    result: *mut [u64; 2],
) -> CUresult {
    guard("integrity check", || {
        if result.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let devices = driver::with(|d| {
            Ok(vec![DeviceIdentity {
                uuid: uuid_of(d).bytes.map(|b| b as u8),
                pci_domain: attribute(d, attr::PCI_DOMAIN_ID)?,
                pci_bus: attribute(d, attr::PCI_BUS_ID)?,
                pci_device: attribute(d, attr::PCI_DEVICE_ID)?,
            }])
        })?;
        // SAFETY: pthread_self has no preconditions.
        let thread = unsafe { libc::pthread_self() } as u32;
        let inputs = integrity::Inputs {
            version,
            unix_seconds,
            driver_version: DRIVER_VERSION as u32,
            process: std::process::id(),
            thread,
            cudart_table: CUDART_INTERFACE.start() as usize,
            integrity_table: INTEGRITY_CHECK.start() as usize,
            function: INTEGRITY_CHECK.0[1] as usize,
        };
        // SAFETY: checked non-null; a writable pair of words from the runtime.
        unsafe { out(result, integrity::digest(&inputs, &devices)) }
    })
}

static INTEGRITY_CHECK: Table<3> = Table([size_of_table(3), integrity_check as Slot, NULL]);

// ---- RUNTIME_PRIVATE: a table CUDA 13 runtimes ask for, slots known one by one ----

/// Slots in RUNTIME_PRIVATE (the highest slot a runtime was seen to call is 51).
const RUNTIME_PRIVATE_SLOTS: usize = 64;

/// Logs a call to a private slot, once per slot.
fn log_slot(table: &str, slot: usize, args: [u64; 3]) {
    static SEEN: Mutex<Option<HashSet<(String, usize)>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert((table.to_string(), slot))
    {
        tracing::warn!(
            table,
            slot,
            arg0 = format!("{:#x}", args[0]),
            arg1 = format!("{:#x}", args[1]),
            arg2 = format!("{:#x}", args[2]),
            "a private driver function this library does not provide was called: answering \
             CUDA_ERROR_NOT_SUPPORTED"
        );
    }
}

/// What slot 51 hands out: an object the runtime only passes back.
struct Opaque(UnsafeCell<[u64; 64]>);

// SAFETY: the library never reads or writes it; only its address is handed out.
unsafe impl Sync for Opaque {}

static RUNTIME_PRIVATE_OBJECT: Opaque = Opaque(UnsafeCell::new([0; 64]));

/// Slot `S` of RUNTIME_PRIVATE. Every slot takes up to six word arguments (the C calling
/// convention lets a callee ignore those it was not given).
unsafe extern "C" fn runtime_private<const S: usize>(
    a0: u64,
    a1: u64,
    a2: u64,
    _a3: u64,
    _a4: u64,
    _a5: u64,
) -> CUresult {
    tracing::debug!(slot = S, a0, a1, a2, "RUNTIME_PRIVATE");
    match S {
        // A flag derived from the first argument, written through the second.
        4 => {
            if a1 == 0 {
                return res::UNKNOWN;
            }
            // SAFETY: non-null, a writable word from the runtime.
            unsafe { (a1 as *mut u64).write_unaligned(u64::from(a0 != 0)) };
            res::SUCCESS
        }
        // A count (none) written through the third argument.
        39 => {
            if a1 == 0 || a2 == 0 {
                return res::INVALID_VALUE;
            }
            // SAFETY: non-null, a writable word from the runtime.
            unsafe { (a2 as *mut u64).write_unaligned(0) };
            res::SUCCESS
        }
        // An object for the handle in the second argument, written through the third.
        51 => {
            if a2 == 0 {
                return res::INVALID_VALUE;
            }
            if a1 == u64::MAX {
                return res::INVALID_HANDLE;
            }
            // SAFETY: non-null, a writable pointer from the runtime.
            unsafe { (a2 as *mut u64).write_unaligned(RUNTIME_PRIVATE_OBJECT.0.get() as u64) };
            res::SUCCESS
        }
        _ => {
            log_slot("RUNTIME_PRIVATE", S, [a0, a1, a2]);
            res::NOT_SUPPORTED
        }
    }
}

macro_rules! private_slots {
    ($($s:literal)*) => {
        [size_of_table(RUNTIME_PRIVATE_SLOTS), $(runtime_private::<$s> as Slot),*]
    };
}

static RUNTIME_PRIVATE: Table<RUNTIME_PRIVATE_SLOTS> = Table(private_slots!(
    1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
    33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
    62 63
));

// ---- the lookup ----

/// (UUID, name, table) of every table the library provides.
fn tables() -> [([u8; 16], &'static str, Slot); 11] {
    [
        (
            [
                0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24,
                0xc8, 0xf2,
            ],
            "RUNTIME_PRIVATE",
            RUNTIME_PRIVATE.start(),
        ),
        (
            [
                0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd,
                0x9d, 0xf9,
            ],
            "CUDART_INTERFACE",
            CUDART_INTERFACE.start(),
        ),
        (
            [
                0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a,
                0xec, 0xdc,
            ],
            "TOOLS_TLS",
            TOOLS_TLS.start(),
        ),
        (
            [
                0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c,
                0x0a, 0x66,
            ],
            "TOOLS_RUNTIME_CALLBACK_HOOKS",
            TOOLS_RUNTIME_CALLBACK_HOOKS.start(),
        ),
        (
            [
                0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8,
                0x95, 0x93,
            ],
            "CONTEXT_LOCAL_STORAGE",
            CONTEXT_LOCAL_STORAGE.start(),
        ),
        (
            [
                0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0, 0xdf, 0x10, 0xe7,
                0x72, 0x86,
            ],
            "CTX_CREATE_BYPASS",
            CTX_CREATE_BYPASS.start(),
        ),
        (
            [
                0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a, 0xac, 0xc5, 0x1d, 0x29, 0xce, 0xa6,
                0x31, 0xae,
            ],
            "HEAP_ACCESS",
            HEAP_ACCESS.start(),
        ),
        (
            [
                0xb1, 0x05, 0x41, 0xe1, 0xf7, 0xc7, 0xc7, 0x4a, 0x9f, 0x64, 0xf2, 0x23, 0xbe, 0x99,
                0xf1, 0xe2,
            ],
            "DEVICE_EXTENDED_RT",
            DEVICE_EXTENDED_RT.start(),
        ),
        (
            [
                0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66,
                0xe1, 0xf2,
            ],
            "INTEGRITY_CHECK",
            INTEGRITY_CHECK.start(),
        ),
        (
            [
                0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d,
                0xfa, 0x7e,
            ],
            "CONTEXT_CHECKS",
            CONTEXT_CHECKS.start(),
        ),
        (
            super::cluster_table::UUID,
            "CLUSTER_PROTOTYPE",
            super::cluster_table::TABLE.start(),
        ),
    ]
}

/// The UUID as the driver's tools print it.
fn uuid_text(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// Logs an unknown table's UUID, once per UUID.
fn log_unknown(u: &[u8; 16]) {
    static SEEN: Mutex<Option<HashSet<[u8; 16]>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(*u) {
        tracing::warn!(
            uuid = uuid_text(u),
            "cuGetExportTable: a private driver table this library does not provide was asked \
             for: answering CUDA_ERROR_INVALID_VALUE"
        );
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const CUuuid,
) -> CUresult {
    guard("cuGetExportTable", || {
        if table.is_null() || id.is_null() {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: checked non-null; a CUuuid from the caller.
        let uuid = unsafe { id.read_unaligned() }.bytes.map(|b| b as u8);
        match tables().iter().find(|t| t.0 == uuid) {
            Some(&(_, name, start)) => {
                tracing::debug!(table = name, "cuGetExportTable");
                // SAFETY: checked non-null; a writable pointer from the caller.
                unsafe { out(table, start) }
            }
            None => {
                log_unknown(&uuid);
                // SAFETY: checked non-null; the driver clears the output for an unknown id.
                unsafe { out(table, std::ptr::null())? };
                Err(res::INVALID_VALUE)
            }
        }
    })
}
