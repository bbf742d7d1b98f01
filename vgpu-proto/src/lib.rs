//! The vGPU wire format (no_std): request headers, opcodes, statuses, config space. Shared by vgpu-device and guest-driver so the two sides cannot drift.
