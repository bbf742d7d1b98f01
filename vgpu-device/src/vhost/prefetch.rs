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
use virtio_queue::desc::split::Descriptor;
use virtio_queue::QueueT;
use vm_memory::{Address, GuestAddress, GuestMemoryBackend};

use super::Vring;
use crate::chain::GuestMem;
use crate::lines::touch;

/// Bytes of a split ring's descriptor.
const DESC_SIZE: usize = 16;
/// A cache line.
const LINE: usize = 64;
/// Lines of a header asked for (a launch's header with a few arguments spans two or three).
const HEADER_LINES: usize = 4;

/// Where the last request was, as host addresses valid while the memory table the queue
/// thread holds is in place (one [`super::VgpuVhostBackend::process_vring`] call).
#[derive(Debug, Default)]
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
        Self {
            avail: GuestAddress(q.avail_ring())
                .checked_add(4)
                .and_then(|a| mem.get_host_address(a).ok())
                .map(|p| (p.cast_const(), q.size())),
            descs: mem
                .get_host_address(GuestAddress(q.desc_table()))
                .ok()
                .map(<*mut u8>::cast_const),
            head: None,
            header: None,
        }
    }

    /// Remembers where the request just taken was: its chain's head descriptor and its
    /// header.
    pub(super) fn learn(&mut self, mem: &GuestMem, head: u16, header: Option<Descriptor>) {
        self.head = Some(head);
        self.header = header.and_then(|d| {
            let p = mem.get_host_address(d.addr()).ok()?;
            Some((p.cast_const(), d.len() as usize))
        });
    }

    /// Asks for the lines of the request at available position `next`, as guessed.
    pub(super) fn ask(&self, next: u16) {
        self.lines(next, touch);
    }

    /// The guessed lines of the request at available position `next`: its available
    /// entry, the last chain's first two descriptors, the last header's lines.
    fn lines(&self, next: u16, mut each: impl FnMut(*const u8)) {
        if let Some((ring, size)) = self.avail {
            each(ring.wrapping_add(usize::from(next % size.max(1)) * 2));
        }
        if let (Some(descs), Some(head)) = (self.descs, self.head) {
            let at = usize::from(head) * DESC_SIZE;
            each(descs.wrapping_add(at));
            each(descs.wrapping_add(at + DESC_SIZE));
        }
        if let Some((header, len)) = self.header {
            for i in 0..len.div_ceil(LINE).min(HEADER_LINES) {
                each(header.wrapping_add(i * LINE));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

    use super::*;

    fn line(p: *const u8) -> usize {
        p as usize / LINE
    }

    /// The lines of guest range `[addr, addr + len)`.
    fn lines_of(mem: &GuestMem, addr: u64, len: usize) -> Vec<usize> {
        let p = mem.get_host_address(GuestAddress(addr)).expect("in RAM") as usize;
        (p / LINE..=(p + len - 1) / LINE).collect()
    }

    #[test]
    fn the_lines_asked_for_are_the_next_request_s_when_the_guest_reuses_its_slots() {
        let ram = GuestMem::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("ram");
        let mem = GuestMemoryAtomic::new(ram);
        let guard = mem.memory();
        let vq = MockSplitQueue::new(&*guard, 256);
        let vring = Vring::new(mem.clone(), 256).expect("vring");
        vring.set_queue_size(256);
        vring
            .set_queue_info(vq.desc_table_addr().0, vq.avail_addr().0, vq.used_addr().0)
            .expect("queue info");
        vring.set_queue_ready(true);
        let (header, header_len) = (1u64 << 20, 150u32);
        let d = |addr: u64, len: u32, flags: u32, next: u16| {
            RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
        };
        // A header and a response, in descriptors 5 and 6.
        let chain = [
            d(header, header_len, VRING_DESC_F_NEXT, 6),
            d(header + 0x1000, 48, VRING_DESC_F_WRITE, 0),
        ];
        let mut guess = Prefetch::new(&vring, &guard);
        let mut asked = Vec::new();
        guess.lines(0, |p| asked.push(line(p)));
        assert_eq!(asked.len(), 1, "before any request: only the ring's entry");

        // The first request, taken and learned from.
        vq.add_desc_chains(&chain, 5).expect("chain");
        let c = super::super::pop(&vring, &guard).expect("posted");
        guess.learn(&guard, c.head_index(), c.clone().next());
        // The second, in the same descriptors and slot, at the next ring position.
        vq.add_desc_chains(&chain, 5).expect("chain");
        let mut asked = Vec::new();
        guess.lines(1, |p| asked.push(line(p)));
        let avail_entry = vq.avail_addr().0 + 4 + 2;
        let descs = vq.desc_table_addr().0 + 5 * DESC_SIZE as u64;
        for (what, want) in [
            ("the ring's entry", lines_of(&guard, avail_entry, 2)),
            ("the descriptors", lines_of(&guard, descs, 2 * DESC_SIZE)),
            ("the header", lines_of(&guard, header, header_len as usize)),
        ] {
            for l in want {
                assert!(asked.contains(&l), "{what}: line {l:#x} not in {asked:x?}");
            }
        }
        assert!(asked.len() <= 1 + 2 + HEADER_LINES, "{asked:x?}");
    }

    #[test]
    fn a_long_header_is_asked_for_its_first_lines_only() {
        let mut guess = Prefetch::default();
        let buf = [0u8; 1024];
        guess.head = Some(0);
        guess.header = Some((buf.as_ptr(), buf.len()));
        let mut n = 0;
        guess.lines(0, |_| n += 1);
        assert_eq!(
            n, HEADER_LINES,
            "no ring or descriptors known: the header's lines"
        );
    }
}
