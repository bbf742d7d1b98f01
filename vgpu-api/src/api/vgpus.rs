//! vGPUs: creation, run-time changes, state, stats, and shared device memory objects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A vGPU to create.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VgpuCreate {
    /// Physical GPU index, or `"auto"` (the same as omitting it): vgpud places the vGPU by
    /// measured load and free memory share among the GPUs it fits on (docs/rebalance.md).
    #[serde(default, deserialize_with = "gpu_or_auto")]
    #[schema(schema_with = gpu_or_auto_schema)]
    pub gpu: Option<u32>,
    /// Device memory the vGPU may allocate (its memory share), > 0.
    pub memory_bytes: u64,
    /// Guaranteed compute share, a fraction in 0..=1.
    pub compute_share: f64,
    /// Guaranteed copy-bandwidth share, 0..=1; omitted = the compute share.
    #[serde(default)]
    pub copy_share: Option<f64>,
    /// Scheduling priority, larger = more important (ready-queue order, eviction victims).
    #[serde(default)]
    pub priority: i32,
    /// Allow oversubscribing device memory: the share is not reserved; the vGPU competes
    /// for what hard shares leave and is swapped out (to the GPU's swap area, then host
    /// memory) when the GPU runs short (docs/memory.md).
    #[serde(default)]
    pub oversubscribe: bool,
    /// Share group: vGPUs in one group may share device memory (shm).
    /// 1..=64 characters of `[A-Za-z0-9_.-]`.
    #[serde(default)]
    pub share_group: Option<String>,
    /// Request queues (guest streams), 1..=64.
    #[serde(default = "one_queue")]
    pub queues: u16,
    /// Storage namespaces the guest may read from GPU kernels: at most 16,
    /// unique ids. The guest attaches one with `STORAGE_ATTACH` and runs the built-in
    /// storage kernels on it (sim GPUs).
    #[serde(default)]
    pub storage: Vec<StorageAttachment>,
    /// A name, unique among live vGPUs: 1 to 63 characters of `a-z 0-9 -`, starting and
    /// ending with a letter or digit (a DNS label).
    #[serde(default)]
    pub name: Option<String>,
    /// Labels: at most 16; keys 1 to 63 characters of `A-Z a-z 0-9 _ . - /`, values at most
    /// 256 printable characters.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// How long one request (a kernel, a copy) of this vGPU may hold the GPU before the
    /// scheduler gives the GPU to its neighbours and charges the overrun to it, ms,
    /// 10..=60000; omitted = vgpud's `--kernel-deadline-ms`.
    #[serde(default)]
    #[schema(minimum = 10, maximum = 60000)]
    pub kernel_deadline_ms: Option<u32>,
    /// Who the vGPU's frontend is: `vm` (default: a VM launched with it) or `process` (a
    /// host or container process using `libcuda.so.1` with `VGPU_SOCKET` set to the
    /// answer's `socket`; docs/cuda-api.md).
    #[serde(default)]
    pub attach: Attach,
    /// `process` attach only: the uid that may connect to the socket (it owns the socket
    /// file); omitted = vgpud's own.
    #[serde(default)]
    pub owner_uid: Option<u32>,
    /// `process` attach only: the gid that may connect to the socket (the socket file's
    /// and its directory's group); omitted = vgpud's own.
    #[serde(default)]
    pub owner_gid: Option<u32>,
}

/// Who a vGPU's frontend (the holder of its vhost-user socket) is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Attach {
    /// A VM's vmm, launched by vgpud with it (`POST /v1/vms`).
    #[default]
    Vm,
    /// A host or container process that is its own frontend (the CUDA library's process
    /// transport). The vGPU outlives the process: when it exits, vgpud starts a fresh
    /// worker on the same socket for the next one, until the vGPU is deleted.
    Process,
}

impl Attach {
    /// Its name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Attach::Vm => "vm",
            Attach::Process => "process",
        }
    }
}

impl std::str::FromStr for Attach {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vm" => Ok(Attach::Vm),
            "process" => Ok(Attach::Process),
            other => Err(format!(
                "{other:?} is not an attach kind: give vm or process"
            )),
        }
    }
}

/// `gpu`: an index, `"auto"` or null.
fn gpu_or_auto<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum GpuOrAuto {
        Index(u32),
        Name(String),
    }
    match Option::<GpuOrAuto>::deserialize(d)? {
        None => Ok(None),
        Some(GpuOrAuto::Index(i)) => Ok(Some(i)),
        Some(GpuOrAuto::Name(n)) if n == "auto" => Ok(None),
        Some(GpuOrAuto::Name(n)) => Err(serde::de::Error::custom(format!(
            "{n:?} is not a GPU: give an index (0, 1, ...) or \"auto\""
        ))),
    }
}

fn gpu_or_auto_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int32)))
                .minimum(Some(0)),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["auto"])),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "Physical GPU index, or \"auto\" (the same as omitting it): placed by measured load and free memory share",
        ))
        .into()
}

fn one_queue() -> u16 {
    1
}

