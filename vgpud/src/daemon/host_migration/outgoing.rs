//! The source's half of a whole-VM move: ask the destination to admit the VM, then
//! drive the vGPU's worker and the vmm, follow them, and settle.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};
use vgpu_api::client::{Client, ClientError, Endpoint};

use super::incoming::MAX_CONSOLE;
use super::{record, update};
use crate::api::{
    self, HostMigration, IncomingAccepted, IncomingCommit, IncomingVm, VgpuCreate, VmCreate,
    VmMigrateRequest, VmState,
};
use crate::control::{Command as Ctl, ReplyBody};
use crate::daemon::config::Config;
use crate::daemon::core::Daemon;
use crate::daemon::error::ApiError;
use crate::daemon::link::Link;
use crate::daemon::migration;
use crate::daemon::state::Inner;
use crate::daemon::vgpus;
use crate::daemon::vms;
use crate::daemon::vms::vmm_api_socket;
use crate::units::permille_to_fraction;

/// The pause a move aims for unless the request says, ms.
const DEFAULT_DOWNTIME_MS: u64 = 300;
/// How long a whole move may take.
const MOVE_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the vmm's progress is read.
const POLL: Duration = Duration::from_millis(100);
/// Longest the vmm's move waits for the vGPU's first pre-copy round (all of its device
/// memory) to reach the destination.
const FIRST_ROUND_WAIT: Duration = Duration::from_secs(300);

/// What the source needs to move a VM.
struct Plan {
    vm_id: u32,
    create: VmCreate,
    vgpu: Option<(u32, u32, Link)>,
    api_socket: PathBuf,
}

/// The destination of a move: its API, what it admitted, and the host its stream
/// addresses are reached at.
#[derive(Clone, Copy)]
struct Peer<'a> {
    client: &'a Client,
    accepted: &'a IncomingAccepted,
    host: Option<&'a str>,
}

/// How the move runs: the pause it aims for, and whether anything moves before the stop.
#[derive(Clone, Copy, Debug)]
struct How {
    downtime_ms: u64,
    stop_copy: bool,
}

/// The request's `mode`: stop-and-copy or not.
fn stop_copy(req: &VmMigrateRequest) -> Result<bool, ApiError> {
    match req.mode.as_deref().unwrap_or("precopy") {
        "precopy" => Ok(false),
        "stop_copy" => Ok(true),
        other => Err(ApiError::bad(
            "mode",
            format!("{other:?}: use \"precopy\" or \"stop_copy\""),
        )),
    }
}

/// The destination daemon's client and its name.
fn destination(req: &VmMigrateRequest) -> Result<(Client, String, Option<String>), ApiError> {
    let d = &req.destination;
    match (&d.socket, &d.url) {
        (Some(s), None) => Ok((
            Client::new(Endpoint::Unix(PathBuf::from(s)), d.token.clone()),
            format!("unix:{s}"),
            None,
        )),
        (None, Some(u)) => {
            let e = Endpoint::from_url(u)
                .map_err(|e| ApiError::bad("destination.url", e.to_string()))?;
            let host = match &e {
                Endpoint::Tcp(hp) => hp.rsplit_once(':').map(|(h, _)| h.to_owned()),
                Endpoint::Unix(_) => None,
            };
            Ok((Client::new(e, d.token.clone()), u.clone(), host))
        }
        _ => Err(ApiError::bad(
            "destination",
            "give exactly one of socket (the destination vgpud's API socket) or url (http://HOST:PORT, with its token)",
        )),
    }
}

/// The destination's refusal, as this daemon answers it.
fn refused(e: ClientError) -> ApiError {
    match &e {
        // Not this daemon's 401: the token the request carried for the destination.
        ClientError::Api { status: 401, .. } => ApiError::peer_unauthorized(
            "destination.token",
            "the destination vgpud refused the VM: the destination's bearer token is missing or wrong",
        ),
        ClientError::Api { status, body } => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY);
            ApiError::status(
                status,
                format!("the destination vgpud refused the VM: {}", body.error),
            )
        }
        other => ApiError::worker(format!("the destination vgpud: {other}")),
    }
}

