//! The device queries: the one vGPU, its identity (the values CUDA reports for it), its
//! memory share and use, and the processes on it (this process alone).
//!
//! The exported functions' contract is NVML's: every pointer a program passes must be
//! valid for what NVML documents (the library checks NULL and the device handle, and cannot
//! check more than that, exactly like NVIDIA's).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, CStr};

use crate::cuda::attr;
use crate::types::{
    ret, Memory, MemoryV2, NvmlDevice, NvmlReturn, PciInfo, ProcessInfo, ProcessInfoV1,
    Utilization, BUS_ID_LEGACY_LEN, BUS_ID_LEN, COMPUTE_MODE_COUNT, MEMORY_V2, NO_INSTANCE,
};
use crate::{device, guard, handle, initialised, out, out_text};

/// `pciDeviceId`: the vGPU's device id (the virtio device id of the vGPU, 0x5647) over
/// NVIDIA's vendor id.
pub const PCI_DEVICE_ID: c_uint = (0x5647 << 16) | 0x10DE;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    guard("nvmlDeviceGetCount_v2", || {
        initialised()?;
        // SAFETY: a writable unsigned int from the caller (NULL refused).
        unsafe { out(count, 1) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    guard("nvmlDeviceGetHandleByIndex_v2", || {
        initialised()?;
        if index != 0 {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: a writable handle from the caller (NULL refused).
        unsafe { out(dev, handle()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, dev) }
}

/// The text C passed, refusing NULL and text that is not UTF-8.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string.
unsafe fn text_in<'a>(p: *const c_char) -> Result<&'a str, NvmlReturn> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| ret::INVALID_ARGUMENT)
}

/// The UUID as NVML prints it: "GPU-" and the 16 bytes in the 8-4-4-4-12 form.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    guard("nvmlDeviceGetHandleByUUID", || {
        let c = initialised()?;
        // SAFETY: NULL (refused) or a NUL-terminated string from the caller.
        let asked = unsafe { text_in(uuid) }?;
        if dev.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        if !asked
            .trim()
            .eq_ignore_ascii_case(&uuid_text(&c.device_uuid()?))
        {
            return Err(ret::NOT_FOUND);
        }
        // SAFETY: checked non-null; a writable handle from the caller.
        unsafe { out(dev, handle()) }
    })
}

/// The vGPU's PCI domain, bus and device: the attributes CUDA reports (the device number is
/// the vGPU's id).
fn pci_address(c: &crate::cuda::Cuda) -> Result<(u32, u32, u32), NvmlReturn> {
    Ok((
        c.attribute(attr::PCI_DOMAIN_ID)? as u32,
        c.attribute(attr::PCI_BUS_ID)? as u32,
        c.attribute(attr::PCI_DEVICE_ID)? as u32,
    ))
}

