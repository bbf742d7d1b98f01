//! The agent's configuration file: the vGPU profiles it offers, who owns the sockets it
//! hands out, and where a container finds them (docs/kubernetes.md, "Profiles").

use std::path::{Path, PathBuf};

use serde::Deserialize;
use vgpu_api::units::{fraction_to_permille, parse_share_fraction, parse_size};

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the configuration {path} is not valid: {why}")]
    Parse { path: PathBuf, why: String },
    #[error("profile {profile:?}: {why}")]
    Profile { profile: String, why: String },
    #[error("{0}")]
    Invalid(String),
}

/// The file as written (JSON).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default = "default_domain")]
    domain: String,
    profiles: Vec<ProfileFile>,
    #[serde(default)]
    socket_uid: u32,
    #[serde(default)]
    socket_gid: u32,
    #[serde(default = "default_container_socket_dir")]
    container_socket_dir: String,
    #[serde(default = "default_container_library_dir")]
    container_library_dir: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    memory: String,
    compute: serde_json::Value,
    #[serde(default)]
    copy: Option<serde_json::Value>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    gpus: Option<Vec<u32>>,
}

fn default_domain() -> String {
    "vgpu.dev".into()
}
fn default_container_socket_dir() -> String {
    "/var/run/vgpu".into()
}
fn default_container_library_dir() -> String {
    "/usr/local/vgpu/lib".into()
}

/// One vGPU size the agent offers: a slice of one GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Its name, the extended resource's name after the domain (`h200-20g-25`).
    pub name: String,
    /// Device memory of one slice.
    pub memory_bytes: u64,
    /// Compute share of one slice, per mille.
    pub compute_permille: u32,
    /// Copy share of one slice, per mille.
    pub copy_permille: u32,
    /// The vGPUs' scheduling priority.
    pub priority: i32,
    /// The GPUs it is offered on (None: all).
    pub gpus: Option<Vec<u32>>,
}

impl Profile {
    /// Whether it is offered on GPU `gpu`.
    pub fn on_gpu(&self, gpu: u32) -> bool {
        self.gpus.as_ref().is_none_or(|g| g.contains(&gpu))
    }
}

/// The checked configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The resource domain and DRA driver name (`vgpu.dev`).
    pub domain: String,
    pub profiles: Vec<Profile>,
    /// Owner of the vGPU sockets handed to containers (a non-root pod adds the gid to its
    /// `supplementalGroups`).
    pub socket_uid: u32,
    pub socket_gid: u32,
    /// Where a container sees the vGPU's socket directory and the CUDA library.
    pub container_socket_dir: String,
    pub container_library_dir: String,
}

/// A share given as a number (0.25) or a string ("25%").
fn share(v: &serde_json::Value) -> Result<u32, String> {
    let f = match v {
        serde_json::Value::Number(n) => {
            let f = n.as_f64().unwrap_or(-1.0);
            if !(0.0..=1.0).contains(&f) {
                return Err(format!("{f} is outside 0..1 of the GPU"));
            }
            f
        }
        serde_json::Value::String(s) => parse_share_fraction(s)?,
        other => return Err(format!("{other} is not a share: write 0.25 or \"25%\"")),
    };
    Ok(fraction_to_permille(f))
}

