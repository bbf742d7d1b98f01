//! The destination's half of a whole-VM move: admit, start the receiving worker and vmm,
//! and settle (commit: the VM is ours; abort or a vmm that ended first: free it all).

use std::net::{IpAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{record, update, IncomingVmm, IncomingWorker};
use crate::api::{self, HostMigration, IncomingAccepted, IncomingCommit, IncomingVm, VgpuState};
use crate::daemon::config::{Config, Listen};
use crate::daemon::core::Daemon;
use crate::daemon::error::ApiError;
use crate::daemon::migration;
use crate::daemon::state::State;
use crate::daemon::vgpus;
use crate::daemon::vms;
use crate::daemon::worker_files::{worker_dir, SECRET_FILE};
use crate::daemon::workers;

/// The socket a receiving worker listens on, in its private directory.
const MIGRATE_IN_SOCKET: &str = "migrate-in.sock";
/// Longest console a source may hand over.
pub(super) const MAX_CONSOLE: usize = 128 << 10;
/// How long a destination whose vmm ended waits for the source's commit before it gives
/// the VM up.
const SETTLE_GRACE: Duration = Duration::from_secs(10);

/// A free TCP port on `ip` (the child binds it a moment later).
fn free_port(ip: IpAddr) -> Result<u16, ApiError> {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ApiError::internal(format!("cannot find a free port for the streams: {e}")))
}

/// A fresh one-time token (32 random bytes, hex) in `path` (owner only).
fn write_token(path: &Path) -> Result<String, ApiError> {
    let err = |e: std::io::Error| ApiError::internal(format!("cannot make a migration token: {e}"));
    let mut b = [0u8; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(err)?,
        &mut b,
    )
    .map_err(err)?;
    let token: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let mut f = crate::daemon::private::create_file(path).map_err(err)?;
    std::io::Write::write_all(&mut f, token.as_bytes()).map_err(err)?;
    Ok(token)
}

/// Whether something listens on stream address `addr` (a unix socket's path exists; a
/// TCP port is in the kernel's listening table).
fn listening(addr: &str) -> bool {
    if let Some(p) = addr.strip_prefix("unix:") {
        return Path::new(p).exists();
    }
    let Some(port) = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()) else {
        return false;
    };
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|t| {
        std::fs::read_to_string(t).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && format!("{} ", f[1]).ends_with(&want) && f[3] == "0A"
            })
        })
    })
}

