//! CPU profiles: which of KVM's supported CPUID features the guest sees.
//!
//! `host` passes KVM's supported set through (what payload guests always got). `restricted`
//! hides features a nested KVM cannot emulate in guest ring 0: on our machines every ring-0
//! instruction of a Linux guest goes through KVM's instruction emulator (docs/payload-abi.md,
//! "Why ring 3"), which has no `cmpxchg16b` in some paths, no `xsave`/`xrstor` family, no
//! AVX/AVX-512/AMX encodings, no `rdrand`/`rdseed`, no `invpcid`, `rdpid`, `serialize`,
//! `clac`/`stac`, and so on. A kernel that sees none of them falls back to the
//! instructions the emulator knows (`fxsave`, plain `cmpxchg`, `rep movs`).

use kvm_bindings::CpuId;

/// What CPUID the guest sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CpuProfile {
    /// KVM's supported CPUID as is.
    #[default]
    Host,
    /// KVM's supported CPUID without the features a nested KVM cannot emulate.
    Restricted,
}

/// A register of a CPUID leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// Bits cleared by the restricted profile: `(leaf, subleaf or None for all, register, mask, what)`.
pub const RESTRICTED_MASKS: &[(u32, Option<u32>, Reg, u32, &str)] = &[
    // Leaf 1 ECX.
    (1, None, Reg::Ecx, 1 << 1, "pclmulqdq"),
    (1, None, Reg::Ecx, 1 << 12, "fma"),
    (1, None, Reg::Ecx, 1 << 13, "cmpxchg16b"),
    (1, None, Reg::Ecx, 1 << 17, "pcid"),
    (1, None, Reg::Ecx, 1 << 23, "popcnt"),
    (1, None, Reg::Ecx, 1 << 25, "aes"),
    (1, None, Reg::Ecx, 1 << 26, "xsave"),
    (1, None, Reg::Ecx, 1 << 27, "osxsave"),
    (1, None, Reg::Ecx, 1 << 28, "avx"),
    (1, None, Reg::Ecx, 1 << 29, "f16c"),
    (1, None, Reg::Ecx, 1 << 30, "rdrand"),
    // Leaf 7 subleaf 0 EBX.
    (7, Some(0), Reg::Ebx, 1 << 0, "fsgsbase"),
    (7, Some(0), Reg::Ebx, 1 << 4, "hle"),
    (7, Some(0), Reg::Ebx, 1 << 5, "avx2"),
    (7, Some(0), Reg::Ebx, 1 << 7, "smep"),
    (7, Some(0), Reg::Ebx, 1 << 10, "invpcid"),
    (7, Some(0), Reg::Ebx, 1 << 11, "rtm"),
    (7, Some(0), Reg::Ebx, 1 << 14, "mpx"),
    (7, Some(0), Reg::Ebx, 1 << 16, "avx512f"),
    (7, Some(0), Reg::Ebx, 1 << 17, "avx512dq"),
    (7, Some(0), Reg::Ebx, 1 << 18, "rdseed"),
    (7, Some(0), Reg::Ebx, 1 << 19, "adx"),
    (7, Some(0), Reg::Ebx, 1 << 20, "smap"),
    (7, Some(0), Reg::Ebx, 1 << 21, "avx512ifma"),
    (7, Some(0), Reg::Ebx, 1 << 23, "clflushopt"),
    (7, Some(0), Reg::Ebx, 1 << 24, "clwb"),
    (7, Some(0), Reg::Ebx, 1 << 26, "avx512pf"),
    (7, Some(0), Reg::Ebx, 1 << 27, "avx512er"),
    (7, Some(0), Reg::Ebx, 1 << 28, "avx512cd"),
    (7, Some(0), Reg::Ebx, 1 << 29, "sha"),
    (7, Some(0), Reg::Ebx, 1 << 30, "avx512bw"),
    (7, Some(0), Reg::Ebx, 1 << 31, "avx512vl"),
    // Leaf 7 subleaf 0 ECX.
    (7, Some(0), Reg::Ecx, 1 << 1, "avx512vbmi"),
    (7, Some(0), Reg::Ecx, 1 << 2, "umip"),
    (7, Some(0), Reg::Ecx, 1 << 3, "pku"),
    (7, Some(0), Reg::Ecx, 1 << 4, "ospke"),
    (7, Some(0), Reg::Ecx, 1 << 5, "waitpkg"),
    (7, Some(0), Reg::Ecx, 1 << 6, "avx512_vbmi2"),
    (7, Some(0), Reg::Ecx, 1 << 8, "gfni"),
    (7, Some(0), Reg::Ecx, 1 << 9, "vaes"),
    (7, Some(0), Reg::Ecx, 1 << 10, "vpclmulqdq"),
    (7, Some(0), Reg::Ecx, 1 << 11, "avx512_vnni"),
    (7, Some(0), Reg::Ecx, 1 << 12, "avx512_bitalg"),
    (7, Some(0), Reg::Ecx, 1 << 14, "avx512_vpopcntdq"),
    (7, Some(0), Reg::Ecx, 1 << 16, "la57"),
    (7, Some(0), Reg::Ecx, 1 << 22, "rdpid"),
    // Leaf 7 subleaf 0 EDX.
    (7, Some(0), Reg::Edx, 1 << 2, "avx512_4vnniw"),
    (7, Some(0), Reg::Edx, 1 << 3, "avx512_4fmaps"),
    (7, Some(0), Reg::Edx, 1 << 8, "avx512_vp2intersect"),
    (7, Some(0), Reg::Edx, 1 << 14, "serialize"),
    (7, Some(0), Reg::Edx, 1 << 22, "amx_bf16"),
    (7, Some(0), Reg::Edx, 1 << 23, "avx512_fp16"),
    (7, Some(0), Reg::Edx, 1 << 24, "amx_tile"),
    (7, Some(0), Reg::Edx, 1 << 25, "amx_int8"),
    // Leaf 7 subleaf 1 EAX.
    (7, Some(1), Reg::Eax, 1 << 4, "avx_vnni"),
    (7, Some(1), Reg::Eax, 1 << 5, "avx512_bf16"),
    // Leaf 0x8000_0001 ECX (AMD).
    (0x8000_0001, None, Reg::Ecx, 1 << 11, "xop"),
    (0x8000_0001, None, Reg::Ecx, 1 << 16, "fma4"),
    (0x8000_0001, None, Reg::Ecx, 1 << 21, "tbm"),
    // Leaf 0x8000_0001 EDX: rdtscp (Linux's rdtsc_ordered() prefers it).
    (0x8000_0001, None, Reg::Edx, 1 << 27, "rdtscp"),
];

