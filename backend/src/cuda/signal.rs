//! A lone kernel's end as a word in host memory. Asking the driver whether a stream is done
//! (`cuStreamQuery`) costs 1.3–1.5 µs on the H200's host, so a wait that polls it notices a
//! kernel's end up to one query late, and on average most of a query late: a large part of
//! a null kernel's round trip. Here the stream writes a fresh value into a word of
//! pinned host memory once everything queued before it has finished
//! (`cuStreamWriteValue32`, queued right after the kernel while the GPU runs it), and the
//! wait reads the word with plain loads: the end is seen as soon as the GPU's write lands.
//! The write is ordered after the kernel and after its memory writes (the default flags
//! keep the memory barrier). A kernel that faults never lets the write happen: the wait
//! still asks the stream between its looks at the word once its first spin is over
//! (`hard_limit.rs`), and the stream reports the fault.
//!
//! The word is pinned host memory of the worker, which the vGPU's own kernels can reach by
//! address (docs/hostile.md, "Host memory mapped into a vGPU's context"). A kernel that
//! wrote the awaited value would end its own wait early, so the values are not a count: each
//! is a keyed hash of one ([`RandomState`], keys drawn per word from the OS), never the
//! word's current value, and kept in the worker's own memory, which no kernel reaches. A
//! kernel that writes the word at random matches one look in 2^32; at worst its wait ends
//! early and its kernel time is under-counted once.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{check, host_device_pointer, Completion, Context, CuError, Stream};

/// Bytes allocated for the word: one cache line, so that nothing else shares the line the
/// GPU writes.
const WORD_BYTES: usize = 64;

/// A pinned host word a stream can write, and the last value asked of it.
#[derive(Debug)]
pub struct Signal {
    /// The host mapping of the word (`cuMemAllocHost`: pinned, mapped for the device).
    word: *mut u32,
    /// The device's address of the same word.
    dev: sys::CUdeviceptr,
    /// The value the last [`Signal::arm`] asked the stream to write.
    last: u32,
    /// Writes asked for so far: what the next value is hashed from.
    count: u64,
    /// The keys of the values' hash.
    keys: RandomState,
    ctx: Arc<Context>,
}

// SAFETY: the word is this value's own pinned allocation, freed once in Drop with its
// context bound; the pointer is only read through an atomic.
unsafe impl Send for Signal {}

impl Signal {
    /// A fresh word in `ctx` (which the caller has bound).
    pub fn new(ctx: &Arc<Context>) -> Result<Self, CuError> {
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        check(
            // SAFETY: writes one host pointer into `p`.
            unsafe { sys::cuMemAllocHost_v2(&mut p, WORD_BYTES) },
            "cuMemAllocHost",
        )?;
        let word = p.cast::<u32>();
        // SAFETY: `word` points to WORD_BYTES bytes of fresh host memory, aligned for a u32
        // (the driver hands out page-aligned pinned memory); no stream writes it yet.
        unsafe { word.write_volatile(0) };
        let dev = match host_device_pointer(p) {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: frees the allocation made above, which nothing else holds.
                let _ = unsafe { sys::cuMemFreeHost(p) };
                return Err(e);
            }
        };
        Ok(Self {
            word,
            dev,
            last: 0,
            count: 0,
            keys: RandomState::new(),
            ctx: ctx.clone(),
        })
    }

    /// Queues on `stream`, after everything queued there, the write of a new value, and
    /// returns what tells that it was written.
    pub fn arm<'a>(&'a mut self, stream: &'a Stream) -> Result<Armed<'a>, CuError> {
        let now = self.load();
        let value = next_value(&self.keys, &mut self.count, now);
        check(
            // SAFETY: `stream` is live in this signal's context, and `dev` is the device
            // address of this value's own pinned word, which outlives the write (Drop frees
            // it only once the last write asked for has landed).
            unsafe {
                sys::cuStreamWriteValue32_v2(
                    stream.raw(),
                    self.dev,
                    value,
                    sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                )
            },
            "cuStreamWriteValue32",
        )?;
        self.last = value;
        Ok(Armed {
            signal: self,
            value,
            stream,
        })
    }

    /// How many writes were asked for, the value last asked for and the value in the word
    /// now.
    #[cfg(test)]
    pub fn seen(&self) -> (u64, u32, u32) {
        (self.count, self.last, self.load())
    }

    fn load(&self) -> u32 {
        // SAFETY: `word` is this value's live, aligned allocation; the GPU writes it
        // whole, and every host access to it is atomic.
        unsafe { AtomicU32::from_ptr(self.word) }.load(Ordering::Acquire)
    }
}

/// The next value to ask for: the keyed hash of the next count that differs from `now`,
/// the word's current value (so that the word cannot already hold it).
fn next_value(keys: &RandomState, count: &mut u64, now: u32) -> u32 {
    loop {
        *count = count.wrapping_add(1);
        // The hash's low half: a keyed hash's bits are all as unpredictable.
        let v = keys.hash_one(*count) as u32;
        if v != now {
            return v;
        }
    }
}

impl Drop for Signal {
    fn drop(&mut self) {
        // A write asked for and not seen (its wait ended in an error) might still land:
        // the line is left allocated rather than freed under the GPU.
        if self.load() != self.last {
            tracing::debug!("a host word's last write has not landed; it stays allocated");
            return;
        }
        if self.ctx.bind().is_err() {
            return;
        }
        // SAFETY: frees our own pinned allocation once, after the last write asked of it
        // landed (checked above), so no queued write targets it.
        let _ = unsafe { sys::cuMemFreeHost(self.word.cast()) };
    }
}

/// A stream whose work up to a [`Signal`]'s write is awaited.
pub struct Armed<'a> {
    signal: &'a Signal,
    value: u32,
    stream: &'a Stream,
}

impl Completion for Armed<'_> {
    /// The word, else the stream. The word comes first: the driver may still call the
    /// stream busy for a moment after the write landed.
    fn finished(&self) -> Result<bool, CuError> {
        if self.signalled() == Some(true) {
            return Ok(true);
        }
        self.stream.finished()
    }

    fn signalled(&self) -> Option<bool> {
        Some(self.signal.load() == self.value)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;
    use std::collections::HashSet;

    use super::next_value;

    #[test]
    fn values_are_never_the_word_s_own_and_follow_no_count() {
        let keys = RandomState::new();
        let mut count = 0;
        let mut now = 0;
        let mut seen = HashSet::new();
        let mut steps = HashSet::new();
        for _ in 0..1000 {
            let v = next_value(&keys, &mut count, now);
            assert_ne!(v, now, "a value the word already holds");
            steps.insert(v.wrapping_sub(now));
            seen.insert(v);
            now = v;
        }
        assert!(seen.len() > 990, "{} distinct values of 1000", seen.len());
        assert!(
            steps.len() > 990,
            "values a fixed step apart: {} steps",
            steps.len()
        );
        // Another word's keys give other values for the same counts.
        let (mut a, mut b) = (0, 0);
        let (ka, kb) = (RandomState::new(), RandomState::new());
        let same = (0..64)
            .filter(|_| next_value(&ka, &mut a, 0) == next_value(&kb, &mut b, 0))
            .count();
        assert!(same < 4, "{same} of 64 values alike under other keys");
    }

    #[test]
    fn a_value_equal_to_the_word_is_skipped() {
        let keys = RandomState::new();
        let mut probe = 0;
        let first = next_value(&keys, &mut probe, 0);
        let mut count = 0;
        let v = next_value(&keys, &mut count, first);
        assert_ne!(v, first);
        assert_eq!(
            count, 2,
            "the count that hashed to the word's value was passed over"
        );
    }
}
