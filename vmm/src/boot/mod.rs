//! Guest kernels other than payloads: Linux bzImage and vmlinux (`linux`).

pub mod linux;
