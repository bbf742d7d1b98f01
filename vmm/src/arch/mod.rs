//! x86-64 setup for a payload guest entered directly in 64-bit long mode.

pub mod assist;
pub mod cpuid;
pub mod gdt;
pub mod paging;
pub mod regs;
