//! The daemon's state file (`vgpud-state.json` in the state directory): what survives a
//! vgpud restart, planned or `kill -9` (docs/hostile.md, "What a vgpud restart keeps and
//! loses").
//!
//! It holds every vGPU definition (its id and effective spec, PATCHed values included),
//! every VM record (its spec and how it ended), the running vmm and worker processes (so
//! the next vgpud adopts them) and the id counters, so an id is never handed out twice. It is versioned JSON, written atomically (temporary file, fsync,
//! rename, fsync of the directory) after every change that alters it, never on the
//! grant or request path. Reading it either gives the whole state or a typed error that
//! names the file and says what to do: vgpud never guesses at a damaged file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vgpu_api::api::Attach;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "vgpud-state.json";
/// The format this vgpud reads and writes.
pub const VERSION: u32 = 2;
/// The oldest format this vgpud still reads (version 1 had no vGPU names and labels).
pub const OLDEST_VERSION: u32 = 1;

/// Why the state file could not be read or written. Each message names the file and
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read the state file {path}: {source}; make it readable by vgpud, or move it aside (mv {path} {path}.bad) to start without the saved vGPUs and VMs")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the state file {path} is damaged ({source}); vgpud will not guess what it held: move it aside (mv {path} {path}.bad) and start again, or start once with --discard-state (it sets the file aside and starts without the saved vGPUs and VMs)")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("the state file {path} has format version {found}, this vgpud reads versions 1 to {supported}; run the vgpud that wrote it, or move the file aside (mv {path} {path}.bad), or start once with --discard-state (it sets the file aside and starts without the saved vGPUs and VMs)")]
    Version {
        path: PathBuf,
        found: u64,
        supported: u32,
    },
    #[error("cannot write the state file {path}: {source}; changes since the last save would not survive a vgpud restart: check the state directory (free space, permissions)")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set the state file {path} aside as {to}: {source}; move it yourself and start again")]
    Discard {
        path: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
}

/// Everything that survives a restart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    /// [`VERSION`].
    pub version: u32,
    /// The next vGPU id (ids are never reused).
    pub next_vgpu: u32,
    /// The next VM id.
    pub next_vm: u32,
    /// The next migration id (migration records themselves do not survive).
    pub next_migration: u32,
    pub vgpus: Vec<SavedVgpu>,
    pub vms: Vec<SavedVm>,
}

impl StateFile {
    /// The state of a daemon that has created nothing yet.
    pub fn empty() -> Self {
        Self {
            version: VERSION,
            next_vgpu: 1,
            next_vm: 1,
            next_migration: 1,
            vgpus: Vec::new(),
            vms: Vec::new(),
        }
    }
}

/// Where a saved vGPU was in its life.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SavedVgpuState {
    /// It held its resources (starting, ready or attached): a definition to bring back.
    Live,
    /// Its VM ended; it holds nothing and is kept as a record.
    Released,
    /// Its worker died; kept as a record with the reason.
    Failed { reason: String },
}

/// One storage namespace of a vGPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedStorage {
    pub namespace: u32,
    pub path: String,
    pub read_only: bool,
}

/// A process a vgpud started and that outlives it (a vmm or a worker): what the next
/// vgpud needs to adopt it. The start time (clock ticks since boot, `/proc/PID/stat`)
/// tells it from a process that reused the pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedProc {
    pub pid: u32,
    pub start_time: u64,
}

/// One vGPU: its effective spec (shares in per-mille, exactly as admitted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedVgpu {
    pub id: u32,
    pub gpu: u32,
    pub memory_bytes: u64,
    pub compute_permille: u32,
    pub copy_permille: u32,
    pub priority: i32,
    pub oversubscribe: bool,
    pub share_group: Option<String>,
    pub queues: u16,
    pub storage: Vec<SavedStorage>,
    /// Created inline with VM `vm` (it goes with that VM's record).
    pub owned_by_vm: bool,
    /// The VM that used it.
    pub vm: Option<u32>,
    pub state: SavedVgpuState,
    /// Its running worker (the next vgpud reconnects to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<SavedProc>,
    /// Its name (from version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its labels (from version 2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its own kernel deadline, ms (absent: the daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_deadline_ms: Option<u32>,
    /// Who its frontend is (absent: a VM).
    #[serde(default, skip_serializing_if = "is_vm")]
    pub attach: Attach,
    /// A process vGPU's socket owner uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<u32>,
    /// A process vGPU's socket owner gid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_gid: Option<u32>,
}

