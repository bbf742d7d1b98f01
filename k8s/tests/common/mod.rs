//! A fake kubelet built from the real kubelet protos (device plugin registration,
//! PodResources, the plugin registry), a fake API server, the agent program, the CUDA
//! library laid out as a node would have it, and "containers": a C program in its own
//! mount namespace with exactly the mounts and env an answer gives.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use vgpu_k8s::cdi::Edits;
use vgpu_k8s::grpc;
use vgpu_k8s::proto::deviceplugin as dp;
use vgpu_k8s::proto::podresources as pr;

/// vgpud's (this test's) uid and gid.
pub fn own_ids() -> (u32, u32) {
    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Polls `f` every 50 ms until it gives a value; panics naming `what` after `limit`.
pub async fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Registrar {
    log: Arc<Mutex<Vec<dp::RegisterRequest>>>,
}

#[tonic::async_trait]
impl dp::registration_server::Registration for Registrar {
    async fn register(
        &self,
        r: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        let r = r.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "version {} is not v1beta1",
                r.version
            )));
        }
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(r);
        Ok(Response::new(dp::Empty {}))
    }
}

struct Lister {
    pods: Arc<Mutex<Vec<pr::PodResources>>>,
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let pod_resources = self.pods.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources,
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn get(
        &self,
        _: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }
}

/// The kubelet's side: its directories under a temp dir, the registration socket and the
/// PodResources socket.
pub struct FakeKubelet {
    pub dir: PathBuf,
    pub dp_dir: PathBuf,
    pub registry_dir: PathBuf,
    pub dra_dir: PathBuf,
    pub pr_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub state_dir: PathBuf,
    pub registrations: Arc<Mutex<Vec<dp::RegisterRequest>>>,
    pub pods: Arc<Mutex<Vec<pr::PodResources>>>,
    reg_server: Option<JoinHandle<()>>,
    pr_server: Option<JoinHandle<()>>,
}

impl FakeKubelet {
    /// Starts the registration and PodResources servers in `dir`.
    pub fn start(dir: &Path) -> Self {
        let mut k = FakeKubelet {
            dir: dir.to_owned(),
            dp_dir: dir.join("device-plugins"),
            registry_dir: dir.join("plugins_registry"),
            dra_dir: dir.join("plugins/vgpu.dev"),
            pr_socket: dir.join("pod-resources/kubelet.sock"),
            cdi_dir: dir.join("cdi"),
            state_dir: dir.join("agent-state"),
            registrations: Arc::default(),
            pods: Arc::default(),
            reg_server: None,
            pr_server: None,
        };
        for d in [&k.dp_dir, &k.registry_dir] {
            std::fs::create_dir_all(d).expect("kubelet dir");
        }
        let l = grpc::bind(&k.pr_socket).expect("pod-resources socket");
        let svc = pr::pod_resources_lister_server::PodResourcesListerServer::new(Lister {
            pods: k.pods.clone(),
        });
        k.pr_server = Some(grpc::serve(
            l,
            tonic::transport::Server::builder().add_service(svc),
        ));
        k.start_registration();
        k
    }

    /// Stops answering PodResources (its socket stays, refusing connections) or starts
    /// again.
    pub fn pod_resources(&mut self, serve: bool) {
        if let Some(s) = self.pr_server.take() {
            s.abort();
        }
        if serve {
            let l = grpc::bind(&self.pr_socket).expect("pod-resources socket");
            let svc = pr::pod_resources_lister_server::PodResourcesListerServer::new(Lister {
                pods: self.pods.clone(),
            });
            self.pr_server = Some(grpc::serve(
                l,
                tonic::transport::Server::builder().add_service(svc),
            ));
        }
    }

    fn start_registration(&mut self) {
        let l = grpc::bind(&self.dp_dir.join("kubelet.sock")).expect("kubelet.sock");
        let svc = dp::registration_server::RegistrationServer::new(Registrar {
            log: self.registrations.clone(),
        });
        self.reg_server = Some(grpc::serve(
            l,
            tonic::transport::Server::builder().add_service(svc),
        ));
    }