/// A `tcp:` address from the destination, with the host this daemon reached it at.
fn reachable(addr: &str, host: Option<&str>) -> String {
    match (addr.strip_prefix("tcp:"), host) {
        (Some(rest), Some(h)) => match rest.rsplit_once(':') {
            Some((_, port)) => format!("tcp:{h}:{port}"),
            None => addr.to_owned(),
        },
        _ => addr.to_owned(),
    }
}

/// The figures of the vmm's last line once the VM moved
/// (`vmm: the VM moved to ADDR: downtime_ms=… bytes=… …`).
fn moved_line(console: &[u8]) -> std::collections::BTreeMap<String, f64> {
    let text = String::from_utf8_lossy(console);
    text.lines()
        .rev()
        .find_map(|l| l.split_once("vmm: the VM moved to ").map(|(_, r)| r))
        .map(|r| {
            r.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| v.parse::<f64>().ok().map(|v| (k.to_owned(), v)))
                .collect()
        })
        .unwrap_or_default()
}

/// How long the destination's receiving worker may take to listen: on a GPU it creates
/// its CUDA context first (a few hundred ms, more while the driver is busy).
const STREAM_WAIT: Duration = Duration::from_secs(30);
/// How often a retried connection asks whether the destination still holds the move.
const PEER_PROBE: Duration = Duration::from_millis(500);

/// Connects to a stream address, as a descriptor for the worker. The destination answers
/// once its vmm listens; its receiving worker may still be building its GPU backend, so a
/// missing or refusing listener is retried until [`STREAM_WAIT`], as long as `alive`
/// (asked every [`PEER_PROBE`]) says the destination still holds the move: a
/// destination that died or gave up ends the wait at once. Runs on a blocking thread.
fn connect(addr: &str, alive: impl Fn() -> Result<(), String>) -> Result<OwnedFd, String> {
    let start = Instant::now();
    let mut probed = start;
    loop {
        let r = if let Some(p) = addr.strip_prefix("unix:") {
            UnixStream::connect(p).map(OwnedFd::from)
        } else if let Some(hp) = addr.strip_prefix("tcp:") {
            TcpStream::connect(hp).and_then(|s| {
                s.set_nodelay(true)?;
                Ok(OwnedFd::from(s))
            })
        } else {
            return Err(format!("{addr:?} is not a stream address"));
        };
        match r {
            Ok(fd) => return Ok(fd),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && start.elapsed() < STREAM_WAIT =>
            {
                if probed.elapsed() >= PEER_PROBE {
                    probed = Instant::now();
                    alive().map_err(|why| {
                        format!("cannot reach the destination's vGPU stream {addr}: {why}")
                    })?;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(format!(
                    "cannot reach the destination's vGPU stream {addr}: {e}"
                ))
            }
        }
    }
}

/// Whether the destination still holds move `remote` (its record there): an error when
/// its vgpud no longer answers or the move there has ended.
fn peer_holds(client: &Client, remote: u32) -> Result<(), String> {
    match client.migration(remote) {
        Ok(m) if matches!(m.state.as_str(), "failed" | "completed") => Err(format!(
            "the destination's record of the move is {} ({})",
            m.state,
            m.error.as_deref().unwrap_or("no reason given")
        )),
        Ok(_) => Ok(()),
        Err(e @ ClientError::Api { .. }) => Err(format!("the destination dropped the move: {e}")),
        Err(e) => Err(format!("the destination vgpud stopped answering: {e}")),
    }
}

/// One request to a vmm's control API.
fn vmm_call(sock: &Path, req: &Value) -> Result<Value, String> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("the vmm's API: {e}"))?;
    for t in [
        s.set_read_timeout(Some(Duration::from_secs(10))),
        s.set_write_timeout(Some(Duration::from_secs(10))),
    ] {
        t.map_err(|e| format!("the vmm's API: {e}"))?;
    }
    let mut line = req.to_string();
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| format!("the vmm's API: {e}"))?;
    let mut answer = String::new();
    BufReader::new(std::io::Read::take(s, 1 << 20))
        .read_line(&mut answer)
        .map_err(|e| format!("the vmm's API: {e}"))?;
    serde_json::from_str(&answer).map_err(|e| format!("the vmm's API answered {answer:?}: {e}"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("a blocking task failed: {e}"))?
}