impl VgpuCreate {
    /// A spec of `memory_bytes` and `compute_share` (the two fields a request must give),
    /// every other field as the API fills it when a request leaves it out: placed
    /// automatically, one queue, no copy share of its own, priority 0, no oversubscription,
    /// share group, storage, name, labels or kernel deadline, attached to a VM, no owner.
    pub fn new(memory_bytes: u64, compute_share: f64) -> Self {
        Self {
            gpu: None,
            memory_bytes,
            compute_share,
            copy_share: None,
            priority: 0,
            oversubscribe: false,
            share_group: None,
            queues: one_queue(),
            storage: Vec::new(),
            name: None,
            labels: BTreeMap::new(),
            kernel_deadline_ms: None,
            attach: Attach::default(),
            owner_uid: None,
            owner_gid: None,
        }
    }
}

#[cfg(test)]
mod new_tests {
    use super::VgpuCreate;

    #[test]
    fn new_is_what_a_request_with_only_the_required_fields_means() {
        let parsed: VgpuCreate =
            serde_json::from_str(r#"{"memory_bytes": 1048576, "compute_share": 0.25}"#)
                .expect("parse");
        assert_eq!(parsed, VgpuCreate::new(1 << 20, 0.25));
    }
}

/// A storage namespace attached to a vGPU: a file or block device on the daemon's host,
/// served to the vGPU by an emulated NVMe controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StorageAttachment {
    /// The id the guest names it by (`STORAGE_ATTACH`), 1..=65535, unique per vGPU.
    pub namespace: u32,
    /// Absolute path of a readable, non-empty regular file or block device.
    pub path: String,
    /// Open it read-only (default true; false also needs write permission).
    #[serde(default = "yes")]
    pub read_only: bool,
}

impl StorageAttachment {
    /// Parses `ID=PATH`, `ID=PATH:ro` or `ID=PATH:rw` (read-only unless `:rw`), the form
    /// vgpuctl's and the worker's `--storage` take.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (id, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: give ID=PATH[:ro|:rw], e.g. 1=/data/graph.bin:ro"))?;
        let namespace: u32 = id
            .trim()
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("{s:?}: the namespace id {id:?} must be a number >= 1"))?;
        let (path, read_only) = if let Some(p) = rest.strip_suffix(":ro") {
            (p, true)
        } else if let Some(p) = rest.strip_suffix(":rw") {
            (p, false)
        } else {
            (rest, true)
        };
        if path.is_empty() {
            return Err(format!("{s:?}: the path is empty"));
        }
        Ok(Self {
            namespace,
            path: path.to_owned(),
            read_only,
        })
    }

    /// The `--storage` value for this attachment, as vgpud hands it to the worker (what
    /// [`StorageAttachment::parse`] reads back).
    pub fn to_arg(&self) -> String {
        format!(
            "{}={}:{}",
            self.namespace,
            self.path,
            if self.read_only { "ro" } else { "rw" }
        )
    }
}

#[cfg(test)]
mod storage_arg_tests {
    use super::StorageAttachment;

    #[test]
    fn storage_args_parse_and_print() {
        let s = StorageAttachment::parse("1=/tmp/a:b.bin").expect("plain");
        assert_eq!(
            (s.namespace, s.read_only, s.path.as_str()),
            (1, true, "/tmp/a:b.bin")
        );
        let s = StorageAttachment::parse("7=/x:rw").expect("rw");
        assert_eq!(
            (s.namespace, s.read_only, s.to_arg().as_str()),
            (7, false, "7=/x:rw")
        );
        assert_eq!(StorageAttachment::parse(&s.to_arg()), Ok(s));
        for bad in ["", "1", "x=/a", "0=/a", "1=", "1=:ro", "/a"] {
            assert!(StorageAttachment::parse(bad).is_err(), "{bad:?}");
        }
    }
}

fn yes() -> bool {
    true
}

/// Run-time changes to a vGPU (any subset).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VgpuPatch {
    /// New compute share, 0..=1.
    #[serde(default)]
    pub compute_share: Option<f64>,
    /// New copy share, 0..=1.
    #[serde(default)]
    pub copy_share: Option<f64>,
    /// New priority.
    #[serde(default)]
    pub priority: Option<i32>,
    /// New name (the rules of `VgpuCreate.name`); `""` removes it.
    #[serde(default)]
    pub name: Option<String>,
    /// New labels, replacing all of them (`{}` removes them).
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// New kernel deadline, ms, 10..=60000 (the rules of `VgpuCreate.kernel_deadline_ms`);
    /// applied to the running vGPU at once.
    #[serde(default)]
    #[schema(minimum = 10, maximum = 60000)]
    pub kernel_deadline_ms: Option<u32>,
}

/// Where a vGPU is in its life.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum VgpuState {
    /// Its worker is starting.
    Starting,
    /// Its worker serves the socket and waits for a VM.
    Ready,
    /// A VM uses it.
    Attached,
    /// It is being deleted: its worker is stopping and it still holds its memory and
    /// shares; it takes no change and no VM (409) until it is gone (404).
    Releasing,
    /// Its VM ended; its worker is gone and its memory and shares are free again.
    Released,
    /// Its worker died or could not start, or it could not be restored after a vgpud
    /// restart (vgpud tries again at its next start); its resources are free.
    Failed {
        /// Why.
        reason: String,
    },
}

