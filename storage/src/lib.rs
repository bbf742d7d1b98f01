//! GPU-initiated NVMe access (BaM): queue pairs, ticket/turn enqueue, software cache, emulated and VFIO controllers.
