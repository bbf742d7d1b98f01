//! Storage namespaces attached to one vGPU (BaM): the operator names them in the
//! vGPU's spec (`storage` in vgpud's `VgpuCreate`, `--storage ID=PATH[:ro|:rw]` on the
//! worker); the guest attaches one with `STORAGE_ATTACH` and passes its handle as the
//! `ns` value argument of the built-in storage kernels (`vgpu_proto::builtin::STORAGE_KERNELS`).
//!
//! A [`StorageSet`] is owned by the worker and shared by the two sides that need it: the
//! device layer answers `STORAGE_ATTACH` through it (`vgpu_device::StorageHost`), and the
//! sim backend resolves a storage kernel's `ns` argument through it
//! ([`crate::SimGpu::with_storage`]). Each namespace is opened on its first attach, with
//! the emulated NVMe controller over its file (io_uring), its own queue pairs and its own
//! page cache: nothing is shared with another vGPU (each vGPU is its own worker process).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vgpu_storage::{Element, Namespace, NamespaceOptions, PageCache, StorageArray};

use crate::error::BackendError;
use crate::sync::lock;

/// Bytes per cache line: one NVMe command (at most the emulated controller's 8 KiB MDTS).
pub const CACHE_LINE: usize = 4096;
/// Cache lines per attached namespace (4 MiB of cache).
pub const CACHE_LINES: usize = 1024;
/// How long a storage kernel waits for one completion before the namespace counts as hung.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// One namespace the operator attached to the vGPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// The id the guest names it by (`STORAGE_ATTACH`'s `namespace`), >= 1.
    pub id: u32,
    /// The backing file or block device.
    pub path: PathBuf,
    /// Opened read-only (the storage kernels only read).
    pub read_only: bool,
}

/// What `STORAGE_ATTACH` tells the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The value storage kernels take as `ns` (the namespace id).
    pub handle: u64,
    /// Namespace size in bytes (whole blocks).
    pub bytes: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Opened read-only.
    pub read_only: bool,
}

/// An opened namespace with its cache.
pub(crate) struct Opened {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) cache: Arc<PageCache>,
}

struct Entry {
    spec: NamespaceSpec,
    opened: Option<Arc<Opened>>,
}

/// The namespaces of one vGPU. See the module documentation.
pub struct StorageSet {
    entries: Mutex<BTreeMap<u32, Entry>>,
}

impl std::fmt::Debug for StorageSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = lock(&self.entries);
        f.debug_list()
            .entries(e.values().map(|e| (&e.spec, e.opened.is_some())))
            .finish()
    }
}

impl StorageSet {
    /// The set of `specs`; ids must be unique and >= 1. Nothing is opened yet.
    pub fn new(specs: Vec<NamespaceSpec>) -> Result<Self, BackendError> {
        let mut entries = BTreeMap::new();
        for spec in specs {
            if spec.id == 0 {
                return Err(BackendError::InvalidArgument(
                    "storage namespace id 0; ids start at 1".into(),
                ));
            }
            let id = spec.id;
            if entries.insert(id, Entry { spec, opened: None }).is_some() {
                return Err(BackendError::InvalidArgument(format!(
                    "storage namespace {id} is given twice; give each id once"
                )));
            }
        }
        Ok(Self {
            entries: Mutex::new(entries),
        })
    }

    /// The namespaces, in id order.
    pub fn specs(&self) -> Vec<NamespaceSpec> {
        let e = lock(&self.entries);
        e.values().map(|e| e.spec.clone()).collect()
    }

    /// Whether no namespace is configured.
    pub fn is_empty(&self) -> bool {
        lock(&self.entries).is_empty()
    }

    /// `STORAGE_ATTACH`: opens namespace `id` (once; later attaches return the same) and
    /// says how the guest reaches it. Unknown id: `InvalidArgument`; a backing file that is
    /// gone or unreadable: `Device`.
    pub fn attach(&self, id: u64) -> Result<Attached, BackendError> {
        let mut entries = lock(&self.entries);
        let known = || {
            let ids: Vec<String> = entries.keys().map(u32::to_string).collect();
            if ids.is_empty() {
                "none".to_string()
            } else {
                ids.join(", ")
            }
        };
        let Some(key) = u32::try_from(id).ok().filter(|k| entries.contains_key(k)) else {
            return Err(BackendError::InvalidArgument(format!(
                "storage namespace {id} is not attached to this vGPU (attached: {}); the operator attaches namespaces with `storage` in the vGPU's spec",
                known()
            )));
        };
        let entry = entries
            .get_mut(&key)
            .ok_or_else(|| BackendError::InvalidArgument(format!("storage namespace {id}")))?;
        let opened = match &entry.opened {
            Some(o) => o.clone(),
            None => {
                let o = Arc::new(open(&entry.spec)?);
                entry.opened = Some(o.clone());
                o
            }
        };
        Ok(Attached {
            handle: u64::from(key),
            bytes: opened.ns.bytes(),
            block_size: opened.ns.block_size(),
            read_only: entry.spec.read_only,
        })
    }

    /// Fault injection: makes attached namespace `id`'s controller ignore its queues (a
    /// hung device) or serve them again. Storage kernels then fail with `DEVICE_ERROR`
    /// after the I/O timeout instead of hanging.
    pub fn set_stalled(&self, id: u64, stalled: bool) -> Result<(), BackendError> {
        self.get(id)?.ns.set_stalled(stalled);
        Ok(())
    }

