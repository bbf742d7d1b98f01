//! VMs: launching one (payload resolution, its vGPU bound or created inline, its vmm),
//! its console, its end (however it ends) and its removal.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;

use super::admission;
use super::admission::{validate_vm_meta, vm_name_free};
use super::config::Config;
use super::core::{no_vm, Daemon};
use super::error::ApiError;
use super::procs;
use super::state::{Inner, State, VgpuAsk, VmDef, VmRec};
use super::storage;
use super::vgpus;
use super::workers;
use super::workers::terminate;
use crate::api::{self, VgpuState, VmCreate};
use crate::units::human_bytes;
use vgpu_api::payloads::Payload;

/// Guest RAM bounds.
const VM_MEMORY_MIN: u64 = 16 << 20;
const VM_MEMORY_MAX: u64 = 64 << 30;
/// Longest payload argument (payload-abi.md).
const MAX_PAYLOAD_ARG: usize = 4096;
/// Most vCPUs (payload-abi.md).
const MAX_VCPUS: u8 = 16;

/// VM `id`'s vmm API socket.
pub(super) fn vmm_api_socket(state_dir: &Path, id: u32) -> PathBuf {
    state_dir.join(format!("vm-{id}.api"))
}

/// A validated VM request.
pub(super) struct VmAsk {
    payload: PathBuf,
    payload_arg: String,
    memory: u64,
    vcpus: u8,
    /// An existing vGPU to attach.
    vgpu_id: Option<u32>,
    /// A new vGPU created with the VM (inline).
    vgpu: Option<VgpuAsk>,
    name: Option<String>,
    labels: BTreeMap<String, String>,
}

/// A payload path as the VM request gives it, resolved and checked.
fn resolve_payload(cfg: &Config, p: &str) -> Result<PathBuf, ApiError> {
    if p.is_empty() {
        return Err(ApiError::bad(
            "payload",
            "payload is empty; give the path of a payload ELF",
        ));
    }
    let path = if p.contains('/') {
        let path = PathBuf::from(p);
        if !path.is_absolute() {
            return Err(ApiError::bad(
                "payload",
                format!("{p:?} is relative; give an absolute path (vgpud resolves it on its own host) or a bare payload name"),
            ));
        }
        path
    } else {
        match &cfg.payload_dir {
            Some(dir) if !dir.join(p).exists() => {
                return Err(ApiError::bad("payload", no_such_payload(cfg, p)))
            }
            Some(dir) => dir.join(p),
            None => {
                return Err(ApiError::bad(
                    "payload",
                    format!(
                    "{p:?} is a bare name but vgpud has no --payload-dir; give an absolute path"
                ),
                ))
            }
        }
    };
    let path = match &cfg.payload_dir {
        Some(dir) => storage::under_root(&path, dir, "--payload-dir")
            .map_err(|why| ApiError::bad("payload", why))?,
        None => path,
    };
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(ApiError::bad(
                "payload",
                format!("{} is not a regular file; give a payload ELF", path.display()),
            ))
        }
        Err(e) => return Err(ApiError::bad(
            "payload",
            format!("cannot read payload {}: {e}; check the path (list the payloads vgpud has with GET /v1/payloads)", path.display()),
        )),
    }
    let mut magic = [0u8; 4];
    let read = File::open(&path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
    match read {
        Ok(()) if magic == *b"\x7fELF" => Ok(path),
        Ok(()) | Err(_) => Err(ApiError::bad(
            "payload",
            format!(
                "{} is not an ELF file; give a payload ELF (list them with GET /v1/payloads)",
                path.display()
            ),
        )),
    }
}

/// Why bare payload name `p` is not in `--payload-dir`: the names there, and the one
/// meant when `p` is close to one.
fn no_such_payload(cfg: &Config, p: &str) -> String {
    let dir = cfg
        .payload_dir
        .as_deref()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let names: Vec<String> = payloads(cfg).into_iter().map(|x| x.name).collect();
    if names.is_empty() {
        return format!("{p:?} is not in vgpud's --payload-dir {dir}, which holds no payload ELFs");
    }
    let meant = closest(p, &names)
        .map(|n| format!("did you mean {n:?}? "))
        .unwrap_or_default();
    format!(
        "{p:?} is not in vgpud's --payload-dir {dir}; {meant}payloads there: {}",
        names.join(", ")
    )
}

