//! `StorageArray<T>`: an array of plain values laid out at a byte offset of the namespace
//! and read through the cache, as BaM's `bam::array<T>`. Kernels index it like memory;
//! a warp's lanes that fall in the same line share one reference (and one I/O on a miss).

use crate::cache::{LineRef, PageCache};

use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::sync::Arc;

/// Lanes per warp in the host-thread simulation of GPU kernels.
pub const WARP: usize = 32;

mod sealed {
    pub trait Sealed {}
}

/// Plain values any bit pattern of which is valid, so they can be read straight out of a
/// cache line.
pub trait Element: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The value widened (or bit-cast) to u64, for reductions.
    fn to_u64(self) -> u64;
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            fn to_u64(self) -> u64 { self as u64 }
        }
    )*};
}
element!(u8, u16, u32, u64, i32, i64);

impl sealed::Sealed for f32 {}
impl Element for f32 {
    fn to_u64(self) -> u64 {
        self.to_bits() as u64
    }
}
impl sealed::Sealed for f64 {}
impl Element for f64 {
    fn to_u64(self) -> u64 {
        self.to_bits()
    }
}

pub struct StorageArray<T: Element> {
    cache: Arc<PageCache>,
    base: u64,
    len: u64,
    _t: PhantomData<T>,
}

impl<T: Element> Clone for StorageArray<T> {
    fn clone(&self) -> Self {
        StorageArray {
            cache: self.cache.clone(),
            base: self.base,
            len: self.len,
            _t: PhantomData,
        }
    }
}

impl<T: Element> StorageArray<T> {
    /// `len` elements starting at byte `base` of the namespace.
    pub fn new(cache: Arc<PageCache>, base: u64, len: u64) -> Result<Self> {
        let size = std::mem::size_of::<T>() as u64;
        if base % size != 0 || cache.line_size() as u64 % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "array base {base} and line size {} must be multiples of the {size}-byte element",
                cache.line_size()
            )));
        }
        let bytes = len.checked_mul(size).and_then(|b| b.checked_add(base));
        if bytes.is_none_or(|end| end > cache.namespace().bytes()) {
            return Err(Error::OutOfRange {
                offset: base,
                len: len.saturating_mul(size),
                size: cache.namespace().bytes(),
            });
        }
        Ok(StorageArray {
            cache,
            base,
            len,
            _t: PhantomData,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn cache(&self) -> &Arc<PageCache> {
        &self.cache
    }

    fn locate(&self, i: u64) -> Result<(u64, usize)> {
        if i >= self.len {
            return Err(Error::OutOfRange {
                offset: i,
                len: 1,
                size: self.len,
            });
        }
        let byte = self.base + i * std::mem::size_of::<T>() as u64;
        let line = self.cache.line_size() as u64;
        Ok((byte / line, (byte % line) as usize))
    }

    fn read_at(line: &LineRef<'_>, off: usize) -> T {
        // SAFETY: off + size_of::<T>() <= line size (element-aligned lines, checked in
        // `new`); the line is pinned and was filled before it became valid.
        unsafe { std::ptr::read_unaligned(line.as_ptr().add(off) as *const T) }
    }

    /// One element (one thread's access).
    pub fn get(&self, i: u64) -> Result<T> {
        let (page, off) = self.locate(i)?;
        let line = self.cache.acquire(page)?;
        Ok(Self::read_at(&line, off))
    }

    /// A warp's access: `idx[lane]` for each lane into `out[lane]`. Lanes are grouped by
    /// line; each group takes one reference (one I/O on a miss) and releases it before
    /// the next, so a warp never pins more than one line and cannot starve the cache.
    pub fn warp_get(&self, idx: &[u64], out: &mut [T]) -> Result<()> {
        if out.len() < idx.len() {
            return Err(Error::InvalidArgument(format!(
                "{} lanes but room for {} results",
                idx.len(),
                out.len()
            )));
        }
        let mut lanes: Vec<(u64, usize, usize)> = Vec::with_capacity(idx.len());
        for (lane, &i) in idx.iter().enumerate() {
            let (page, off) = self.locate(i)?;
            lanes.push((page, off, lane));
        }
        lanes.sort_unstable_by_key(|l| l.0);
        for group in lanes.chunk_by(|a, b| a.0 == b.0) {
            let line = self.cache.acquire(group[0].0)?;
            for &(_, off, lane) in group {
                out[lane] = Self::read_at(&line, off);
            }
        }
        Ok(())
    }

    /// `out.len()` consecutive elements from `start` (a coalesced warp read).
    pub fn read_range(&self, start: u64, out: &mut [T]) -> Result<()> {
        let mut i = 0usize;
        while i < out.len() {
            let (page, off) = self.locate(start + i as u64)?;
            let line = self.cache.acquire(page)?;
            let per_line = (self.cache.line_size() - off) / std::mem::size_of::<T>();
            let n = per_line.min(out.len() - i);
            for k in 0..n {
                out[i + k] = Self::read_at(&line, off + k * std::mem::size_of::<T>());
            }
            i += n;
        }
        Ok(())
    }
}
