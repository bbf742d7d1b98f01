//! Adopting what a previous vgpud left running: vmms and workers outlive vgpud (their own
//! session, no parent-death signal), so a restart, an upgrade or a `kill -9` of vgpud never
//! touches a running guest. At start the new vgpud finds them from the state file (pid
//! and start time, so a reused pid is never taken for them), supervises them through
//! pidfds (it is not their parent), reconnects to each worker's control socket with the
//! worker's secret, and attaches the vGPU to its GPU's scheduler again: the new grant
//! page and doorbell ride on the reconnection. Until then the worker serves its guest
//! ungated (docs/api.md, "Restarts").

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::core::Daemon;
use super::link;
use super::memory;
use super::procs::{self, Proc};
use super::state::WorkerHandle;
use super::vms;
use super::worker_files::{self, CONTROL_SOCKET, SECRET_FILE};
use super::workers;
use super::workers::terminate;
use crate::api::VgpuState;

/// The first line vgpud sends on a worker's control socket (the worker's
/// `control::ATTACH`), followed by the worker's secret.
const ATTACH: &str = "attach ";

/// How long an adopted worker that exited waits for its VM's vmm to be reported gone
/// too before its exit counts as a crash (the worker exits right after its vmm
/// disconnects, and the two exits may be seen in either order).
const VMM_EXIT_GRACE: Duration = Duration::from_secs(1);

/// The exit status of a process that is a zombie now (`/proc/PID/stat` field 52, in
/// waitpid's form): known only until its parent reaps it.
fn zombie_status(pid: u32) -> Option<ExitStatus> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() != Some(&"Z") {
        return None;
    }
    // Fields after comm start at 3; the exit code is field 52.
    let raw: i32 = fields.get(52 - 3)?.parse().ok()?;
    Some(ExitStatus::from_raw(raw))
}

/// Reconnects to vGPU `id`'s running worker `proc` and attaches the vGPU to its GPU's
/// scheduler again. The record holds its resources (state `starting`) already.
pub(super) async fn adopt_worker(d: &Arc<Daemon>, id: u32, proc: Proc) -> Result<(), String> {
    let (fds, gpu, log, oversubscribe) = d.state.with(|inner| {
        let rec = inner
            .vgpus
            .get(&id)
            .ok_or_else(|| "its record vanished".to_owned())?;
        let fds = d.grants.attach(rec, rec.gpu()).map_err(|e| e.error)?;
        Ok::<_, String>((fds, rec.gpu(), rec.log().clone(), rec.oversubscribe()))
    })?;
    if oversubscribe {
        let priority = d
            .state
            .with(|i| i.vgpus.get(&id).map_or(0, |r| r.priority()));
        d.memory.join(gpu, id, priority);
    }
    memory::refresh_pool(d, gpu);
    let dir = worker_files::worker_dir(&d.cfg.state_dir, id);
    let connected = (|| {
        let secret = std::fs::read_to_string(dir.join(SECRET_FILE))
            .map_err(|e| format!("cannot read its secret: {e}"))?;
        let stream = UnixStream::connect(dir.join(CONTROL_SOCKET))
            .map_err(|e| format!("cannot reach its control socket: {e}"))?;
        let line = format!("{ATTACH}{}\n", secret.trim());
        let raw = [fds.page.as_raw_fd(), fds.doorbell.as_raw_fd()];
        let sent = stream
            .send_with_fds(&[line.as_bytes()], &raw)
            .map_err(|e| format!("cannot send it the grant channel: {e}"))?;
        (&stream)
            .write_all(line.as_bytes().get(sent..).unwrap_or_default())
            .map_err(|e| format!("cannot greet it: {e}"))?;
        Ok::<_, String>(stream)
    })();
    drop(fds);
    let stream = match connected {
        Ok(s) => s,
        Err(e) => {
            d.grants.detach(id, gpu);
            return Err(e);
        }
    };
    let (link, ready) = link::start(stream, workers::worker_events(d, id)).map_err(|e| {
        d.grants.detach(id, gpu);
        format!("control channel: {e}")
    })?;
    d.state.with(|i| {
        if let Some(rec) = i.vgpus.get_mut(&id) {
            rec.worker_started(WorkerHandle {
                proc: proc.clone(),
                link,
            });
        }
    });
    let p = proc.clone();
    tokio::spawn({
        let d = d.clone();
        async move {
            procs::watch(&p).await;
            on_adopted_worker_exit(&d, id, p.pid).await;
        }
    });
    workers::await_ready(&d.state, id, &proc, &log, ready)
        .await
        .map_err(|e| e.error)?;
    d.state.with(|i| {
        let live_vm = i
            .vgpus
            .get(&id)
            .and_then(|r| r.vm())
            .is_some_and(|v| i.vms.get(&v).is_some_and(|v| v.state().is_live()));
        if let Some(rec) = i.vgpus.get_mut(&id) {
            rec.clear_restore_failed();
            if live_vm && *rec.state() == VgpuState::Ready {
                rec.mark_attached();
            }
        }
    });
    tracing::info!(vgpu = id, pid = proc.pid, "worker adopted");
    Ok(())
}