/// `[domain:]bus:device[.function]` in hex, as NVML accepts a bus id.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let s = s.trim();
    let (rest, function) = match s.split_once('.') {
        Some((r, f)) => (r, u32::from_str_radix(f, 16).ok()?),
        None => (s, 0),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let num = |p: &str| u32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [d, b, v] => Some((num(d)?, num(b)?, num(v)?, function)),
        [b, v] => Some((0, num(b)?, num(v)?, function)),
        _ => None,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    guard("nvmlDeviceGetHandleByPciBusId_v2", || {
        let c = initialised()?;
        // SAFETY: NULL (refused) or a NUL-terminated string from the caller.
        let asked = unsafe { text_in(bus_id) }?;
        if dev.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let (domain, bus, device, function) = parse_bus_id(asked).ok_or(ret::INVALID_ARGUMENT)?;
        if (domain, bus, device) != pci_address(c)? || function != 0 {
            return Err(ret::NOT_FOUND);
        }
        // SAFETY: checked non-null; a writable handle from the caller.
        unsafe { out(dev, handle()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    dev: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard("nvmlDeviceGetName", || {
        let c = device(dev)?;
        if name.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let text = c.device_name()?;
        // SAFETY: checked non-null; holds `length` bytes by the caller's contract.
        unsafe { out_text(name, length, &text) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard("nvmlDeviceGetUUID", || {
        let c = device(dev)?;
        if uuid.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let text = uuid_text(&c.device_uuid()?);
        // SAFETY: checked non-null; holds `length` bytes by the caller's contract.
        unsafe { out_text(uuid, length, &text) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    guard("nvmlDeviceGetIndex", || {
        device(dev)?;
        // SAFETY: a writable unsigned int from the caller (NULL refused).
        unsafe { out(index, 0) }
    })
}

/// The vGPU's memory: (share, used, free) in bytes.
fn memory(dev: NvmlDevice) -> Result<(u64, u64, u64), NvmlReturn> {
    let (share, used, _) = device(dev)?.memory()?;
    Ok((share, used, share.saturating_sub(used)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(dev: NvmlDevice, mem: *mut Memory) -> NvmlReturn {
    guard("nvmlDeviceGetMemoryInfo", || {
        device(dev)?;
        if mem.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let (total, used, free) = memory(dev)?;
        // SAFETY: checked non-null; a writable nvmlMemory_t from the caller.
        unsafe { out(mem, Memory { total, free, used }) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: NvmlDevice,
    mem: *mut MemoryV2,
) -> NvmlReturn {
    guard("nvmlDeviceGetMemoryInfo_v2", || {
        device(dev)?;
        if mem.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the struct starts with its version (the caller's
        // contract: a nvmlMemory_v2_t, or at least its version field).
        let version = unsafe { mem.cast::<c_uint>().read_unaligned() };
        if version != MEMORY_V2 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used, free) = memory(dev)?;
        let v = MemoryV2 {
            version,
            total,
            reserved: 0,
            free,
            used,
        };
        // SAFETY: checked non-null; a writable nvmlMemory_v2_t from the caller.
        unsafe { out(mem, v) }
    })
}

/// The vGPU's worker does not report its busy share to the tenant (only to the operator,
/// `vgpuctl vgpu stats`): `NVML_ERROR_NOT_SUPPORTED`, as for a GPU without the counters.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    dev: NvmlDevice,
    util: *mut Utilization,
) -> NvmlReturn {
    guard("nvmlDeviceGetUtilizationRates", || {
        device(dev)?;
        if util.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        Err(ret::NOT_SUPPORTED)
    })
}

/// `nvmlPciInfo_t` of the vGPU.
fn pci_info(dev: NvmlDevice) -> Result<PciInfo, NvmlReturn> {
    let (domain, bus, device_no) = pci_address(device(dev)?)?;
    let mut info = PciInfo {
        bus_id_legacy: [0; BUS_ID_LEGACY_LEN],
        domain,
        bus,
        device: device_no,
        pci_device_id: PCI_DEVICE_ID,
        pci_subsystem_id: 0,
        bus_id: [0; BUS_ID_LEN],
    };
    let fill = |dst: &mut [c_char], text: String| {
        let room = dst.len().saturating_sub(1);
        for (d, s) in dst.iter_mut().zip(text.bytes().take(room)) {
            *d = s as c_char;
        }
    };
    fill(
        &mut info.bus_id_legacy,
        format!("{domain:04X}:{bus:02X}:{device_no:02X}.0"),
    );
    // The form cuDeviceGetPCIBusId answers.
    fill(
        &mut info.bus_id,
        format!("{domain:08X}:{bus:02X}:{device_no:02X}.0"),
    );
    Ok(info)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(dev: NvmlDevice, pci: *mut PciInfo) -> NvmlReturn {
    guard("nvmlDeviceGetPciInfo_v3", || {
        device(dev)?;
        if pci.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let info = pci_info(dev)?;
        // SAFETY: checked non-null; a writable nvmlPciInfo_t from the caller.
        unsafe { out(pci, info) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(dev: NvmlDevice, pci: *mut PciInfo) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo_v3(dev, pci) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(dev: NvmlDevice, pci: *mut PciInfo) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo_v3(dev, pci) }
}

/// The processes on the vGPU that this process can see: itself, with the vGPU's used
/// memory, while it holds a CUDA context on the vGPU; nobody else (another process of the
/// tenant, never another tenant, is not this library's to report).
fn processes(dev: NvmlDevice) -> Result<Vec<(c_uint, u64)>, NvmlReturn> {
    let c = device(dev)?;
    match c.memory_if_open() {
        Ok((_, used, true)) => Ok(vec![(std::process::id(), used)]),
        Ok((_, _, false)) | Err(ret::UNINITIALIZED) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Writes the process list in NVML's way: `*count` in is the room in `infos`, out the
/// number of processes; `NVML_ERROR_INSUFFICIENT_SIZE` when they do not fit.
///
/// # Safety
/// `count` must be NULL or a valid unsigned int; `infos` NULL or valid for `*count` writes
/// of `T`.
unsafe fn write_processes<T>(
    dev: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(c_uint, u64) -> T,
) -> Result<(), NvmlReturn> {
    device(dev)?;
    if count.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    let list = processes(dev)?;
    // SAFETY: checked non-null; a valid unsigned int from the caller.
    let room = unsafe { count.read_unaligned() } as usize;
    // SAFETY: as above.
    unsafe { count.write_unaligned(list.len() as c_uint) };
    if list.len() > room {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    if list.is_empty() {
        return Ok(());
    }
    if infos.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    for (i, &(pid, used)) in list.iter().enumerate() {
        // SAFETY: i < list.len() <= room, the entries the caller's array holds.
        unsafe { infos.add(i).write_unaligned(make(pid, used)) };
    }
    Ok(())
}

fn info_v2(pid: c_uint, used: u64) -> ProcessInfo {
    ProcessInfo {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: NO_INSTANCE,
        compute_instance_id: NO_INSTANCE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    guard("nvmlDeviceGetComputeRunningProcesses_v3", || {
        // SAFETY: the caller's count and array, as NVML documents them.
        unsafe { write_processes(dev, count, infos, info_v2) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    dev: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    guard("nvmlDeviceGetComputeRunningProcesses_v2", || {
        // SAFETY: the caller's count and array, as NVML documents them.
        unsafe { write_processes(dev, count, infos, info_v2) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    dev: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> NvmlReturn {
    guard("nvmlDeviceGetComputeRunningProcesses", || {
        // SAFETY: the caller's count and array of nvmlProcessInfo_v1_t.
        unsafe {
            write_processes(dev, count, infos, |pid, used| ProcessInfoV1 {
                pid,
                used_gpu_memory: used,
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    dev: NvmlDevice,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    guard("nvmlDeviceGetCudaComputeCapability", || {
        let c = device(dev)?;
        if major.is_null() || minor.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let ma = c.attribute(attr::COMPUTE_CAPABILITY_MAJOR)?;
        let mi = c.attribute(attr::COMPUTE_CAPABILITY_MINOR)?;
        // SAFETY: both checked non-null; writable ints from the caller.
        unsafe {
            out(major, ma)?;
            out(minor, mi)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    dev: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    guard("nvmlDeviceGetComputeMode", || {
        let c = device(dev)?;
        if mode.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let m = c.attribute(attr::COMPUTE_MODE)? as c_uint;
        if m >= COMPUTE_MODE_COUNT {
            return Err(ret::UNKNOWN);
        }
        // SAFETY: checked non-null; a writable nvmlComputeMode_t from the caller.
        unsafe { out(mode, m) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_is_nvml_form() {
        let u = *b"vGPU\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00";
        assert_eq!(uuid_text(&u), "GPU-76475055-0100-0000-0000-000001000000");
    }

    #[test]
    fn bus_ids_in_every_form_nvml_accepts() {
        assert_eq!(parse_bus_id("00000000:01:02.0"), Some((0, 1, 2, 0)));
        assert_eq!(parse_bus_id("0000:1A:02.0"), Some((0, 0x1a, 2, 0)));
        assert_eq!(parse_bus_id("1a:02.1"), Some((0, 0x1a, 2, 1)));
        assert_eq!(parse_bus_id(" 0001:00:03 "), Some((1, 0, 3, 0)));
        assert_eq!(parse_bus_id("nonsense"), None);
        assert_eq!(parse_bus_id("1:2:3:4.0"), None);
        assert_eq!(parse_bus_id("zz:01:02.0"), None);
        assert_eq!(parse_bus_id(""), None);
    }
}
