//! The exported C functions. Their contract is the CUDA Driver API's: every pointer a
//! program passes must be valid for what the API documents (the library checks NULL and
//! every handle, and cannot check more than that, exactly like the real driver).
#![allow(clippy::missing_safety_doc)]

pub mod context;
pub mod copy;
pub mod device;
pub mod export;
pub mod launch;
pub mod memory;
pub mod module;
pub mod procaddr;
pub mod ptsz;
pub mod runtime;
pub mod stream;
pub mod stubs;
pub mod table;
pub mod vgpu;
// Libraries, function attributes, pitched memory, pools, host functions, graphs, tensor
// maps.
pub mod capture;
pub mod cluster_occupancy;
pub mod cluster_table;
pub mod enumerate;
pub mod fill;
pub mod func;
pub mod graph;
pub mod hostfn;
pub mod launch_ex;
pub mod library;
pub mod limits;
pub mod memcpy;
pub mod memcpy2d;
pub mod pointer;
pub mod pool;
pub mod tensor_map;
pub mod vmm;