/// What VM `vm_id` is launched as elsewhere. Caller holds the state lock.
fn plan(cfg: &Config, inner: &Inner, vm_id: u32) -> Result<Plan, ApiError> {
    let vm = inner
        .vms
        .get(&vm_id)
        .ok_or_else(|| super::super::core::no_vm(vm_id))?;
    if *vm.state() != VmState::Running || vm.proc().is_none() {
        return Err(ApiError::conflict(
            "id",
            format!("VM {vm_id} is {:?}; only a running VM moves", vm.state()),
        ));
    }
    let payload = match &cfg.payload_dir {
        Some(dir) => vm
            .payload()
            .strip_prefix(dir)
            .ok()
            .and_then(|p| p.to_str())
            .map(str::to_owned),
        None => None,
    }
    .unwrap_or_else(|| vm.payload().display().to_string());
    let mut vgpu = None;
    let mut create_vgpu = None;
    if let Some(g) = vm.vgpu() {
        let rec = inner
            .vgpus
            .get(&g)
            .ok_or_else(|| ApiError::internal(format!("VM {vm_id}'s vGPU {g} vanished")))?;
        // An oversubscribed vGPU moves with every byte, swapped pieces included; the
        // destination runs it oversubscribed too, under its own admission rule.
        if !rec.storage().is_empty() || rec.migrating_to().is_some() {
            return Err(ApiError::conflict(
                "id",
                format!("VM {vm_id}'s vGPU {g} has storage namespaces or is migrating between GPUs; such a vGPU does not move to another host"),
            ));
        }
        let link = rec
            .link()
            .ok_or_else(|| ApiError::conflict("id", format!("vGPU {g} has no worker")))?;
        create_vgpu = Some(VgpuCreate {
            gpu: None,
            memory_bytes: rec.memory(),
            compute_share: permille_to_fraction(rec.compute()),
            copy_share: Some(permille_to_fraction(rec.copy())),
            priority: rec.priority(),
            oversubscribe: rec.oversubscribe(),
            share_group: None,
            queues: rec.queues(),
            storage: Vec::new(),
            name: rec.name().clone(),
            labels: rec.labels().clone(),
            kernel_deadline_ms: rec.kernel_deadline_ms(),
            attach: Default::default(),
            owner_uid: None,
            owner_gid: None,
        });
        vgpu = Some((g, rec.gpu(), link));
    }
    Ok(Plan {
        vm_id,
        create: VmCreate {
            payload: Some(payload),
            payload_arg: vm.payload_arg().clone(),
            kernel: None,
            initrd: None,
            cmdline: None,
            memory_bytes: vm.memory(),
            vcpus: vm.vcpus(),
            vgpu_id: None,
            vgpu: create_vgpu,
            name: vm.name().clone(),
            labels: vm.labels().clone(),
        },
        vgpu,
        api_socket: vmm_api_socket(&cfg.state_dir, vm_id),
    })
}

