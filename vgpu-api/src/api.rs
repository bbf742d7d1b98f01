//! The REST API's request and response types (schemas of docs/openapi.json).
//!
//! Units: sizes in bytes; shares as **fractions of one physical GPU** in `0.0..=1.0`
//! (0.3 = 30 %), with a resolution of 0.001 (the device's per-mille); bandwidths in
//! bytes per second; utilizations as fractions (1.0 = the whole GPU).
//! Requests reject unknown fields.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error answer: what went wrong and which request field it is about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// What went wrong and what to do about it.
    pub error: String,
    /// The request field (dotted path) or path parameter at fault, when there is one.
    pub field: Option<String>,
}

/// One physical GPU and what is committed on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Index used by `gpu` fields (0-based).
    pub index: u32,
    /// Device name.
    pub name: String,
    /// Backend serving it: `sim` (or `cuda` once that backend lands).
    pub backend: String,
    /// Device memory.
    pub memory_bytes: u64,
    /// Memory promised to live vGPUs.
    pub memory_committed_bytes: u64,
    /// Memory still free for new vGPUs with hard shares.
    pub memory_free_bytes: u64,
    /// Memory held by shared objects.
    pub memory_shared_bytes: u64,
    /// Memory oversubscribed vGPUs share (what hard shares and shared objects leave, less
    /// the swap area).
    pub oversubscribed_pool_bytes: u64,
    /// Bytes of that pool resident now.
    pub oversubscribed_resident_bytes: u64,
    /// Size of the device-side temporal swap area.
    pub swap_area_bytes: u64,
    /// Bytes in it now.
    pub swap_area_used_bytes: u64,
    /// Host-device copy bandwidth in bytes/s (0 = unpaced).
    pub copy_bandwidth: u64,
    /// Sim compute-rate factor (1.0 = nominal).
    pub speed: f64,
    /// Sum of the compute shares of live vGPUs (at most 1.0).
    pub compute_committed: f64,
    /// Sum of the copy shares of live vGPUs (at most 1.0).
    pub copy_committed: f64,
    /// Ids of the vGPUs placed on it that still hold resources.
    pub vgpus: Vec<u32>,
}

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

/// A VM to launch. Give `payload` (a no_std payload ELF); `kernel`/`initrd`/`cmdline`
/// (Linux guests) answer 501: vgpud launches payload guests only; run a Linux guest with
/// `vmm --kernel` by hand (docs/linux-guests.md). Give its vGPU as `vgpu_id` (an existing
/// `ready` vGPU) or `vgpu` (created with the VM and deleted with it), or neither.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VmCreate {
    /// Payload ELF: an absolute path on the daemon's host, or a bare name looked up in
    /// the daemon's `--payload-dir`.
    #[serde(default)]
    pub payload: Option<String>,
    /// String handed to the payload (at most 4096 bytes).
    #[serde(default)]
    pub payload_arg: String,
    /// Linux kernel (not yet: 501).
    #[serde(default)]
    pub kernel: Option<String>,
    /// Linux initramfs (not yet: 501).
    #[serde(default)]
    pub initrd: Option<String>,
    /// Linux command line (not yet: 501).
    #[serde(default)]
    pub cmdline: Option<String>,
    /// Guest RAM, 16 MiB..=64 GiB, a multiple of 4 KiB (default 256 MiB).
    #[serde(default = "default_vm_memory")]
    pub memory_bytes: u64,
    /// vCPUs, 1..=16 (default 1).
    #[serde(default = "one_vcpu")]
    pub vcpus: u8,
    /// An existing vGPU in state `ready`.
    #[serde(default)]
    pub vgpu_id: Option<u32>,
    /// A vGPU to create for this VM.
    #[serde(default)]
    pub vgpu: Option<VgpuCreate>,
    /// A name, unique among live VMs (the rules of `VgpuCreate.name`).
    #[serde(default)]
    pub name: Option<String>,
    /// Labels (the rules of `VgpuCreate.labels`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Default guest RAM.
pub const DEFAULT_VM_MEMORY: u64 = 256 << 20;

/// The start of the reason a VM is `failed` with when it was running as vgpud went away and
/// its vmm was gone when vgpud came back (a restart itself leaves running VMs alone).
pub const VM_LOST_IN_RESTART: &str = "stopped: its vmm was gone when vgpud restarted";

fn default_vm_memory() -> u64 {
    DEFAULT_VM_MEMORY
}

fn one_vcpu() -> u8 {
    1
}

