//! A per-request timeline, for finding where the time between two kernels goes.
//!
//! Off unless the worker's environment sets `VGPU_TIMELINE` to an existing directory the
//! worker may write to (vgpud passes its environment on to workers): then every
//! request served by a queue thread leaves one record (CSV, one line per request) in
//! `$VGPU_TIMELINE/timeline-<start>-<pid>.csv`, `<start>` the CLOCK_MONOTONIC time the
//! worker began recording (sandboxed workers each have pid 1 in their own pid namespace:
//! the start time keeps their files apart and sorts them in start order). Times are
//! CLOCK_MONOTONIC nanoseconds, the clock vgpud and every worker share, so files of
//! several workers line up. Columns:
//!
//! | column | when |
//! |---|---|
//! | `vgpu`, `queue` | the vGPU and the queue the request came on |
//! | `resource` | `compute`, `copy` or `none` (the request took no grant) |
//! | `kick` | the queue thread took the request off the available ring |
//! | `asked` | the device asked the gate for the GPU |
//! | `granted` | the gate let the request start; the backend call begins here |
//! | `backend_end` | the backend call returned (a kernel: its completion was noticed) |
//! | `released` | the grant was given back (the completion record is on its way) |
//! | `used` | the response is in the used ring and the guest was signalled if it asked (launches answered from inside the backend's call: before `backend_end`) |
//!
//! Stages a request skips (no grant) are 0. The records go to a buffer allocated once;
//! a thread writes it out every second (and [`flush`] writes it at once). When the buffer
//! is full, further records are counted as lost rather than allocated. When
//! `VGPU_TIMELINE` is unset, each hook costs one relaxed atomic load.

use std::cell::Cell;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use vgpu_grant::{Gate, Permit, Resource};

/// The environment variable naming the directory the timeline goes to.
pub const ENV: &str = "VGPU_TIMELINE";
/// Records kept between two writes.
const CAPACITY: usize = 1 << 16;
/// How often the writer thread empties the buffer.
const PERIOD: Duration = Duration::from_secs(1);
/// The CSV header.
pub const HEADER: &str = "vgpu,queue,resource,kick,asked,granted,backend_end,released,used";

/// One request's timeline (CLOCK_MONOTONIC ns; 0: the stage did not happen).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The vGPU.
    pub vgpu: u32,
    /// The queue.
    pub queue: u16,
    /// 0: none, 1: compute, 2: copy.
    pub resource: u8,
    /// Off the available ring.
    pub kick: u64,
    /// The gate was asked.
    pub asked: u64,
    /// The gate granted; the backend call starts.
    pub granted: u64,
    /// The backend call returned.
    pub backend_end: u64,
    /// The grant was released.
    pub released: u64,
    /// The used ring was written.
    pub used: u64,
}

impl Record {
    /// The resource's name, as in the CSV.
    pub fn resource_name(&self) -> &'static str {
        match self.resource {
            1 => "compute",
            2 => "copy",
            _ => "none",
        }
    }

    /// One CSV line (no newline).
    pub fn to_csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{}",
            self.vgpu,
            self.queue,
            self.resource_name(),
            self.kick,
            self.asked,
            self.granted,
            self.backend_end,
            self.released,
            self.used
        )
    }

    /// Parses a line written by [`Record::to_csv`]; None for the header or a bad line.
    pub fn from_csv(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != 9 {
            return None;
        }
        let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        Some(Self {
            vgpu: f.first()?.parse().ok()?,
            queue: f.get(1)?.parse().ok()?,
            resource: match *f.get(2)? {
                "compute" => 1,
                "copy" => 2,
                _ => 0,
            },
            kick: n(3)?,
            asked: n(4)?,
            granted: n(5)?,
            backend_end: n(6)?,
            released: n(7)?,
            used: n(8)?,
        })
    }
}

struct Sink {
    /// The worker's timeline file.
    path: PathBuf,
    buf: Mutex<Vec<Record>>,
    spare: Mutex<Vec<Record>>,
    lost: AtomicU64,
}

/// Whether recording is on (read on every hook).
static ON: AtomicBool = AtomicBool::new(false);
static SINK: OnceLock<Option<Sink>> = OnceLock::new();

thread_local! {
    static CURRENT: Cell<Record> = const { Cell::new(Record {
        vgpu: 0, queue: 0, resource: 0, kick: 0, asked: 0, granted: 0, backend_end: 0,
        released: 0, used: 0,
    }) };
}

