//! Cache-line hints. Data one thread of the worker wrote and another reads next (a
//! request's lines the guest's core wrote, a batch the queue thread checked and the launch
//! runner runs) crosses between cores a line at a time: a few hundred nanoseconds each on
//! a large host, in series when each read waits for its line. Asking for all of them
//! first lets the transfers overlap.

/// Hints the CPU to bring the line at `p` in. A prefetch reads nothing the program sees,
/// cannot fault and changes no result, whatever the address.
#[inline(always)]
pub(crate) fn touch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults, whatever the
    // address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
