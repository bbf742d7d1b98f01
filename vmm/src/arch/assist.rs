//! Help for a KVM whose instruction emulator gives up on software interrupts in guest
//! ring 0 (kvm_pvm emulates every ring-0 instruction, and KVM's emulator does not deliver
//! protected-mode `int3`/`int n`: "emulation failure"). Linux executes an `int3` at boot
//! (`int3_selftest`, and `text_poke_bp` for static keys), so in Linux mode the vmm finishes
//! the instruction itself: it steps `rip` past it and injects the exception through
//! KVM_SET_VCPU_EVENTS, whose delivery does not go through the emulator.

use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// `KVM_INTERNAL_ERROR_EMULATION`.
pub const SUBERROR_EMULATION: u32 = 1;

/// The software interrupt an instruction raises: `(vector, length)` for `int3` (CC) and
/// `int imm8` (CD ib); `None` for anything else.
pub fn software_interrupt(code: &[u8]) -> Option<(u8, u64)> {
    match code {
        [0xcc, ..] => Some((3, 1)),
        [0xcd, v, ..] => Some((*v, 2)),
        _ => None,
    }
}

/// Completes a software interrupt the emulator refused. Returns whether the vCPU can run on.
pub fn complete_software_interrupt(vcpu: &VcpuFd, suberror: u32, mem: &GuestMemoryMmap) -> bool {
    if suberror != SUBERROR_EMULATION {
        return false;
    }
    let Ok(mut regs) = vcpu.get_regs() else {
        return false;
    };
    let Ok(t) = vcpu.translate_gva(regs.rip) else {
        return false;
    };
    if t.valid == 0 {
        return false;
    }
    let mut code = [0u8; 2];
    // A read across the page end fails: then only an int3 can be told apart.
    if mem
        .read_slice(&mut code, GuestAddress(t.physical_address))
        .is_err()
        && mem
            .read_slice(&mut code[..1], GuestAddress(t.physical_address))
            .is_err()
    {
        return false;
    }
    let Some((vector, len)) = software_interrupt(&code) else {
        return false;
    };
    let Ok(mut events) = vcpu.get_vcpu_events() else {
        return false;
    };
    // A trap: the handler sees rip after the instruction.
    regs.rip = regs.rip.wrapping_add(len);
    events.exception.injected = 1;
    events.exception.pending = 0;
    events.exception.nr = vector;
    events.exception.has_error_code = 0;
    events.exception.error_code = 0;
    let ok = vcpu.set_regs(&regs).is_ok() && vcpu.set_vcpu_events(&events).is_ok();
    tracing::debug!(
        vector,
        rip = regs.rip,
        ok,
        "software interrupt delivered for the emulator"
    );
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_software_interrupts_only() {
        assert_eq!(software_interrupt(&[0xcc, 0x90]), Some((3, 1)));
        assert_eq!(software_interrupt(&[0xcd, 0x80]), Some((0x80, 2)));
        assert_eq!(software_interrupt(&[0xcd]), None);
        assert_eq!(software_interrupt(&[0x0f, 0x0b]), None);
        assert_eq!(software_interrupt(&[]), None);
    }
}
