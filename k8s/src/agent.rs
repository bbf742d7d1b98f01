//! The agent's shared state and its loops: vgpud's inventory followed every `poll`, the
//! device plugin's registration with the kubelet, the DRA driver, and the cleanup of
//! vGPUs whose pods are gone.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Mutex};
use vgpu_api::api::{Attach, Vgpu, VgpuCreate};
use vgpu_api::client::ClientError;

use crate::cdi::{Edits, SpecDir};
use crate::config::Config;
use crate::inventory::{self, LabelKeys, Snapshot, AGENT};
use crate::vgpud::{gone, Vgpud};

/// Where things are on the node, and how often to look.
#[derive(Clone, Debug)]
pub struct Options {
    pub config: Config,
    /// This node's name (the DRA pool and ResourceSlices name it).
    pub node_name: String,
    /// The kubelet's device plugin directory (`kubelet.sock` and our sockets).
    pub device_plugin_dir: PathBuf,
    /// The kubelet's PodResources socket.
    pub pod_resources_socket: PathBuf,
    /// The kubelet's plugin registration directory (the DRA driver registers there).
    pub plugins_registry_dir: PathBuf,
    /// The DRA driver's own directory (its gRPC socket).
    pub dra_plugin_dir: PathBuf,
    /// Where CDI specs go.
    pub cdi_dir: PathBuf,
    /// The host directory holding `libcuda.so.1` (`vgpu-cuda install --prefix P` makes
    /// `P/lib`).
    pub library_dir: PathBuf,
    /// The agent's own state (the DRA checkpoint).
    pub state_dir: PathBuf,
    /// The API server (plain HTTP, e.g. `kubectl proxy` beside the agent), for the DRA
    /// driver's ResourceClaims and ResourceSlices.
    pub kube_api: Option<String>,
    /// How often vgpud and the kubelet's sockets are looked at.
    pub poll: Duration,
    /// How long a device plugin vGPU may go unlisted by PodResources before it is deleted
    /// (the kubelet lists an allocation once its pod is admitted).
    pub gc_grace: Duration,
    pub device_plugin: bool,
    pub dra: bool,
}

