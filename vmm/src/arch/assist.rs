//! Help for a KVM whose instruction emulator gives up on some instructions in guest
//! ring 0 (kvm_pvm emulates every ring-0 instruction, and KVM's emulator does not deliver
//! protected-mode `int3`/`int n`: "emulation failure"). Linux executes an `int3` at boot
//! (`int3_selftest`, and `text_poke_bp` for static keys), so in Linux mode the vmm finishes
//! the instruction itself: it steps `rip` past it and injects the exception through
//! KVM_SET_VCPU_EVENTS, whose delivery does not go through the emulator. `fwait` (the
//! kernel's FPU switch code has one) is refused too; with no unmasked x87 exception
//! pending it does nothing, so the vmm steps over it.

use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// `KVM_INTERNAL_ERROR_EMULATION`.
pub const SUBERROR_EMULATION: u32 = 1;

/// What the vmm does for an instruction the emulator refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assist {
    /// Step over `len` bytes and raise exception `vector` (a trap: `int3`, `int n`).
    Interrupt { vector: u8, len: u64 },
    /// Step over `len` bytes (`fwait`).
    Skip { len: u64 },
}

/// The assist for the instruction starting with `code`, if the vmm knows one.
pub fn assist_for(code: &[u8]) -> Option<Assist> {
    match code {
        [0xcc, ..] => Some(Assist::Interrupt { vector: 3, len: 1 }),
        [0xcd, v, ..] => Some(Assist::Interrupt { vector: *v, len: 2 }),
        [0x9b, ..] => Some(Assist::Skip { len: 1 }),
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
    let (vector, len) = match assist_for(&code) {
        Some(Assist::Interrupt { vector, len }) => (vector, len),
        Some(Assist::Skip { len }) => {
            regs.rip = regs.rip.wrapping_add(len);
            tracing::debug!(
                rip = regs.rip,
                "stepped over an instruction for the emulator"
            );
            return vcpu.set_regs(&regs).is_ok();
        }
        None => return false,
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
    fn knows_software_interrupts_and_fwait_only() {
        assert_eq!(
            assist_for(&[0xcc, 0x90]),
            Some(Assist::Interrupt { vector: 3, len: 1 })
        );
        assert_eq!(
            assist_for(&[0xcd, 0x80]),
            Some(Assist::Interrupt {
                vector: 0x80,
                len: 2
            })
        );
        assert_eq!(assist_for(&[0x9b, 0x65]), Some(Assist::Skip { len: 1 }));
        assert_eq!(assist_for(&[0xcd]), None);
        assert_eq!(assist_for(&[0x0f, 0x0b]), None);
        assert_eq!(assist_for(&[]), None);
    }
}
