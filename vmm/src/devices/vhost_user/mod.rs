//! A virtio device whose queues an external vhost-user backend serves (the vGPU's
//! `vgpu-worker`). The vmm only wires it up: memory table, rings, kick and call eventfds;
//! it never touches a request.

mod device;
mod event_handler;

pub use device::{VhostUserDevice, VhostUserError};
pub use event_handler::VhostUserEventHandler;