/// Why a vGPU could not be handed out.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("vgpud did not create the vGPU: {0}")]
    Vgpud(#[from] ClientError),
    #[error(transparent)]
    Cdi(#[from] crate::cdi::CdiError),
    #[error("vgpud answered a socket path without a directory: {0}")]
    Socket(String),
    #[error("{0}")]
    Request(String),
}

/// A vGPU handed to a container, with what the container receives.
#[derive(Clone, Debug)]
pub struct Handed {
    pub vgpu: Vgpu,
    pub edits: Edits,
    /// Its CDI device ID (`vgpu.dev/vgpu=vgpu-3`).
    pub cdi_device: String,
}

/// The agent.
pub struct Agent {
    pub opts: Options,
    pub vgpud: Vgpud,
    pub cdi: SpecDir,
    pub keys: LabelKeys,
    /// What the GPUs can give, as last seen.
    pub snapshot: watch::Sender<Snapshot>,
    /// Serializes creating and deleting vGPUs (Allocate, prepare, cleanup).
    pub changes: Mutex<()>,
    /// When this agent created each of its device plugin vGPUs (cleanup waits `gc_grace`).
    pub created: std::sync::Mutex<HashMap<u32, Instant>>,
}

impl Agent {
    pub fn new(opts: Options, vgpud: Vgpud) -> Arc<Self> {
        let cdi = SpecDir::new(opts.cdi_dir.clone(), &opts.config.domain);
        let keys = LabelKeys::new(&opts.config.domain);
        Arc::new(Self {
            opts,
            vgpud,
            cdi,
            keys,
            snapshot: watch::Sender::new(Snapshot::default()),
            changes: Mutex::new(()),
            created: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Reads vgpud's GPUs and vGPUs and publishes what they can give; while vgpud does not
    /// answer, every device is unhealthy.
    pub async fn refresh(&self) -> Result<Vec<Vgpu>, ClientError> {
        let r = self.vgpud.run(|c| Ok((c.gpus()?, c.vgpus()?))).await;
        match r {
            Ok((gpus, vgpus)) => {
                let s = inventory::snapshot(&self.opts.config, &gpus, &vgpus);
                self.snapshot.send_if_modified(|old| {
                    let changed = *old != s;
                    if changed {
                        *old = s;
                    }
                    changed
                });
                Ok(vgpus)
            }
            Err(e) => {
                self.snapshot.send_if_modified(|old| {
                    let down = old.all_unhealthy();
                    let changed = *old != down;
                    if changed {
                        tracing::warn!("vgpud does not answer ({e}): every device is unhealthy");
                        *old = down;
                    }
                    changed
                });
                Err(e)
            }
        }
    }

    /// The vGPUs this agent created, as vgpud lists them.
    pub async fn our_vgpus(&self) -> Result<Vec<Vgpu>, ClientError> {
        let keys = self.keys.clone();
        let all = self.vgpud.run(|c| c.vgpus()).await?;
        Ok(all.into_iter().filter(|v| keys.ours(v)).collect())
    }

    /// Creates a process vGPU on `gpu` and writes its CDI spec: what a container receives.
    pub async fn hand_out(
        &self,
        gpu: u32,
        memory_bytes: u64,
        compute_permille: u32,
        copy_permille: u32,
        priority: i32,
        labels: Vec<(String, String)>,
    ) -> Result<Handed, AllocError> {
        let cfg = &self.opts.config;
        let mut all_labels: std::collections::BTreeMap<String, String> =
            labels.into_iter().collect();
        all_labels.insert(self.keys.agent.clone(), AGENT.into());
        let spec = VgpuCreate {
            gpu: Some(gpu),
            memory_bytes,
            compute_share: f64::from(compute_permille.min(1000)) / 1000.0,
            copy_share: Some(f64::from(copy_permille.min(1000)) / 1000.0),
            priority,
            oversubscribe: false,
            share_group: None,
            queues: 4,
            storage: Vec::new(),
            name: None,
            labels: all_labels,
            kernel_deadline_ms: None,
            attach: Attach::Process,
            owner_uid: Some(cfg.socket_uid),
            owner_gid: Some(cfg.socket_gid),
        };
        let vgpu = self.vgpud.run(move |c| c.create_vgpu(&spec)).await?;
        match self.edits_and_spec(&vgpu) {
            Ok((edits, cdi_device)) => Ok(Handed {
                vgpu,
                edits,
                cdi_device,
            }),
            Err(e) => {
                self.take_back(vgpu.id).await;
                Err(e)
            }
        }
    }

    /// The edits of an existing vGPU, its CDI spec (re)written.
    pub fn edits_and_spec(&self, vgpu: &Vgpu) -> Result<(Edits, String), AllocError> {
        let cfg = &self.opts.config;
        let edits = Edits::for_vgpu(
            std::path::Path::new(&vgpu.socket),
            &self.opts.library_dir,
            &cfg.container_socket_dir,
            &cfg.container_library_dir,
        )
        .ok_or_else(|| AllocError::Socket(vgpu.socket.clone()))?;
        self.cdi.write(vgpu.id, &edits)?;
        Ok((edits, self.cdi.qualified(vgpu.id)))
    }

    /// Deletes vGPU `id` and its CDI spec; logs what fails (a later cleanup retries).
    pub async fn take_back(&self, id: u32) -> bool {
        let r = self.vgpud.run(move |c| c.delete_vgpu(id)).await;
        let ok = match r {
            Ok(()) => true,
            Err(e) if gone(&e) => true,
            Err(e) => {
                tracing::warn!("cannot delete vGPU {id}: {e}");
                false
            }
        };
        if ok {
            if let Err(e) = self.cdi.remove(id) {
                tracing::warn!("{e}");
            }
            if let Ok(mut m) = self.created.lock() {
                m.remove(&id);
            }
        }
        ok
    }

    /// Follows vgpud until the process ends.
    pub async fn follow_vgpud(self: Arc<Self>) {
        loop {
            let _ = self.refresh().await;
            tokio::time::sleep(self.opts.poll).await;
        }
    }
}
