//! The host daemon (vgpud), the per-vGPU worker (vgpu-worker), the operator CLI (vgpuctl)
//! and the demo (vgpu-demo).
//!
//! - [`control`]: the daemon ↔ worker control channel.
//! - [`api`]: the REST API's types and its OpenAPI document.
//! - [`daemon`]: vgpud itself (state, process supervision, REST handlers, metrics).
//! - [`client`]: a small blocking HTTP client for the API (vgpuctl, the demo, tests).
//! - [`units`]: sizes, bandwidths and shares as people type them.

pub mod api;
pub mod client;
pub mod control;
pub mod daemon;
pub mod memlink;
pub mod plot;
pub mod units;
