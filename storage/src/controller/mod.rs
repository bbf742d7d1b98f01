//! Controllers: the emulated NVMe controller (a file or block device behind io_uring), a
//! real controller through VFIO, and the register programming both share.

pub mod driver;
pub mod emulated;
pub mod vfio;

pub use driver::{Driver, DriverOptions};
pub use emulated::{EmulatedController, EmulatedOptions, EngineKind, PollGuard};
