//! The dirty log of one guest memory region as the device marks it: vhost-user-backend's
//! log ([`BitmapMmapRegion`], the frontend's `SET_LOG_BASE`) behind a flag that says
//! whether there is one.
//!
//! Every guest-memory access through vm-memory takes a slice of the region's bitmap, and
//! every write marks the pages it wrote. vhost-user-backend's own bitmap clones an `Arc`
//! for each slice and takes an `RwLock` for each mark, even while no log is set: four
//! atomic read-modify-writes on one shared line per access, a few hundred nanoseconds of
//! every request's path. Here a slice is a reference, and a mark reads one flag; the
//! log's lock is taken only while a log is set (a whole-VM migration).
//!
//! A write and the log: vm-memory marks after it writes. The mark fences, then reads the
//! flag. The frontend's log goes in (flag set) before vhost-user-backend answers
//! `SET_LOG_BASE`, and the frontend copies pages only after that answer. So a write whose
//! mark saw no log was visible before the log went in, and the frontend's first pass over
//! the page copies it.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapMmapRegion, BitmapReplace};
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;

/// One region's dirty log: vhost-user-backend's, and whether the frontend set one. Clones
/// share it (vhost-user-backend's bitmap type must clone); slices borrow it.
#[derive(Clone, Debug, Default)]
pub struct DirtyLog(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    /// Set once the frontend's log is in place; a new memory table starts without one.
    on: AtomicBool,
    log: BitmapMmapRegion,
}

impl DirtyLog {
    /// Whether the frontend set a log for this region.
    pub fn is_on(&self) -> bool {
        self.0.on.load(Ordering::Acquire)
    }
}

impl<'a> WithBitmapSlice<'a> for DirtyLog {
    type S = RefSlice<'a, Self>;
}

impl Bitmap for DirtyLog {
    fn mark_dirty(&self, offset: usize, len: usize) {
        // The write this mark covers is ordered before the flag is read (module docs).
        fence(Ordering::SeqCst);
        if self.0.on.load(Ordering::Relaxed) {
            self.0.log.mark_dirty(offset, len);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.is_on() && self.0.log.dirty_at(offset)
    }

    fn slice_at(&self, offset: usize) -> <Self as WithBitmapSlice<'_>>::S {
        RefSlice::new(self, offset)
    }
}

impl BitmapReplace for DirtyLog {
    type InnerBitmap = AtomicBitmapMmap;

    fn replace(&self, bitmap: AtomicBitmapMmap) {
        self.0.log.replace(bitmap);
        self.0.on.store(true, Ordering::SeqCst);
    }
}

impl NewBitmap for DirtyLog {
    fn with_len(_len: usize) -> Self {
        Self::default()
    }
}
