//! The DRA driver (kubelet DRA API v1, registered through `plugins_registry/`):
//! NodePrepareResources reads each claim from the API server, creates one process vGPU per
//! device allocated from this node's pool (the amounts of the device's profile, or less as
//! the claim's opaque configuration asks) and answers its CDI device ID;
//! NodeUnprepareResources deletes them. Both are idempotent: a checkpoint file (claim UID
//! → vGPUs, written atomically) and the vGPUs' labels in vgpud make a retry answer the
//! same vGPUs, after an agent restart too.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};
use vgpu_api::api::VgpuState;
use vgpu_api::units::{fraction_to_permille, parse_size};

use crate::agent::Agent;
use crate::cdi::write_atomic;
use crate::grpc;
use crate::kubeapi::KubeApi;
use crate::proto::dra as pb;
use crate::proto::pluginregistration as reg;
use crate::slices;

/// The service version registered (`v1.DRAPlugin`, the kubelet's DRA API v1).
pub const SERVICE: &str = "v1.DRAPlugin";

/// The checkpoint: what each prepared claim got.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// One prepared claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
}

/// One device of a prepared claim and its vGPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub vgpu: u32,
    pub cdi_device_id: String,
}

/// A claim's opaque configuration for this driver (`parameters`); every field optional,
/// none above the allocated device's profile.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VgpuParameters {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub memory: Option<String>,
    #[serde(default)]
    pub compute: Option<f64>,
    #[serde(default)]
    pub copy: Option<f64>,
    #[serde(default)]
    pub priority: Option<i32>,
}

/// The checkpoint file.
fn checkpoint_path(agent: &Agent) -> PathBuf {
    agent.opts.state_dir.join("dra-checkpoint.json")
}

/// Reads the checkpoint (none yet: empty; damaged: an error naming the file).
pub fn load_checkpoint(agent: &Agent) -> Result<Checkpoint, String> {
    let path = checkpoint_path(agent);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            format!("the DRA checkpoint {} is damaged ({e}); move it aside and restart the agent (prepared claims are found again by their vGPUs' labels)", path.display())
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn save_checkpoint(agent: &Agent, c: &Checkpoint) -> Result<(), String> {
    let path = checkpoint_path(agent);
    let text = serde_json::to_vec_pretty(c).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&agent.opts.state_dir)
        .and_then(|()| write_atomic(&path, &text))
        .map_err(|e| format!("cannot write the DRA checkpoint {}: {e}", path.display()))
}

/// The DRA service.
#[derive(Clone)]
pub struct Driver {
    agent: Arc<Agent>,
}

