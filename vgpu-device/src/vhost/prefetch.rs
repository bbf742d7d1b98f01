//! The next request's cache lines, asked for at once. A request the guest posts is in
//! four places the guest's CPU has just written: the available ring's index, its entry,
//! the descriptors and the header. Read one after the other, each waits for its line to
//! cross from the guest's core: four transfers in series, the largest part of taking a
//! request off the ring on a host where a transfer costs a few hundred nanoseconds.
//!
//! The guest driver takes descriptors and request slots from the top of its free lists
//! (docs/protocol.md, "Descriptors and slots"), so a guest that waits for each request
//! before the next posts it in the descriptors and the slot the last one used. The queue
//! thread remembers where the last request was and, the moment it sees the index move,
//! asks for all of those lines together, before it reads any of them: the transfers
//! overlap. A guess that is wrong costs a few loads of lines that are not needed. A
//! prefetch only hints the CPU: it reads nothing the program sees, cannot fault, and
//! changes no result.

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Address, GuestAddress, GuestMemoryBackend};

use super::Vring;
use crate::chain::GuestMem;
use crate::request::Received;

/// Bytes of a split ring's descriptor.
const DESC_SIZE: u64 = 16;
/// A cache line.
const LINE: usize = 64;
/// Lines of a header asked for (a launch's header with a few arguments spans two or three).
const HEADER_LINES: usize = 4;

/// Where the last request was, as host addresses valid while the memory table the queue
/// thread holds is in place.
#[derive(Default)]
pub(super) struct Prefetch {
    /// The available ring's first entry, and the ring's size.
    avail: Option<(*const u8, u16)>,
    /// The descriptor table.
    descs: Option<*const u8>,
    /// The last chain's head descriptor.
    head: Option<u16>,
    /// The last request's header and its length.
    header: Option<(*const u8, usize)>,
}

impl Prefetch {
    /// The ring's places in `mem` (none while the queue is not ready).
    pub(super) fn new(vring: &Vring, mem: &GuestMem) -> Self {
        let state = vring.get_ref();
        let q = state.get_queue();
        if !q.ready() {
            return Self::default();
        }
        let host = |a: u64| mem.get_host_address(GuestAddress(a)).ok();
        Self {
            avail: GuestAddress(q.avail_ring())
                .checked_add(4)
                .and_then(|a| mem.get_host_address(a).ok())
                .map(|p| (p.cast_const(), q.size())),
            descs: host(q.desc_table()).map(<*mut u8>::cast_const),
            head: None,
            header: None,
        }
    }

    /// Remembers where `r` was.
    pub(super) fn learn(&mut self, mem: &GuestMem, r: &Received<'_>) {
        self.head = Some(r.chain.head_index());
        self.header = r.layout.header.and_then(|d| {
            let p = mem.get_host_address(d.addr()).ok()?;
            Some((p.cast_const(), d.len() as usize))
        });
    }

    /// Asks for the lines of the request at available position `next`, as guessed.
    pub(super) fn ask(&self, next: u16) {
        if let Some((ring, size)) = self.avail {
            touch(ring.wrapping_add(usize::from(next % size.max(1)) * 2));
        }
        if let (Some(descs), Some(head)) = (self.descs, self.head) {
            let at = u64::from(head) * DESC_SIZE;
            touch(descs.wrapping_add(at as usize));
            touch(descs.wrapping_add((at + DESC_SIZE) as usize));
        }
        if let Some((header, len)) = self.header {
            let lines = len.div_ceil(LINE).min(HEADER_LINES);
            for i in 0..lines {
                touch(header.wrapping_add(i * LINE));
            }
        }
    }
}

/// Hints the CPU to bring the line at `p` in.
#[inline(always)]
fn touch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults, whatever the
    // address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
