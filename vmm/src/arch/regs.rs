//! Register state for entering a payload (ring 3) or a Linux kernel (ring 0) in 64-bit long
//! mode.

use kvm_bindings::{kvm_regs, kvm_sregs};

use super::gdt;
use crate::layout;

const CR0_PE: u64 = 1;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const RFLAGS_IOPL3: u64 = 3 << 12;

/// Special registers: long mode, paging on with `cr3`, flat segments, SSE usable.
pub fn long_mode_sregs(mut sregs: kvm_sregs, cr3: u64) -> kvm_sregs {
    sregs.gdt.base = layout::GDT_ADDR;
    sregs.gdt.limit = (std::mem::size_of_val(&gdt::GDT) - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    // Ring 3: payload code then runs natively instead of through KVM's emulator.
    sregs.cs = gdt::segment(gdt::USER_CODE);
    let data = gdt::segment(gdt::USER_DATA);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = gdt::segment(gdt::TSS);
    sregs.cr3 = cr3;
    sregs.cr4 |= CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    // Caches on (CD and NW clear), FPU/SSE usable (EM and TS clear).
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// General registers: entry point, this vCPU's stack, `rdi` = BootInfo, `rsi` = index.
pub fn entry_regs(entry: u64, vcpu_index: u8) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: stack_top(vcpu_index),
        rbp: stack_top(vcpu_index),
        rdi: layout::BOOT_INFO_ADDR,
        rsi: u64::from(vcpu_index),
        // IOPL 3: port I/O (console, exit) works from ring 3; interrupts stay off.
        rflags: RFLAGS_IOPL3 | 0x2,
        ..Default::default()
    }
}

/// Special registers for a Linux kernel's 64-bit entry: long mode, paging on with `cr3`
/// (identity map), flat ring-0 code and data from our GDT, interrupts off. The kernel loads
/// its own GDT, IDT and page tables at once.
pub fn linux_sregs(mut sregs: kvm_sregs, cr3: u64) -> kvm_sregs {
    sregs.gdt.base = layout::GDT_ADDR;
    sregs.gdt.limit = (std::mem::size_of_val(&gdt::GDT) - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cs = gdt::segment(gdt::KERNEL_CODE);
    let data = gdt::segment(gdt::KERNEL_DATA);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = gdt::segment(gdt::TSS);
    sregs.cr3 = cr3;
    sregs.cr4 = CR4_PAE;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_NE | CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// General registers for a Linux kernel's 64-bit entry: `rsi` = the zero page.
pub fn linux_regs(entry: u64, zero_page: u64, stack: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: stack,
        rbp: stack,
        rsi: zero_page,
        rflags: 0x2,
        ..Default::default()
    }
}

/// Top of vCPU `index`'s stack (grows down).
pub fn stack_top(index: u8) -> u64 {
    layout::STACKS_TOP - u64::from(index) * layout::STACK_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sregs_enter_long_mode_with_sse() {
        let s = long_mode_sregs(kvm_sregs::default(), 0x9000);
        assert_eq!(s.cr3, 0x9000);
        assert_ne!(s.cr0 & CR0_PG, 0);
        assert_ne!(s.cr0 & CR0_PE, 0);
        assert_eq!(s.cr0 & (1 << 2), 0, "EM must be clear for SSE");
        assert_ne!(s.cr4 & CR4_OSFXSR, 0);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.cs.dpl, 3, "payloads run in ring 3");
        assert_eq!(s.ss.dpl, 3);
        assert_eq!(s.gdt.limit, 55);
    }

    #[test]
    fn linux_entry_is_ring0_long_mode() {
        let s = linux_sregs(kvm_sregs::default(), 0x9000);
        assert_eq!((s.cs.dpl, s.cs.l, s.cs.selector), (0, 1, 0x08));
        assert_eq!((s.ss.dpl, s.ds.selector), (0, 0x10));
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr4, CR4_PAE);
        assert_ne!(s.cr0 & CR0_PG, 0);
        let r = linux_regs(0x100_0000, 0x7000, 0x8ff0);
        assert_eq!(
            (r.rip, r.rsi, r.rsp, r.rflags),
            (0x100_0000, 0x7000, 0x8ff0, 2)
        );
    }

    #[test]
    fn each_vcpu_gets_its_own_stack() {
        let r0 = entry_regs(0x20_1000, 0);
        let r3 = entry_regs(0x20_1000, 3);
        assert_eq!(r0.rsp, 0x20_0000);
        assert_eq!(r3.rsp, 0x20_0000 - 3 * 0x1_0000);
        assert_eq!(
            (r3.rdi, r3.rsi, r3.rip),
            (layout::BOOT_INFO_ADDR, 3, 0x20_1000)
        );
    }
}
