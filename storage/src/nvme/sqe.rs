//! The 64-byte submission queue entry and builders for the commands we issue.

/// Admin command set opcodes.
pub mod admin {
    pub const DELETE_IO_SQ: u8 = 0x00;
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const DELETE_IO_CQ: u8 = 0x04;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const SET_FEATURES: u8 = 0x09;
}

/// NVM command set opcodes.
pub mod nvm {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
}

/// Identify CNS values.
pub const CNS_NAMESPACE: u32 = 0x00;
pub const CNS_CONTROLLER: u32 = 0x01;
/// Set Features feature id: Number of Queues.
pub const FID_NUMBER_OF_QUEUES: u32 = 0x07;

/// One submission queue entry, exactly as the controller fetches it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sqe {
    /// Opcode (bits 0-7), fused (8-9), PSDT (14-15), command identifier (16-31).
    pub cdw0: u32,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub mptr: u64,
    pub prp1: u64,
    pub prp2: u64,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

const _: () = assert!(std::mem::size_of::<Sqe>() == 64);

impl Sqe {
    fn with_opcode(opcode: u8) -> Self {
        Sqe {
            cdw0: opcode as u32,
            ..Default::default()
        }
    }

    pub fn opcode(&self) -> u8 {
        (self.cdw0 & 0xff) as u8
    }

    pub fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }

    /// The queue assigns the command identifier at enqueue time (it is the SQ slot).
    pub fn set_cid(&mut self, cid: u16) {
        self.cdw0 = (self.cdw0 & 0xffff) | ((cid as u32) << 16);
    }

    /// Read or write `nlb` logical blocks (1-based count) at `slba`.
    pub fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u16, prp1: u64, prp2: u64) -> Self {
        let mut s = Self::with_opcode(opcode);
        s.nsid = nsid;
        s.prp1 = prp1;
        s.prp2 = prp2;
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        s.cdw12 = nlb.saturating_sub(1) as u32;
        s
    }

    pub fn read(nsid: u32, slba: u64, nlb: u16, prp1: u64, prp2: u64) -> Self {
        Self::rw(nvm::READ, nsid, slba, nlb, prp1, prp2)
    }

    pub fn write(nsid: u32, slba: u64, nlb: u16, prp1: u64, prp2: u64) -> Self {
        Self::rw(nvm::WRITE, nsid, slba, nlb, prp1, prp2)
    }

    pub fn flush(nsid: u32) -> Self {
        let mut s = Self::with_opcode(nvm::FLUSH);
        s.nsid = nsid;
        s
    }

    /// Starting LBA of a read/write.
    pub fn slba(&self) -> u64 {
        self.cdw10 as u64 | ((self.cdw11 as u64) << 32)
    }

    /// Number of logical blocks of a read/write, 1-based.
    pub fn nlb(&self) -> u32 {
        (self.cdw12 & 0xffff) + 1
    }

    pub fn identify(cns: u32, nsid: u32, prp1: u64) -> Self {
        let mut s = Self::with_opcode(admin::IDENTIFY);
        s.nsid = nsid;
        s.prp1 = prp1;
        s.cdw10 = cns;
        s
    }

    /// Create an I/O completion queue, physically contiguous, interrupts off (we poll).
    pub fn create_io_cq(qid: u16, entries: u32, base: u64) -> Self {
        let mut s = Self::with_opcode(admin::CREATE_IO_CQ);
        s.prp1 = base;
        s.cdw10 = ((entries.saturating_sub(1) & 0xffff) << 16) | qid as u32;
        s.cdw11 = 1; // PC=1, IEN=0
        s
    }

    /// Create an I/O submission queue bound to completion queue `cqid`.
    pub fn create_io_sq(qid: u16, entries: u32, base: u64, cqid: u16) -> Self {
        let mut s = Self::with_opcode(admin::CREATE_IO_SQ);
        s.prp1 = base;
        s.cdw10 = ((entries.saturating_sub(1) & 0xffff) << 16) | qid as u32;
        s.cdw11 = ((cqid as u32) << 16) | 1; // PC=1, priority urgent(0)
        s
    }

    pub fn delete_io_sq(qid: u16) -> Self {
        let mut s = Self::with_opcode(admin::DELETE_IO_SQ);
        s.cdw10 = qid as u32;
        s
    }

    pub fn delete_io_cq(qid: u16) -> Self {
        let mut s = Self::with_opcode(admin::DELETE_IO_CQ);
        s.cdw10 = qid as u32;
        s
    }

    /// Ask for `nsq` submission and `ncq` completion queues (1-based counts).
    pub fn set_number_of_queues(nsq: u16, ncq: u16) -> Self {
        let mut s = Self::with_opcode(admin::SET_FEATURES);
        s.cdw10 = FID_NUMBER_OF_QUEUES;
        s.cdw11 = (nsq.saturating_sub(1) as u32) | ((ncq.saturating_sub(1) as u32) << 16);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_command_fields_land_where_the_spec_says() {
        let mut s = Sqe::read(1, 0x1_0000_0002, 8, 0x1000, 0);
        s.set_cid(0xbeef);
        assert_eq!(s.opcode(), nvm::READ);
        assert_eq!(s.cid(), 0xbeef);
        assert_eq!(s.slba(), 0x1_0000_0002);
        assert_eq!(s.nlb(), 8);
        assert_eq!(s.cdw12, 7);
    }
}
