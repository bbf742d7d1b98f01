//! Deletes the vGPUs of pods that are gone: the kubelet's PodResources API lists what every
//! pod holds; a device plugin vGPU none of whose slices is listed any more (and that is
//! older than the grace time, so an allocation the kubelet has not recorded yet is safe) is
//! deleted with its CDI spec. CDI specs of this agent whose vGPU vgpud no longer has go too.
//! Nothing is deleted while PodResources or vgpud do not answer.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use crate::agent::Agent;
use crate::grpc;
use crate::proto::podresources as pr;

/// The (resource name, device ID) pairs every pod holds, from the kubelet.
pub async fn held_devices(agent: &Agent) -> Result<BTreeSet<(String, String)>, String> {
    let channel = grpc::connect(&agent.opts.pod_resources_socket)
        .await
        .map_err(|e| e.to_string())?;
    let list = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel)
        .list(pr::ListPodResourcesRequest {})
        .await
        .map_err(|e| format!("PodResources List: {}", e.message()))?
        .into_inner();
    let mut held = BTreeSet::new();
    for pod in &list.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                for id in &d.device_ids {
                    held.insert((d.resource_name.clone(), id.clone()));
                }
            }
        }
    }
    Ok(held)
}

/// One cleanup pass; returns the vGPUs deleted.
pub async fn pass(agent: &Arc<Agent>) -> Result<Vec<u32>, String> {
    let held = held_devices(agent).await?;
    let _one = agent.changes.lock().await;
    let ours = agent.our_vgpus().await.map_err(|e| e.to_string())?;
    let mut deleted = Vec::new();
    for v in &ours {
        let Some((profile, ids)) = agent.keys.allocation(v) else {
            continue;
        };
        let resource = format!("{}/{profile}", agent.opts.config.domain);
        if ids
            .iter()
            .any(|id| held.contains(&(resource.clone(), id.clone())))
        {
            continue;
        }
        let young = agent
            .created
            .lock()
            .ok()
            .and_then(|m| m.get(&v.id).copied())
            .is_some_and(|t: Instant| t.elapsed() < agent.opts.gc_grace);
        if young {
            continue;
        }
        tracing::info!(
            "vGPU {} ({resource} {}) belongs to no pod the kubelet lists: deleting it",
            v.id,
            ids.join(",")
        );
        if agent.take_back(v.id).await {
            deleted.push(v.id);
        }
    }
    // Specs whose vGPU is gone (deleted by hand, or the agent stopped half-way). DRA specs
    // stay while their claim is prepared: vgpud still lists their vGPUs.
    let live: BTreeSet<u32> = ours.iter().map(|v| v.id).collect();
    if let Ok(entries) = std::fs::read_dir(&agent.cdi.dir) {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|n| agent.cdi.id_of_file(n)) else {
                continue;
            };
            if !live.contains(&id) && !deleted.contains(&id) {
                tracing::info!("removing the CDI spec of vGPU {id}, which vgpud no longer has");
                if let Err(e) = agent.cdi.remove(id) {
                    tracing::warn!("{e}");
                }
            }
        }
    }
    if !deleted.is_empty() {
        let _ = agent.refresh().await;
    }
    Ok(deleted)
}

/// Cleans up every `poll` while the kubelet's PodResources socket is there.
pub async fn run(agent: Arc<Agent>) {
    let mut last_error = String::new();
    loop {
        tokio::time::sleep(agent.opts.poll).await;
        if !agent.opts.pod_resources_socket.exists() {
            continue;
        }
        match pass(&agent).await {
            Ok(_) => last_error.clear(),
            Err(e) => {
                if e != last_error {
                    tracing::warn!("cleanup skipped: {e}");
                    last_error = e;
                }
            }
        }
    }
}
