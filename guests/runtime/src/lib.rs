//! Runtime for the no_std payload guests (docs/payload-abi.md): the `_start` entry point,
//! COM1 console, exit/reset, a bump heap, TSC time, benchmark lines, argument parsing, and a
//! [`guest_driver::Transport`] over identity-mapped MMIO and heap memory.
//!
//! A payload is `#![no_std] #![no_main]`, calls [`entry!`] and returns its exit code from
//! `main`.
// Host unit tests (args parsing and the like) build with std; the bare-metal pieces
// (_start, panic handler, allocator, memcpy) are then left out, as std provides them.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod args;
pub mod bench;
pub mod boot;
pub mod exit;
pub mod heap;
pub mod io;
#[cfg(not(test))]
mod memfuncs;
#[cfg(not(test))]
mod panic;
pub mod serial;
pub mod start;
pub mod time;
pub mod vgpu;
pub mod virtio;
pub mod wait;

pub use args::Args;
pub use boot::{BootInfo, MemRegion, MmioDevice};
pub use exit::{exit, park, reset};

/// Exit code of a panicking payload (as Rust's test harness uses for a failed test).
pub const EXIT_PANIC: u8 = 101;
