//! The kubelet device plugin (API v1beta1): one gRPC server and one registration per
//! profile (`vgpu.dev/<profile>`), its devices the slices the GPUs can still give
//! (inventory.rs). Allocate creates one process vGPU per container holding all the
//! container's slices (they must lie on one GPU: GetPreferredAllocation packs them so) and
//! answers with its CDI device and, for runtimes without CDI, the same mounts and envs.
//! When the kubelet restarts (its `kubelet.sock` is a new file) the servers start again
//! and register again.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::agent::Agent;
use crate::config::Profile;
use crate::grpc;
use crate::inventory::{self, parse_device_id, Snapshot};
use crate::proto::deviceplugin as dp;

/// The API version registered.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket in the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// One profile's device plugin.
#[derive(Clone)]
pub struct ProfilePlugin {
    agent: Arc<Agent>,
    profile: Profile,
}

impl ProfilePlugin {
    fn devices(&self, s: &Snapshot) -> Vec<dp::Device> {
        s.devices
            .get(&self.profile.name)
            .map(|list| {
                list.iter()
                    .map(|d| dp::Device {
                        id: d.id.clone(),
                        health: if d.healthy { "Healthy" } else { "Unhealthy" }.into(),
                        topology: None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Creates the vGPU of one container's slices.
    async fn allocate_one(
        &self,
        ids: &[String],
    ) -> Result<(u32, dp::ContainerAllocateResponse), Status> {
        let p = &self.profile;
        if ids.is_empty() {
            return Err(Status::invalid_argument("a container asked for no device"));
        }
        let mut gpus = BTreeSet::new();
        let distinct: BTreeSet<&String> = ids.iter().collect();
        if distinct.len() != ids.len() {
            return Err(Status::invalid_argument(format!(
                "the devices {ids:?} name a slice twice"
            )));
        }
        for id in ids {
            let (g, _) = parse_device_id(id).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{id:?} is not a device of {}; the kubelet names devices from ListAndWatch",
                    self.agent.opts.config.resource_name(p)
                ))
            })?;
            gpus.insert(g);
        }
        let gpu = match gpus.iter().collect::<Vec<_>>().as_slice() {
            [g] => **g,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "the {} slices asked for lie on GPUs {gpus:?}; a container runs on one vGPU: \
                     ask for as many slices as one GPU holds",
                    ids.len()
                )))
            }
        };
        // A slice the kubelet hands out again belongs to a pod that is gone: its vGPU goes.
        let keys = self.agent.keys.clone();
        let stale: Vec<u32> = self
            .agent
            .our_vgpus()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .iter()
            .filter(|v| {
                keys.allocation(v).is_some_and(|(prof, held)| {
                    prof == p.name && held.iter().any(|h| ids.iter().any(|i| i == h))
                })
            })
            .map(|v| v.id)
            .collect();
        for id in stale {
            tracing::info!("vGPU {id} held slices the kubelet hands out again: deleting it");
            self.agent.take_back(id).await;
        }
        let n = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        let labels = vec![
            (keys.resource.clone(), p.name.clone()),
            (
                keys.devices.clone(),
                inventory::encode_devices(ids)
                    .ok_or_else(|| Status::invalid_argument("the slices lie on several GPUs"))?,
            ),
        ];
        let handed = self
            .agent
            .hand_out(
                gpu,
                p.memory_bytes.saturating_mul(u64::from(n)),
                p.compute_permille.saturating_mul(n),
                p.copy_permille.saturating_mul(n),
                p.priority,
                labels,
            )
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        if let Ok(mut m) = self.agent.created.lock() {
            m.insert(handed.vgpu.id, Instant::now());
        }
        tracing::info!(
            "allocated {} slice(s) of {} on GPU {gpu} as vGPU {} ({})",
            ids.len(),
            p.name,
            handed.vgpu.id,
            handed.vgpu.socket
        );
        let envs: HashMap<String, String> = handed.edits.env.iter().cloned().collect();
        let mounts = handed
            .edits
            .mounts
            .iter()
            .map(|(host, ctr, ro)| dp::Mount {
                container_path: ctr.clone(),
                host_path: host.clone(),
                read_only: *ro,
            })
            .collect();
        Ok((
            handed.vgpu.id,
            dp::ContainerAllocateResponse {
                envs,
                mounts,
                devices: Vec::new(),
                annotations: HashMap::new(),
                cdi_devices: vec![dp::CdiDevice {
                    name: handed.cdi_device,
                }],
            },
        ))
    }
}

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for ProfilePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<dp::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut watch = self.agent.snapshot.subscribe();
        let me = self.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<dp::Device>> = None;
            loop {
                let devices = me.devices(&watch.borrow_and_update());
                if last.as_ref() != Some(&devices) {
                    let msg = dp::ListAndWatchResponse {
                        devices: devices.clone(),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return; // the kubelet hung up
                    }
                    last = Some(devices);
                }
                tokio::select! {
                    r = watch.changed() => if r.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| dp::ContainerPreferredAllocationResponse {
                device_i_ds: inventory::preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let req = req.into_inner();
        let _one = self.agent.changes.lock().await;
        let mut made = Vec::new();
        let mut container_responses = Vec::new();
        for c in &req.container_requests {
            match self.allocate_one(&c.devices_ids).await {
                Ok((id, r)) => {
                    made.push(id);
                    container_responses.push(r);
                }
                Err(e) => {
                    // All or nothing: the pod gets no half of its vGPUs.
                    for id in made {
                        self.agent.take_back(id).await;
                    }
                    tracing::warn!("Allocate of {:?} refused: {}", c.devices_ids, e.message());
                    let _ = self.agent.refresh().await;
                    return Err(e);
                }
            }
        }
        let _ = self.agent.refresh().await;
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

fn options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The socket file of a profile's server in the device plugin directory.
pub fn socket_name(profile: &Profile) -> String {
    format!("vgpu-k8s-{}.sock", profile.name)
}

/// Identity of the kubelet's registration socket (a restarted kubelet makes a new file).
fn identity(path: &Path) -> Option<(u64, u64, i64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.ctime_nsec() + m.ctime() * 1_000_000_000))
}

/// Starts every profile's server and registers it; returns the servers.
async fn start_and_register(agent: &Arc<Agent>) -> Result<Vec<JoinHandle<()>>, String> {
    let dir = &agent.opts.device_plugin_dir;
    let mut servers = Vec::new();
    let result = async {
        for p in &agent.opts.config.profiles {
            let name = socket_name(p);
            let listener = grpc::bind(&dir.join(&name)).map_err(|e| e.to_string())?;
            let svc = dp::device_plugin_server::DevicePluginServer::new(ProfilePlugin {
                agent: agent.clone(),
                profile: p.clone(),
            });
            let router = tonic::transport::Server::builder().add_service(svc);
            servers.push(grpc::serve(listener, router));
            let channel = grpc::connect(&dir.join(KUBELET_SOCKET))
                .await
                .map_err(|e| e.to_string())?;
            let resource_name = agent.opts.config.resource_name(p);
            dp::registration_client::RegistrationClient::new(channel)
                .register(dp::RegisterRequest {
                    version: VERSION.into(),
                    endpoint: name,
                    resource_name: resource_name.clone(),
                    options: Some(options()),
                })
                .await
                .map_err(|e| format!("the kubelet refused {resource_name}: {}", e.message()))?;
            tracing::info!("registered {resource_name} with the kubelet");
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => Ok(servers),
        Err(e) => {
            for s in servers {
                s.abort();
            }
            Err(e)
        }
    }
}

/// Registers with the kubelet, and again whenever the kubelet restarted or our sockets
/// went away (the kubelet removes them when it starts): the directory is watched, and
/// looked at every poll.
pub async fn run(agent: Arc<Agent>) {
    let dir: PathBuf = agent.opts.device_plugin_dir.clone();
    let kubelet = dir.join(KUBELET_SOCKET);
    let mut servers: Vec<JoinHandle<()>> = Vec::new();
    let mut registered_with = None;
    let mut last_error = String::new();
    let wake = Arc::new(tokio::sync::Notify::new());
    if let Err(e) = crate::dirwatch::watch(&dir, wake.clone()) {
        tracing::warn!(
            "cannot watch {} ({e}); a kubelet restart is seen at the next poll",
            dir.display()
        );
    }
    loop {
        let now = identity(&kubelet);
        let ours_there = agent
            .opts
            .config
            .profiles
            .iter()
            .all(|p| dir.join(socket_name(p)).exists());
        if now.is_some() && (now != registered_with || !ours_there) {
            for s in servers.drain(..) {
                s.abort();
            }
            match start_and_register(&agent).await {
                Ok(s) => {
                    servers = s;
                    registered_with = now;
                    last_error.clear();
                }
                Err(e) => {
                    if e != last_error {
                        tracing::warn!("device plugin registration failed (retrying): {e}");
                        last_error = e;
                    }
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(agent.opts.poll) => {}
            () = wake.notified() => {}
        }
    }
}