/// The payload ELFs in `--payload-dir` (none without one), each described from the
/// payload table when it is one of the payloads vgpu ships.
pub fn payloads(cfg: &Config) -> Vec<Payload> {
    let Some(dir) = &cfg.payload_dir else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Payload> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let meta = std::fs::metadata(e.path()).ok()?;
            let mut magic = [0u8; 4];
            File::open(e.path())
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .ok()?;
            (meta.is_file() && magic == *b"\x7fELF")
                .then(|| Payload::describe(&name, e.path().display().to_string(), meta.len()))
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Checks a VM request field by field (nothing is admitted yet).
pub(super) fn validate_vm(d: &Daemon, req: &VmCreate) -> Result<VmAsk, ApiError> {
    for (field, v) in [
        ("kernel", &req.kernel),
        ("initrd", &req.initrd),
        ("cmdline", &req.cmdline),
    ] {
        if v.is_some() {
            return Err(ApiError::not_implemented(
                Some(field),
                "this vgpud boots payload guests only; launch one with payload (GET /v1/payloads lists them)",
            ));
        }
    }
    let Some(payload) = req.payload.as_deref() else {
        return Err(ApiError::bad(
            "payload",
            "give payload: the path of a payload ELF to boot",
        ));
    };
    let payload = resolve_payload(&d.cfg, payload)?;
    if req.payload_arg.len() > MAX_PAYLOAD_ARG || req.payload_arg.contains('\0') {
        return Err(ApiError::bad(
            "payload_arg",
            format!("payload_arg must be at most {MAX_PAYLOAD_ARG} bytes without NUL"),
        ));
    }
    if !(VM_MEMORY_MIN..=VM_MEMORY_MAX).contains(&req.memory_bytes) || req.memory_bytes % 4096 != 0
    {
        return Err(ApiError::bad(
            "memory_bytes",
            format!(
                "{} of guest RAM: give a multiple of 4 KiB between {} and {}",
                req.memory_bytes,
                human_bytes(VM_MEMORY_MIN),
                human_bytes(VM_MEMORY_MAX)
            ),
        ));
    }
    if req.vcpus == 0 || req.vcpus > MAX_VCPUS {
        return Err(ApiError::bad(
            "vcpus",
            format!("{} vCPUs: give 1 to {MAX_VCPUS}", req.vcpus),
        ));
    }
    validate_vm_meta(req.name.as_deref(), &req.labels)?;
    if req.vgpu_id.is_some() && req.vgpu.is_some() {
        return Err(ApiError::bad(
            "vgpu",
            "give either vgpu_id (an existing vGPU) or vgpu (a new one), not both",
        ));
    }
    let vgpu = req
        .vgpu
        .as_ref()
        .map(|s| {
            super::attach::refuse_inline(s)
                .and_then(|()| admission::validate_vgpu(d, s))
                .map_err(|e| e.within("vgpu"))
        })
        .transpose()?;
    Ok(VmAsk {
        payload,
        payload_arg: req.payload_arg.clone(),
        memory: req.memory_bytes,
        vcpus: req.vcpus,
        vgpu_id: req.vgpu_id,
        vgpu,
        name: req.name.clone(),
        labels: req.labels.clone(),
    })
}

/// Launches a VM (and its inline vGPU).
pub async fn create_vm(d: &Arc<Daemon>, req: VmCreate) -> Result<api::Vm, ApiError> {
    d.check_running()?;
    let ask = validate_vm(d, &req)?;
    let inline = ask.vgpu.is_some();
    let (vm_id, vgpu_id) = d.state.with(|inner| admit_vm(d, inner, ask))?;
    if let (true, Some(g)) = (inline, vgpu_id) {
        if let Err(e) = workers::start_worker(d, g).await {
            vgpus::forget_vgpu(d, g);
            d.state.with(|i| i.vms.remove(&vm_id));
            d.persist.mark_dirty();
            return Err(e);
        }
        d.state.with(|i| {
            if let Some(rec) = i.vgpus.get_mut(&g) {
                if *rec.state() == VgpuState::Ready {
                    rec.mark_attached();
                }
            }
        });
    }
    if let Err(e) = spawn_vmm(d, vm_id).await {
        undo_vm(d, vm_id, vgpu_id, inline).await;
        return Err(e);
    }
    d.persist
        .save(&d.state)
        .await
        .map_err(|e| ApiError::unsaved(&format!("VM {vm_id} was created"), &e))?;
    d.state
        .with(|i| i.vms.get(&vm_id).map(VmRec::view))
        .ok_or_else(|| ApiError::internal(format!("VM {vm_id} vanished while starting")))
}

/// Binds (or admits) the VM's vGPU and inserts its record (state `starting`): the
/// VM's id and its vGPU's. Caller holds the state lock.
pub(super) fn admit_vm(
    d: &Daemon,
    inner: &mut Inner,
    ask: VmAsk,
) -> Result<(u32, Option<u32>), ApiError> {
    vm_name_free(inner, ask.name.as_deref())?;
    let vm_id = inner.next_vm;
    let vgpu_id = match (ask.vgpu_id, ask.vgpu) {
        (Some(g), _) => {
            bind_vgpu(inner, g, vm_id)?;
            Some(g)
        }
        (None, Some(vgpu)) => {
            Some(admission::admit(d, inner, vgpu, Some(vm_id)).map_err(|e| e.within("vgpu"))?)
        }
        (None, None) => None,
    };
    inner.next_vm += 1;
    let console = d.cfg.state_dir.join(format!("vm-{vm_id}.log"));
    inner.vms.insert(
        vm_id,
        VmRec::launched(VmDef {
            id: vm_id,
            payload: ask.payload,
            payload_arg: ask.payload_arg,
            memory: ask.memory,
            vcpus: ask.vcpus,
            vgpu: vgpu_id,
            console,
            name: ask.name,
            labels: ask.labels,
        }),
    );
    Ok((vm_id, vgpu_id))
}

/// Rolls back a VM whose vmm could not start.
pub(super) async fn undo_vm(d: &Daemon, vm_id: u32, vgpu: Option<u32>, inline: bool) {
    if let Some(vm) = d.state.with(|i| i.vms.remove(&vm_id)) {
        let _ = std::fs::remove_file(vm.console());
    }
    d.persist.mark_dirty();
    let Some(g) = vgpu else { return };
    if inline {
        let worker = d.state.with(|inner| {
            inner.vgpus.get_mut(&g).and_then(|r| {
                r.mark_stopping();
                r.worker().map(|w| (w.proc.clone(), w.link.clone()))
            })
        });
        if let Some((p, link)) = worker {
            workers::stop_worker(d, g, &p, &link).await;
        }
        vgpus::forget_vgpu(d, g);
    } else {
        d.state.with(|inner| {
            if let Some(rec) = inner.vgpus.get_mut(&g) {
                rec.detach();
            }
        });
    }
}

/// Starts VM `vm_id`'s vmm and its reaper. The command line is read under the state
/// lock; the console is opened and the vmm forked off the runtime with no lock held,
/// so launches of different VMs proceed side by side.
pub(super) async fn spawn_vmm(d: &Arc<Daemon>, vm_id: u32) -> Result<(), ApiError> {
    let (mut cmd, console_path, payload) = d.state.with(|inner| vmm_command(d, inner, vm_id))?;
    let console_for_open = console_path.clone();
    let console = tokio::task::spawn_blocking(move || open_console(&console_for_open))
        .await
        .map_err(|e| ApiError::internal(format!("the console task failed: {e}")))??;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(console.0))
        .stderr(Stdio::from(console.1));
    let (child, proc) = procs::spawn_off_runtime(cmd, None, Vec::new(), None)
        .await
        .map_err(|e| {
            ApiError::internal(format!(
                "cannot start {}: {e}; check vgpud's --vmm-bin",
                d.cfg.vmm_bin.display()
            ))
        })?;
    tracing::info!(vm = vm_id, pid = proc.pid, payload = %payload.display(), "vmm started");
    let recorded = d.state.with(|inner| {
        let has_vgpu = inner.vms.get(&vm_id).map(|vm| vm.vgpu().is_some());
        let vm = inner.vms.get_mut(&vm_id)?;
        vm.vmm_started(proc.clone());
        if has_vgpu == Some(false) {
            vm.mark_running();
        }
        Some(())
    });
    if recorded.is_none() {
        // The VM was removed while its vmm started: nobody owns this one.
        proc.signal(libc::SIGKILL);
    }
    let d = d.clone();
    tokio::spawn(async move {
        let status = procs::reap(child, &proc).await;
        on_vmm_exit(&d, vm_id, proc.pid, status);
    });
    match recorded {
        Some(()) => Ok(()),
        None => Err(ApiError::internal(format!(
            "VM {vm_id} vanished while starting"
        ))),
    }
}