/// Reads `VGPU_TIMELINE` once; starts the writer thread when it is set.
pub fn init() {
    SINK.get_or_init(|| {
        let dir = std::env::var_os(ENV).map(PathBuf::from)?;
        // The directory must exist: the worker's sandbox does not let it create one.
        if !dir.is_dir() {
            tracing::warn!(dir = %dir.display(), "the timeline directory does not exist; timeline off");
            return None;
        }
        ON.store(true, Ordering::Release);
        let spawned = std::thread::Builder::new()
            .name("timeline".into())
            .spawn(|| loop {
                std::thread::sleep(PERIOD);
                flush();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the timeline writer; records are written on flush only");
        }
        tracing::info!(dir = %dir.display(), "recording a per-request timeline");
        Some(Sink {
            path: dir.join(format!("timeline-{}-{}.csv", now(), std::process::id())),
            buf: Mutex::new(Vec::with_capacity(CAPACITY)),
            spare: Mutex::new(Vec::with_capacity(CAPACITY)),
            lost: AtomicU64::new(0),
        })
    });
}

/// Whether records are being taken.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

fn now() -> u64 {
    vgpu_grant::time::now()
}

fn update(f: impl FnOnce(&mut Record)) {
    CURRENT.with(|c| {
        let mut r = c.get();
        f(&mut r);
        c.set(r);
    });
}

/// A queue thread took a request of `vgpu` off `queue`'s available ring at `kick` (the
/// timeline's clock, [`stamp`]); it is served now.
pub fn begin(vgpu: u32, queue: u16, kick: u64) {
    if !enabled() {
        return;
    }
    CURRENT.with(|c| {
        c.set(Record {
            vgpu,
            queue,
            kick,
            ..Record::default()
        })
    });
}

/// The request's response is in the used ring: the record is complete.
pub fn end() {
    if !enabled() {
        return;
    }
    let t = now();
    let r = CURRENT.with(|c| {
        let mut r = c.get();
        r.used = t;
        c.set(Record::default());
        r
    });
    push(r);
}

/// The timeline's clock now, or 0 when no records are taken (a batch's stages).
pub fn stamp() -> u64 {
    if enabled() {
        now()
    } else {
        0
    }
}

/// Adds a finished record (a batched request's, whose stages its batch shares).
pub fn push(r: Record) {
    if !enabled() {
        return;
    }
    if let Some(Some(sink)) = SINK.get() {
        let mut buf = vgpu_backend::sync::lock(&sink.buf);
        if buf.len() < buf.capacity() {
            buf.push(r);
        } else {
            sink.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Asks `gate` for `resource`, noting when it was asked and granted; the permit notes the
/// end of the backend call and the release when dropped.
pub fn acquire(gate: &dyn Gate, resource: Resource) -> Timed<'_> {
    acquire_for(gate, resource, 0)
}

/// As [`acquire`], for a request expected to run `expect_ns` (0: unknown; see
/// [`Gate::acquire_for`]).
pub fn acquire_for(gate: &dyn Gate, resource: Resource, expect_ns: u64) -> Timed<'_> {
    if !enabled() {
        return Timed(Some(gate.acquire_for(resource, expect_ns)));
    }
    let asked = now();
    let permit = gate.acquire_for(resource, expect_ns);
    let granted = now();
    update(|r| {
        r.resource = code(resource);
        r.asked = asked;
        r.granted = granted;
    });
    Timed(Some(permit))
}

/// A resource as the timeline writes it.
fn code(resource: Resource) -> u8 {
    match resource {
        Resource::Compute => 1,
        Resource::Copy => 2,
    }
}

/// Notes on this request's record a grant of `resource` taken without [`acquire`]: when it
/// was asked, granted, the backend call ended and the grant was released.
pub fn note(resource: Resource, [asked, granted, backend_end, released]: [u64; 4]) {
    if !enabled() {
        return;
    }
    update(|r| {
        r.resource = code(resource);
        r.asked = asked;
        r.granted = granted;
        r.backend_end = backend_end;
        r.released = released;
    });
}

/// A grant whose release is on the timeline.
pub struct Timed<'a>(Option<Permit<'a>>);

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        if !enabled() {
            return;
        }
        let end = now();
        drop(self.0.take());
        let released = now();
        update(|r| {
            r.backend_end = end;
            r.released = released;
        });
    }
}

/// Writes the records taken so far to the timeline file.
pub fn flush() {
    let Some(Some(sink)) = SINK.get() else {
        return;
    };
    // Swap the full buffer for the empty spare so the queue threads never wait on I/O.
    let mut out = vgpu_backend::sync::lock(&sink.spare);
    std::mem::swap(&mut *out, &mut *vgpu_backend::sync::lock(&sink.buf));
    let lost = sink.lost.swap(0, Ordering::Relaxed);
    if lost > 0 {
        tracing::warn!(
            lost,
            "timeline buffer full: records lost (more than {CAPACITY} requests a second)"
        );
    }
    if out.is_empty() {
        return;
    }
    let path = &sink.path;
    let fresh = !path.exists();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            if fresh {
                writeln!(w, "{HEADER}")?;
            }
            for r in out.iter() {
                writeln!(w, "{}", r.to_csv())?;
            }
            w.flush()
        });
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the timeline");
    }
    out.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip() {
        let r = Record {
            vgpu: 3,
            queue: 1,
            resource: 1,
            kick: 10,
            asked: 11,
            granted: 12,
            backend_end: 20,
            released: 21,
            used: 22,
        };
        assert_eq!(Record::from_csv(&r.to_csv()), Some(r));
        assert_eq!(Record::from_csv(HEADER), None);
    }

    #[test]
    fn off_costs_nothing_and_records_nothing() {
        // VGPU_TIMELINE is not set in the test environment.
        begin(1, 0, stamp());
        let _p = acquire(&vgpu_grant::Ungated, Resource::Compute);
        end();
        assert!(!enabled() || std::env::var_os(ENV).is_some());
    }
}