/// Leaves removed outright by the restricted profile: 0xD enumerates XSAVE state (meaningless
/// without XSAVE), 0x14 is processor trace, 0x1D/0x1E are AMX tiles.
pub const RESTRICTED_LEAVES: &[u32] = &[0xd, 0x14, 0x1d, 0x1e];

/// Kernel parameters the restricted profile adds to a Linux command line. Some KVMs
/// (`kvm_pvm` on our machines) do not apply all of KVM_SET_CPUID2 (measured: XSAVE, AVX,
/// UMIP stayed visible, cmpxchg16b went), so the kernel is also told not to use them:
/// `noxsave` (FXSAVE instead; AVX and later need XSAVE and go with it) and the
/// `clearcpuid=` numbers of cx16 (4*32+13), popcnt (4*32+23), rdrand (4*32+30),
/// rdtscp (1*32+27), smap (9*32+20), rdseed (9*32+18), umip (16*32+2), rdpid (16*32+22).
/// popcnt and rdtscp are there because the emulator failed on them here (popcnt in the
/// kernel's `hweight` alternative after 6 minutes of boot).
pub const RESTRICTED_LINUX_PARAMS: &str =
    "noxsave nopku nosmap nosmep noinvpcid nopcid nofsgsbase nordrand tsx=off \
clearcpuid=59,141,151,158,306,308,514,534";

impl CpuProfile {
    /// The profile's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Restricted => "restricted",
        }
    }

    /// The profile of `name`, as `name()` writes it.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "host" => Some(Self::Host),
            "restricted" => Some(Self::Restricted),
            _ => None,
        }
    }

    /// Kernel parameters that go with the profile (empty for `host`).
    pub fn linux_params(self) -> &'static str {
        match self {
            CpuProfile::Host => "",
            CpuProfile::Restricted => RESTRICTED_LINUX_PARAMS,
        }
    }

    /// Applies the profile to a CPUID table (after `arch::cpuid::for_vcpu`).
    pub fn apply(self, cpuid: CpuId) -> CpuId {
        match self {
            CpuProfile::Host => cpuid,
            CpuProfile::Restricted => restrict(cpuid),
        }
    }
}