/// Moves VM `vm_id`, vGPU included, to another vgpud: the destination admits it
/// first (its refusal comes back as it is: 409 when it does not fit, 401 for a wrong
/// token); the move then runs on (follow it at `GET /v1/migrations/{id}`).
pub async fn migrate_vm_to_host(
    d: &Arc<Daemon>,
    vm_id: u32,
    req: VmMigrateRequest,
) -> Result<api::Migration, ApiError> {
    d.check_running()?;
    let downtime_ms = req.downtime_ms.unwrap_or(DEFAULT_DOWNTIME_MS);
    if !(1..=60_000).contains(&downtime_ms) {
        return Err(ApiError::bad("downtime_ms", "give 1 to 60000 ms"));
    }
    let how = How {
        downtime_ms,
        stop_copy: stop_copy(&req)?,
    };
    let (client, peer, host) = destination(&req)?;
    let plan = d.state.with(|inner| plan(&d.cfg, inner, vm_id))?;
    if let Some((g, _, _)) = &plan.vgpu {
        migration::check_no_shm(&d.shm_lock(), *g)?;
    }
    let body = serde_json::to_vec(&IncomingVm {
        vm: plan.create.clone(),
        source: format!("VM {vm_id}"),
    })
    .map_err(|e| ApiError::internal(format!("cannot encode the VM: {e}")))?;
    let c = client.clone();
    let accepted: IncomingAccepted =
        tokio::task::spawn_blocking(move || c.call("POST", "/v1/migrations/incoming", Some(&body)))
            .await
            .map_err(|e| ApiError::internal(format!("the admission task failed: {e}")))?
            .map_err(refused)?;
    let (vgpu_id, gpu) = plan.vgpu.as_ref().map_or((0, 0), |(g, gpu, _)| (*g, *gpu));
    let mid = d.state.with(|inner| {
        let mid = inner.next_migration;
        inner.next_migration += 1;
        let mut m = record(
            mid,
            vgpu_id,
            gpu,
            HostMigration {
                direction: "outgoing".into(),
                vm: vm_id,
                peer: peer.clone(),
                remote_vm: Some(accepted.vm),
                remote_migration: Some(accepted.migration),
                vmm_rounds: 0,
                vmm_bytes: 0,
                stop_ram_bytes: 0,
                vgpu_rounds: 0,
                vgpu_bytes: 0,
                vgpu_downtime_ms: None,
            },
        );
        m.phase = "starting".into();
        if how.stop_copy {
            m.mode = "stop_copy".into();
        }
        inner.migrations.insert(mid, m);
        mid
    });
    d.persist.mark_dirty();
    tracing::info!(vm = vm_id, migration = mid, destination = %peer, remote_vm = accepted.vm, "moving a VM to another vgpud");
    tokio::spawn({
        let d = d.clone();
        async move {
            let started = Instant::now();
            let to = Peer {
                client: &client,
                accepted: &accepted,
                host: host.as_deref(),
            };
            let r = drive(&d, mid, vm_id, &plan, &to, how).await;
            settle(&d, mid, plan, accepted, client, r, started).await;
        }
    });
    migration::migration(&d.state, mid)
}

