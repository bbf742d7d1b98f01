//! CDI specs (the Container Device Interface, spec version 0.6.0; schema vendored in
//! schema/cdi/ from cncf-tags/container-device-interface v1.1.0): one spec file per vGPU
//! naming one device whose container edits bind-mount the vGPU's socket directory and the
//! CUDA library and set `VGPU_SOCKET` and `LD_LIBRARY_PATH`. Written atomically (a
//! temporary file in the same directory, fsync, rename) and removed with the vGPU.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The spec version written (mounts and env need no later one).
pub const CDI_VERSION: &str = "0.6.0";

/// A CDI spec file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    /// `vendor/class`: `vgpu.dev/vgpu`.
    pub kind: String,
    pub devices: Vec<Device>,
}

/// One CDI device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

/// What the runtime does to the container for a device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A bind mount.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// What a container receives for one vGPU: the same whether the runtime reads the CDI spec
/// or the device plugin's mounts and envs.
#[derive(Clone, Debug, PartialEq)]
pub struct Edits {
    /// (host path, container path, read-only)
    pub mounts: Vec<(String, String, bool)>,
    /// (name, value)
    pub env: Vec<(String, String)>,
}

impl Edits {
    /// The edits for a vGPU whose socket is `socket` (in its own attach directory), with
    /// the CUDA library in `library_dir` on the host.
    pub fn for_vgpu(
        socket: &Path,
        library_dir: &Path,
        container_socket_dir: &str,
        container_library_dir: &str,
    ) -> Option<Edits> {
        let dir = socket.parent()?;
        let file = socket.file_name()?.to_str()?;
        Some(Edits {
            mounts: vec![
                (
                    dir.to_str()?.to_owned(),
                    container_socket_dir.to_owned(),
                    false,
                ),
                (
                    library_dir.to_str()?.to_owned(),
                    container_library_dir.to_owned(),
                    true,
                ),
            ],
            env: vec![
                (
                    "VGPU_SOCKET".into(),
                    format!("{}/{file}", container_socket_dir.trim_end_matches('/')),
                ),
                ("LD_LIBRARY_PATH".into(), container_library_dir.to_owned()),
            ],
        })
    }

    /// As CDI container edits.
    pub fn to_cdi(&self) -> ContainerEdits {
        ContainerEdits {
            env: self.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            mounts: self
                .mounts
                .iter()
                .map(|(host, ctr, ro)| Mount {
                    host_path: host.clone(),
                    container_path: ctr.clone(),
                    kind: Some("bind".into()),
                    options: if *ro {
                        vec!["rbind".into(), "ro".into(), "nosuid".into(), "nodev".into()]
                    } else {
                        vec!["rbind".into(), "nosuid".into(), "nodev".into()]
                    },
                })
                .collect(),
        }
    }
}

/// Why a spec could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(
        "cannot write the CDI spec {path}: {source} (is the CDI directory writable by the agent?)"
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove the CDI spec {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The spec files of one agent in one directory.
#[derive(Clone, Debug)]
pub struct SpecDir {
    pub dir: PathBuf,
    /// `vgpu.dev/vgpu`
    pub kind: String,
}

impl SpecDir {
    pub fn new(dir: PathBuf, domain: &str) -> Self {
        Self {
            dir,
            kind: format!("{domain}/vgpu"),
        }
    }

    /// The CDI device name of vGPU `id`.
    pub fn device_name(id: u32) -> String {
        format!("vgpu-{id}")
    }

    /// The fully qualified CDI device ID of vGPU `id` (`vgpu.dev/vgpu=vgpu-3`).
    pub fn qualified(&self, id: u32) -> String {
        format!("{}={}", self.kind, Self::device_name(id))
    }

    /// The spec file of vGPU `id`.
    pub fn path(&self, id: u32) -> PathBuf {
        let vendor = self.kind.split('/').next().unwrap_or("vgpu");
        self.dir.join(format!("{vendor}-vgpu-{id}.json"))
    }

    /// The vGPU id of one of this agent's spec files, by its name.
    pub fn id_of_file(&self, name: &str) -> Option<u32> {
        let vendor = self.kind.split('/').next().unwrap_or("vgpu");
        let id: u32 = name
            .strip_prefix(vendor)?
            .strip_prefix("-vgpu-")?
            .strip_suffix(".json")?
            .parse()
            .ok()?;
        (self.path(id).file_name()?.to_str()? == name).then_some(id)
    }

    /// The spec of vGPU `id`.
    pub fn spec(&self, id: u32, edits: &Edits) -> Spec {
        Spec {
            cdi_version: CDI_VERSION.into(),
            kind: self.kind.clone(),
            devices: vec![Device {
                name: Self::device_name(id),
                container_edits: edits.to_cdi(),
            }],
        }
    }

    /// Writes vGPU `id`'s spec atomically; returns its path.
    pub fn write(&self, id: u32, edits: &Edits) -> Result<PathBuf, CdiError> {
        let path = self.path(id);
        let err = |source| CdiError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        let text = serde_json::to_vec_pretty(&self.spec(id, edits))
            .map_err(|e| err(std::io::Error::other(e)))?;
        write_atomic(&path, &text).map_err(err)?;
        Ok(path)
    }

    /// Removes vGPU `id`'s spec (gone already is fine).
    pub fn remove(&self, id: u32) -> Result<(), CdiError> {
        let path = self.path(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CdiError::Remove { path, source }),
        }
    }
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so a reader
/// sees the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