fn is_vm(a: &Attach) -> bool {
    *a == Attach::Vm
}

/// Where a saved VM was in its life.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SavedVmState {
    /// It was running (or starting) when the state was saved: it ended with that vgpud.
    Live,
    /// The vmm exited with `code`.
    Exited { code: i32 },
    /// It failed.
    Failed { reason: String },
}

/// One VM record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedVm {
    pub id: u32,
    /// The payload ELF's absolute path.
    pub payload: String,
    pub payload_arg: String,
    pub memory_bytes: u64,
    pub vcpus: u8,
    pub vgpu: Option<u32>,
    pub state: SavedVmState,
    /// Launch time, ms since the Unix epoch.
    pub launched_unix_ms: u64,
    /// How long it ran: known for a VM that had ended, or that a graceful stop of vgpud
    /// ended; None for one that was running when vgpud was killed.
    pub uptime_ms: Option<u64>,
    /// Its running vmm (the next vgpud supervises it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmm: Option<SavedProc>,
    /// Its name (from version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its labels (from version 2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// The state file in `state_dir`.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

fn temp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".tmp");
    PathBuf::from(p)
}

/// Reads the state file: `Ok(None)` when there is none (a fresh start).
pub fn load(path: &Path) -> Result<Option<StateFile>, StateError> {
    // A temporary file is what a crash in the middle of a save leaves; the state file
    // itself is still whole (it is replaced by rename only).
    let tmp = temp_path(path);
    if tmp.exists() {
        tracing::debug!(path = %tmp.display(), "removing an unfinished state save");
        let _ = std::fs::remove_file(&tmp);
    }
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Read {
                path: path.to_owned(),
                source,
            })
        }
    };
    parse(path, &bytes).map(Some)
}

/// Parses the file's bytes: the version first, so a newer format is reported as such
/// and not as damage.
fn parse(path: &Path, bytes: &[u8]) -> Result<StateFile, StateError> {
    #[derive(Deserialize)]
    struct Probe {
        version: u64,
    }
    let corrupt = |source| StateError::Corrupt {
        path: path.to_owned(),
        source,
    };
    let probe: Probe = serde_json::from_slice(bytes).map_err(corrupt)?;
    if !(u64::from(OLDEST_VERSION)..=u64::from(VERSION)).contains(&probe.version) {
        return Err(StateError::Version {
            path: path.to_owned(),
            found: probe.version,
            supported: VERSION,
        });
    }
    serde_json::from_slice(bytes).map_err(corrupt)
}

