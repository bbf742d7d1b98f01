//! Completion status codes, typed so a kernel thread can match on them.

/// A command's completion status other than success (SCT/SC from the CQE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NvmeStatus {
    /// The controller does not know this opcode; this build issued a command the device does not support.
    #[error("invalid command opcode")]
    InvalidOpcode,
    /// A command field is invalid (queue size, identify CNS, alignment); check the request against the identify data.
    #[error("invalid field in command")]
    InvalidField,
    /// The data could not be moved to or from the buffer; check the buffer is mapped for DMA.
    #[error("data transfer error")]
    DataTransferError,
    /// The controller failed internally; retry, and reset the controller if it repeats.
    #[error("internal controller error")]
    InternalError,
    /// The namespace id is not attached; use namespace 1.
    #[error("invalid namespace or format")]
    InvalidNamespace,
    /// The request reaches past the end of the namespace; keep LBAs below the namespace size.
    #[error("LBA out of range")]
    LbaOutOfRange,
    /// The queue id is unused, reserved or out of range; pick a free queue id below the negotiated count.
    #[error("invalid queue identifier")]
    InvalidQueueIdentifier,
    /// The queue size exceeds CAP.MQES or is below 2; pick a smaller queue depth.
    #[error("invalid queue size")]
    InvalidQueueSize,
    /// The completion queue named by a create-SQ does not exist; create the CQ first.
    #[error("completion queue invalid")]
    CompletionQueueInvalid,
    /// A completion queue still has submission queues bound to it; delete those first.
    #[error("invalid queue deletion")]
    InvalidQueueDeletion,
    /// The medium could not be read (for the emulated controller: the backing file shrank or failed); check the backing file or device.
    #[error("unrecovered read error")]
    UnrecoveredReadError,
    /// The medium could not be written; check the backing file or device (space, permissions).
    #[error("write fault")]
    WriteFault,
    /// The namespace is write protected (the emulated controller: opened read-only); write elsewhere or attach it read-write.
    #[error("namespace is write protected")]
    NamespaceWriteProtected,
    /// Any other status; see the NVMe specification for SCT/SC.
    #[error("NVMe status sct={sct:#x} sc={sc:#x}")]
    Other { sct: u8, sc: u8 },
}

impl NvmeStatus {
    /// Decode the 15-bit status field of a CQE (bits 17-31 of dword 3).
    pub fn from_field(field: u16) -> Self {
        let sc = (field & 0xff) as u8;
        let sct = ((field >> 8) & 0x7) as u8;
        match (sct, sc) {
            (0, 0x01) => Self::InvalidOpcode,
            (0, 0x02) => Self::InvalidField,
            (0, 0x04) => Self::DataTransferError,
            (0, 0x06) => Self::InternalError,
            (0, 0x0b) => Self::InvalidNamespace,
            (0, 0x20) => Self::NamespaceWriteProtected,
            (0, 0x80) => Self::LbaOutOfRange,
            (1, 0x00) => Self::CompletionQueueInvalid,
            (1, 0x01) => Self::InvalidQueueIdentifier,
            (1, 0x02) => Self::InvalidQueueSize,
            (1, 0x0c) => Self::InvalidQueueDeletion,
            (2, 0x80) => Self::WriteFault,
            (2, 0x81) => Self::UnrecoveredReadError,
            (sct, sc) => Self::Other { sct, sc },
        }
    }

    /// The status field the controller writes; DNR is set (retrying the same command fails the same way).
    pub fn to_field(self) -> u16 {
        let (sct, sc): (u16, u16) = match self {
            Self::InvalidOpcode => (0, 0x01),
            Self::InvalidField => (0, 0x02),
            Self::DataTransferError => (0, 0x04),
            Self::InternalError => (0, 0x06),
            Self::InvalidNamespace => (0, 0x0b),
            Self::NamespaceWriteProtected => (0, 0x20),
            Self::LbaOutOfRange => (0, 0x80),
            Self::CompletionQueueInvalid => (1, 0x00),
            Self::InvalidQueueIdentifier => (1, 0x01),
            Self::InvalidQueueSize => (1, 0x02),
            Self::InvalidQueueDeletion => (1, 0x0c),
            Self::WriteFault => (2, 0x80),
            Self::UnrecoveredReadError => (2, 0x81),
            Self::Other { sct, sc } => (sct as u16 & 7, sc as u16),
        };
        sc | (sct << 8) | (1 << 14)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_through_the_cqe_field() {
        for s in [
            NvmeStatus::LbaOutOfRange,
            NvmeStatus::InvalidQueueSize,
            NvmeStatus::UnrecoveredReadError,
            NvmeStatus::NamespaceWriteProtected,
            NvmeStatus::Other { sct: 3, sc: 0x10 },
        ] {
            assert_eq!(NvmeStatus::from_field(s.to_field()), s);
        }
    }
}
