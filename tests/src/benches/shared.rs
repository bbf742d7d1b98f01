//! Small pieces the benchmarks share: a figure in its anchor's unit, and the one-thread
//! launch of a builtin sim kernel.

use vgpu_backend::{Access, ArgValue, LaunchConfig};

use crate::bench::Figure;

/// A figure in the unit of its anchor.
pub fn fig(name: String, value: f64, unit: &str, anchor_name: &str, anchor: f64) -> Figure {
    Figure {
        name,
        value,
        unit: unit.into(),
        anchor_name: anchor_name.into(),
        anchor,
        anchor_unit: unit.into(),
    }
}

/// One block of one thread: the builtin sim kernels loop over their elements themselves.
pub const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid: [1, 1, 1],
    block: [1, 1, 1],
    shared_bytes: 0,
};

/// A pointer argument with its declared access.
pub fn ptr(addr: u64, access: Access) -> ArgValue {
    ArgValue::Ptr { addr, access }
}