/// VM `vm_id`'s vmm command line (without its standard streams), its console log and
/// its payload. Caller holds the state lock.
fn vmm_command(
    d: &Daemon,
    inner: &Inner,
    vm_id: u32,
) -> Result<(Command, PathBuf, PathBuf), ApiError> {
    let vm = inner
        .vms
        .get(&vm_id)
        .ok_or_else(|| ApiError::internal(format!("VM {vm_id} vanished while starting")))?;
    let socket = vm
        .vgpu()
        .and_then(|g| inner.vgpus.get(&g))
        .map(|r| r.socket().clone());
    let mut cmd = Command::new(&d.cfg.vmm_bin);
    match d.host.vmm(vm_id) {
        // A VM moving here from another vgpud: its shape comes with it.
        Some(incoming) => {
            cmd.arg("--migrate-from")
                .arg(&incoming.address)
                .arg("--migrate-token-file")
                .arg(&incoming.token_file);
        }
        None => {
            cmd.arg("--payload")
                .arg(vm.payload())
                .args(["--memory", &vm.memory().to_string()])
                .args(["--vcpus", &vm.vcpus().to_string()])
                .arg("--payload-arg")
                .arg(vm.payload_arg());
        }
    }
    cmd.arg("--api-socket")
        .arg(vmm_api_socket(&d.cfg.state_dir, vm_id));
    if let Some(s) = socket {
        let mut spec = std::ffi::OsString::from("socket=");
        spec.push(s.as_os_str());
        cmd.arg("--vgpu").arg(spec);
    }
    Ok((cmd, vm.console().clone(), vm.payload().clone()))
}

