//! `vgpu-k8s`: the Kubernetes node agent (docs/kubernetes.md). Runs beside vgpud on every
//! GPU node (a DaemonSet) and serves the kubelet's device plugin and DRA APIs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vgpu_api::client::{Client, Endpoint};
use vgpu_k8s::config::Config;
use vgpu_k8s::{vgpud::Vgpud, Options};

#[derive(Parser, Debug)]
#[command(
    name = "vgpu-k8s",
    args_override_self = true,
    about = "Hands the local vgpud's process vGPUs to Kubernetes pods: a kubelet device plugin and a DRA driver"
)]
struct Args {
    /// The profiles file (JSON; docs/kubernetes.md, "Profiles").
    #[arg(long, default_value = "/etc/vgpu-k8s/config.json")]
    config: PathBuf,
    /// vgpud's API socket.
    #[arg(long, default_value = "/run/vgpud/vgpud.sock")]
    vgpud_socket: PathBuf,
    /// This node's name (the DRA pool's name).
    #[arg(long)]
    node_name: String,
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    device_plugin_dir: PathBuf,
    #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pod_resources_socket: PathBuf,
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    plugins_registry_dir: PathBuf,
    /// The DRA driver's socket directory (default /var/lib/kubelet/plugins/DOMAIN).
    #[arg(long)]
    dra_plugin_dir: Option<PathBuf>,
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// The host directory with libcuda.so.1 (`vgpu-cuda install --prefix P` makes P/lib).
    #[arg(long, default_value = "/var/lib/vgpu-k8s/lib")]
    library_dir: PathBuf,
    /// The agent's state (the DRA checkpoint).
    #[arg(long, default_value = "/var/lib/vgpu-k8s")]
    state_dir: PathBuf,
    /// The API server over plain HTTP (`kubectl proxy` beside the agent) for the DRA
    /// driver's ResourceClaims and ResourceSlices; without it only the device plugin works.
    #[arg(long)]
    kube_api: Option<String>,
    /// How often vgpud and the kubelet's sockets are looked at, ms.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    poll_ms: u64,
    /// How long a device plugin vGPU may be unlisted by PodResources before it is deleted, s.
    #[arg(long, default_value_t = 30)]
    cleanup_grace_s: u64,
    /// Serve the device plugin only.
    #[arg(long, conflicts_with = "no_device_plugin")]
    no_dra: bool,
    /// Serve the DRA driver only.
    #[arg(long)]
    no_device_plugin: bool,
    /// Logs as text or one JSON object a line.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if a.log_format == "json" {
        logs.json().init();
    } else {
        logs.init();
    }
    let config = match Config::load(&a.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vgpu-k8s: {e}");
            return ExitCode::from(2);
        }
    };
    let dra_plugin_dir = a
        .dra_plugin_dir
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&config.domain));
    if let Some(url) = &a.kube_api {
        if let Err(e) = vgpu_k8s::kubeapi::KubeApi::new(url) {
            eprintln!("vgpu-k8s: --kube-api: {e}");
            return ExitCode::from(2);
        }
    }
    let opts = Options {
        config,
        node_name: a.node_name,
        device_plugin_dir: a.device_plugin_dir,
        pod_resources_socket: a.pod_resources_socket,
        plugins_registry_dir: a.plugins_registry_dir,
        dra_plugin_dir,
        cdi_dir: a.cdi_dir,
        library_dir: a.library_dir,
        state_dir: a.state_dir,
        kube_api: a.kube_api,
        poll: Duration::from_millis(a.poll_ms),
        gc_grace: Duration::from_secs(a.cleanup_grace_s),
        device_plugin: !a.no_device_plugin,
        dra: !a.no_dra,
    };
    let vgpud = Vgpud::new(Client::new(Endpoint::Unix(a.vgpud_socket), None));
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vgpu-k8s: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // SIGTERM (the DaemonSet's pod going) or SIGINT stop the agent; the vGPUs it handed
    // out stay with their pods, and the next agent finds them by their labels.
    rt.block_on(async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!("cannot watch for SIGTERM: {e}");
                    return;
                }
            };
        tokio::select! {
            () = vgpu_k8s::run(opts, vgpud) => {}
            _ = tokio::signal::ctrl_c() => tracing::info!("stopping (SIGINT)"),
            _ = term.recv() => tracing::info!("stopping (SIGTERM)"),
        }
    });
    ExitCode::SUCCESS
}
