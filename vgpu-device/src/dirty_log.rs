//! The dirty log of the guest memory the device writes, for a live migration of the VM
//! (vhost-user's `LOG_SHMFD`/`SET_LOG_BASE`): vhost-user-backend's log region, behind one
//! flag that says whether a log was set.
//!
//! vhost-user-backend's own bitmap (`BitmapMmapRegion`) shares one `Arc` and one `RwLock`
//! among every access to a region: each guest memory access clones and drops the `Arc`
//! and each write takes the lock, atomic read-modify-writes on cache lines that every
//! thread of the worker touching guest memory (queue threads, launch runners) passes
//! between them, on every request. This bitmap hands out plain references (`RefSlice`),
//! and a write reads one flag while no log is set, which is all the time but a live
//! migration.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapMmapRegion, BitmapReplace};
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;

/// One guest memory region's dirty log (clones share it).
#[derive(Default, Debug, Clone)]
pub struct DirtyLog {
    /// Set once the frontend handed a log over (it stays set, as the log does).
    logging: Arc<AtomicBool>,
    /// The log, checked against the region when it is set (vhost-user-backend's).
    log: BitmapMmapRegion,
}

impl<'a> WithBitmapSlice<'a> for DirtyLog {
    type S = RefSlice<'a, Self>;
}

impl Bitmap for DirtyLog {
    fn mark_dirty(&self, offset: usize, len: usize) {
        if self.logging.load(Ordering::Acquire) {
            self.log.mark_dirty(offset, len);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.logging.load(Ordering::Acquire) && self.log.dirty_at(offset)
    }

    fn slice_at(&self, offset: usize) -> RefSlice<'_, Self> {
        RefSlice::new(self, offset)
    }
}

impl BitmapReplace for DirtyLog {
    type InnerBitmap = AtomicBitmapMmap;

    fn replace(&self, bitmap: AtomicBitmapMmap) {
        self.log.replace(bitmap);
        // After the log: a writer that sees the flag finds the log in place.
        self.logging.store(true, Ordering::Release);
    }
}

impl NewBitmap for DirtyLog {
    fn with_len(len: usize) -> Self {
        Self {
            logging: Arc::default(),
            log: BitmapMmapRegion::with_len(len),
        }
    }
}
