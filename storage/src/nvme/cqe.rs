//! The 16-byte completion queue entry.

use super::status::NvmeStatus;

/// One completion queue entry. Dword 3 holds the command identifier (bits 0-15), the
/// phase tag (bit 16) and the status field (bits 17-31); it is written last by the
/// controller so a poller that sees the new phase sees the whole entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    pub dw0: u32,
    pub dw1: u32,
    pub sq_head: u16,
    pub sq_id: u16,
    pub dw3: u32,
}

const _: () = assert!(std::mem::size_of::<Cqe>() == 16);

impl Cqe {
    pub fn cid(&self) -> u16 {
        self.dw3 as u16
    }

    pub fn phase(&self) -> bool {
        self.dw3 & (1 << 16) != 0
    }

    /// The raw 15-bit status field (SC, SCT, CRD, M, DNR).
    pub fn status_field(&self) -> u16 {
        (self.dw3 >> 17) as u16
    }

    /// `Ok` for a successful command, the typed status otherwise.
    pub fn status(&self) -> Result<(), NvmeStatus> {
        match self.status_field() & 0x7ff {
            0 => Ok(()),
            _ => Err(NvmeStatus::from_field(self.status_field())),
        }
    }

    /// Dword 3 as the controller writes it.
    pub fn make_dw3(cid: u16, phase: bool, status: u16) -> u32 {
        cid as u32 | ((phase as u32) << 16) | ((status as u32) << 17)
    }
}
