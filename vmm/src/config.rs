//! What a VM is made of, from the command line (or, later, from vgpud).

use std::path::PathBuf;

use crate::boot::linux::LinuxConfig;
use crate::cpuid_profile::CpuProfile;

/// One vGPU device: the vhost-user socket its vgpu-worker serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VgpuSpec {
    pub socket: PathBuf,
}

/// Why a `--vgpu` value could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("--vgpu needs socket=PATH, got {0:?}")]
    MissingSocket(String),
    #[error("--vgpu has an unknown key {0:?}; the only key is socket=PATH")]
    UnknownKey(String),
}

impl std::str::FromStr for VgpuSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let mut socket = None;
        for part in s.split(',').filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("socket", v)) if !v.is_empty() => socket = Some(PathBuf::from(v)),
                Some(("socket", _)) => return Err(SpecError::MissingSocket(s.into())),
                _ => return Err(SpecError::UnknownKey(part.into())),
            }
        }
        socket
            .map(|socket| VgpuSpec { socket })
            .ok_or_else(|| SpecError::MissingSocket(s.into()))
    }
}

/// Why a size could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a size: use a number with an optional K, M or G suffix, e.g. 256M")]
pub struct SizeError(pub String);

/// Parses `256M`, `1G`, `4096`, `64K` (binary units).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 10),
        Some((i, 'm' | 'M')) => (&t[..i], 20),
        Some((i, 'g' | 'G')) => (&t[..i], 30),
        Some((i, 't' | 'T')) => (&t[..i], 40),
        _ => (t, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| SizeError(s.into()))
}

/// What the VM boots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guest {
    /// A no_std payload ELF and its argument string (docs/payload-abi.md).
    Payload { path: PathBuf, arg: String },
    /// A Linux kernel with an optional initrd and a command line (docs/linux-guests.md).
    Linux(LinuxConfig),
}

/// A VM to run.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub guest: Guest,
    pub memory: u64,
    pub vcpus: u8,
    pub vgpus: Vec<VgpuSpec>,
    /// Which CPUID features the guest sees.
    pub cpu_profile: CpuProfile,
    /// Where the control API (pause, resume, migrate, status) listens, if anywhere.
    pub api_socket: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "M", "12Q", "-1M", "99999999999999999999G", "1.5G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn vgpu_specs() {
        assert_eq!(
            "socket=/tmp/a.sock".parse(),
            Ok(VgpuSpec {
                socket: "/tmp/a.sock".into()
            })
        );
        assert!(matches!(
            "".parse::<VgpuSpec>(),
            Err(SpecError::MissingSocket(_))
        ));
        assert!(matches!(
            "socket=".parse::<VgpuSpec>(),
            Err(SpecError::MissingSocket(_))
        ));
        assert!(matches!(
            "sock=/x".parse::<VgpuSpec>(),
            Err(SpecError::UnknownKey(_))
        ));
    }
}