    /// What a kubelet restart does to the device plugin directory: its registration
    /// server goes, every socket there is removed, and a new `kubelet.sock` comes.
    pub fn restart(&mut self) {
        if let Some(s) = self.reg_server.take() {
            s.abort();
        }
        for e in std::fs::read_dir(&self.dp_dir).expect("dp dir").flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        std::thread::sleep(Duration::from_millis(100));
        self.start_registration();
    }

    /// How many registrations of `resource` the kubelet took so far.
    pub fn registered(&self, resource: &str) -> usize {
        self.registrations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|r| r.resource_name == resource)
            .count()
    }

    /// Waits for registration number `n` of `resource`; its request.
    pub async fn wait_registered(&self, resource: &str, n: usize) -> dp::RegisterRequest {
        let log = self.registrations.clone();
        eventually(
            &format!("registration {n} of {resource}"),
            Duration::from_secs(20),
            || {
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter(|r| r.resource_name == resource)
                    .nth(n - 1)
                    .cloned()
            },
        )
        .await
    }

    /// A client of the plugin registered last for `resource`.
    pub async fn plugin(
        &self,
        resource: &str,
    ) -> dp::device_plugin_client::DevicePluginClient<Channel> {
        let n = self.registered(resource);
        let r = self.wait_registered(resource, n.max(1)).await;
        let ch = grpc::connect(&self.dp_dir.join(&r.endpoint))
            .await
            .expect("plugin socket");
        dp::device_plugin_client::DevicePluginClient::new(ch)
    }

    /// Sets what PodResources lists: pods with one container holding `devices` of
    /// `resource` each.
    pub fn set_pods(&self, pods: &[(&str, &str, Vec<String>)]) {
        let list = pods
            .iter()
            .map(|(name, resource, ids)| pr::PodResources {
                name: (*name).into(),
                namespace: "default".into(),
                containers: vec![pr::ContainerResources {
                    name: "main".into(),
                    devices: vec![pr::ContainerDevices {
                        resource_name: (*resource).into(),
                        device_ids: ids.clone(),
                        topology: None,
                    }],
                    ..Default::default()
                }],
            })
            .collect();
        *self.pods.lock().unwrap_or_else(|p| p.into_inner()) = list;
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for s in [self.reg_server.take(), self.pr_server.take()]
            .into_iter()
            .flatten()
        {
            s.abort();
        }
    }
}

