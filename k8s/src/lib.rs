//! vgpu-k8s: the Kubernetes node agent. It hands the local vgpud's process vGPUs to pods
//! as a kubelet device plugin (extended resources, one per profile) and as a DRA driver
//! (ResourceClaims), with CDI specs for the container runtime (docs/kubernetes.md).

pub mod agent;
pub mod cdi;
pub mod cleanup;
pub mod config;
pub mod device_plugin;
pub mod dirwatch;
pub mod dra;
pub mod grpc;
pub mod inventory;
pub mod kubeapi;
pub mod proto;
pub mod slices;
pub mod vgpud;

pub use agent::{Agent, Options};

/// Runs the agent until the process is stopped.
pub async fn run(opts: Options, vgpud: vgpud::Vgpud) {
    let agent = Agent::new(opts, vgpud);
    let _ = agent.refresh().await;
    let mut tasks = vec![tokio::spawn(agent.clone().follow_vgpud())];
    if agent.opts.device_plugin {
        tasks.push(tokio::spawn(device_plugin::run(agent.clone())));
        tasks.push(tokio::spawn(cleanup::run(agent.clone())));
    }
    if agent.opts.dra {
        tasks.push(tokio::spawn(dra::run(agent.clone())));
    }
    for t in tasks {
        let _ = t.await;
    }
}
