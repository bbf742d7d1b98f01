//! Fault injection on demand (tests, the soak, docs/hostile.md): a [`Faulty`] backend wraps
//! another and, while its [`Faults`] say so, fails copies, memsets and launches with a
//! device error, fails allocations with out-of-memory, or delays every copy and launch
//! (a slow device). The faults change at run time; with none set it only forwards.
//!
//! `vgpu-worker` wraps its backend in one when `VGPU_FAULTS_DIR` is set in its environment
//! (vgpud passes its own environment on), and re-reads `<dir>/vgpu-<id>` every 20 ms:
//! a line such as `error=3 oom slow=5 target-fail` (see [`FaultSpec::parse`]). Without the
//! variable nothing is wrapped and nothing is read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vm_memory::VolatileSlice;

use crate::{
    one_result, Allocated, Backend, BackendError, Launch, LaunchStats, Relocatable, Result,
};

/// What to inject, as parsed from a spec line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultSpec {
    /// Every `n`-th copy, memset or launch fails with `DEVICE_ERROR` (0: none; 1: all).
    pub error_every: u64,
    /// Every allocation fails with `OUT_OF_MEMORY`.
    pub oom: bool,
    /// Each copy, memset and launch waits this long first (a slow device), ms.
    pub slow_ms: u64,
    /// A migration target built while this is set fails its copies (the migration must
    /// abort and leave the vGPU where it was).
    pub target_fail: bool,
}

impl FaultSpec {
    /// Parses whitespace- or comma-separated words: `error=N`, `oom`, `slow=MS`,
    /// `target-fail`, `none`. Unknown words are an error.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let mut f = FaultSpec::default();
        for w in s.split(|c: char| c.is_whitespace() || c == ',') {
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("fault {w:?}: {v:?} is not a whole number"))
            };
            match w.split_once('=') {
                _ if w.is_empty() || w == "none" => {}
                None if w == "oom" => f.oom = true,
                None if w == "target-fail" => f.target_fail = true,
                Some(("error", v)) => f.error_every = num(v)?,
                Some(("slow", v)) => f.slow_ms = num(v)?,
                _ => {
                    return Err(format!(
                        "unknown fault {w:?}: use error=N, oom, slow=MS, target-fail or none"
                    ))
                }
            }
        }
        Ok(f)
    }
}

/// The faults in force, changeable while backends use them.
#[derive(Debug, Default)]
pub struct Faults {
    error_every: AtomicU64,
    oom: AtomicBool,
    slow_ms: AtomicU64,
    target_fail: AtomicBool,
    ops: AtomicU64,
    injected: AtomicU64,
}

impl Faults {
    /// Puts `spec` in force.
    pub fn set(&self, spec: FaultSpec) {
        self.error_every.store(spec.error_every, Ordering::Relaxed);
        self.oom.store(spec.oom, Ordering::Relaxed);
        self.slow_ms.store(spec.slow_ms, Ordering::Relaxed);
        self.target_fail.store(spec.target_fail, Ordering::Relaxed);
    }

    /// What is in force.
    pub fn spec(&self) -> FaultSpec {
        FaultSpec {
            error_every: self.error_every.load(Ordering::Relaxed),
            oom: self.oom.load(Ordering::Relaxed),
            slow_ms: self.slow_ms.load(Ordering::Relaxed),
            target_fail: self.target_fail.load(Ordering::Relaxed),
        }
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Before a copy, memset or launch: waits if slow, fails if this one is due.
    fn op(&self, what: &str) -> Result<()> {
        let slow = self.slow_ms.load(Ordering::Relaxed);
        if slow > 0 {
            std::thread::sleep(Duration::from_millis(slow.min(10_000)));
        }
        let every = self.error_every.load(Ordering::Relaxed);
        let n = self.ops.fetch_add(1, Ordering::Relaxed) + 1;
        if every > 0 && n % every == 0 {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::Device(format!(
                "injected fault: {what} failed (fault injection is on for this vGPU)"
            )));
        }
        Ok(())
    }