/// Writes the agent's config (sockets owned by this test's user) with `profiles`.
pub fn write_config(dir: &Path, profiles: &str) -> PathBuf {
    let (uid, gid) = own_ids();
    let path = dir.join("config.json");
    let text = format!(r#"{{"socket_uid": {uid}, "socket_gid": {gid}, "profiles": {profiles}}}"#);
    std::fs::write(&path, text).expect("config");
    path
}

/// The agent program, killed on drop.
pub struct AgentProc {
    pub child: Option<Child>,
    pub log: PathBuf,
    args: Vec<String>,
}

impl AgentProc {
    /// Starts `vgpu-k8s` against `k`'s directories and vgpud at `vgpud`.
    pub fn start(k: &FakeKubelet, vgpud: &Path, config: &Path, extra: &[&str]) -> Self {
        let mut args: Vec<String> = vec![
            "--config".into(),
            config.display().to_string(),
            "--vgpud-socket".into(),
            vgpud.display().to_string(),
            "--node-name".into(),
            "node-a".into(),
            "--device-plugin-dir".into(),
            k.dp_dir.display().to_string(),
            "--pod-resources-socket".into(),
            k.pr_socket.display().to_string(),
            "--plugins-registry-dir".into(),
            k.registry_dir.display().to_string(),
            "--dra-plugin-dir".into(),
            k.dra_dir.display().to_string(),
            "--cdi-dir".into(),
            k.cdi_dir.display().to_string(),
            "--state-dir".into(),
            k.state_dir.display().to_string(),
            "--library-dir".into(),
            k.dir.join("lib").display().to_string(),
            "--poll-ms".into(),
            "100".into(),
            "--cleanup-grace-s".into(),
            "1".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut a = AgentProc {
            child: None,
            log: k.dir.join("agent.log"),
            args,
        };
        a.spawn();
        a
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log");
        let child = Command::new(env!("CARGO_BIN_EXE_vgpu-k8s"))
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start vgpu-k8s");
        self.child = Some(child);
    }

    /// `kill -9` and start again with the same options.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `libcuda.so.1` (the built vgpu-cuda library, built when missing) in `dir/lib`, laid out
/// as `vgpu-cuda install --prefix dir` does.
pub fn install_library(dir: &Path) -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let built = vgpu_tests::bins::profile_dir().join("libvgpu_cuda.so");
    {
        let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
        if !built.exists() {
            let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
            let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args([
                    "build",
                    "--quiet",
                    "--manifest-path",
                    manifest,
                    "-p",
                    "vgpu-cuda",
                    "--lib",
                ])
                .status();
            assert!(
                matches!(status, Ok(s) if s.success()),
                "cannot build vgpu-cuda: {status:?}"
            );
        }
    }
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    std::fs::copy(&built, lib.join("libcuda.so.1")).expect("copy the library");
    let _ = std::os::unix::fs::symlink("libcuda.so.1", lib.join("libcuda.so"));
    lib
}

/// The pod program (tests/c/pod.c) built against include/cuda.h and `-lcuda` in `lib`;
/// None where no C compiler is present.
pub fn build_pod_program(dir: &Path, lib: &Path) -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        return None;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join("pod");
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-O1", "-Wall", "-Werror", "-I"])
        .arg(manifest.join("../cuda-shim/include"))
        .arg(manifest.join("tests/c/pod.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(lib)
        .arg("-lcuda")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// Whether containers can be made here: root and `unshare -m` working.
pub fn can_make_containers() -> bool {
    own_ids().0 == 0
        && Command::new("unshare")
            .args(["-m", "--propagation", "private", "true"])
            .status()
            .is_ok_and(|s| s.success())
}

/// Starts `program args` as a container would run it: in its own mount namespace with
/// tmpfs over /run and /usr/local (where the container paths lie), exactly `mounts`
/// bind-mounted (read-only where asked) and exactly `env` as its environment.
pub fn start_container(program: &Path, args: &[&str], edits: &Edits) -> Child {
    let (mounts, env) = (&edits.mounts, &edits.env);
    let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut script =
        String::from("set -e; mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /usr/local; ");
    for (host, ctr, ro) in mounts {
        script += &format!(
            "mkdir -p {c}; mount --bind {h} {c}; ",
            h = q(host),
            c = q(ctr)
        );
        if *ro {
            script += &format!("mount -o remount,bind,ro {}; ", q(ctr));
        }
    }
    script += "exec env -i";
    for (k, v) in env {
        script += &format!(" {}", q(&format!("{k}={v}")));
    }
    script += &format!(" {}", q(&program.display().to_string()));
    for a in args {
        script += &format!(" {}", q(a));
    }
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the container")
}

/// Waits for a container; its exit success, stdout and stderr.
pub fn finish(child: Child) -> (bool, String, String) {
    let out = child.wait_with_output().expect("wait for the container");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One request the fake API server saw.
#[derive(Clone, Debug)]
pub struct ApiRequest {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

/// A fake API server: GET answers the objects put in `objects` (by path), PUT replaces an
/// object there (404 when absent), POST to a collection creates `collection/name`, DELETE
/// removes. Every request is logged.
pub struct FakeApi {
    pub url: String,
    pub objects: Arc<Mutex<std::collections::BTreeMap<String, serde_json::Value>>>,
    pub log: Arc<Mutex<Vec<ApiRequest>>>,
}

impl FakeApi {
    pub fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let objects: Arc<Mutex<std::collections::BTreeMap<String, serde_json::Value>>> =
            Arc::default();
        let log: Arc<Mutex<Vec<ApiRequest>>> = Arc::default();
        let (o, lg) = (objects.clone(), log.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let _ = serve_one(s, &o, &lg);
            }
        });
        FakeApi { url, objects, log }
    }

    pub fn requests(&self) -> Vec<ApiRequest> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn serve_one(
    mut s: std::net::TcpStream,
    objects: &Mutex<std::collections::BTreeMap<String, serde_json::Value>>,
    log: &Mutex<Vec<ApiRequest>>,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or("").to_owned();
    let path = words.next().unwrap_or("").to_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    log.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(ApiRequest {
            method: method.clone(),
            path: path.clone(),
            body: body.clone(),
        });
    let mut objs = objects.lock().unwrap_or_else(|p| p.into_inner());
    let json = serde_json::from_slice::<serde_json::Value>(&body).ok();
    let (status, answer) = match method.as_str() {
        "GET" => match objs.get(&path) {
            Some(v) => (200, v.to_string()),
            None => (404, r#"{"kind":"Status","code":404}"#.to_owned()),
        },
        "PUT" if objs.contains_key(&path) => {
            objs.insert(path, json.clone().unwrap_or_default());
            (200, json.unwrap_or_default().to_string())
        }
        "POST" => {
            let name = json
                .as_ref()
                .and_then(|j| j["metadata"]["name"].as_str())
                .unwrap_or("")
                .to_owned();
            objs.insert(format!("{path}/{name}"), json.clone().unwrap_or_default());
            (201, json.unwrap_or_default().to_string())
        }
        "DELETE" if objs.remove(&path).is_some() => (200, "{}".to_owned()),
        _ => (404, r#"{"kind":"Status","code":404}"#.to_owned()),
    };
    drop(objs);
    let reply = format!(
        "HTTP/1.0 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
        answer.len()
    );
    s.write_all(reply.as_bytes())
}

/// The vendored CDI JSON schema (schema.json with its defs.json), compiled.
pub fn cdi_validator() -> jsonschema::Validator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/cdi");
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(f)).expect("schema file"))
            .expect("schema JSON")
    };
    let mut schema = read("schema.json");
    schema["$id"] = serde_json::json!("https://cdi.invalid/schema.json");
    let defs = read("defs.json");
    let registry = jsonschema::Registry::new()
        .add("https://cdi.invalid/defs.json", &defs)
        .and_then(|b| b.prepare())
        .expect("the CDI schema's defs.json");
    jsonschema::options()
        .with_registry(&registry)
        .build(&schema)
        .expect("the CDI schema compiles")
}

/// Checks a CDI spec file against the CDI schema; its JSON.
pub fn valid_cdi_spec(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("spec JSON");
    let errors: Vec<String> = cdi_validator()
        .iter_errors(&v)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{} is not a valid CDI spec: {errors:?}\n{text}",
        path.display()
    );
    v
}

/// The mounts and env of a CDI spec's first device (env sorted).
pub fn cdi_edits(spec: &serde_json::Value) -> Edits {
    let edits = &spec["devices"][0]["containerEdits"];
    let mounts = edits["mounts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    let ro = m["options"]
                        .as_array()
                        .is_some_and(|o| o.iter().any(|x| x == "ro"));
                    (
                        m["hostPath"].as_str().unwrap_or("").to_owned(),
                        m["containerPath"].as_str().unwrap_or("").to_owned(),
                        ro,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut env: Vec<(String, String)> = edits["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    let (k, v) = e.as_str()?.split_once('=')?;
                    Some((k.to_owned(), v.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default();
    env.sort();
    Edits { mounts, env }
}