    /// The opened namespace a storage kernel's `ns` argument names; it must have been
    /// attached (`STORAGE_ATTACH`) first.
    pub(crate) fn get(&self, ns: u64) -> Result<Arc<Opened>, BackendError> {
        let entries = lock(&self.entries);
        u32::try_from(ns)
            .ok()
            .and_then(|k| entries.get(&k))
            .and_then(|e| e.opened.clone())
            .ok_or_else(|| {
                BackendError::InvalidArgument(format!(
                    "storage namespace {ns} is not attached; pass the handle STORAGE_ATTACH returned"
                ))
            })
    }
}

fn open(spec: &NamespaceSpec) -> Result<Opened, BackendError> {
    let opts = NamespaceOptions {
        queues: 2,
        queue_depth: 256,
        timeout: IO_TIMEOUT,
        read_only: spec.read_only,
        ..NamespaceOptions::default()
    };
    let what = |e: vgpu_storage::Error| {
        BackendError::Device(format!(
            "storage namespace {} ({}): {e}; check that the backing file exists and is readable",
            spec.id,
            spec.path.display()
        ))
    };
    let ns = Namespace::open_file(&spec.path, &opts).map_err(what)?;
    let cache = PageCache::new(ns.clone(), CACHE_LINE, CACHE_LINES).map_err(what)?;
    tracing::info!(namespace = spec.id, path = %spec.path.display(), bytes = ns.bytes(),
        read_only = spec.read_only, engine = ?ns.engine(), "storage namespace opened");
    Ok(Opened { ns, cache })
}

/// The array of `T` from byte `base` of the namespace: `len` elements, or to the end.
pub(crate) fn array<T: Element>(
    kernel: &str,
    o: &Opened,
    base: u64,
    len: Option<u64>,
) -> Result<StorageArray<T>, BackendError> {
    let size = std::mem::size_of::<T>() as u64;
    let bytes = o.ns.bytes();
    if base % size != 0 || base > bytes {
        return Err(BackendError::InvalidArgument(format!(
            "{kernel}: byte offset {base} must be a multiple of {size} and inside the {bytes}-byte namespace"
        )));
    }
    let len = len.unwrap_or((bytes - base) / size);
    StorageArray::new(o.cache.clone(), base, len).map_err(|e| error(kernel, e))
}

/// Checks an array of `n` (or, with `None`, all remaining) elements of `elem_bytes`
/// (4 or 8) from byte `base`, as a storage kernel's arguments describe it.
pub(crate) fn check_elems(
    kernel: &str,
    o: &Opened,
    base: u64,
    n: Option<u64>,
    elem_bytes: u64,
) -> Result<(), BackendError> {
    match elem_bytes {
        4 => array::<u32>(kernel, o, base, n).map(|_| ()),
        8 => array::<u64>(kernel, o, base, n).map(|_| ()),
        other => Err(bad_elem_bytes(kernel, other)),
    }
}

/// `elem_bytes` other than 4 or 8.
pub(crate) fn bad_elem_bytes(kernel: &str, elem_bytes: u64) -> BackendError {
    BackendError::InvalidArgument(format!("{kernel}: elem_bytes = {elem_bytes}; use 4 or 8"))
}

/// The BFS kernel's vertex count and source: vertex ids are u32, the source one of them.
pub(crate) fn check_bfs(kernel: &str, vertices: u64, source: u64) -> Result<(), BackendError> {
    if vertices == 0 || vertices > u64::from(u32::MAX) {
        return Err(BackendError::InvalidArgument(format!(
            "{kernel}: vertices = {vertices}; give 1..=2^32-1 (vertex ids are u32)"
        )));
    }
    if source >= vertices {
        return Err(BackendError::InvalidArgument(format!(
            "{kernel}: source = {source} is not below vertices = {vertices}"
        )));
    }
    Ok(())
}

/// A storage-layer error as the guest sees it: bad offsets and sizes are the guest's
/// (`InvalidArgument`); I/O errors, timeouts and dead controllers are the device's.
pub(crate) fn error(kernel: &str, e: vgpu_storage::Error) -> BackendError {
    use vgpu_storage::Error as E;
    match e {
        E::OutOfRange { .. } | E::InvalidArgument(_) => {
            BackendError::InvalidArgument(format!("{kernel}: {e}"))
        }
        other => BackendError::Device(format!("{kernel}: storage I/O failed: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_duplicate_and_missing_namespaces_are_errors() {
        let spec = |id, p: &str| NamespaceSpec {
            id,
            path: PathBuf::from(p),
            read_only: true,
        };
        assert!(StorageSet::new(vec![spec(1, "/a"), spec(1, "/b")]).is_err());
        assert!(StorageSet::new(vec![spec(0, "/a")]).is_err());
        let set = StorageSet::new(vec![spec(3, "/nonexistent/vgpu-storage-test")]).expect("set");
        let e = set.attach(4).expect_err("unknown");
        assert_eq!(e.status(), vgpu_proto::Status::InvalidArgument, "{e}");
        assert!(e.to_string().contains("attached: 3"), "{e}");
        let e = set.attach(3).expect_err("missing file");
        assert_eq!(e.status(), vgpu_proto::Status::DeviceError, "{e}");
        assert!(
            e.to_string().contains("/nonexistent/vgpu-storage-test"),
            "{e}"
        );
        assert!(set.get(3).is_err(), "not attached");
    }
}
