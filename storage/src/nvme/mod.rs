//! NVMe wire formats: the 64-byte submission entry, the 16-byte completion entry, the
//! controller registers and the identify data we read. Layouts follow NVMe Base 1.4.

pub mod cqe;
pub mod identify;
pub mod regs;
pub mod sqe;
pub mod status;

pub use cqe::Cqe;
pub use sqe::Sqe;
pub use status::NvmeStatus;

/// Memory page size the controller is programmed with (CC.MPS = 0).
pub const PAGE_SIZE: usize = 4096;