/// A vGPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Vgpu {
    pub id: u32,
    /// Physical GPU index.
    pub gpu: u32,
    pub memory_bytes: u64,
    pub compute_share: f64,
    pub copy_share: f64,
    pub priority: i32,
    pub oversubscribe: bool,
    pub share_group: Option<String>,
    pub queues: u16,
    /// Its storage namespaces.
    #[serde(default)]
    pub storage: Vec<StorageAttachment>,
    pub state: VgpuState,
    /// The VM using it.
    pub vm: Option<u32>,
    /// Created together with that VM (deleted with it; after a vgpud restart it stays
    /// `released` with that VM's record).
    pub owned_by_vm: bool,
    /// Its vhost-user socket. For `process` attach a path that stays the same for the
    /// vGPU's life (the socket of whichever worker serves it now): what `VGPU_SOCKET`
    /// takes, or what a container runtime bind-mounts (its directory) into a container.
    pub socket: String,
    /// Its worker process while it runs.
    pub worker_pid: Option<u32>,
    /// Its name, if it has one.
    #[serde(default)]
    pub name: Option<String>,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its own kernel deadline, ms; null: vgpud's `--kernel-deadline-ms`.
    #[serde(default)]
    pub kernel_deadline_ms: Option<u32>,
    /// Who its frontend is (`vm` or `process`).
    #[serde(default)]
    pub attach: Attach,
    /// `process` attach: the uid the socket file belongs to.
    #[serde(default)]
    pub owner_uid: Option<u32>,
    /// `process` attach: the group of the socket file and its directory.
    #[serde(default)]
    pub owner_gid: Option<u32>,
}

/// Utilization and counters of one vGPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VgpuStats {
    pub vgpu: u32,
    pub gpu: u32,
    /// Whether the counters come from a running worker now (false: the last values seen
    /// before it ended).
    pub live: bool,
    /// Length of the window the utilizations cover, ms (0: not enough samples yet).
    pub window_ms: u64,
    /// Kernel device time over wall time in the window, as a fraction of the GPU (can
    /// exceed 1.0 while several of its queues run kernels at once).
    pub compute_utilization: f64,
    /// Host-device bytes copied over what the GPU's copy bandwidth allows in the window;
    /// null when the GPU's copy bandwidth is unpaced (0).
    pub copy_utilization: Option<f64>,
    /// Memory share (bytes the vGPU may allocate).
    pub memory_share_bytes: u64,
    /// Bytes allocated.
    pub memory_used_bytes: u64,
    /// Bytes of those in device memory now.
    pub memory_resident_bytes: u64,
    /// Bytes of those swapped out (swap area and host memory).
    pub memory_swapped_bytes: u64,
    /// Bytes of those in the GPU's swap area.
    pub memory_device_swap_bytes: u64,
    /// Host memory charged to the vGPU for its frontend's guest memory: the bytes its
    /// worker maps and may pin for direct copies (the frontend's memory table; at most its
    /// VM's memory, docs/hostile.md).
    #[serde(default)]
    pub pinned_host_bytes: u64,
    /// Bytes swapped out so far.
    pub swap_out_bytes: u64,
    /// Bytes swapped back in so far.
    pub swap_in_bytes: u64,
    /// Time spent swapping out, ms.
    pub swap_out_ms: f64,
    /// Time spent swapping in, ms.
    pub swap_in_ms: f64,
    /// Pieces evicted so far.
    pub evictions: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Requests completed, failed ones included.
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Kernels completed.
    pub kernels: u64,
    /// Their device time, ns.
    pub kernel_ns: u64,
    pub bytes_htod: u64,
    pub bytes_dtoh: u64,
    pub bytes_dtod: u64,
    /// Shares and priority the worker runs with now.
    pub compute_share: f64,
    pub copy_share: f64,
    pub priority: i32,
    /// Requests of it that held the GPU past its kernel deadline and lost it to the
    /// neighbours (compute engine), since its worker attached to the GPU's scheduler.
    #[serde(default)]
    pub compute_overruns: u64,
    /// The same on the copy engine.
    #[serde(default)]
    pub copy_overruns: u64,
    /// Implausible values its worker wrote on its grant page (each one ignored; too many
    /// and the worker is detached from the GPU and the vGPU fails).
    #[serde(default)]
    pub violations: u32,
}

/// A shared device memory object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShmObject {
    /// The id SHM_GET returns.
    pub id: u64,
    /// The key the guests chose.
    pub key: u64,
    pub size_bytes: u64,
    pub gpu: u32,
    /// Only vGPUs of this group on this GPU may use it.
    pub share_group: String,
    /// The vGPU that created it.
    pub creator_vgpu: u32,
    /// Attachments across vGPUs.
    pub attachments: u64,
    /// vGPUs that have it attached.
    pub attached_vgpus: Vec<u32>,
    /// RMID was asked: freed at the last detach.
    pub removed: bool,
}
