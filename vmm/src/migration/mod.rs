//! Whole-VM live migration between hosts (docs/migration.md, "Whole-VM migration between
//! hosts"): the source pre-copies guest RAM with KVM's dirty log while the VM runs, pauses
//! it, sends the rest with every vCPU's and device's state, and hands over; the destination
//! (`vmm --migrate-from ADDR`) checks and restores everything, then runs the VM. Until the
//! destination confirms, any failure resumes the VM on the source.

pub mod channel;
pub mod dest;
pub mod dirty_log;
pub mod pod;
pub mod ram;
pub mod snapshot;
pub mod source;
pub mod vcpu_state;
pub mod wire;

pub use channel::{Address, Listener, Stream};
pub use source::{MigrateRequest, MigrationStatus, Phase};

/// Why a migration failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    #[error("cannot reach the destination {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot listen for the incoming VM on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    State(#[from] vcpu_state::StateError),
    #[error(transparent)]
    Pause(#[from] crate::vcpu_control::PauseError),
    #[error("KVM refused to {0}: {1}")]
    Kvm(&'static str, kvm_ioctls::Error),
    #[error("a device cannot be migrated: {0}")]
    Device(String),
    #[error("the incoming VM is unusable here: {0}")]
    Incompatible(String),
    #[error("a migration is already running")]
    Busy,
}
