//! The entry point. Every vCPU starts at `_start` at once, in long mode with its own stack
//! (docs/payload-abi.md): rdi = &BootInfo, rsi = vCPU index.

use crate::boot::BootInfo;

/// Exit code when the vmm's BootInfo is not what this runtime was built for.
pub const EXIT_BAD_BOOTINFO: u8 = 102;

/// What a payload's `entry!` provides.
pub type MainFn = fn(&'static BootInfo, &'static str) -> u8;
pub type ApFn = fn(&'static BootInfo, u32);

/// The bare-metal entry; host unit tests link std's own `_start` instead.
#[cfg(not(test))]
mod bare {
    use core::sync::atomic::{AtomicBool, Ordering};

    use super::{ApFn, MainFn, EXIT_BAD_BOOTINFO};
    use crate::boot::BootInfo;
    use crate::exit::{exit, park};

    /// Set by vCPU 0 once the heap and clock are ready; other vCPUs wait for it before
    /// running the payload's AP hook.
    static READY: AtomicBool = AtomicBool::new(false);

    extern "Rust" {
        /// Defined by `entry!` in the payload binary.
        static __PAYLOAD_MAIN: MainFn;
        /// Defined by `entry!`: `None` parks the other vCPUs at once.
        static __PAYLOAD_AP_MAIN: Option<ApFn>;
    }

    // The vmm already set rsp 16-byte aligned; `call` then leaves it as the SysV ABI expects
    // at function entry. rbp = 0 ends frame-pointer walks here.
    core::arch::global_asm!(
        ".section .text._start,\"ax\",@progbits",
        ".global _start",
        ".type _start,@function",
        "_start:",
        "    xor ebp, ebp",
        "    and rsp, -16",
        "    call {rust_start}",
        "    ud2",
        ".size _start, . - _start",
        rust_start = sym rust_start,
    );

    extern "C" fn rust_start(boot: *const BootInfo, index: u64) -> ! {
        // SAFETY: the vmm passes the address of the BootInfo block (0x7000) in rdi; it lives in
        // identity-mapped RAM for the whole run and the guest never writes it.
        let boot: &'static BootInfo = unsafe { &*boot };

        if index != 0 {
            // SAFETY: the static is defined by the payload's entry! macro and never written.
            let ap = unsafe { __PAYLOAD_AP_MAIN };
            if let Some(ap) = ap {
                while !READY.load(Ordering::Acquire) {
                    core::hint::spin_loop();
                }
                ap(boot, index as u32);
            }
            park();
        }

        if !boot.is_valid() {
            crate::println!(
                "payload-rt: bad BootInfo at {:p}: magic {:#x} version {}",
                boot,
                boot.magic,
                boot.version
            );
            exit(EXIT_BAD_BOOTINFO);
        }
        crate::time::init(boot.tsc_khz);
        crate::heap::init(boot);
        READY.store(true, Ordering::Release);

        // SAFETY: as above, defined by entry! and never written.
        let main = unsafe { __PAYLOAD_MAIN };
        exit(main(boot, boot.args()))
    }
}

/// Declares the payload's entry points:
///
/// ```ignore
/// payload_rt::entry!(main);                  // other vCPUs park
/// payload_rt::entry!(main, ap = ap_main);    // other vCPUs run ap_main(boot, index)
/// fn main(boot: &'static BootInfo, args: &'static str) -> u8 { 0 }
/// ```
///
/// `main` runs on vCPU 0 and its return value is the VM's exit code. `ap_main` starts on
/// every other vCPU once vCPU 0 has set up the heap and clock, concurrently with `main`;
/// when it returns the vCPU parks.
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        #[unsafe(no_mangle)]
        static __PAYLOAD_MAIN: $crate::start::MainFn = $main;
        #[unsafe(no_mangle)]
        static __PAYLOAD_AP_MAIN: ::core::option::Option<$crate::start::ApFn> = None;
    };
    ($main:path, ap = $ap:path) => {
        #[unsafe(no_mangle)]
        static __PAYLOAD_MAIN: $crate::start::MainFn = $main;
        #[unsafe(no_mangle)]
        static __PAYLOAD_AP_MAIN: ::core::option::Option<$crate::start::ApFn> = Some($ap);
    };
}