/// A DNS label: what a profile name must be to sit in a resource name and device names.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl Config {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Invalid(why) => ConfigError::Parse {
                path: path.to_owned(),
                why,
            },
            other => other,
        })
    }

    /// Parses and checks a configuration's JSON text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let f: ConfigFile =
            serde_json::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let domain_ok =
            f.domain.contains('.') && f.domain.split('.').all(dns_label) && f.domain.len() <= 253;
        if !domain_ok {
            return Err(ConfigError::Invalid(format!(
                "domain {:?} is not a DNS domain (e.g. vgpu.dev)",
                f.domain
            )));
        }
        if f.profiles.is_empty() {
            return Err(ConfigError::Invalid(
                "no profiles: give at least one {\"name\", \"memory\", \"compute\"}".into(),
            ));
        }
        for (what, dir) in [
            ("container_socket_dir", &f.container_socket_dir),
            ("container_library_dir", &f.container_library_dir),
        ] {
            if !dir.starts_with('/') || dir.contains("..") {
                return Err(ConfigError::Invalid(format!(
                    "{what} {dir:?} must be an absolute path without .."
                )));
            }
        }
        let mut profiles: Vec<Profile> = Vec::new();
        for p in &f.profiles {
            let bad = |why: String| ConfigError::Profile {
                profile: p.name.clone(),
                why,
            };
            if !dns_label(&p.name) {
                return Err(bad(
                    "a name is 1 to 63 characters of a-z 0-9 -, starting and ending with a letter or digit".into(),
                ));
            }
            if profiles.iter().any(|q| q.name == p.name) {
                return Err(bad("given twice".into()));
            }
            let memory_bytes = parse_size(&p.memory).map_err(|e| bad(format!("memory: {e}")))?;
            if memory_bytes == 0 {
                return Err(bad("memory must be more than 0".into()));
            }
            let compute_permille = share(&p.compute).map_err(|e| bad(format!("compute: {e}")))?;
            let copy_permille = match &p.copy {
                Some(c) => share(c).map_err(|e| bad(format!("copy: {e}")))?,
                None => compute_permille,
            };
            profiles.push(Profile {
                name: p.name.clone(),
                memory_bytes,
                compute_permille,
                copy_permille,
                priority: p.priority,
                gpus: p.gpus.clone(),
            });
        }
        Ok(Config {
            domain: f.domain,
            profiles,
            socket_uid: f.socket_uid,
            socket_gid: f.socket_gid,
            container_socket_dir: f.container_socket_dir,
            container_library_dir: f.container_library_dir,
        })
    }

    /// The extended resource name of `profile` (`vgpu.dev/h200-20g-25`).
    pub fn resource_name(&self, profile: &Profile) -> String {
        format!("{}/{}", self.domain, profile.name)
    }

    /// The profile whose resource name is `resource`.
    pub fn profile_of_resource(&self, resource: &str) -> Option<&Profile> {
        let name = resource.strip_prefix(&self.domain)?.strip_prefix('/')?;
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The profile called `name`.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_with_their_defaults_and_bad_ones_name_the_fault() {
        let c = Config::parse(
            r#"{"profiles": [{"name": "h200-20g-25", "memory": "20G", "compute": 0.25},
                {"name": "half", "memory": "64G", "compute": "50%", "copy": 0.3, "gpus": [1]}]}"#,
        )
        .expect("config");
        assert_eq!(c.domain, "vgpu.dev");
        assert_eq!(c.resource_name(&c.profiles[0]), "vgpu.dev/h200-20g-25");
        assert_eq!(
            (
                c.profiles[0].memory_bytes,
                c.profiles[0].compute_permille,
                c.profiles[0].copy_permille
            ),
            (20 << 30, 250, 250)
        );
        assert_eq!(
            (c.profiles[1].compute_permille, c.profiles[1].copy_permille),
            (500, 300)
        );
        assert!(c.profiles[1].on_gpu(1) && !c.profiles[1].on_gpu(0));
        assert_eq!(
            c.profile_of_resource("vgpu.dev/half")
                .map(|p| p.memory_bytes),
            Some(64 << 30)
        );
        assert!(c.profile_of_resource("other.dev/half").is_none());
        for (text, needle) in [
            (r#"{"profiles": []}"#, "no profiles"),
            (
                r#"{"profiles": [{"name": "A", "memory": "1G", "compute": 0.1}]}"#,
                "a-z",
            ),
            (
                r#"{"profiles": [{"name": "a", "memory": "1X", "compute": 0.1}]}"#,
                "memory",
            ),
            (
                r#"{"profiles": [{"name": "a", "memory": "1G", "compute": 1.5}]}"#,
                "compute",
            ),
            (
                r#"{"profiles": [{"name": "a", "memory": "1G", "compute": 0.1, "colour": 1}]}"#,
                "colour",
            ),
            (
                r#"{"domain": "nodots", "profiles": [{"name": "a", "memory": "1G", "compute": 0.1}]}"#,
                "domain",
            ),
            (
                r#"{"profiles": [{"name": "a", "memory": "1G", "compute": 0.1}, {"name": "a", "memory": "1G", "compute": 0.1}]}"#,
                "twice",
            ),
        ] {
            let e = Config::parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
