//! Pinned host memory the GPU reaches at its host address, through the library's C ABI
//! against a sim `vgpu-worker` (sim's "GPU" is the worker's CPU): the round of
//! `host_map/mod.rs` without the PTX kernel. One test per file: the library is one per
//! process, as libcuda is.

mod common;
mod host_map;

#[test]
fn pinned_host_memory_takes_memsets_and_device_copies_at_its_host_address() {
    let (_worker, cu) = common::cuda::start("api-host-map");
    host_map::exercise(&cu, false);
}