fn restrict(cpuid: CpuId) -> CpuId {
    let mut entries: Vec<_> = cpuid
        .as_slice()
        .iter()
        .copied()
        .filter(|e| !RESTRICTED_LEAVES.contains(&e.function))
        .collect();
    for entry in &mut entries {
        for &(leaf, sub, reg, mask, _) in RESTRICTED_MASKS {
            if entry.function != leaf || sub.is_some_and(|s| s != entry.index) {
                continue;
            }
            let r = match reg {
                Reg::Eax => &mut entry.eax,
                Reg::Ebx => &mut entry.ebx,
                Reg::Ecx => &mut entry.ecx,
                Reg::Edx => &mut entry.edx,
            };
            *r &= !mask;
        }
    }
    tracing::debug!(
        hidden = RESTRICTED_MASKS.len(),
        "restricted CPU profile applied"
    );
    // Fewer entries than we started with, so this stays within KVM's limit.
    CpuId::from_entries(&entries).unwrap_or(cpuid)
}

#[cfg(test)]
mod tests {
    use kvm_bindings::kvm_cpuid_entry2;

    use super::*;

    fn leaf(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: u32::MAX,
            ebx: u32::MAX,
            ecx: u32::MAX,
            edx: u32::MAX,
            ..Default::default()
        }
    }

    fn all_ones() -> CpuId {
        CpuId::from_entries(&[
            leaf(0, 0),
            leaf(1, 0),
            leaf(7, 0),
            leaf(7, 1),
            leaf(0xd, 0),
            leaf(0xd, 1),
            leaf(0x8000_0001, 0),
        ])
        .unwrap()
    }

    fn get(c: &CpuId, function: u32, index: u32) -> Option<kvm_cpuid_entry2> {
        c.as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .copied()
    }

    #[test]
    fn host_profile_changes_nothing() {
        let c = CpuProfile::Host.apply(all_ones());
        assert_eq!(c.as_slice(), all_ones().as_slice());
    }

    #[test]
    fn restricted_profile_clears_the_intended_bits() {
        let c = CpuProfile::Restricted.apply(all_ones());
        let l1 = get(&c, 1, 0).unwrap();
        // cmpxchg16b, xsave, osxsave, avx, fma, f16c, rdrand gone...
        for bit in [13, 26, 27, 28, 12, 29, 30] {
            assert_eq!(l1.ecx & (1 << bit), 0, "leaf 1 ecx bit {bit}");
        }
        // ...and popcnt; SSE3 (0), SSSE3 (9), SSE4.1 (19), SSE4.2 (20), hypervisor (31)
        // and every EDX bit (FPU, TSC, APIC, SSE, SSE2, ...) stay.
        assert_eq!(l1.ecx & (1 << 23), 0, "popcnt");
        for bit in [0, 9, 19, 20, 31] {
            assert_ne!(l1.ecx & (1 << bit), 0, "leaf 1 ecx bit {bit} kept");
        }
        assert_eq!(l1.edx, u32::MAX);
        let l7 = get(&c, 7, 0).unwrap();
        // AVX2, AVX-512F/DQ/CD/BW/VL, rdseed, smap, invpcid.
        for bit in [5, 16, 17, 28, 30, 31, 18, 20, 10] {
            assert_eq!(l7.ebx & (1 << bit), 0, "leaf 7 ebx bit {bit}");
        }
        // BMI1 (3), BMI2 (8), ERMS (9) stay.
        for bit in [3, 8, 9] {
            assert_ne!(l7.ebx & (1 << bit), 0, "leaf 7 ebx bit {bit} kept");
        }
        assert_eq!(l7.ecx & (1 << 22), 0, "rdpid");
        assert_eq!(l7.edx & (1 << 14), 0, "serialize");
        assert_eq!(l7.edx & (1 << 23), 0, "avx512_fp16");
        let l71 = get(&c, 7, 1).unwrap();
        assert_eq!(l71.eax & 0x30, 0, "avx_vnni, avx512_bf16");
        assert!(get(&c, 0xd, 0).is_none(), "XSAVE leaf removed");
        assert!(get(&c, 0xd, 1).is_none(), "XSAVE leaf removed");
        let ext = get(&c, 0x8000_0001, 0).unwrap();
        assert_eq!(ext.ecx & ((1 << 11) | (1 << 16)), 0, "xop, fma4");
        assert_eq!(ext.edx, !(1 << 27), "rdtscp only");
        assert_eq!(get(&c, 0, 0).unwrap().eax, u32::MAX, "leaf 0 untouched");
    }

    #[test]
    fn every_mask_is_one_bit_and_named() {
        for &(_, _, _, mask, name) in RESTRICTED_MASKS {
            assert_eq!(mask.count_ones(), 1, "{name}");
            assert!(!name.is_empty());
        }
    }
}
