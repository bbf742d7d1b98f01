//! CPUID for the guest: KVM's supported set, with the vCPU's APIC id filled in and the
//! hypervisor bit set.

use kvm_bindings::CpuId;

/// Adjusts KVM's supported CPUID for vCPU `index` of `count`.
pub fn for_vcpu(mut cpuid: CpuId, index: u8, count: u8) -> CpuId {
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                // EBX[31:24] initial APIC id, EBX[23:16] logical processor count.
                entry.ebx =
                    (entry.ebx & 0x0000_ffff) | (u32::from(index) << 24) | (u32::from(count) << 16);
                // ECX bit 31: running under a hypervisor.
                entry.ecx |= 1 << 31;
            }
            0xb | 0x1f => {
                // EDX: x2APIC id of this vCPU.
                entry.edx = u32::from(index);
            }
            _ => {}
        }
    }
    cpuid
}

#[cfg(test)]
mod tests {
    use kvm_bindings::kvm_cpuid_entry2;

    use super::*;

    #[test]
    fn apic_id_and_hypervisor_bit() {
        let leaf1 = kvm_cpuid_entry2 {
            function: 1,
            ebx: 0xffff_ffff,
            ..Default::default()
        };
        let cpuid = CpuId::from_entries(&[leaf1]).unwrap();
        let out = for_vcpu(cpuid, 3, 4);
        let e = out.as_slice()[0];
        assert_eq!(e.ebx >> 24, 3);
        assert_eq!((e.ebx >> 16) & 0xff, 4);
        assert_eq!(e.ebx & 0xffff, 0xffff);
        assert_ne!(e.ecx & (1 << 31), 0);
    }
}