/// VM `vm_id`'s vmm `pid` exited: the VM ended, and its vGPU's worker goes too.
pub(super) fn on_vmm_exit(d: &Daemon, vm_id: u32, pid: u32, status: ExitStatus) {
    let worker = d.state.with(|inner| {
        let vm = inner.vms.get_mut(&vm_id)?;
        if vm.proc().map(|p| p.pid) != Some(pid) {
            return None;
        }
        vm.vmm_gone();
        if vm.state().is_live() {
            match status.code() {
                Some(code) => vm.mark_exited(code),
                None => vm.fail(format!("the vmm was {}", procs::describe(&status))),
            }
        }
        tracing::info!(vm = vm_id, pid, state = ?vm.state(), "vmm exited");
        d.persist.mark_dirty();
        let worker = vm
            .vgpu()
            .and_then(|g| inner.vgpus.get(&g))
            .and_then(|r| r.worker_proc());
        Some(worker)
    });
    let Some(worker) = worker else { return };
    // The worker exits by itself when its frontend disconnects; make sure of it, so
    // the vGPU's memory and shares are free within a second.
    if let Some(p) = worker {
        terminate(p);
    }
    d.state.notify();
}

/// One VM.
pub fn get_vm(state: &State, id: u32) -> Result<api::Vm, ApiError> {
    state
        .with(|i| i.vms.get(&id).map(VmRec::view))
        .ok_or_else(|| no_vm(id))
}

/// Every VM.
pub fn list_vms(state: &State) -> Vec<api::Vm> {
    state.with(|i| i.vms.values().map(VmRec::view).collect())
}

/// The VM's console output from byte `offset` on.
pub fn console(d: &Daemon, id: u32, offset: u64) -> Result<Vec<u8>, ApiError> {
    let path = d
        .state
        .with(|i| i.vms.get(&id).map(|v| v.console().clone()))
        .ok_or_else(|| no_vm(id))?;
    let mut data = d
        .host
        .console_before(id)
        .and_then(|p| std::fs::read(p).ok())
        .unwrap_or_default();
    data.extend(std::fs::read(&path).unwrap_or_default());
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(data.len());
    Ok(data[start..].to_vec())
}