impl Driver {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self { agent }
    }

    /// The amounts one device's vGPU gets: its profile's, lowered by the parameters.
    fn amounts(
        &self,
        profile: &crate::config::Profile,
        params: &VgpuParameters,
    ) -> Result<(u64, u32, u32, i32), String> {
        let domain = &self.agent.opts.config.domain;
        if let Some(v) = &params.api_version {
            if v != &format!("{domain}/v1") {
                return Err(format!("parameters apiVersion {v:?}: give {domain}/v1"));
            }
        }
        if let Some(k) = &params.kind {
            if k != "VgpuConfig" {
                return Err(format!("parameters kind {k:?}: give VgpuConfig"));
            }
        }
        let memory = match &params.memory {
            Some(m) => parse_size(m).map_err(|e| format!("parameters memory: {e}"))?,
            None => profile.memory_bytes,
        };
        let share = |what: &str, v: Option<f64>, max: u32| -> Result<u32, String> {
            match v {
                None => Ok(max),
                Some(f) if (0.0..=1.0).contains(&f) => {
                    let p = fraction_to_permille(f);
                    if p > max {
                        Err(format!(
                            "parameters {what} {f} is more than the device's {} (profile {}); ask for a bigger profile",
                            f64::from(max) / 1000.0,
                            profile.name
                        ))
                    } else {
                        Ok(p)
                    }
                }
                Some(f) => Err(format!("parameters {what} {f} is outside 0..1 of the GPU")),
            }
        };
        if memory == 0 || memory > profile.memory_bytes {
            return Err(format!(
                "parameters memory {memory} bytes: give more than 0 and at most the device's {} (profile {})",
                profile.memory_bytes, profile.name
            ));
        }
        let compute = share("compute", params.compute, profile.compute_permille)?;
        let copy = share(
            "copy",
            params.copy.or(params.compute),
            profile.copy_permille,
        )?;
        Ok((
            memory,
            compute,
            copy,
            params.priority.unwrap_or(profile.priority),
        ))
    }

    /// Prepares one claim; its devices.
    async fn prepare(&self, claim: &pb::Claim) -> Result<Vec<PreparedDevice>, String> {
        let agent = &self.agent;
        let mut cp = load_checkpoint(agent)?;
        if let Some(done) = cp.claims.get(&claim.uid) {
            let mut all_there = true;
            for d in &done.devices {
                let id = d.vgpu;
                match agent.vgpud.run(move |c| c.vgpu(id)).await {
                    Ok(v)
                        if !matches!(v.state, VgpuState::Failed { .. } | VgpuState::Releasing) => {}
                    _ => all_there = false,
                }
            }
            if all_there {
                return Ok(done.devices.clone());
            }
            for d in &done.devices {
                agent.take_back(d.vgpu).await;
            }
        }
        for (what, v) in [("namespace", &claim.namespace), ("name", &claim.name)] {
            let ok = !v.is_empty()
                && v.len() <= 253
                && v.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !ok {
                return Err(format!(
                    "the claim's {what} {v:?} is not a Kubernetes object name"
                ));
            }
        }
        let api = agent
            .opts
            .kube_api
            .as_deref()
            .ok_or("the agent has no --kube-api to read ResourceClaims from")?;
        let api = KubeApi::new(api)?;
        let path = format!(
            "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
            claim.namespace, claim.name
        );
        let rc: ResourceClaim = tokio::task::spawn_blocking(move || api.get(&path))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if rc.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(format!(
                "ResourceClaim {}/{} has UID {:?}, not {}: it was deleted and created again",
                claim.namespace, claim.name, rc.metadata.uid, claim.uid
            ));
        }
        let cfg = &agent.opts.config;
        let alloc = rc
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .ok_or_else(|| {
                format!(
                    "ResourceClaim {}/{} is not allocated",
                    claim.namespace, claim.name
                )
            })?;
        let configs = alloc.config.unwrap_or_default();
        // vGPUs left by an attempt that did not reach the checkpoint.
        let uid = claim.uid.clone();
        let keys = agent.keys.clone();
        let left: HashMap<String, u32> = agent
            .our_vgpus()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|v| v.labels.get(&keys.claim) == Some(&uid))
            .filter_map(|v| Some((v.labels.get(&keys.device)?.clone(), v.id)))
            .collect();
        let mut made = Vec::new();
        let mut devices = Vec::new();
        let result: Result<(), String> = async {
            for r in alloc.results.unwrap_or_default() {
                if r.driver != cfg.domain || r.pool != agent.opts.node_name {
                    continue;
                }
                let (gpu, profile) =
                    slices::parse_device_name(cfg, &r.device).ok_or_else(|| {
                        format!("device {:?} is not one this driver publishes", r.device)
                    })?;
                let mut params = VgpuParameters::default();
                for c in &configs {
                    let Some(o) = &c.opaque else { continue };
                    let applies = c
                        .requests
                        .as_ref()
                        .is_none_or(|q| q.is_empty() || q.contains(&r.request));
                    if o.driver != cfg.domain || !applies {
                        continue;
                    }
                    let p: VgpuParameters = serde_json::from_value(o.parameters.0.clone())
                        .map_err(|e| {
                            format!(
                                "the {} configuration of request {:?}: {e}",
                                c.source, r.request
                            )
                        })?;
                    params = VgpuParameters {
                        api_version: p.api_version.or(params.api_version),
                        kind: p.kind.or(params.kind),
                        memory: p.memory.or(params.memory),
                        compute: p.compute.or(params.compute),
                        copy: p.copy.or(params.copy),
                        priority: p.priority.or(params.priority),
                    };
                }
                let (memory, compute, copy, priority) = self.amounts(profile, &params)?;
                let vgpu = match left.get(&r.device) {
                    Some(&id) => agent
                        .vgpud
                        .run(move |c| c.vgpu(id))
                        .await
                        .map_err(|e| e.to_string())?,
                    None => {
                        let labels = vec![
                            (keys.claim.clone(), claim.uid.clone()),
                            (keys.device.clone(), r.device.clone()),
                        ];
                        let h = agent
                            .hand_out(gpu, memory, compute, copy, priority, labels)
                            .await
                            .map_err(|e| e.to_string())?;
                        made.push(h.vgpu.id);
                        h.vgpu
                    }
                };
                let (_, cdi_device_id) = agent.edits_and_spec(&vgpu).map_err(|e| e.to_string())?;
                devices.push(PreparedDevice {
                    request: r.request.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    vgpu: vgpu.id,
                    cdi_device_id,
                });
            }
            cp.claims.insert(
                claim.uid.clone(),
                PreparedClaim {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    devices: devices.clone(),
                },
            );
            save_checkpoint(agent, &cp)
        }
        .await;
        match result {
            Ok(()) => Ok(devices),
            Err(e) => {
                for id in made {
                    agent.take_back(id).await;
                }
                Err(e)
            }
        }
    }

    /// Unprepares one claim: deletes its vGPUs and specs, then forgets it.
    async fn unprepare(&self, claim: &pb::Claim) -> Result<(), String> {
        let agent = &self.agent;
        let mut cp = load_checkpoint(agent)?;
        let mut ids: Vec<u32> = cp
            .claims
            .get(&claim.uid)
            .map(|c| c.devices.iter().map(|d| d.vgpu).collect())
            .unwrap_or_default();
        let keys = agent.keys.clone();
        for v in agent.our_vgpus().await.map_err(|e| e.to_string())? {
            if v.labels.get(&keys.claim) == Some(&claim.uid) && !ids.contains(&v.id) {
                ids.push(v.id);
            }
        }
        let mut failed = Vec::new();
        for id in ids {
            if !agent.take_back(id).await {
                failed.push(id);
            }
        }
        if !failed.is_empty() {
            return Err(format!(
                "vGPUs {failed:?} could not be deleted yet (the kubelet retries)"
            ));
        }
        if cp.claims.remove(&claim.uid).is_some() {
            save_checkpoint(agent, &cp)?;
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::dra_plugin_server::DraPlugin for Driver {
    async fn node_prepare_resources(
        &self,
        req: Request<pb::NodePrepareResourcesRequest>,
    ) -> Result<Response<pb::NodePrepareResourcesResponse>, Status> {
        let _one = self.agent.changes.lock().await;
        let mut claims = HashMap::new();
        for c in &req.get_ref().claims {
            let r = match self.prepare(c).await {
                Ok(devices) => pb::NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| pb::Device {
                            request_names: vec![d.request],
                            pool_name: d.pool,
                            device_name: d.device,
                            cdi_device_ids: vec![d.cdi_device_id],
                            share_id: None,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(
                        "preparing claim {}/{} ({}) failed: {error}",
                        c.namespace,
                        c.name,
                        c.uid
                    );
                    pb::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            claims.insert(c.uid.clone(), r);
        }
        let _ = self.agent.refresh().await;
        Ok(Response::new(pb::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<pb::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<pb::NodeUnprepareResourcesResponse>, Status> {
        let _one = self.agent.changes.lock().await;
        let mut claims = HashMap::new();
        for c in &req.get_ref().claims {
            let error = self.unprepare(c).await.err().unwrap_or_default();
            claims.insert(c.uid.clone(), pb::NodeUnprepareResourceResponse { error });
        }
        let _ = self.agent.refresh().await;
        Ok(Response::new(pb::NodeUnprepareResourcesResponse { claims }))
    }
}

/// The registration service the kubelet's plugin watcher calls.
pub struct Registrar {
    name: String,
    endpoint: String,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: self.name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![SERVICE.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!("the kubelet registered DRA driver {}", self.name);
        } else {
            tracing::warn!(
                "the kubelet did not register DRA driver {}: {}",
                self.name,
                s.error
            );
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The DRA driver's socket.
pub fn driver_socket(agent: &Agent) -> PathBuf {
    agent.opts.dra_plugin_dir.join("dra.sock")
}

/// Its registration socket in the plugin registry.
pub fn registration_socket(agent: &Agent) -> PathBuf {
    agent
        .opts
        .plugins_registry_dir
        .join(format!("{}-reg.sock", agent.opts.config.domain))
}

/// Serves the driver and its registration (again whenever a socket file is removed), and
/// publishes the ResourceSlices when an API server is configured.
pub async fn run(agent: Arc<Agent>) {
    let drv = driver_socket(&agent);
    let regs = registration_socket(&agent);
    let mut servers = Vec::new();
    let mut published: Option<Vec<k8s_openapi::api::resource::v1::ResourceSlice>> = None;
    let mut generation = 0i64;
    loop {
        // A socket file left by an agent that died is not ours: serve anew at the start.
        if servers.is_empty() || !drv.exists() || !regs.exists() {
            for s in servers.drain(..) {
                tokio::task::JoinHandle::abort(&s);
            }
            let started = (|| {
                let l1 = grpc::bind(&drv)?;
                let l2 = grpc::bind(&regs)?;
                Ok::<_, grpc::GrpcError>((l1, l2))
            })();
            match started {
                Ok((l1, l2)) => {
                    let svc =
                        pb::dra_plugin_server::DraPluginServer::new(Driver::new(agent.clone()));
                    servers.push(grpc::serve(
                        l1,
                        tonic::transport::Server::builder().add_service(svc),
                    ));
                    let r = reg::registration_server::RegistrationServer::new(Registrar {
                        name: agent.opts.config.domain.clone(),
                        endpoint: drv.display().to_string(),
                    });
                    servers.push(grpc::serve(
                        l2,
                        tonic::transport::Server::builder().add_service(r),
                    ));
                    tracing::info!(
                        "DRA driver {} serves {}",
                        agent.opts.config.domain,
                        drv.display()
                    );
                }
                Err(e) => tracing::warn!("the DRA driver cannot start (retrying): {e}"),
            }
        }
        if let Some(url) = agent.opts.kube_api.clone() {
            if let Err(e) = publish(&agent, &url, &mut published, &mut generation).await {
                tracing::warn!("publishing ResourceSlices: {e}");
            }
        }
        tokio::time::sleep(agent.opts.poll).await;
    }
}

/// Writes the node's ResourceSlices when they changed (PUT, or POST for a new one; a GPU's
/// slice that is gone is deleted).
async fn publish(
    agent: &Arc<Agent>,
    url: &str,
    published: &mut Option<Vec<k8s_openapi::api::resource::v1::ResourceSlice>>,
    generation: &mut i64,
) -> Result<(), String> {
    let api = KubeApi::new(url)?;
    let (gpus, vgpus) = agent
        .vgpud
        .run(|c| Ok((c.gpus()?, c.vgpus()?)))
        .await
        .map_err(|e| e.to_string())?;
    let now = slices::build(
        &agent.opts.config,
        &agent.opts.node_name,
        *generation,
        &gpus,
        &vgpus,
    );
    if published.as_ref() == Some(&now) {
        return Ok(());
    }
    *generation += 1;
    let now = slices::build(
        &agent.opts.config,
        &agent.opts.node_name,
        *generation,
        &gpus,
        &vgpus,
    );
    let old = published.take().unwrap_or_default();
    let r = tokio::task::spawn_blocking(move || {
        const BASE: &str = "/apis/resource.k8s.io/v1/resourceslices";
        for s in &now {
            let name = s.metadata.name.clone().unwrap_or_default();
            let body = serde_json::to_vec(&serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": s.metadata, "spec": s.spec,
            }))
            .map_err(|e| e.to_string())?;
            match api.request("PUT", &format!("{BASE}/{name}"), Some(&body)) {
                Ok(_) => {}
                Err(e) if e.status() == Some(404) => {
                    api.request("POST", BASE, Some(&body))
                        .map_err(|e| e.to_string())?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        for s in &old {
            let name = s.metadata.name.clone().unwrap_or_default();
            if !now
                .iter()
                .any(|n| n.metadata.name.as_deref() == Some(name.as_str()))
            {
                match api.request("DELETE", &format!("{BASE}/{name}"), None) {
                    Ok(_) => {}
                    Err(e) if e.status() == Some(404) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        Ok(now)
    })
    .await
    .map_err(|e| e.to_string())?;
    *published = Some(r?);
    Ok(())
}