/// Where a VM is in its life.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum VmState {
    /// The vmm is starting (and its vGPU not yet connected).
    Starting,
    /// The guest runs (its vGPU is connected).
    Running,
    /// The vmm exited with `code` (the guest's exit code; 143 after a stop).
    Exited {
        /// Exit code.
        code: i32,
    },
    /// The vmm was killed, its vGPU's worker died, or vgpud restarted while it ran
    /// (`stopped: vgpud restarted ...`: the record is kept, the VM is not).
    Failed {
        /// Why.
        reason: String,
    },
}

impl VmState {
    /// Whether the VM still runs.
    pub fn is_live(&self) -> bool {
        matches!(self, VmState::Starting | VmState::Running)
    }
}

/// A VM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    pub id: u32,
    /// The payload ELF it runs.
    pub payload: String,
    pub payload_arg: String,
    pub memory_bytes: u64,
    pub vcpus: u8,
    /// Its vGPU.
    pub vgpu: Option<u32>,
    pub state: VmState,
    /// The vmm process while it runs.
    pub pid: Option<u32>,
    /// Milliseconds since the VM was launched (until it ended).
    pub uptime_ms: u64,
    /// Its name, if it has one.
    #[serde(default)]
    pub name: Option<String>,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
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

/// A live migration request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// Target physical GPU; default: the least loaded other GPU with room.
    #[serde(default)]
    pub target_gpu: Option<u32>,
    /// `precopy` (default: copy while the guest runs, pause only for the rest) or
    /// `stop_copy` (pause, copy everything).
    #[serde(default)]
    pub mode: Option<String>,
    /// Pre-copy stops once the rest is expected to copy within this, ms (default 50).
    #[serde(default)]
    pub max_downtime_ms: Option<u64>,
}

/// One phase of a migration on its timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrationSpan {
    /// `precopy`, `draining` or `stop_copy`.
    pub phase: String,
    /// Since the migration started, ms.
    pub start_ms: f64,
    pub end_ms: f64,
}

/// A live migration of a vGPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Migration {
    pub id: u32,
    pub vgpu: u32,
    pub source_gpu: u32,
    pub target_gpu: u32,
    /// `precopy` or `stop_copy`.
    pub mode: String,
    /// `running`, `completed` or `failed` (then the vGPU still runs on its source).
    pub state: String,
    /// `starting`, `precopy`, `draining`, `stop_copy`, `done`.
    pub phase: String,
    /// Pre-copy rounds so far.
    pub rounds: u32,
    /// Bytes copied so far.
    pub bytes: u64,
    /// Bytes the vGPU holds.
    pub total_bytes: u64,
    /// Bytes still to copy, as last estimated.
    pub dirty_bytes: u64,
    /// The guest's pause, ms (once completed).
    pub downtime_ms: Option<f64>,
    /// Time since the start (total time once finished), ms.
    pub elapsed_ms: f64,
    /// Why it failed.
    pub error: Option<String>,
    pub timeline: Vec<MigrationSpan>,
    /// A whole VM moving to or from another vgpud (then `vgpu`, `source_gpu` and
    /// `target_gpu` are this side's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMigration>,
}

/// One GPU's demand as the rebalancer measured it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuDemand {
    pub gpu: u32,
    /// Smoothed demand (busy + queue wait of its vGPUs) over capacity, compute engine.
    pub compute_demand: f64,
    /// The same for the copy engine.
    pub copy_demand: f64,
    /// max(compute, copy): above 1 the GPU's vGPUs want more than it has.
    pub load: f64,
    /// Overloaded (load above the threshold for a whole window) now.
    pub overloaded: bool,
    /// Holds no vGPU (can be powered down or lent out).
    pub idle: bool,
    /// vGPUs on it.
    pub vgpus: u32,
    /// Time its load was above the overload threshold, ms since vgpud started.
    pub overload_ms: u64,
    /// Time it held no vGPU, ms since vgpud started.
    pub idle_ms: u64,
}

/// One vGPU's measured demand.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VgpuDemand {
    pub vgpu: u32,
    pub gpu: u32,
    /// Compute busy time over the last interval, fraction.
    pub compute_busy: f64,
    /// Time with compute requests waiting for a grant, fraction.
    pub compute_wait: f64,
    pub copy_busy: f64,
    pub copy_wait: f64,
    /// Smoothed demand on its GPU (busy + wait, at most 1 each).
    pub compute_demand: f64,
    pub copy_demand: f64,
    /// Device memory resident now (what a move copies).
    pub memory_resident_bytes: u64,
    /// Device memory it has allocated.
    pub memory_allocated_bytes: u64,
    /// Its memory share.
    pub memory_share_bytes: u64,
}