/// Runs the move: the vGPU's stream, the vmm's migration, progress until it ends.
async fn drive(
    d: &Arc<Daemon>,
    mid: u32,
    vm_id: u32,
    plan: &Plan,
    to: &Peer<'_>,
    how: How,
) -> Result<(), String> {
    let Peer {
        client,
        accepted,
        host,
    } = *to;
    let How {
        downtime_ms,
        stop_copy,
    } = how;
    let mut vgpu_task = None;
    if let (Some((vgpu, _, link)), Some(addr), Some(token)) =
        (&plan.vgpu, &accepted.vgpu_address, &accepted.token)
    {
        d.host.forget_reported(*vgpu);
        let addr = reachable(addr, host);
        let (c, remote) = ((*client).clone(), accepted.migration);
        let fd = blocking(move || connect(&addr, || peer_holds(&c, remote))).await?;
        let link = link.clone();
        let token = token.clone();
        vgpu_task = Some(tokio::spawn(async move {
            link.call_with_fds(
                Ctl::MigrateOut {
                    token,
                    max_downtime_ms: downtime_ms,
                    stop_copy,
                },
                vec![fd],
                MOVE_TIMEOUT,
            )
            .await
        }));
    }
    if let (Some(task), Some((vgpu, _, _))) = (&vgpu_task, &plan.vgpu) {
        // The vmm stops the VM as soon as its own dirty RAM fits the budget, and the
        // stop waits for the vGPU's round in progress: started together, the vGPU's
        // first round (all of its device memory) would run inside the stop. So guest
        // RAM starts moving once the vGPU has sent its first round (it keeps sending
        // what the guest dirties meanwhile). Stop-and-copy sends no round: the VM
        // stops once the worker has taken the move (it reports in at once), so that
        // the rings' stop waits for the vGPU's state.
        let until = Instant::now() + FIRST_ROUND_WAIT;
        loop {
            let rounds = d.state.with(|i| {
                i.migrations
                    .get(&mid)
                    .and_then(|m| m.host.as_ref())
                    .map_or(0, |h| h.vgpu_rounds)
            });
            let ready = if stop_copy {
                d.host.reported(*vgpu)
            } else {
                rounds >= 1
            };
            if ready || task.is_finished() || Instant::now() > until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let sock = plan.api_socket.clone();
    let destination = reachable(&accepted.vmm_address, host);
    let mut ask = json!({
        "command": "migrate",
        "destination": destination,
        "downtime_ms": downtime_ms,
        "precopy": !stop_copy,
    });
    if let Some(t) = &accepted.vmm_token {
        ask["token"] = json!(t);
    }
    let s = sock.clone();
    // A vmm that received its VM moments ago may not serve its API yet.
    let answer = blocking(move || {
        let start = Instant::now();
        loop {
            match vmm_call(&s, &ask) {
                Err(_) if start.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                r => return r,
            }
        }
    })
    .await;
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            cancel_out(plan).await;
            return Err(e);
        }
    };
    if answer.get("ok").and_then(Value::as_bool) != Some(true) {
        cancel_out(plan).await;
        return Err(format!(
            "the vmm refused the move: {}",
            answer.get("error").unwrap_or(&Value::Null)
        ));
    }
    d.state
        .with(|inner| update(inner, mid, |m| m.phase = "precopy".into()));
    let deadline = Instant::now() + MOVE_TIMEOUT;
    let mut unreachable = 0;
    let outcome = loop {
        tokio::time::sleep(POLL).await;
        if Instant::now() > deadline {
            break Err("the move took too long".to_string());
        }
        let s = sock.clone();
        let status = blocking(move || vmm_call(&s, &json!({"command": "status"}))).await;
        let mig = match status {
            Ok(v) => v.get("migration").cloned().unwrap_or(Value::Null),
            Err(e) => {
                // The vmm ends (status 0) once the destination has the VM.
                let state = d
                    .state
                    .with(|i| i.vms.get(&vm_id).map(|v| v.state().clone()));
                match state {
                    Some(VmState::Exited { code: 0 }) => break Ok(()),
                    Some(s) if s.is_live() => {
                        unreachable += 1;
                        if unreachable > 50 {
                            break Err(e);
                        }
                        continue;
                    }
                    _ => break Err(format!("the VM ended during the move ({e})")),
                }
            }
        };
        let phase = mig.get("phase").and_then(Value::as_str).unwrap_or("");
        let num = |k: &str| mig.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (rounds, bytes, stop) = (num("rounds"), num("bytes"), num("stop_ram_bytes"));
        let downtime = mig.get("downtime_ms").and_then(Value::as_f64);
        d.state.with(|inner| {
            update(inner, mid, |m| {
                if let Some(h) = &mut m.host {
                    h.vmm_rounds = u32::try_from(rounds).unwrap_or(u32::MAX);
                    h.vmm_bytes = bytes;
                    h.stop_ram_bytes = stop;
                    m.bytes = bytes + h.vgpu_bytes;
                    m.rounds = h.vmm_rounds;
                }
                m.total_bytes = m.total_bytes.max(num("ram_bytes"));
                m.phase = match phase {
                    "stopped" => "stop_copy".into(),
                    "completed" => "done".into(),
                    other => other.to_owned(),
                };
                m.downtime_ms = downtime.or(m.downtime_ms);
            })
        });
        match phase {
            "completed" => break Ok(()),
            "failed" => {
                break Err(mig
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("the vmm's migration failed")
                    .to_owned())
            }
            _ => {}
        }
    };
    if outcome.is_err() {
        cancel_out(plan).await;
    }
    if let Some(t) = vgpu_task {
        match t.await {
            Ok(Ok(ReplyBody::Migrated { report })) => d.state.with(|inner| {
                update(inner, mid, |m| {
                    if let Some(h) = &mut m.host {
                        h.vgpu_rounds = report.rounds;
                        h.vgpu_bytes = report.precopy_bytes + report.stop_bytes;
                        h.vgpu_downtime_ms = Some(report.downtime_ms);
                        m.bytes = h.vmm_bytes + h.vgpu_bytes;
                    }
                })
            }),
            Ok(Ok(ReplyBody::Error { message })) if outcome.is_ok() => {
                tracing::warn!(migration = mid, error = %message, "the vGPU's worker reported an error after the VM moved");
            }
            Ok(other) if outcome.is_ok() => {
                tracing::warn!(migration = mid, answer = ?other, "unexpected answer from the vGPU's worker");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(migration = mid, error = %e, "the vGPU stream task failed")
            }
        }
    }
    outcome
}

