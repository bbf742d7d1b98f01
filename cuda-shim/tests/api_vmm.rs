//! The virtual memory management API through the library's C ABI against a sim
//! `vgpu-worker` (a 256 MiB share): the round of `vmm/mod.rs`. One test per file: the
//! library is one per process, as libcuda is.

mod common;
mod vmm;

#[test]
fn reserve_create_map_copy_and_release() {
    let (_worker, cu) = common::cuda::start("api-vmm");
    vmm::exercise(&cu);
}
