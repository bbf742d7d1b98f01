//! Runtime for the no_std payload guests (docs/payload-abi.md): the `_start` entry point,
//! COM1 console, exit/reset, a bump heap, TSC time, benchmark lines, argument parsing, and a
//! [`guest_driver::Transport`] over identity-mapped MMIO and heap memory.
//!
//! A payload is `#![no_std] #![no_main]`, calls [`entry!`] and returns its exit code from
//! `main`.
#![no_std]

pub mod args;
pub mod bench;
pub mod boot;
pub mod exit;
pub mod heap;
pub mod io;
mod memfuncs;
mod panic;
pub mod serial;
pub mod start;
pub mod time;

pub use args::Args;
pub use boot::{BootInfo, MemRegion, MmioDevice};
pub use exit::{exit, park, reset};
pub use panic::EXIT_PANIC;
