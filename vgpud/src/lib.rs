//! The host daemon (vgpud), the per-vGPU worker (vgpu-worker) and the operator CLI (vgpuctl).