/// Stops a VM (SIGTERM, then SIGKILL), waits until its vGPU is released, removes it
/// (and its inline vGPU).
pub async fn delete_vm(d: &Daemon, id: u32) -> Result<(), ApiError> {
    let (proc, vgpu) = d.state.with(|inner| {
        let vm = inner.vms.get(&id).ok_or_else(|| no_vm(id))?;
        // A vGPU restored after a restart no longer belongs to the VM it served before
        // (it may serve a new one): leave it alone.
        let vgpu = vm
            .vgpu()
            .filter(|g| inner.vgpus.get(g).is_some_and(|r| r.vm() == Some(id)));
        Ok::<_, ApiError>((vm.proc().cloned(), vgpu))
    })?;
    if let Some(p) = proc {
        workers::stop_proc(&d.state, &p, |i| {
            i.vms.get(&id).is_none_or(|v| v.proc().is_none())
        })
        .await;
    }
    if let Some(g) = vgpu {
        // Its worker stops on the vmm's disconnect (with SIGKILL after the grace).
        let worker = d
            .state
            .with(|i| i.vgpus.get(&g).and_then(|r| r.worker_proc()));
        if let Some(p) = worker {
            workers::stop_proc(&d.state, &p, |i| i.worker_gone(g)).await;
        }
    }
    let (vm, owned) = d.state.with(|inner| {
        let vm = inner.vms.remove(&id);
        let owned = vgpu.filter(|g| inner.vgpus.get(g).is_some_and(|r| r.owned()));
        if let Some(rec) = vgpu.and_then(|g| inner.vgpus.get_mut(&g)) {
            rec.forget_vm();
        }
        (vm, owned)
    });
    if let Some(vm) = vm {
        let _ = std::fs::remove_file(vm.console());
    }
    d.host.forget_vm(id);
    // The vmm's API socket, and the socket a VM that moved here arrived on.
    let _ = std::fs::remove_file(vmm_api_socket(&d.cfg.state_dir, id));
    let _ = std::fs::remove_file(d.cfg.state_dir.join(format!("vm-{id}.in.sock")));
    let _ = std::fs::remove_file(d.cfg.state_dir.join(format!("vm-{id}.token")));
    if let Some(g) = owned {
        vgpus::forget_vgpu(d, g);
    }
    d.state.notify();
    tracing::info!(vm = id, "VM deleted");
    d.persist
        .save(&d.state)
        .await
        .map_err(|e| ApiError::unsaved(&format!("VM {id} was deleted"), &e))
}

/// Creates VM console log `path` (owner only: a guest's console is no other tenant's, nor
/// its worker's, business): two handles, for the vmm's stdout and stderr.
fn open_console(path: &std::path::Path) -> Result<(File, File), ApiError> {
    let console = super::private::create_file(path).map_err(|e| {
        ApiError::internal(format!(
            "cannot create the console log {}: {e}",
            path.display()
        ))
    })?;
    let console2 = console
        .try_clone()
        .map_err(|e| ApiError::internal(format!("console log: {e}")))?;
    Ok((console, console2))
}

/// Attaches existing vGPU `g` to new VM `vm_id`, if it is ready and free.
fn bind_vgpu(inner: &mut Inner, g: u32, vm_id: u32) -> Result<(), ApiError> {
    let Some(rec) = inner.vgpus.get(&g) else {
        return Err(ApiError::bad(
            "vgpu_id",
            format!("there is no vGPU {g} (GET /v1/vgpus lists them)"),
        ));
    };
    if rec.process().is_some() {
        return Err(ApiError::conflict(
            "vgpu_id",
            format!("vGPU {g} is for processes (attach \"process\"); create a vGPU for the VM"),
        ));
    }
    let vm_live = |v: u32| inner.vms.get(&v).is_some_and(|v| v.state().is_live());
    match (rec.state(), rec.vm()) {
        (VgpuState::Ready, None) => {}
        (_, Some(v)) if vm_live(v) => {
            return Err(ApiError::conflict(
                "vgpu_id",
                format!("vGPU {g} is in use by VM {v}; create another vGPU"),
            ));
        }
        (state, _) => {
            return Err(ApiError::conflict(
                "vgpu_id",
                format!(
                    "vGPU {g} is {state:?}, not ready; a vGPU serves one VM, so create a new one"
                ),
            ));
        }
    }
    if let Some(rec) = inner.vgpus.get_mut(&g) {
        rec.attach_to(vm_id);
    }
    Ok(())
}

/// The name in `names` closest to `given` when it is close enough to be a typo (an edit
/// distance of at most a third of its length, at least 1), or one `given` starts or ends.
fn closest<'a>(given: &str, names: &'a [String]) -> Option<&'a str> {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let here = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != *cb))
                    .min(row[j] + 1)
                    .min(here + 1);
                prev = here;
            }
        }
        row[b.len()]
    };
    let lower = given.to_ascii_lowercase();
    names
        .iter()
        .map(|n| (distance(&lower, &n.to_ascii_lowercase()), n))
        .filter(|(d, n)| {
            *d <= (n.len() / 3).max(1) || n.starts_with(&lower) || lower.starts_with(n.as_str())
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n.as_str())
}

#[cfg(test)]
mod payload_name_tests {
    #[test]
    fn a_mistyped_payload_name_finds_the_one_meant() {
        let names: Vec<String> = ["hello", "vecadd", "gpu-load"].map(String::from).into();
        assert_eq!(super::closest("vecad", &names), Some("vecadd"));
        assert_eq!(super::closest("gpuload", &names), Some("gpu-load"));
        assert_eq!(super::closest("Hello", &names), Some("hello"));
        assert_eq!(super::closest("storage", &names), None);
    }
}
