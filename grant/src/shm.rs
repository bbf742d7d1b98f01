//! The shared grant page: counters the worker and daemon each own half of, and a
//! single-producer ring of completions (the worker's threads take turns producing).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use vgpu_scheduler::gpu::Resource;
use vgpu_scheduler::Nanos;

use crate::GrantError;

pub const MAGIC: u64 = 0x4752_414e_5447_5056; // "VPGTNARG"
pub const VERSION: u32 = 1;
/// Completions the ring holds; a worker with more outstanding waits for the daemon.
pub const SLOTS: u32 = 4096;

/// The open bit of a lease word.
pub const LEASE_OPEN: u64 = 1 << 63;
/// The quiet bit of a lease word: the daemon sets it beside the open bit while the holder
/// is alone on the resource (no other vGPU waits for it). A worker then starts requests
/// under the lease and pushes their completions without ringing the doorbell; the daemon
/// reads the page at each of its wake-ups instead, and clears the bit (then reads the
/// page once more) as soon as another vGPU asks, from when on every start and completion
/// rings again.
pub const LEASE_QUIET: u64 = 1 << 62;
/// The count bits of a lease word: requests started under the lease.
pub const LEASE_COUNT: u64 = LEASE_QUIET - 1;

/// Resource index into the counters.
pub fn index(r: Resource) -> usize {
    match r {
        Resource::Compute => 0,
        Resource::Copy => 1,
    }
}

pub fn resource(i: u32) -> Option<Resource> {
    match i {
        0 => Some(Resource::Compute),
        1 => Some(Resource::Copy),
        _ => None,
    }
}

/// One completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    pub resource: u32,
    pub _pad: u32,
    pub started: Nanos,
    pub finished: Nanos,
}

#[repr(C, align(64))]
struct Line<T>(T);

/// The worker's line: what it asks for, and when its running work should end.
#[repr(C)]
struct Asks {
    /// Requests the worker wants to start, per resource.
    submitted: [AtomicU64; 2],
    /// When the request it runs on each resource is expected to end (CLOCK_MONOTONIC ns
    /// of [`crate::time::now`]; 0: no estimate). A hint only: the daemon times its own
    /// polling for the completion with it (a hand-over without two wake-ups) and
    /// accounts nothing by it. It fits the line's padding, so the page keeps its layout.
    ends_at: [AtomicU64; 2],
}

/// The daemon's line: grants, and whether it polls for completions around their ends.
#[repr(C)]
struct Grants {
    /// Requests the daemon allowed, per resource (futex words).
    granted: [AtomicU32; 2],
    /// Non-zero when the daemon polls for a holder's completion around its end estimate:
    /// only then is a granted worker's estimate worth a doorbell. In the line's padding.
    polls: AtomicU32,
}

#[repr(C)]
struct Layout {
    magic: u64,
    version: u32,
    _pad: u32,
    /// Worker writes.
    submitted: Line<Asks>,
    /// Daemon writes.
    granted: Line<Grants>,
    /// Lease words: bit 63 set while the worker holds the resource and may start requests
    /// without a grant; bit 62 ([`LEASE_QUIET`]) set while it holds it alone; the low bits
    /// count every request so started (the worker adds one with a compare-and-swap that
    /// only succeeds while the open bit is set). The daemon closes a lease by clearing
    /// both bits, which tells it exactly how many requests started under it: no start can
    /// slip past the close.
    lease: Line<[AtomicU64; 2]>,
    /// Ring of completions: worker produces at `tail`, daemon consumes at `head`.
    head: Line<AtomicU32>,
    tail: Line<AtomicU32>,
    slots: [Completion; SLOTS as usize],
}

/// A mapping of the grant page.
pub struct Page {
    ptr: NonNull<Layout>,
    file: File,
    /// Serialises this process's producers. The ring has one producer as the daemon sees
    /// it, the worker, but a worker completes requests from every queue's thread at once
    /// (each stream runs on its own thread). `push` reads the tail, writes the slot and
    /// stores the tail plus one: two threads in there together write the same slot and
    /// lose a completion (the scheduler then counts that request as running for ever,
    /// so the vGPU never goes idle and BAND never passes the GPU on: its neighbour
    /// starves), or one preempted between its read and its store moves the tail back
    /// over completions the daemon already took, which reads as a ring holding more
    /// than it can, and the daemon expels the worker. Under this lock the ring stays
    /// single-producer; an uncontended lock costs one compare-and-swap per completion.
    push_lock: std::sync::Mutex<()>,
}

// SAFETY: the page is only accessed through atomics and volatile slot reads/writes whose
// ownership the SPSC protocol gives to exactly one side at a time (this process's
// producers take turns under `push_lock`).
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

const LEN: usize = std::mem::size_of::<Layout>();

