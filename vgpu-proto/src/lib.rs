//! The vGPU wire format (no_std, no alloc): device ID, config space, request header,
//! opcodes and their arguments, kernel arguments with access modes, responses, statuses,
//! and the built-in kernel signatures. Shared by vgpu-device (host) and guest-driver
//! (guest) so the two sides cannot drift. docs/protocol.md is the prose version.
//!
//! Every wire struct is `#[repr(C)]`, little endian, without padding (checked at compile
//! time), and is read and written with safe little-endian field accessors.
#![no_std]
#![deny(missing_docs)]

pub mod args;
mod attributes;
pub mod builtin;
mod config;
mod header;
mod info;
pub mod launch;
mod occupancy;
mod opcode;
mod request;
mod status;
pub mod tensor_map;
pub mod wire;

pub use args::*;
pub use attributes::{DeviceAttributes, FunctionAttributes, ParamLayout};
pub use config::{features, VgpuConfig, SHARE_SCALE, VIRTIO_ID_VGPU};
pub use header::{RequestHeader, Response};
pub use info::{backend_kind, DeviceInfo};
pub use launch::{
    encode_launch, encode_launch_with_blob, launch_request_len, Access, ArgError, ArgKind,
    ArgValue, ClusterError, Deps, KernelArg, KernelArgs, LaunchArgs, LAUNCH_CLUSTER, MAX_ARG_BYTES,
    MAX_CLUSTER_BLOCKS, MAX_DEPS, MAX_KERNEL_ARGS, MAX_PARAM_BLOB_BYTES, MAX_SHARED_BYTES,
    MAX_THREADS_PER_BLOCK,
};
pub use occupancy::{
    occupancy_query, ClusterOccupancyArgs, OccupancyError, MAX_OCCUPANCY_CLUSTER_BLOCKS,
    OCCUPANCY_NON_PORTABLE, PORTABLE_CLUSTER_BLOCKS,
};
pub use opcode::{DataShape, Opcode};
pub use request::{parse_request, LaunchRequest, ParseError, Request};
pub use status::Status;
pub use tensor_map::{
    tensor_map_kind, TensorMapArgs, TensorMapError, MAX_TENSOR_RANK, TENSOR_MAP_BYTES,
};
pub use wire::WireError;

/// Major version: bumped on any incompatible change (a layout, a meaning, a renumbering).
pub const VERSION_MAJOR: u16 = 1;
/// Minor version: bumped when something is added compatibly (a new opcode, status, feature
/// bit, or a field appended to an argument struct whose old length stays accepted).
pub const VERSION_MINOR: u16 = 7;
/// `(major << 16) | minor`, as in the config space and `DeviceInfo`.
pub const PROTOCOL_VERSION: u32 = ((VERSION_MAJOR as u32) << 16) | VERSION_MINOR as u32;

/// True if a guest built for `PROTOCOL_VERSION` may talk to a device announcing
/// `device_version`: the majors must be equal. A guest must not use what a device of a
/// lower minor lacks (the feature bits say what that is).
pub const fn version_compatible(device_version: u32) -> bool {
    (device_version >> 16) == VERSION_MAJOR as u32
}

/// Most bytes of a module name (a built-in module's) and of the other names the protocol
/// carries (shared memory segments, storage volumes).
pub const MAX_NAME_LEN: u64 = 256;
/// Most bytes of a kernel or module variable name (`GET_FUNCTION`, `GET_FUNCTION_LAYOUT`,
/// `GET_GLOBAL`): C++ template instantiations (CUB, Thrust) have mangled names of
/// thousands of bytes.
pub const MAX_SYMBOL_LEN: u64 = 4096;
/// Most bytes of PTX text in one `MODULE_LOAD`.
pub const MAX_MODULE_BYTES: u64 = 64 << 20;
/// Alignment of every device allocation's start address.
pub const DEVICE_ALLOC_ALIGN: u64 = 2 << 20;
/// Granularity of the virtual memory operations (since 1.5): sizes, addresses and
/// alignments of `VA_RESERVE`, `MEM_CREATE` and `MEM_MAP` are multiples of it (the CUDA
/// driver's minimum and recommended granularity for device memory on the GPUs vgpu runs on).
pub const VMM_GRANULARITY: u64 = DEVICE_ALLOC_ALIGN;

#[cfg(test)]
mod occupancy_tests;
#[cfg(test)]
mod tensor_map_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vmm_tests;
