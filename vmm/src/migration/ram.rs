//! Sending guest RAM: whole regions (skipping pages still zero, on a first pass into a
//! fresh destination) and the pages KVM's dirty log reports.

use std::io::Write;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::wire::{write_message, Kind, WireError, MAX_RAM_RUN};
use crate::vm::{Slot, VmHandles};

pub const PAGE: u64 = 4096;

/// Counts what was sent.
#[derive(Default, Clone, Copy, Debug)]
pub struct Sent {
    pub bytes: u64,
    pub pages: u64,
}

/// Sends guest RAM to a stream in runs of at most `MAX_RAM_RUN` bytes.
pub struct RamSender {
    buf: Vec<u8>,
    pub sent: Sent,
}

impl Default for RamSender {
    fn default() -> Self {
        Self {
            buf: vec![0u8; MAX_RAM_RUN],
            sent: Sent::default(),
        }
    }
}

static ZERO_PAGE: [u8; PAGE as usize] = [0; PAGE as usize];

fn is_zero(page: &[u8]) -> bool {
    page == &ZERO_PAGE[..page.len().min(ZERO_PAGE.len())]
}

/// Copies guest RAM at `gpa` into `out` with one memcpy, after checking that the range
/// lies in one region. The guest may be writing the same pages: a torn page is re-sent,
/// since the write marks it dirty.
pub fn copy_out(mem: &GuestMemoryMmap, gpa: u64, out: &mut [u8]) -> Result<(), WireError> {
    let outside = || WireError::OutsideRam {
        gpa,
        len: out.len(),
    };
    let slice = mem
        .get_slice(GuestAddress(gpa), out.len())
        .map_err(|_| outside())?;
    // SAFETY: `slice` covers `out.len()` bytes of a live guest mapping (checked above) and
    // `out` is a distinct buffer of that length; the bytes are copied as plain data, no
    // reference to guest memory is formed.
    unsafe {
        std::ptr::copy_nonoverlapping(slice.ptr_guard().as_ptr(), out.as_mut_ptr(), out.len())
    };
    Ok(())
}

impl RamSender {
    fn send_run<W: Write>(
        &mut self,
        w: &mut W,
        gpa: u64,
        range: std::ops::Range<usize>,
    ) -> Result<(), WireError> {
        let n = range.len() as u64;
        write_message(w, Kind::Ram, &[&gpa.to_le_bytes(), &self.buf[range]])?;
        self.sent.bytes += n;
        self.sent.pages += n / PAGE;
        Ok(())
    }

    /// Sends `len` bytes of RAM from `gpa` (page aligned); with `skip_zero`, pages that are
    /// all zero stay unsent (the destination's fresh RAM is zero already).
    pub fn send_range<W: Write>(
        &mut self,
        w: &mut W,
        mem: &GuestMemoryMmap,
        gpa: u64,
        len: u64,
        skip_zero: bool,
    ) -> Result<(), WireError> {
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(MAX_RAM_RUN as u64) as usize;
            let base = gpa + off;
            copy_out(mem, base, &mut self.buf[..n])?;
            if !skip_zero {
                self.send_run(w, base, 0..n)?;
            } else {
                let pages = n / PAGE as usize;
                let mut p = 0;
                while p < pages {
                    let at = |i: usize| &self.buf[i * PAGE as usize..(i + 1) * PAGE as usize];
                    if is_zero(at(p)) {
                        p += 1;
                        continue;
                    }
                    let start = p;
                    while p < pages && !is_zero(at(p)) {
                        p += 1;
                    }
                    let (s, e) = (start * PAGE as usize, p * PAGE as usize);
                    self.send_run(w, base + s as u64, s..e)?;
                }
            }
            off += n as u64;
        }
        Ok(())
    }

    /// Sends the pages whose bits are set in `bitmap` (one bit per page of `slot`).
    pub fn send_dirty<W: Write>(
        &mut self,
        w: &mut W,
        mem: &GuestMemoryMmap,
        slot: &Slot,
        bitmap: &[u64],
    ) -> Result<(), WireError> {
        let pages = slot.len / PAGE;
        let max_run = MAX_RAM_RUN as u64 / PAGE;
        let bit = |i: u64| {
            bitmap
                .get((i / 64) as usize)
                .is_some_and(|w| w >> (i % 64) & 1 == 1)
        };
        let mut i = 0u64;
        while i < pages {
            if bitmap.get((i / 64) as usize) == Some(&0) {
                i = (i / 64 + 1) * 64;
                continue;
            }
            if !bit(i) {
                i += 1;
                continue;
            }
            let start = i;
            while i < pages && bit(i) && i - start < max_run {
                i += 1;
            }
            self.send_range(w, mem, slot.gpa + start * PAGE, (i - start) * PAGE, false)?;
        }
        Ok(())
    }
}

/// Dirty bitmaps of every slot (KVM clears them as it returns them).
pub fn fetch_dirty(h: &VmHandles) -> Result<Vec<Vec<u64>>, kvm_ioctls::Error> {
    h.slots
        .iter()
        .map(|s| h.vm.get_dirty_log(s.slot, s.len as usize))
        .collect()
}

/// Pages set in `maps`.
pub fn count_dirty(maps: &[Vec<u64>]) -> u64 {
    maps.iter()
        .flat_map(|m| m.iter())
        .map(|w| u64::from(w.count_ones()))
        .sum()
}

/// ORs `b` into `a`.
pub fn merge(a: &mut [Vec<u64>], b: &[Vec<u64>]) {
    for (x, y) in a.iter_mut().zip(b) {
        for (p, q) in x.iter_mut().zip(y) {
            *p |= q;
        }
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::Bytes;

    use super::*;
    use crate::migration::wire::{read_message, Message};

    #[test]
    fn zero_pages_are_skipped_and_runs_coalesce() {
        let mem = crate::memory::create_guest_memory(8 << 20).unwrap();
        mem.write_slice(&[1; 8192], GuestAddress(0x10000)).unwrap();
        mem.write_slice(&[2; 10], GuestAddress(0x20000)).unwrap();
        let mut out = Vec::new();
        let mut s = RamSender::default();
        s.send_range(&mut out, &mem, 0, 8 << 20, true).unwrap();
        assert_eq!(s.sent.pages, 3);
        let dst = crate::memory::create_guest_memory(8 << 20).unwrap();
        let mut r = out.as_slice();
        let mut buf = Vec::new();
        let mut runs = 0;
        while let Ok(Message::Ram { gpa, data }) = read_message(&mut r, &mut buf) {
            crate::migration::wire::apply_ram(&dst, gpa, data).unwrap();
            runs += 1;
        }
        assert_eq!(runs, 2);
        let mut a = vec![0u8; 8 << 20];
        let mut b = vec![0u8; 8 << 20];
        mem.read_slice(&mut a, GuestAddress(0)).unwrap();
        dst.read_slice(&mut b, GuestAddress(0)).unwrap();
        assert!(a == b);

        let slot = Slot {
            slot: 0,
            gpa: 0,
            len: 8 << 20,
            hva: 0,
        };
        let mut bitmap = vec![0u64; (8 << 20) / 4096 / 64];
        bitmap[0] = 0b1011;
        let mut out = Vec::new();
        let mut s = RamSender::default();
        s.send_dirty(&mut out, &mem, &slot, &bitmap).unwrap();
        assert_eq!(s.sent.pages, 3);
        assert_eq!(count_dirty(&[bitmap]), 3);
    }
}
