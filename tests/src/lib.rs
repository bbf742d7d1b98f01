//! End-to-end support: locating the project's binaries and payloads, running a VM with a
//! deadline, and small in-test vhost-user backends.
//!
//! The tests under `tests/` use these; so does the `vgpu-bench-vmm` benchmark, so a test and
//! a benchmark of the same path run the same code.

pub mod bench;
pub mod benches;
pub mod bins;
pub mod daemon;
pub mod echo;
pub mod gpus;
pub mod run;
pub mod worker;
