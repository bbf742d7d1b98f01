//! Controller register offsets and fields in BAR0 (NVMe Base 1.4 §3.1).

pub const CAP: u64 = 0x00;
pub const VS: u64 = 0x08;
pub const INTMS: u64 = 0x0c;
pub const CC: u64 = 0x14;
pub const CSTS: u64 = 0x1c;
pub const AQA: u64 = 0x24;
pub const ASQ: u64 = 0x28;
pub const ACQ: u64 = 0x30;
/// First doorbell; doorbell `2*qid + is_cq` sits at `DOORBELL_BASE + n * (4 << CAP.DSTRD)`.
pub const DOORBELL_BASE: u64 = 0x1000;

pub const CC_EN: u32 = 1;
pub const CC_SHN_NORMAL: u32 = 1 << 14;
pub const CC_SHN_MASK: u32 = 3 << 14;
pub const CSTS_RDY: u32 = 1;
pub const CSTS_CFS: u32 = 1 << 1;
pub const CSTS_SHST_MASK: u32 = 3 << 2;
pub const CSTS_SHST_DONE: u32 = 2 << 2;

/// CC value we program: NVM command set, 4 KiB pages, round robin, 64-byte SQEs, 16-byte CQEs.
pub const CC_CONFIG: u32 = (6 << 16) | (4 << 20);

pub fn cc_iosqes(cc: u32) -> u32 {
    (cc >> 16) & 0xf
}
pub fn cc_iocqes(cc: u32) -> u32 {
    (cc >> 20) & 0xf
}
pub fn cc_mps(cc: u32) -> u32 {
    (cc >> 7) & 0xf
}

/// Maximum queue entries supported (1-based).
pub fn cap_mqes(cap: u64) -> u32 {
    (cap & 0xffff) as u32 + 1
}
/// Worst-case time to become ready, in milliseconds.
pub fn cap_timeout_ms(cap: u64) -> u64 {
    ((cap >> 24) & 0xff) * 500
}
pub fn cap_dstrd(cap: u64) -> u32 {
    ((cap >> 32) & 0xf) as u32
}

/// Offset of a queue's doorbell register.
pub fn doorbell_offset(qid: u16, is_cq: bool, dstrd: u32) -> u64 {
    DOORBELL_BASE + (2 * qid as u64 + is_cq as u64) * (4u64 << dstrd)
}
