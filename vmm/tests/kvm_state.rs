//! KVM state save and restore on this host's KVM (needs /dev/kvm; on the project's dev
//! machine that is `kvm_pvm`): a vCPU set up as a payload's is saved, restored into a vCPU
//! of a second VM and saved again; both snapshots must agree. A refused ioctl fails with
//! its name, which is how this test doubles as the probe of what the host supports.

use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vmm::migration::pod::from_bytes;
use vmm::migration::vcpu_state::{msr_list, restore_vcpu, restore_vm, save_vcpu, save_vm};
use vmm::vcpu::{self, Entry};
use vmm::CpuProfile;

fn have_kvm() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

fn vm_with_vcpu(kvm: &Kvm, rip: u64) -> (VmFd, VcpuFd) {
    let vm = kvm.create_vm().expect("create a VM");
    vm.set_tss_address(vmm::layout::KVM_TSS_ADDR as usize)
        .expect("TSS");
    vm.create_irq_chip().expect("irqchip");
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .expect("cpuid");
    let entry = Entry::Payload {
        rip,
        cr3: vmm::layout::PML4_ADDR,
    };
    let v = vcpu::create(&vm, &cpuid, 0, 1, entry, CpuProfile::Host).expect("vcpu");
    (vm, v)
}

#[test]
fn vcpu_and_vm_state_round_trip() {
    if !have_kvm() {
        eprintln!("SKIPPED: /dev/kvm is not available on this machine");
        return;
    }
    let kvm = Kvm::new().expect("kvm");
    let msrs = msr_list(&kvm).expect("MSR list");
    assert!(!msrs.is_empty());
    let (vm_a, a) = vm_with_vcpu(&kvm, 0x20_1000);
    let saved = save_vcpu(&a, &msrs, true).expect("save");
    let vm_state = save_vm(&vm_a, false).expect("save the VM");
    assert_eq!(vm_state.irqchips.len(), 3);
    assert!(!saved.msrs.is_empty(), "no MSR readable");

    let (vm_b, b) = vm_with_vcpu(&kvm, 0x9999_0000);
    restore_vm(&vm_b, &vm_state).expect("restore the VM");
    restore_vcpu(&b, &saved).expect("restore");
    let again = save_vcpu(&b, &msrs, true).expect("save again");
    assert_eq!(again.regs, saved.regs);
    assert_eq!(again.sregs, saved.sregs);
    assert_eq!(again.fpu, saved.fpu);
    assert_eq!(again.lapic, saved.lapic);
    assert_eq!(again.mp_state, saved.mp_state);
    let regs: kvm_bindings::kvm_regs = from_bytes(&again.regs).expect("regs blob");
    assert_eq!(regs.rip, 0x20_1000);
    // Every MSR that was saved is restored to the same value, except the TSC, which runs.
    for (i, v) in &saved.msrs {
        if *i == 0x10 {
            continue;
        }
        let back = again.msrs.iter().find(|(j, _)| j == i).map(|(_, v)| *v);
        assert_eq!(back, Some(*v), "MSR {i:#x}");
    }

    // Broken blobs are refused by name, before KVM sees them.
    let mut bad = saved.clone();
    bad.sregs.truncate(10);
    let e = restore_vcpu(&b, &bad).expect_err("short sregs");
    assert!(e.to_string().contains("special registers"), "{e}");
}

#[test]
fn dirty_logging_can_be_switched_on_and_read() {
    if !have_kvm() {
        eprintln!("SKIPPED: /dev/kvm is not available on this machine");
        return;
    }
    let kvm = Kvm::new().expect("kvm");
    let vm = kvm.create_vm().expect("vm");
    let mem = vmm::memory::create_guest_memory(8 << 20).expect("ram");
    use vm_memory::{GuestAddress, GuestMemoryBackend};
    let hva = mem.get_host_address(GuestAddress(0)).expect("hva") as u64;
    let r = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: 8 << 20,
        userspace_addr: hva,
        flags: KVM_MEM_LOG_DIRTY_PAGES,
    };
    // SAFETY: `mem` maps 8 MiB at `hva` and outlives the VM in this test.
    unsafe { vm.set_user_memory_region(r) }.expect("KVM_MEM_LOG_DIRTY_PAGES");
    let map = vm.get_dirty_log(0, 8 << 20).expect("KVM_GET_DIRTY_LOG");
    assert_eq!(map.len(), (8 << 20) / 4096 / 64);
    assert!(map.iter().all(|w| *w == 0), "nothing ran, nothing is dirty");
}