impl Page {
    /// A fresh page in a new memfd (the daemon's side).
    pub fn create() -> Result<Self, GrantError> {
        // SAFETY: a valid NUL-terminated name and flags.
        let fd = unsafe { libc::memfd_create(c"vgpu-grant".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(GrantError::Os {
                what: "memfd_create",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is a new descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(LEN as u64)
            .map_err(GrantError::os("sizing the grant page"))?;
        let page = Self::map(file)?;
        // SAFETY: the mapping is LEN bytes, writable, and nobody else has it yet.
        unsafe {
            std::ptr::addr_of_mut!((*page.ptr.as_ptr()).magic).write(MAGIC);
            std::ptr::addr_of_mut!((*page.ptr.as_ptr()).version).write(VERSION);
        }
        Ok(page)
    }

    /// Maps a page received from the daemon (the worker's side).
    pub fn open(fd: OwnedFd) -> Result<Self, GrantError> {
        let file = File::from(fd);
        let len = file
            .metadata()
            .map_err(GrantError::os("inspecting the grant page"))?
            .len();
        if len < LEN as u64 {
            return Err(GrantError::BadPage);
        }
        let page = Self::map(file)?;
        if page.layout().magic != MAGIC || page.layout().version != VERSION {
            return Err(GrantError::BadPage);
        }
        Ok(page)
    }

    fn map(file: File) -> Result<Self, GrantError> {
        // SAFETY: mapping LEN bytes of a file at least that long, shared, read/write; the
        // result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(GrantError::Os {
                what: "mmap of the grant page",
                source: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(p.cast::<Layout>()).ok_or(GrantError::BadPage)?;
        Ok(Self {
            ptr,
            file,
            push_lock: std::sync::Mutex::new(()),
        })
    }

    fn layout(&self) -> &Layout {
        // SAFETY: the mapping lives as long as self, is LEN bytes and suitably aligned
        // (mmap returns page-aligned memory); fields are atomics or written only through
        // volatile accesses.
        unsafe { self.ptr.as_ref() }
    }

    /// The memfd, to hand to the worker.
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn submitted(&self, r: Resource) -> &AtomicU64 {
        &self.layout().submitted.0.submitted[index(r)]
    }

    /// The worker's estimate of when its running request on `r` ends (0: none).
    pub fn ends_at(&self, r: Resource) -> &AtomicU64 {
        &self.layout().submitted.0.ends_at[index(r)]
    }

    /// Daemon: whether the worker has pushed a completion not taken yet (the daemon's
    /// poll while a hand-over is due; `pop` checks what it finds).
    pub fn has_completions(&self) -> bool {
        let l = self.layout();
        l.tail.0.load(Ordering::Acquire) != l.head.0.load(Ordering::Relaxed)
    }

    /// Completions in the ring not taken yet (at most the ring's size; a tail that claims
    /// more is `pop`'s to report). The daemon's count of what it has to read; the worker's
    /// of how full its ring is.
    pub fn queued(&self) -> u64 {
        let l = self.layout();
        let n = l
            .tail
            .0
            .load(Ordering::Acquire)
            .wrapping_sub(l.head.0.load(Ordering::Relaxed));
        u64::from(n.min(SLOTS))
    }

    pub fn granted(&self, r: Resource) -> &AtomicU32 {
        &self.layout().granted.0.granted[index(r)]
    }

    /// Whether the daemon polls around end estimates (it sets this at attach).
    pub fn polls(&self) -> &AtomicU32 {
        &self.layout().granted.0.polls
    }

    pub fn lease(&self, r: Resource) -> &AtomicU64 {
        &self.layout().lease.0[index(r)]
    }

    /// Worker: appends a completion; false when the ring is full. Safe to call from
    /// several threads at once (see `push_lock`).
    pub fn push(&self, c: Completion) -> bool {
        let _one = vgpu_sync::lock(&self.push_lock);
        let l = self.layout();
        let tail = l.tail.0.load(Ordering::Relaxed);
        let head = l.head.0.load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= SLOTS {
            return false;
        }
        let slot = (tail % SLOTS) as usize;
        // SAFETY: slot < SLOTS; the slot between head and tail+1 belongs to the producer
        // (this thread, under `push_lock`) until the Release store below publishes it.
        unsafe {
            std::ptr::addr_of!(l.slots[slot])
                .cast_mut()
                .write_volatile(c)
        };
        l.tail.0.store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Daemon: takes the oldest completion. `Err` when the worker's tail is impossible
    /// (more entries than the ring holds).
    pub fn pop(&self) -> Result<Option<Completion>, GrantError> {
        let l = self.layout();
        let head = l.head.0.load(Ordering::Relaxed);
        let tail = l.tail.0.load(Ordering::Acquire);
        let n = tail.wrapping_sub(head);
        if n == 0 {
            return Ok(None);
        }
        if n > SLOTS {
            return Err(GrantError::Untrusted(format!(
                "its completion ring claims {n} entries (head {head}, tail {tail}), more than the {SLOTS} it holds"
            )));
        }
        let slot = (head % SLOTS) as usize;
        // SAFETY: slot < SLOTS and was published by the producer's Release store of tail.
        let c = unsafe { std::ptr::addr_of!(l.slots[slot]).read_volatile() };
        l.head.0.store(head.wrapping_add(1), Ordering::Release);
        Ok(Some(c))
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`; nothing borrows it past self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), LEN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_fills_and_drains_in_order() {
        let page = Page::create().unwrap();
        for i in 0..SLOTS {
            assert!(page.push(Completion {
                resource: 0,
                _pad: 0,
                started: u64::from(i),
                finished: 0
            }));
        }
        assert!(!page.push(Completion::default()), "full");
        for i in 0..SLOTS {
            assert_eq!(page.pop().unwrap().unwrap().started, u64::from(i));
        }
        assert_eq!(page.pop().unwrap(), None);
    }

    #[test]
    fn a_second_mapping_sees_the_same_page() {
        let a = Page::create().unwrap();
        let fd: OwnedFd = a.file().try_clone().unwrap().into();
        let b = Page::open(fd).unwrap();
        a.granted(Resource::Copy).store(7, Ordering::SeqCst);
        assert_eq!(b.granted(Resource::Copy).load(Ordering::SeqCst), 7);
        assert!(b.push(Completion {
            resource: 1,
            _pad: 0,
            started: 1,
            finished: 2
        }));
        assert_eq!(a.pop().unwrap().unwrap().finished, 2);
    }

    #[test]
    fn the_end_estimate_fits_the_worker_line() {
        // The estimate lives in the submitted line's padding: every other field keeps its
        // offset, so a daemon and a worker of different builds still agree on the page.
        assert_eq!(std::mem::size_of::<Line<Asks>>(), 64);
        assert_eq!(std::mem::size_of::<Line<Grants>>(), 64);
        assert_eq!(std::mem::offset_of!(Layout, granted), 128);
        assert_eq!(std::mem::offset_of!(Layout, lease), 192);
        let a = Page::create().unwrap();
        let fd: OwnedFd = a.file().try_clone().unwrap().into();
        let b = Page::open(fd).unwrap();
        b.ends_at(Resource::Compute).store(42, Ordering::SeqCst);
        assert_eq!(a.ends_at(Resource::Compute).load(Ordering::SeqCst), 42);
        assert!(!a.has_completions());
        assert!(b.push(Completion::default()));
        assert!(a.has_completions());
    }

    #[test]
    fn a_corrupt_tail_is_detected() {
        let page = Page::create().unwrap();
        page.layout().tail.0.store(SLOTS + 5, Ordering::SeqCst);
        assert!(matches!(page.pop(), Err(GrantError::Untrusted(_))));
    }

    #[test]
    fn foreign_memory_is_refused() {
        // SAFETY: a valid name and flags.
        let fd = unsafe { libc::memfd_create(c"not-grant".as_ptr(), 0) };
        // SAFETY: fd is new and ours.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(LEN as u64).unwrap();
        assert!(matches!(Page::open(f.into()), Err(GrantError::BadPage)));
        // SAFETY: as above.
        let fd = unsafe { libc::memfd_create(c"short".as_ptr(), 0) };
        // SAFETY: as above.
        let f = unsafe { File::from_raw_fd(fd) };
        assert!(matches!(Page::open(f.into()), Err(GrantError::BadPage)));
    }
    #[test]
    fn concurrent_producers_lose_no_completion() {
        // A worker reports completions from every queue's thread at once: four streams
        // finishing together push into the ring concurrently, and the daemon pops while
        // they do. Every completion must arrive exactly once, and the ring must never look
        // corrupt (a tail that moved back reads as more entries than the ring holds).
        const THREADS: u64 = 4;
        const EACH: u64 = 500_000;
        let page = std::sync::Arc::new(Page::create().unwrap());
        let producers: Vec<_> = (0..THREADS)
            .map(|t| {
                let page = page.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let c = Completion {
                            resource: 0,
                            _pad: 0,
                            started: t,
                            finished: i,
                        };
                        while !page.push(c) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; THREADS as usize];
        let mut popped = 0;
        while popped < THREADS * EACH {
            match page.pop() {
                Ok(Some(c)) => {
                    let t = c.started as usize;
                    assert_eq!(
                        c.finished, next[t],
                        "producer {t}'s completions in order, each once"
                    );
                    next[t] += 1;
                    popped += 1;
                }
                Ok(None) if producers.iter().all(|p| p.is_finished()) => {
                    panic!("{popped} of {} completions arrived", THREADS * EACH)
                }
                Ok(None) => std::thread::yield_now(),
                Err(e) => panic!("the ring looked corrupt after {popped} completions: {e}"),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(page.pop().unwrap(), None, "nothing more than was pushed");
    }
}
