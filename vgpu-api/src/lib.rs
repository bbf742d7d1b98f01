//! What vgpud's clients and its workers share with it, without the daemon itself.
//!
//! - [`api`]: the REST API's request and response types (the schemas of docs/openapi.json).
//! - [`client`]: a small blocking HTTP client for the API (vgpuctl, the demo, tests).
//! - [`control`]: the daemon ↔ worker control channel's messages.
//! - [`payloads`]: the payload guests and their arguments (`GET /v1/payloads`).
//! - [`units`]: sizes, bandwidths and shares as people type them.
//!
//! With the `pager` feature, the control channel's memory types convert to and from the
//! backend pager's.

pub mod api;
pub mod client;
pub mod control;
#[cfg(feature = "pager")]
mod pager;
pub mod payloads;
pub mod units;