/// Waits until `addr` listens (the vmm binds it as it starts).
async fn wait_listening(addr: &str) -> Result<(), ApiError> {
    let start = tokio::time::Instant::now();
    while !listening(addr) {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(ApiError::internal(format!(
                "the vmm did not listen on {addr} within 10 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Where a stream to this daemon goes: a unix socket at `unix` when vgpud listens on
/// one, else a fresh TCP port on its API address.
fn stream_address(cfg: &Config, unix: &Path) -> Result<String, ApiError> {
    match &cfg.listen {
        Listen::Unix(_) => Ok(format!("unix:{}", unix.display())),
        Listen::Tcp(a) => Ok(format!("tcp:{}:{}", a.ip(), free_port(a.ip())?)),
    }
}

/// Admits a VM another vgpud moves here and starts what receives it.
pub async fn incoming_vm(d: &Arc<Daemon>, req: IncomingVm) -> Result<IncomingAccepted, ApiError> {
    d.check_running()?;
    if req.vm.vgpu_id.is_some() {
        return Err(ApiError::bad(
            "vm.vgpu_id",
            "an incoming VM brings its vGPU inline (vm.vgpu())",
        ));
    }
    let ask = vms::validate_vm(d, &req.vm).map_err(|e| e.within("vm"))?;
    let (vm_id, vgpu) = d.state.with(|inner| vms::admit_vm(d, inner, ask))?;
    let vmm_address =
        match stream_address(&d.cfg, &d.cfg.state_dir.join(format!("vm-{vm_id}.in.sock"))) {
            Ok(a) => a,
            Err(e) => {
                vms::undo_vm(d, vm_id, vgpu, true).await;
                return Err(e);
            }
        };
    let token_file = d.cfg.state_dir.join(format!("vm-{vm_id}.token"));
    let vmm_token = match write_token(&token_file) {
        Ok(t) => t,
        Err(e) => {
            vms::undo_vm(d, vm_id, vgpu, true).await;
            return Err(e);
        }
    };
    d.host.receive_vmm(
        vm_id,
        IncomingVmm {
            address: vmm_address.clone(),
            token_file,
        },
    );
    let mut vgpu_address = None;
    let mut token = None;
    if let Some(g) = vgpu {
        match start_receiving_worker(d, g).await {
            Ok((a, t)) => {
                vgpu_address = Some(a);
                token = Some(t);
            }
            Err(e) => {
                d.host.vmm_gone(vm_id);
                vgpus::forget_vgpu(d, g);
                d.state.with(|i| i.vms.remove(&vm_id));
                d.persist.mark_dirty();
                return Err(e);
            }
        }
    }
    let gpu = vgpu
        .and_then(|g| d.state.with(|i| i.vgpus.get(&g).map(|r| r.gpu())))
        .unwrap_or(0);
    let mid = d.state.with(|inner| {
        let mid = inner.next_migration;
        inner.next_migration += 1;
        let mut m = record(
            mid,
            vgpu.unwrap_or(0),
            gpu,
            HostMigration {
                direction: "incoming".into(),
                vm: vm_id,
                peer: req.source.clone(),
                remote_vm: None,
                remote_migration: None,
                vmm_rounds: 0,
                vmm_bytes: 0,
                stop_ram_bytes: 0,
                vgpu_rounds: 0,
                vgpu_bytes: 0,
                vgpu_downtime_ms: None,
            },
        );
        m.phase = "incoming".into();
        inner.migrations.insert(mid, m);
        mid
    });
    if let Err(e) = vms::spawn_vmm(d, vm_id).await {
        d.host.vmm_gone(vm_id);
        settle_failed(d, mid, &e.error);
        vms::undo_vm(d, vm_id, vgpu, true).await;
        return Err(e);
    }
    if let Err(e) = wait_listening(&vmm_address).await {
        d.host.vmm_gone(vm_id);
        settle_failed(d, mid, &e.error);
        drop_incoming(d, vm_id).await;
        return Err(e);
    }
    tracing::info!(vm = vm_id, migration = mid, source = %req.source, "waiting for an incoming VM");
    let d = d.clone();
    tokio::spawn(async move { watch_incoming(d, mid, vm_id, vgpu).await });
    Ok(IncomingAccepted {
        migration: mid,
        vm: vm_id,
        vmm_address,
        vgpu_address,
        token,
        vmm_token: Some(vmm_token),
    })
}

/// Starts vGPU `g`'s worker receiving its state: the stream's address and its
/// one-time token (the worker's fresh secret).
async fn start_receiving_worker(d: &Arc<Daemon>, g: u32) -> Result<(String, String), ApiError> {
    let dir = worker_dir(&d.cfg.state_dir, g);
    let address = stream_address(&d.cfg, &dir.join(MIGRATE_IN_SOCKET))?;
    // The worker binds it relative to its private directory (its working directory).
    let local = match address.strip_prefix("unix:") {
        Some(_) => format!("unix:{MIGRATE_IN_SOCKET}"),
        None => address.clone(),
    };
    d.host.receive_worker(g, IncomingWorker { address: local });
    let started = workers::start_worker(d, g).await;
    d.host.worker_gone(g);
    started?;
    d.state.with(|i| {
        if let Some(rec) = i.vgpus.get_mut(&g) {
            if *rec.state() == VgpuState::Ready {
                rec.mark_attached();
            }
        }
    });
    let token = std::fs::read_to_string(dir.join(SECRET_FILE))
        .map_err(|e| ApiError::internal(format!("cannot read the worker's secret: {e}")))?
        .trim()
        .to_owned();
    Ok((address, token))
}

fn settle_failed(d: &Daemon, mid: u32, why: &str) {
    d.state.with(|inner| {
        update(inner, mid, |m| {
            m.state = "failed".into();
            m.error = Some(why.to_owned());
        })
    });
    d.host.settle(mid, false);
}

/// Until the source settles incoming move `mid`: a vmm that ends first (the source
/// gave up, or the stream broke) takes the VM and its vGPU with it.
/// A source that has not connected its VM stream within `--migration-connect-timeout-s`
/// (the vmm still listens: only the source with the token ends its wait) is not
/// coming: the move is cancelled and what it reserved freed.
async fn watch_incoming(d: Arc<Daemon>, mid: u32, vm_id: u32, vgpu: Option<u32>) {
    let mut ended_at = None;
    let admitted = tokio::time::Instant::now();
    let mut connected = false;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        // An abort frees the VM itself.
        if d.host.is_settled(mid) {
            break;
        }
        if !connected {
            let address = d.host.vmm(vm_id).map(|v| v.address);
            connected = !address.as_deref().is_some_and(listening);
            let limit = d.cfg.migration_connect_timeout;
            if !connected && admitted.elapsed() >= limit {
                tracing::warn!(
                    vm = vm_id,
                    migration = mid,
                    "the source did not connect within {} s; cancelling the incoming move",
                    limit.as_secs()
                );
                settle_failed(
                    &d,
                    mid,
                    &format!(
                        "the source did not connect within {} s (--migration-connect-timeout-s)",
                        limit.as_secs()
                    ),
                );
                drop_incoming(&d, vm_id).await;
                break;
            }
        }
        let live = d
            .state
            .with(|i| i.vms.get(&vm_id).map(|v| v.state().is_live()));
        match (live, ended_at) {
            (Some(true), _) => {}
            (None, _) => break,
            (Some(false), None) => ended_at = Some(tokio::time::Instant::now()),
            (Some(false), Some(t)) if t.elapsed() >= SETTLE_GRACE => {
                tracing::warn!(
                    vm = vm_id,
                    migration = mid,
                    "the incoming VM ended before its source committed the move; freeing it"
                );
                settle_failed(&d, mid, "the VM did not arrive (its vmm here ended before the source committed the move)");
                drop_incoming(&d, vm_id).await;
                break;
            }
            (Some(false), Some(_)) => {}
        }
    }
    d.host.vmm_gone(vm_id);
    if let Some(g) = vgpu {
        d.host.worker_gone(g);
    }
}

async fn drop_incoming(d: &Daemon, vm_id: u32) {
    if let Err(e) = vms::delete_vm(d, vm_id).await {
        tracing::warn!(vm = vm_id, error = %e, "cannot remove the VM that did not arrive");
    }
}

fn incoming_record(state: &State, mid: u32) -> Result<(u32, String), ApiError> {
    let m = migration::migration(state, mid)?;
    match m.host {
        Some(h) if h.direction == "incoming" => Ok((h.vm, m.state)),
        _ => Err(ApiError::conflict(
            "id",
            format!("migration {mid} is not a VM moving here from another vgpud"),
        )),
    }
}

/// The source committed incoming move `mid`: the VM is ours, its console continues
/// the one it had.
pub async fn commit_incoming(
    d: &Daemon,
    mid: u32,
    c: IncomingCommit,
) -> Result<api::Migration, ApiError> {
    let (vm_id, state) = incoming_record(&d.state, mid)?;
    if state != "running" {
        return Err(ApiError::conflict(
            "id",
            format!("migration {mid} is {state}, not running"),
        ));
    }
    if c.console.len() > MAX_CONSOLE {
        return Err(ApiError::bad(
            "console",
            format!("at most {MAX_CONSOLE} bytes of console"),
        ));
    }
    let path = d.cfg.state_dir.join(format!("vm-{vm_id}.before.log"));
    let written = crate::daemon::private::create_file(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, c.console.as_bytes()));
    match written {
        Ok(()) => {
            d.host.console_moved_here(vm_id, path);
        }
        Err(e) => {
            tracing::warn!(vm = vm_id, error = %e, "cannot keep the VM's earlier console")
        }
    }
    d.host.settle(mid, true);
    d.state.with(|inner| {
        // Its uptime continues the one it had.
        if let (Some(vm), Some(ms)) = (inner.vms.get_mut(&vm_id), c.uptime_ms) {
            vm.continue_uptime(ms);
        }
        update(inner, mid, |m| {
            m.state = "completed".into();
            m.phase = "done".into();
            m.downtime_ms = c.downtime_ms;
            m.elapsed_ms = c.elapsed_ms.unwrap_or(m.elapsed_ms);
            if let (Some(h), Some(f)) = (&mut m.host, &c.figures) {
                h.remote_vm = Some(f.vm);
                h.vmm_rounds = f.vmm_rounds;
                h.vmm_bytes = f.vmm_bytes;
                h.stop_ram_bytes = f.stop_ram_bytes;
                h.vgpu_rounds = f.vgpu_rounds;
                h.vgpu_bytes = f.vgpu_bytes;
                h.vgpu_downtime_ms = f.vgpu_downtime_ms;
                m.rounds = f.vmm_rounds;
                m.bytes = f.vmm_bytes + f.vgpu_bytes;
            }
        })
    });
    d.persist.mark_dirty();
    tracing::info!(vm = vm_id, migration = mid, "the VM moved here");
    migration::migration(&d.state, mid)
}

/// The source gave incoming move `mid` up: the VM and its vGPU go.
pub async fn abort_incoming(d: &Daemon, mid: u32) -> Result<api::Migration, ApiError> {
    let (vm_id, state) = incoming_record(&d.state, mid)?;
    if state == "running" {
        settle_failed(d, mid, "the source gave the move up");
        drop_incoming(d, vm_id).await;
    }
    migration::migration(&d.state, mid)
}