/// Writes `state` to `path` atomically: a temporary file beside it, fsync, rename over
/// the old one, fsync of the directory. A crash at any point leaves the old file or the
/// new one, whole.
pub fn save(path: &Path, state: &StateFile) -> Result<(), StateError> {
    let err = |source| StateError::Write {
        path: path.to_owned(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(state)
        .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    text.push(b'\n');
    let tmp = temp_path(path);
    let written = (|| {
        // Created afresh, never through a link someone left at the temporary name.
        let mut f = super::private::create_file(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    // The rename is durable once the directory is.
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)
}

/// Sets an unreadable state file aside (`--discard-state`) as
/// `<file>.discarded-<unix seconds>`, so nothing is lost for good; returns the new name.
pub fn discard(path: &Path) -> Result<PathBuf, StateError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut to = path.as_os_str().to_owned();
    to.push(format!(".discarded-{secs}"));
    let to = PathBuf::from(to);
    std::fs::rename(path, &to).map_err(|source| StateError::Discard {
        path: path.to_owned(),
        to: to.clone(),
        source,
    })?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vgpud-statefile-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    fn sample() -> StateFile {
        StateFile {
            version: VERSION,
            next_vgpu: 7,
            next_vm: 3,
            next_migration: 2,
            vgpus: vec![
                SavedVgpu {
                    id: 2,
                    gpu: 1,
                    memory_bytes: 1 << 30,
                    compute_permille: 300,
                    copy_permille: 250,
                    priority: -2,
                    oversubscribe: true,
                    share_group: Some("team-a".into()),
                    queues: 4,
                    storage: vec![SavedStorage {
                        namespace: 1,
                        path: "/data/x.bin".into(),
                        read_only: true,
                    }],
                    owned_by_vm: false,
                    vm: None,
                    state: SavedVgpuState::Live,
                    worker: Some(SavedProc {
                        pid: 4242,
                        start_time: 987_654,
                    }),
                    name: Some("train-a".into()),
                    labels: BTreeMap::from([("team".into(), "vision".into())]),
                    kernel_deadline_ms: None,
                    attach: Attach::Process,
                    owner_uid: Some(1000),
                    owner_gid: None,
                },
                SavedVgpu {
                    id: 5,
                    gpu: 0,
                    memory_bytes: 64 << 20,
                    compute_permille: 100,
                    copy_permille: 100,
                    priority: 0,
                    oversubscribe: false,
                    share_group: None,
                    queues: 1,
                    storage: Vec::new(),
                    owned_by_vm: true,
                    vm: Some(2),
                    state: SavedVgpuState::Failed {
                        reason: "the worker exited unexpectedly".into(),
                    },
                    worker: None,
                    name: None,
                    labels: BTreeMap::new(),
                    kernel_deadline_ms: None,
                    attach: Attach::Vm,
                    owner_uid: None,
                    owner_gid: None,
                },
            ],
            vms: vec![
                SavedVm {
                    id: 1,
                    payload: "/p/hello".into(),
                    payload_arg: "exit=3".into(),
                    memory_bytes: 256 << 20,
                    vcpus: 2,
                    vgpu: None,
                    state: SavedVmState::Exited { code: 3 },
                    launched_unix_ms: 1_700_000_000_000,
                    uptime_ms: Some(42),
                    vmm: None,
                    name: Some("web-1".into()),
                    labels: BTreeMap::from([("env".into(), "prod".into())]),
                },
                SavedVm {
                    id: 2,
                    payload: "/p/gpu-load".into(),
                    payload_arg: String::new(),
                    memory_bytes: 64 << 20,
                    vcpus: 1,
                    vgpu: Some(5),
                    state: SavedVmState::Live,
                    launched_unix_ms: 1_700_000_001_000,
                    uptime_ms: None,
                    vmm: Some(SavedProc {
                        pid: 4243,
                        start_time: 987_655,
                    }),
                    name: None,
                    labels: BTreeMap::new(),
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let d = dir("round-trip");
        let p = path_in(&d);
        save(&p, &sample()).expect("save");
        assert_eq!(load(&p).expect("load"), Some(sample()));
        // Saving again replaces it whole.
        save(&p, &StateFile::empty()).expect("save");
        assert_eq!(load(&p).expect("load"), Some(StateFile::empty()));
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn a_version_1_file_loads() {
        let d = dir("v1");
        let p = path_in(&d);
        // Version 1 is version 2 without names and labels.
        let mut v1 = serde_json::to_value(sample()).expect("encode");
        v1["version"] = 1.into();
        let vms = v1["vms"].as_array_mut().cloned().unwrap_or_default();
        let mut old_vms = vms;
        for v in &mut old_vms {
            if let Some(o) = v.as_object_mut() {
                o.remove("name");
                o.remove("labels");
            }
        }
        v1["vms"] = old_vms.into();
        for v in v1["vgpus"].as_array_mut().into_iter().flatten() {
            if let Some(o) = v.as_object_mut() {
                o.remove("name");
                o.remove("labels");
            }
        }
        std::fs::write(&p, serde_json::to_vec(&v1).expect("encode")).expect("write");
        let back = load(&p).expect("load").expect("a state");
        assert_eq!(back.vgpus.len(), 2);
        assert_eq!(
            (back.vgpus[0].name.as_deref(), back.vgpus[0].labels.len()),
            (None, 0)
        );
        assert_eq!(back.next_vgpu, sample().next_vgpu);
        assert_eq!((back.vms[0].name.as_deref(), back.vms.len()), (None, 2));
    }

    #[test]
    fn a_file_without_process_records_still_loads() {
        let d = dir("no-procs");
        let p = path_in(&d);
        let mut old = sample();
        for v in &mut old.vgpus {
            v.worker = None;
        }
        for v in &mut old.vms {
            v.vmm = None;
        }
        let text = serde_json::to_string(&old).expect("encode");
        assert!(
            !text.contains("\"worker\"") && !text.contains("\"vmm\""),
            "{text}"
        );
        std::fs::write(&p, text).expect("write");
        assert_eq!(load(&p).expect("load"), Some(old));
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn missing_file_is_a_fresh_start() {
        let d = dir("missing");
        assert_eq!(load(&path_in(&d)).expect("load"), None);
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn write_is_atomic_and_leaves_no_temporary_file() {
        let d = dir("atomic");
        let p = path_in(&d);
        save(&p, &sample()).expect("save");
        let names: Vec<String> = std::fs::read_dir(&d)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [FILE_NAME], "only the state file");
        // A save that fails half-way (here: its temporary file cannot be created) leaves
        // the previous state whole.
        std::fs::create_dir(temp_path(&p)).expect("block the temporary file");
        let e = save(&p, &StateFile::empty()).expect_err("cannot write");
        assert!(matches!(e, StateError::Write { .. }), "{e}");
        assert!(e.to_string().contains(FILE_NAME), "{e}");
        assert_eq!(load(&p).expect("load"), Some(sample()));
        // A crash between write and rename leaves a temporary file: the next load ignores
        // and removes it.
        let _ = std::fs::remove_dir(temp_path(&p));
        std::fs::write(temp_path(&p), b"{\"version\": 1, \"trunc").expect("tmp");
        assert_eq!(load(&p).expect("load"), Some(sample()));
        assert!(!temp_path(&p).exists());
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn corrupt_file_is_refused_with_what_to_do() {
        let d = dir("corrupt");
        let p = path_in(&d);
        for bad in [
            &b""[..],
            b"{\"version\": 1, \"next_vgpu\": 3",
            b"not json",
            b"{\"next_vgpu\": 3}",
            b"{\"version\": 1, \"next_vgpu\": 1, \"next_vm\": 1, \"next_migration\": 1, \"vgpus\": [], \"vms\": [], \"extra\": 1}",
            b"{\"version\": 1, \"next_vgpu\": 1, \"next_vm\": 1, \"next_migration\": 1, \"vgpus\": [{\"id\": 1}], \"vms\": []}",
        ] {
            std::fs::write(&p, bad).expect("write");
            let e = load(&p).expect_err("corrupt");
            assert!(matches!(e, StateError::Corrupt { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains(&p.display().to_string())
                    && msg.contains("move it aside")
                    && msg.contains("--discard-state"),
                "{msg}"
            );
        }
        let to = discard(&p).expect("discard");
        assert!(!p.exists() && to.exists(), "set aside as {}", to.display());
        assert_eq!(load(&p).expect("load"), None);
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn unknown_version_is_refused() {
        let d = dir("version");
        let p = path_in(&d);
        std::fs::write(&p, b"{\"version\": 3, \"whatever\": [1, 2]}").expect("write");
        let e = load(&p).expect_err("newer format");
        match &e {
            StateError::Version {
                found, supported, ..
            } => assert_eq!((*found, *supported), (3, VERSION)),
            other => panic!("expected a version error, got {other}"),
        }
        assert!(e.to_string().contains("--discard-state"), "{e}");
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn unreadable_file_is_a_read_error() {
        let d = dir("unreadable");
        let p = path_in(&d);
        // A directory where the file should be cannot be read as one.
        std::fs::create_dir(&p).expect("dir");
        let e = load(&p).expect_err("unreadable");
        assert!(matches!(e, StateError::Read { .. }), "{e}");
        std::fs::remove_dir_all(&d).expect("rm");
    }
}
