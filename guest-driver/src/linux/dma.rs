//! DMA memory for the device: physically contiguous chunks (2 MiB hugepages, or one region
//! reserved with `memmap=` and mapped through `/dev/mem`), carved up first-fit.

use std::ptr::NonNull;

use super::mapping::Mapping;

/// One physically contiguous chunk and its free ranges (offset, length), sorted.
#[derive(Debug)]
pub struct Chunk {
    map: Mapping,
    phys: u64,
    free: Vec<(usize, usize)>,
}

impl Chunk {
    /// `map` must be physically contiguous from `phys`.
    pub fn new(map: Mapping, phys: u64) -> Self {
        let len = map.len();
        Chunk {
            map,
            phys,
            free: vec![(0, len)],
        }
    }

    pub fn phys(&self) -> u64 {
        self.phys
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes not handed out.
    pub fn free_bytes(&self) -> usize {
        self.free.iter().map(|&(_, l)| l).sum()
    }

    /// Takes `len` bytes whose *physical* address is `align`-aligned; their offset.
    fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        let align = align.max(1);
        for i in 0..self.free.len() {
            let (start, flen) = self.free[i];
            let phys = self.phys.checked_add(start as u64)?;
            let pad = (phys.next_multiple_of(align as u64) - phys) as usize;
            if pad.checked_add(len)? > flen {
                continue;
            }
            let at = start + pad;
            let rest = flen - pad - len;
            self.free.remove(i);
            if rest > 0 {
                self.free.insert(i, (at + len, rest));
            }
            if pad > 0 {
                self.free.insert(i, (start, pad));
            }
            return Some(at);
        }
        None
    }

    /// Gives back `len` bytes at `offset`, merging neighbours.
    fn give(&mut self, offset: usize, len: usize) {
        let pos = self.free.partition_point(|&(s, _)| s < offset);
        self.free.insert(pos, (offset, len));
        // Merge with the next, then the previous.
        if pos + 1 < self.free.len() && self.free[pos].0 + self.free[pos].1 == self.free[pos + 1].0
        {
            self.free[pos].1 += self.free[pos + 1].1;
            self.free.remove(pos + 1);
        }
        if pos > 0 && self.free[pos - 1].0 + self.free[pos - 1].1 == self.free[pos].0 {
            self.free[pos - 1].1 += self.free[pos].1;
            self.free.remove(pos);
        }
    }
}

/// The chunks of one transport.
#[derive(Debug, Default)]
pub struct Pool {
    chunks: Vec<Chunk>,
    /// Live allocations: (chunk, offset, rounded length), for dma_free.
    live: Vec<(usize, usize, usize)>,
}

/// Allocations are rounded to this many bytes.
const GRAIN: usize = 64;

impl Pool {
    pub fn add(&mut self, chunk: Chunk) {
        self.chunks.push(chunk);
    }

    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// Zeroed memory: (CPU pointer, physical address).
    pub fn alloc(&mut self, len: usize, align: usize) -> Option<(NonNull<u8>, u64)> {
        if !align.is_power_of_two() {
            return None;
        }
        let rounded = len.max(1).checked_next_multiple_of(GRAIN)?;
        for (ci, c) in self.chunks.iter_mut().enumerate() {
            if let Some(off) = c.take(rounded, align) {
                // SAFETY: off + rounded lies inside the chunk's mapping (take checked it).
                let ptr = unsafe { c.map.base().add(off) };
                // SAFETY: the range is ours alone now (just taken from the free list).
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, rounded) };
                self.live.push((ci, off, rounded));
                return Some((ptr, c.phys + off as u64));
            }
        }
        None
    }

    /// Returns an allocation by its CPU pointer; false if it is not one of ours.
    pub fn free(&mut self, ptr: *const u8) -> bool {
        let found = self
            .live
            .iter()
            .position(|&(ci, off, _)| self.chunks[ci].map.offset_of(ptr, 0) == Some(off));
        match found {
            Some(i) => {
                let (ci, off, len) = self.live.swap_remove(i);
                self.chunks[ci].give(off, len);
                true
            }
            None => false,
        }
    }

    /// The physical address of `ptr..ptr + len` if it lies inside one chunk.
    pub fn phys(&self, ptr: *const u8, len: usize) -> Option<u64> {
        self.chunks
            .iter()
            .find_map(|c| c.map.offset_of(ptr, len).map(|off| c.phys + off as u64))
    }
}
