//! The vGPU device as a guest sees it, served as a vhost-user backend inside vgpu-worker: descriptor chains to backend calls.