    fn alloc(&self, size: u64) -> Result<()> {
        if self.oom.load(Ordering::Relaxed) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::OutOfMemory {
                requested: size,
                available: 0,
                capacity: 0,
            });
        }
        Ok(())
    }
}

/// A backend that injects [`Faults`] into another's data path. Its swapping and
/// relocation capabilities are the wrapped backend's, unchanged.
pub struct Faulty {
    inner: Arc<dyn Backend>,
    faults: Arc<Faults>,
}

impl Faulty {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>, faults: Arc<Faults>) -> Self {
        Self { inner, faults }
    }
}

/// A migration target that fails every copy into it (`target-fail`).
pub struct FailingTarget(pub Arc<dyn Backend>);

impl Backend for Faulty {
    fn alloc(&self, size: u64) -> Result<Allocated> {
        self.faults.alloc(size)?;
        self.inner.alloc(size)
    }
    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> Result<u64> {
        self.faults.op("MEMCPY_HTOD")?;
        self.inner.copy_htod(dst, src)
    }
    fn copy_dtoh(&self, src: u64, dst: &VolatileSlice<'_>) -> Result<u64> {
        self.faults.op("MEMCPY_DTOH")?;
        self.inner.copy_dtoh(src, dst)
    }
    fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<u64> {
        self.faults.op("MEMCPY_DTOD")?;
        self.inner.copy_dtod(dst, src, len)
    }
    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<u64> {
        self.faults.op("MEMSET")?;
        self.inner.memset(dst, value, elem_size, count)
    }
    fn launch(&self, launches: &[Launch<'_>]) -> Vec<Result<LaunchStats>> {
        // Each launch meets the faults (and runs) on its own, as separate calls would.
        launches
            .iter()
            .map(|l| {
                self.faults.op("LAUNCH")?;
                one_result(self.inner.launch(std::slice::from_ref(l)))
            })
            .collect()
    }

    crate::forward_backend!(inner:
        info, memory_usage, free, check_range, synchronize, modules, paging, relocation,
        shared_memory, host_memory, virtual_memory
    );
}

/// The faults of this process once [`from_env`] turned injection on.
static IN_FORCE: std::sync::OnceLock<Arc<Faults>> = std::sync::OnceLock::new();

/// The environment variable naming the fault directory.
pub const FAULTS_DIR_ENV: &str = "VGPU_FAULTS_DIR";

/// Wraps `inner` in a [`Faulty`] driven by `$VGPU_FAULTS_DIR/vgpu-<vgpu_id>` when that
/// variable is set (a thread re-reads the file every 20 ms; a missing file means no
/// faults); returns `inner` unchanged otherwise.
pub fn from_env(inner: Arc<dyn Backend>, vgpu_id: u32) -> Arc<dyn Backend> {
    let Some(dir) = std::env::var_os(FAULTS_DIR_ENV).filter(|d| !d.is_empty()) else {
        return inner;
    };
    let file = std::path::PathBuf::from(dir).join(format!("vgpu-{vgpu_id}"));
    let faults = IN_FORCE.get_or_init(|| Arc::new(Faults::default())).clone();
    tracing::warn!(file = %file.display(), "fault injection is on ({FAULTS_DIR_ENV} is set)");
    let f = faults.clone();
    let spawned = std::thread::Builder::new()
        .name("faults".into())
        .spawn(move || {
            let mut last = String::new();
            loop {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if text != last {
                    match FaultSpec::parse(text.trim()) {
                        Ok(spec) => {
                            tracing::warn!(?spec, "injected faults changed");
                            f.set(spec);
                        }
                        Err(e) => tracing::warn!(file = %file.display(), "ignored: {e}"),
                    }
                    last = text;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the fault injection thread ({e}); no faults injected");
        return inner;
    }
    Arc::new(Faulty::new(inner, faults))
}

/// A migration target backend: one that fails its copies while `target-fail` is in force,
/// else `b` unchanged.
pub fn target(b: Arc<dyn Backend>) -> Arc<dyn Backend> {
    match IN_FORCE.get() {
        Some(f) if f.spec().target_fail => {
            f.injected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("injected fault: this migration target fails its copies");
            Arc::new(FailingTarget(b))
        }
        _ => b,
    }
}

fn target_failed(what: &str) -> BackendError {
    BackendError::Device(format!(
        "injected fault: the migration target failed {what} (target-fail)"
    ))
}

impl Backend for FailingTarget {
    fn copy_htod(&self, _dst: u64, _src: &VolatileSlice<'_>) -> Result<u64> {
        Err(target_failed("a copy into it"))
    }
    fn relocation(&self) -> Option<&dyn Relocatable> {
        self.0.relocation().map(|_| self as &dyn Relocatable)
    }

    crate::forward_backend!(0:
        info, memory_usage, alloc, free, check_range, copy_dtoh, copy_dtod, memset, launch,
        synchronize, modules, paging, shared_memory, host_memory, virtual_memory
    );
}

/// The wrapped backend's relocation without its device window: copies into the target
/// must go through [`Backend::copy_htod`], which fails.
impl Relocatable for FailingTarget {
    fn alloc_at(&self, addr: u64, size: u64) -> Result<Allocated> {
        crate::require_relocation(&*self.0)?.alloc_at(addr, size)
    }
    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> Result<u64> {
        crate::copy_to_peer(&*self.0, peer, addr, len)
    }
    fn vacate_addresses(&self) -> Result<()> {
        crate::require_relocation(&*self.0)?.vacate_addresses()
    }
    fn reoccupy_addresses(&self) -> Result<()> {
        crate::require_relocation(&*self.0)?.reoccupy_addresses()
    }
    fn occupy_addresses(&self) -> Result<()> {
        crate::require_relocation(&*self.0)?.occupy_addresses()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimConfig, SimGpu};

    #[test]
    fn specs_parse() {
        assert_eq!(FaultSpec::parse("").unwrap(), FaultSpec::default());
        assert_eq!(FaultSpec::parse("none\n").unwrap(), FaultSpec::default());
        assert_eq!(
            FaultSpec::parse("error=3, oom slow=5 target-fail").unwrap(),
            FaultSpec {
                error_every: 3,
                oom: true,
                slow_ms: 5,
                target_fail: true
            }
        );
        assert!(FaultSpec::parse("error=x").is_err());
        assert!(FaultSpec::parse("explode").is_err());
    }

    #[test]
    fn faults_come_and_go_on_demand() {
        let sim = SimGpu::new(SimConfig {
            memory: 8 << 20,
            va_size: 1 << 30,
            threads: 1,
            ..SimConfig::default()
        })
        .unwrap();
        let faults = Arc::new(Faults::default());
        let b = Faulty::new(Arc::new(sim), faults.clone());
        let a = b.alloc(4096).unwrap();
        let mut buf = [7u8; 64];
        let s = VolatileSlice::from(&mut buf[..]);
        assert_eq!(b.copy_htod(a.addr, &s).unwrap(), 64);
        faults.set(FaultSpec::parse("error=1 oom").unwrap());
        assert!(matches!(
            b.alloc(4096),
            Err(BackendError::OutOfMemory { .. })
        ));
        assert!(matches!(
            b.copy_dtoh(a.addr, &s),
            Err(BackendError::Device(_))
        ));
        assert_eq!(faults.injected(), 2);
        faults.set(FaultSpec::parse("slow=20").unwrap());
        let t = std::time::Instant::now();
        assert_eq!(b.copy_dtoh(a.addr, &s).unwrap(), 64);
        assert!(t.elapsed() >= Duration::from_millis(20));
        faults.set(FaultSpec::default());
        assert_eq!(b.copy_dtoh(a.addr, &s).unwrap(), 64);
        let mut back = [0u8; 64];
        s.copy_to(&mut back[..]);
        assert_eq!(back, [7u8; 64]);
        let t = FailingTarget(Arc::new(
            SimGpu::new(SimConfig {
                memory: 8 << 20,
                va_size: 1 << 30,
                threads: 1,
                ..SimConfig::default()
            })
            .unwrap(),
        ));
        let a2 = t.alloc(4096).unwrap();
        assert!(t.copy_htod(a2.addr, &s).is_err());
    }
}