/// The rebalancer: its settings and what it measures now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebalancerStatus {
    /// `off` (measure only), `balance` or `consolidate`.
    pub mode: String,
    pub interval_ms: u64,
    /// How long an overload (or light load) must last before it is acted on.
    pub window_ms: u64,
    /// Overload threshold on a GPU's load.
    pub overload: f64,
    /// Migrations the rebalancer started.
    pub migrations: u64,
    /// GPUs that hold no vGPU now.
    pub idle_gpus: Vec<u32>,
    pub gpus: Vec<GpuDemand>,
    pub vgpus: Vec<VgpuDemand>,
}

/// Something the rebalancer decided or noticed, with its reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebalanceEvent {
    pub id: u64,
    /// Since vgpud started, ms.
    pub at_ms: u64,
    /// `balance` or `consolidate` (a migration), `overloaded`, `cleared`, `idle`,
    /// `busy`, `stuck` (overloaded, no move helps), or `failed` (a migration it started
    /// failed).
    pub kind: String,
    /// The GPU it is about (the source of a move).
    pub gpu: Option<u32>,
    pub vgpu: Option<u32>,
    pub target_gpu: Option<u32>,
    /// GPU load(s) before, and after as predicted for a move.
    pub load: Option<f64>,
    pub load_after: Option<f64>,
    /// Bytes a move copies.
    pub bytes: Option<u64>,
    /// The migration started (follow it at /v1/migrations/{id}).
    pub migration: Option<u32>,
    /// In words.
    pub reason: String,
}

/// Where a whole VM moves: another vgpud, on this host (`socket`: its API socket) or
/// another (`url` `http://HOST:PORT` with that daemon's bearer `token`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrationDestination {
    #[serde(default)]
    pub socket: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
}

/// `POST /v1/vms/{id}/migrate` with a destination: move the whole VM, vGPU included, to
/// another vgpud. Without `destination` the request moves the VM's vGPU to another GPU of
/// this host (see [`MigrateRequest`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VmMigrateRequest {
    pub destination: MigrationDestination,
    /// The pause the move aims for, ms (default 300).
    #[serde(default)]
    pub downtime_ms: Option<u64>,
    /// `precopy` (default: guest RAM and the vGPU's memory copied while the VM runs, one
    /// short stop for the rest) or `stop_copy` (the VM stops first; everything moves while
    /// it is stopped).
    #[serde(default)]
    pub mode: Option<String>,
}

/// A VM another vgpud wants to move here (`POST /v1/migrations/incoming`): what it is
/// launched as, its vGPU inline. The destination admits it with its own admission rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncomingVm {
    pub vm: VmCreate,
    /// Who sends it, for the record (the source's VM id and daemon).
    #[serde(default)]
    pub source: String,
}

/// The destination admitted the VM and waits for it: where to send the VM's stream
/// (`vmm`) and its vGPU's (`vgpu`), and the vGPU stream's one-time token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncomingAccepted {
    /// The destination's record of the move (`GET /v1/migrations/{id}` there).
    pub migration: u32,
    /// The VM's id there.
    pub vm: u32,
    /// `unix:PATH` or `tcp:HOST:PORT` (HOST empty: the destination's API host).
    pub vmm_address: String,
    pub vgpu_address: Option<String>,
    pub token: Option<String>,
    /// The VM stream's one-time token.
    #[serde(default)]
    pub vmm_token: Option<String>,
}

/// The source's last word on a finished move (`POST /v1/migrations/{id}/commit`): the
/// VM's console so far, which the destination's console continues.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncomingCommit {
    #[serde(default)]
    pub console: String,
    /// The move's figures as the source measured them (the destination's record shows
    /// them too).
    #[serde(default)]
    pub downtime_ms: Option<f64>,
    #[serde(default)]
    pub elapsed_ms: Option<f64>,
    #[serde(default)]
    pub figures: Option<HostMigration>,
    /// How long the VM has run, ms (its uptime continues at the destination).
    #[serde(default)]
    pub uptime_ms: Option<u64>,
}

/// A whole-VM move between two vgpud daemons, as one side sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostMigration {
    /// `outgoing` or `incoming`.
    pub direction: String,
    /// The VM's id on this side.
    pub vm: u32,
    /// The other daemon.
    pub peer: String,
    /// The VM's id and the move's record on the other side (once known).
    pub remote_vm: Option<u32>,
    pub remote_migration: Option<u32>,
    /// Guest RAM: pre-copy rounds, bytes sent, RAM sent while stopped.
    pub vmm_rounds: u32,
    pub vmm_bytes: u64,
    pub stop_ram_bytes: u64,
    /// The vGPU's state: rounds, bytes, the vGPU's share of the stop.
    pub vgpu_rounds: u32,
    pub vgpu_bytes: u64,
    pub vgpu_downtime_ms: Option<f64>,
}
