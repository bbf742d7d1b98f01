//! VMs: launch, state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::VgpuCreate;

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

/// What an empty request body means: no payload or kernel, [`DEFAULT_VM_MEMORY`] of
/// guest RAM, one vCPU, no vGPU, name or labels.
impl Default for VmCreate {
    fn default() -> Self {
        Self {
            payload: None,
            payload_arg: String::new(),
            kernel: None,
            initrd: None,
            cmdline: None,
            memory_bytes: default_vm_memory(),
            vcpus: one_vcpu(),
            vgpu_id: None,
            vgpu: None,
            name: None,
            labels: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod default_tests {
    use super::VmCreate;

    #[test]
    fn default_is_what_an_empty_request_means() {
        let parsed: VmCreate = serde_json::from_str("{}").expect("parse");
        assert_eq!(parsed, VmCreate::default());
    }
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
