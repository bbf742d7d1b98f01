//! The emulated controller's I/O engines: io_uring (the default), and plain
//! preadv/pwritev where the kernel or a seccomp profile refuses io_uring.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Which engine moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum EngineKind {
    IoUring,
    /// Synchronous preadv/pwritev on the controller thread.
    Sync,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoKind {
    Read,
    Write,
    Flush,
}

/// One request; `iov` points at an array that stays put until the request completes.
pub(crate) struct IoReq {
    pub tag: u64,
    pub kind: IoKind,
    pub offset: u64,
    pub iov: *const libc::iovec,
    pub n_iov: u32,
}

pub(crate) trait Engine: Send {
    /// Queue a request; false if the engine has no room (retry after reaping).
    fn push(&mut self, req: IoReq) -> bool;
    /// Hand queued requests to the kernel without waiting.
    fn submit(&mut self);
    /// Collect finished requests as (tag, result): bytes moved or -errno.
    fn reap(&mut self, out: &mut Vec<(u64, i32)>);
    /// Block until something completes or `timeout` passes.
    fn wait(&mut self, timeout: Duration);
}

pub(crate) fn open(kind: EngineKind, file: &File, entries: u32) -> (Box<dyn Engine>, EngineKind) {
    if kind == EngineKind::IoUring {
        match io_uring::IoUring::new(entries) {
            Ok(ring) => {
                return (
                    Box::new(Uring {
                        ring,
                        fd: file.as_raw_fd(),
                        queued: 0,
                    }),
                    EngineKind::IoUring,
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; the emulated controller falls back to preadv")
            }
        }
    }
    (
        Box::new(SyncEngine {
            fd: file.as_raw_fd(),
            done: Vec::new(),
        }),
        EngineKind::Sync,
    )
}

struct Uring {
    ring: io_uring::IoUring,
    fd: i32,
    queued: u32,
}

impl Engine for Uring {
    fn push(&mut self, req: IoReq) -> bool {
        use io_uring::{opcode, types::Fd};
        let fd = Fd(self.fd);
        let entry = match (req.kind, req.n_iov) {
            (IoKind::Flush, _) => opcode::Fsync::new(fd).build(),
            (IoKind::Read, 1) => {
                // SAFETY: iov points at a live iovec (IoReq contract).
                let v = unsafe { *req.iov };
                opcode::Read::new(fd, v.iov_base as *mut u8, v.iov_len as u32)
                    .offset(req.offset)
                    .build()
            }
            (IoKind::Write, 1) => {
                // SAFETY: as above.
                let v = unsafe { *req.iov };
                opcode::Write::new(fd, v.iov_base as *const u8, v.iov_len as u32)
                    .offset(req.offset)
                    .build()
            }
            (IoKind::Read, n) => opcode::Readv::new(fd, req.iov, n)
                .offset(req.offset)
                .build(),
            (IoKind::Write, n) => opcode::Writev::new(fd, req.iov, n)
                .offset(req.offset)
                .build(),
        }
        .user_data(req.tag);
        // SAFETY: the buffers and the iovec array stay valid until the completion for this
        // tag is reaped (the device keeps the op, and the DMA window keeps the memory).
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.submit();
            // SAFETY: as above.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                return false;
            }
        }
        self.queued += 1;
        true
    }

    fn submit(&mut self) {
        if self.queued > 0 {
            match self.ring.submit() {
                Ok(_) => self.queued = 0,
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring submit failed; retrying on the next pass")
                }
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        for cqe in self.ring.completion() {
            out.push((cqe.user_data(), cqe.result()));
        }
    }

    fn wait(&mut self, timeout: Duration) {
        let ts = io_uring::types::Timespec::from(timeout);
        let args = io_uring::types::SubmitArgs::new().timespec(&ts);
        // ETIME on timeout is the expected outcome, not an error.
        let _ = self.ring.submitter().submit_with_args(1, &args);
        self.queued = 0;
    }
}

struct SyncEngine {
    fd: i32,
    done: Vec<(u64, i32)>,
}

impl Engine for SyncEngine {
    fn push(&mut self, req: IoReq) -> bool {
        // SAFETY: fd is the open backing file; iov points at `n_iov` live iovecs whose
        // buffers are mapped DMA memory (IoReq contract).
        let r = unsafe {
            match req.kind {
                IoKind::Read => libc::preadv(self.fd, req.iov, req.n_iov as i32, req.offset as i64),
                IoKind::Write => {
                    libc::pwritev(self.fd, req.iov, req.n_iov as i32, req.offset as i64)
                }
                IoKind::Flush => libc::fsync(self.fd) as isize,
            }
        };
        let res = if r < 0 {
            -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        } else {
            r as i32
        };
        self.done.push((req.tag, res));
        true
    }
    fn submit(&mut self) {}
    fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        out.append(&mut self.done);
    }
    fn wait(&mut self, _timeout: Duration) {}
}