/// An adopted worker exited: its status is its parent's, so a worker whose VM is still
/// running once the grace is over crashed; one whose VM ended went with it.
async fn on_adopted_worker_exit(d: &Arc<Daemon>, id: u32, pid: u32) {
    let vm_running = |i: &super::state::Inner| {
        i.vgpus
            .get(&id)
            .and_then(|r| r.vm())
            .and_then(|v| i.vms.get(&v))
            .is_some_and(|v| v.proc().is_some())
    };
    d.state.wait_until(VMM_EXIT_GRACE, |i| !vm_running(i)).await;
    workers::on_worker_exit(d, id, pid, None);
}

/// Supervises VM `vm_id`'s running vmm `proc` (a previous vgpud started it).
pub(super) fn adopt_vmm(d: &Arc<Daemon>, vm_id: u32, proc: Proc) {
    tracing::info!(vm = vm_id, pid = proc.pid, "vmm adopted");
    let d = d.clone();
    tokio::spawn(async move {
        procs::watch(&proc).await;
        match zombie_status(proc.pid) {
            Some(status) => vms::on_vmm_exit(&d, vm_id, proc.pid, status),
            None => on_adopted_vmm_gone(&d, vm_id, proc.pid),
        }
    });
}

/// Removes the private directories of workers that are gone (stopped while no vgpud
/// ran, or not adopted): nothing else removes them. Runs once the start-up's restore is done.
pub(super) fn sweep_worker_dirs(d: &Daemon) {
    let parent = d.cfg.state_dir.join("workers");
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let id = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
        let gone = id.is_none_or(|id| d.state.with(|i| i.worker_gone(id)));
        if gone {
            tracing::debug!(dir = %e.path().display(), "removing a gone worker's directory");
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let _ = std::fs::remove_dir(&parent);
}

/// An adopted vmm exited and its parent reaped it before we could read its status.
fn on_adopted_vmm_gone(d: &Daemon, vm_id: u32, pid: u32) {
    let worker = d.state.with(|inner| {
        let vm = inner.vms.get_mut(&vm_id)?;
        if vm.proc().map(|p| p.pid) != Some(pid) {
            return None;
        }
        vm.vmm_gone();
        if vm.state().is_live() {
            vm.fail("the vmm exited; it was adopted after a vgpud restart, so its exit status is unknown (see its console)".into());
        }
        tracing::info!(vm = vm_id, pid, "adopted vmm exited");
        d.persist.mark_dirty();
        Some(
            vm.vgpu()
                .and_then(|g| inner.vgpus.get(&g))
                .and_then(|r| r.worker_proc()),
        )
    });
    if let Some(Some(p)) = worker {
        terminate(p);
    }
    d.state.notify();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_has_no_zombie_status() {
        assert!(zombie_status(std::process::id()).is_none());
        assert!(zombie_status(u32::MAX).is_none());
    }
}