/// Gives the vGPU's outgoing stream up (the VM stays).
async fn cancel_out(plan: &Plan) {
    if let Some((_, _, link)) = &plan.vgpu {
        if let Err(e) = link
            .call(Ctl::CancelMigrateOut, Duration::from_secs(5))
            .await
        {
            tracing::debug!(error = %e, "cancel not delivered");
        }
    }
}

/// Records how move `mid` ended: the destination gets the console and the source
/// frees the VM, or the destination frees what it reserved and the VM stays.
async fn settle(
    d: &Arc<Daemon>,
    mid: u32,
    plan: Plan,
    accepted: IncomingAccepted,
    client: Client,
    r: Result<(), String>,
    started: Instant,
) {
    let (remote, vm_id) = (accepted.migration, plan.vm_id);
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    match r {
        Ok(()) => {
            // Everything it printed, here and wherever it ran before.
            let console = vms::console(d, vm_id, 0).unwrap_or_default();
            let figures = moved_line(&console);
            let tail = &console[console.len().saturating_sub(MAX_CONSOLE)..];
            let mut text = String::from_utf8_lossy(tail).into_owned();
            while text.len() > MAX_CONSOLE {
                text.remove(0);
            }
            d.state.with(|inner| {
                update(inner, mid, |m| {
                    m.elapsed_ms = elapsed_ms;
                    let f = |k: &str| figures.get(k).copied();
                    m.downtime_ms = f("downtime_ms").or(m.downtime_ms);
                    if let Some(h) = &mut m.host {
                        h.vmm_bytes = f("bytes").map_or(h.vmm_bytes, |v| v as u64);
                        h.stop_ram_bytes =
                            f("stop_ram_bytes").map_or(h.stop_ram_bytes, |v| v as u64);
                        h.vmm_rounds = f("rounds").map_or(h.vmm_rounds, |v| v as u32);
                        m.rounds = h.vmm_rounds;
                        m.bytes = h.vmm_bytes + h.vgpu_bytes;
                    }
                })
            });
            let record = migration::migration(&d.state, mid).ok();
            let body = serde_json::to_vec(&IncomingCommit {
                console: text,
                downtime_ms: record.as_ref().and_then(|m| m.downtime_ms),
                elapsed_ms: Some(elapsed_ms),
                figures: record.and_then(|m| m.host),
                uptime_ms: vms::get_vm(&d.state, vm_id).ok().map(|v| v.uptime_ms),
            })
            .unwrap_or_default();
            let c = client.clone();
            let path = format!("/v1/migrations/{remote}/commit");
            let committed = tokio::task::spawn_blocking(move || {
                c.call::<api::Migration>("POST", &path, Some(&body))
            })
            .await;
            if !matches!(committed, Ok(Ok(_))) {
                tracing::warn!(
                    migration = mid,
                    "the destination did not take the commit; its VM runs anyway"
                );
            }
            d.state.with(|inner| {
                update(inner, mid, |m| {
                    m.state = "completed".into();
                    m.phase = "done".into();
                })
            });
            tracing::info!(
                vm = vm_id,
                migration = mid,
                "the VM moved to another vgpud; freeing it here"
            );
            if let Err(e) = vms::delete_vm(d, vm_id).await {
                tracing::warn!(vm = vm_id, error = %e, "cannot remove the moved VM");
            }
            if let Some((g, _, _)) = plan.vgpu {
                if d.state.with(|i| i.vgpus.contains_key(&g)) {
                    let _ = vgpus::delete_vgpu(d, g).await;
                }
            }
        }
        Err(why) => {
            tracing::warn!(vm = vm_id, migration = mid, error = %why, "the move failed; the VM runs on here");
            let c = client.clone();
            let path = format!("/v1/migrations/{remote}");
            let _ = tokio::task::spawn_blocking(move || c.raw("DELETE", &path, None)).await;
            d.state.with(|inner| {
                update(inner, mid, |m| {
                    m.state = "failed".into();
                    m.error = Some(why);
                    m.elapsed_ms = elapsed_ms;
                })
            });
        }
    }
    d.persist.mark_dirty();
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_api::api::MigrationDestination;

    fn req(mode: Option<&str>) -> VmMigrateRequest {
        VmMigrateRequest {
            destination: MigrationDestination {
                socket: Some("/run/b.sock".into()),
                url: None,
                token: None,
            },
            downtime_ms: None,
            mode: mode.map(str::to_owned),
        }
    }

    #[test]
    fn the_mode_is_precopy_or_stop_copy_and_anything_else_names_the_field() {
        assert!(!stop_copy(&req(None)).expect("default"));
        assert!(!stop_copy(&req(Some("precopy"))).expect("precopy"));
        assert!(stop_copy(&req(Some("stop_copy"))).expect("stop_copy"));
        for bad in ["stop-copy", "live", ""] {
            let e = stop_copy(&req(Some(bad))).expect_err(bad);
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert_eq!(e.field.as_deref(), Some("mode"), "{bad}");
        }
    }

    #[test]
    fn a_refused_stream_is_retried_while_the_destination_holds_the_move_and_not_after() {
        let dir = std::env::temp_dir().join(format!("vgpud-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("migrate-in.sock");
        let addr = format!("unix:{}", path.display());
        // A destination that gave up: the wait ends at its first probe, not after
        // STREAM_WAIT, and says why.
        let start = Instant::now();
        let e = connect(&addr, || {
            Err("the destination vgpud stopped answering".into())
        })
        .expect_err("no listener");
        assert!(start.elapsed() < PEER_PROBE * 4, "{:?}", start.elapsed());
        assert!(e.contains("stopped answering"), "{e}");
        // A destination still starting its worker: the listener that comes is reached.
        let (p, probes) = (path.clone(), std::cell::Cell::new(0));
        let listener = std::thread::spawn(move || {
            std::thread::sleep(PEER_PROBE * 2);
            let l = std::os::unix::net::UnixListener::bind(&p).expect("bind");
            l.accept().map(|_| ())
        });
        connect(&addr, || {
            probes.set(probes.get() + 1);
            Ok(())
        })
        .expect("reached once it listens");
        assert!(probes.get() >= 1, "the destination was asked while waiting");
        listener.join().expect("join").expect("accepted");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
