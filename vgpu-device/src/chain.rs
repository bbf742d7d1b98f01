//! The shape of one descriptor chain: header, data descriptors, response. Every
//! descriptor's guest range is checked against the memory table before anything is read or
//! written; data descriptors are walked a second time (re-checked, since the guest may
//! rewrite its descriptor table meanwhile) to move the bytes.

use vhost_user_backend::bitmap::BitmapMmapRegion;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

use crate::error::RequestError;

/// The guest memory type the device serves: vhost-user memfd regions, each with the
/// frontend's dirty log once it sends one (`SET_LOG_BASE`, during a whole-VM migration).
/// Writes through vm-memory (responses, used rings) mark their pages in it by themselves;
/// the backends write data descriptors through raw host pointers, so [`for_each_data`]
/// marks those pages once the callback has written them.
pub type GuestMem = GuestMemoryMmap<BitmapMmapRegion>;
/// A descriptor chain over that memory.
pub type Chain<'m> = DescriptorChain<&'m GuestMem>;

/// What the first walk of a chain found.
#[derive(Debug, Default)]
pub struct Layout {
    /// Descriptors in the chain.
    pub count: usize,
    /// The first descriptor.
    pub header: Option<Descriptor>,
    /// The last descriptor, if it can hold a response (writable, large enough, in RAM).
    pub response: Option<Descriptor>,
    /// Data descriptors (all but first and last).
    pub data_count: usize,
    /// Sum of their lengths.
    pub data_len: u64,
    /// Sum of the lengths of the writable ones.
    pub data_writable_len: u64,
    /// Position of the first readable data descriptor.
    pub first_readable: Option<usize>,
    /// Position of the first writable data descriptor.
    pub first_writable: Option<usize>,
    /// The first descriptor not inside guest RAM (position, descriptor).
    pub outside: Option<(usize, Descriptor)>,
}

fn in_ram(mem: &GuestMem, d: &Descriptor) -> bool {
    d.len() == 0 || GuestMemoryBackend::check_range(mem, d.addr(), d.len() as usize)
}

impl Layout {
    /// Walks `chain` once.
    pub fn of(mem: &GuestMem, chain: &Chain<'_>) -> Layout {
        let mut l = Layout::default();
        let mut prev: Option<Descriptor> = None;
        for (i, d) in chain.clone().enumerate() {
            l.count = i + 1;
            if l.outside.is_none() && !in_ram(mem, &d) {
                l.outside = Some((i, d));
            }
            if i == 0 {
                l.header = Some(d);
            } else if let Some(p) = prev.filter(|_| i >= 2) {
                l.add_data(i - 1, &p);
            }
            prev = Some(d);
        }
        if let Some(last) = prev {
            // A single descriptor can only be a response (the header is missing).
            let usable = last.is_write_only()
                && last.len() as usize >= vgpu_proto::Response::SIZE
                && in_ram(mem, &last);
            if usable {
                l.response = Some(last);
            }
        }
        l
    }

    fn add_data(&mut self, index: usize, d: &Descriptor) {
        self.data_count += 1;
        // Each length is < 2^32 and a chain has < 2^16 descriptors: no overflow.
        self.data_len += u64::from(d.len());
        if d.is_write_only() {
            self.data_writable_len += u64::from(d.len());
            self.first_writable.get_or_insert(index);
        } else {
            self.first_readable.get_or_insert(index);
        }
    }
}

/// Calls `f(offset, slice)` for each guest memory slice of the data descriptors, in order,
/// checking again that each is in RAM, has direction `writable`, and that they add up to
/// exactly `expected` bytes. Returns the bytes visited.
///
/// The slices carry no dirty bitmap (the backends copy through their host addresses, which
/// vm-memory cannot see); with `writable`, every slice's pages are marked in the dirty log
/// after `f` returns, whether it succeeded or not (a failed copy may have written part).
pub fn for_each_data<'m>(
    mem: &'m GuestMem,
    chain: &Chain<'m>,
    layout: &Layout,
    opcode: &'static str,
    writable: bool,
    expected: u64,
    mut f: impl FnMut(u64, &VolatileSlice<'m>) -> Result<(), RequestError>,
) -> Result<u64, RequestError> {
    let mut off = 0u64;
    for (index, d) in chain.clone().enumerate().skip(1).take(layout.data_count) {
        if d.is_write_only() != writable {
            return Err(RequestError::DataDirection {
                opcode,
                index,
                writable,
            });
        }
        let end = off
            .checked_add(u64::from(d.len()))
            .filter(|e| *e <= expected)
            .ok_or(RequestError::DataLength {
                opcode,
                expected,
                got: off.saturating_add(u64::from(d.len())),
            })?;
        let outside = || RequestError::OutsideGuestMemory {
            index,
            addr: d.addr().0,
            len: d.len(),
        };
        for s in GuestMemoryBackend::get_slices(mem, d.addr(), d.len() as usize) {
            let s = s.map_err(|_| outside())?;
            let plain = without_bitmap(&s);
            let r = f(off, &plain);
            if writable {
                // After the write: a log read between a mark and the write it covers would
                // let the page go out before its new bytes.
                s.bitmap().mark_dirty(0, s.len());
            }
            r?;
            off = off.checked_add(s.len() as u64).ok_or_else(outside)?;
        }
        if off != end {
            return Err(outside());
        }
    }
    if off != expected {
        return Err(RequestError::DataLength {
            opcode,
            expected,
            got: off,
        });
    }
    Ok(off)
}

/// The same guest bytes as `s`, without its dirty bitmap (the type the backends take).
fn without_bitmap<'m>(s: &VolatileSlice<'m, BitmapMmapRegion>) -> VolatileSlice<'m> {
    // SAFETY: `s` covers `s.len()` bytes of a guest memory mapping that lives for 'm (it
    // came from `mem.get_slices`, which borrows the mapping for 'm); the new slice is the
    // same range and is only accessed with volatile operations, like `s`.
    unsafe { VolatileSlice::new(s.ptr_guard_mut().as_ptr(), s.len()) }
}

/// Gathers the data descriptors (readable, `len` bytes in all) into `out[..len]`.
pub fn gather<'m>(
    mem: &'m GuestMem,
    chain: &Chain<'m>,
    layout: &Layout,
    opcode: &'static str,
    len: u64,
    out: &mut [u8],
) -> Result<(), RequestError> {
    for_each_data(mem, chain, layout, opcode, false, len, |off, s| {
        let dst = usize::try_from(off)
            .ok()
            .and_then(|o| out.get_mut(o..o.checked_add(s.len())?))
            .ok_or(RequestError::DataLength {
                opcode,
                expected: len,
                got: off.saturating_add(s.len() as u64),
            })?;
        s.copy_to(dst);
        Ok(())
    })
    .map(|_| ())
}
