//! A bump allocator over the free RAM after the image. Payloads are short-lived, so
//! freeing is a no-op; what they need is `Vec` and aligned DMA buffers, cheaply, from any vCPU.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::boot::BootInfo;

extern "C" {
    /// End of the image (bss included), page aligned; defined by payloads/link.ld.
    static _end: u8;
}

pub struct BumpAllocator {
    next: AtomicUsize,
    end: AtomicUsize,
}

#[cfg_attr(not(test), global_allocator)]
static HEAP: BumpAllocator = BumpAllocator {
    next: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
};

/// Hands the RAM from `_end` to the end of its region to the allocator. Called once by
/// vCPU 0 before `main`; until then every allocation fails.
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn init(boot: &BootInfo) {
    let start = core::ptr::addr_of!(_end) as u64;
    let Some((_, end)) = boot.usable_region_containing(start) else {
        return;
    };
    HEAP.end.store(end as usize, Ordering::Relaxed);
    HEAP.next.store(start as usize, Ordering::Release);
}

/// Bytes still free on the heap.
pub fn free_bytes() -> usize {
    HEAP.end
        .load(Ordering::Relaxed)
        .saturating_sub(HEAP.next.load(Ordering::Acquire))
}

// SAFETY: alloc hands out disjoint, suitably aligned ranges of otherwise unused RAM (each
// caller's range comes from a successful compare-exchange of `next`), or null when full.
unsafe impl GlobalAlloc for BumpAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let end = self.end.load(Ordering::Relaxed);
        let mut cur = self.next.load(Ordering::Acquire);
        loop {
            if cur == 0 {
                return core::ptr::null_mut();
            }
            // Layout guarantees a power-of-two alignment.
            let Some(start) = cur
                .checked_add(layout.align() - 1)
                .map(|v| v & !(layout.align() - 1))
            else {
                return core::ptr::null_mut();
            };
            let Some(new) = start.checked_add(layout.size()).filter(|&n| n <= end) else {
                return core::ptr::null_mut();
            };
            match self
                .next
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return start as *mut u8,
                Err(seen) => cur = seen,
            }
        }
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}
