//! Conversions between the control channel's memory types and the memory planner's (vgpu-scheduler).

use vgpu_scheduler::memory::{MemState, Tier};

use crate::control::{MemReport, SwapTier};

impl From<SwapTier> for Tier {
    fn from(t: SwapTier) -> Self {
        match t {
            SwapTier::Device => Self::Device,
            SwapTier::Host => Self::Host,
        }
    }
}

impl From<Tier> for SwapTier {
    fn from(t: Tier) -> Self {
        match t {
            Tier::Device => Self::Device,
            Tier::Host => Self::Host,
        }
    }
}

impl From<MemState> for MemReport {
    fn from(s: MemState) -> Self {
        Self {
            used: s.used,
            resident: s.resident,
            device_swap: s.device_swap,
            host_swap: s.host_swap,
            swap_out_bytes: s.swap_out_bytes,
            swap_in_bytes: s.swap_in_bytes,
            swap_out_ns: s.swap_out_ns,
            swap_in_ns: s.swap_in_ns,
            evictions: s.evictions,
            restores: s.restores,
        }
    }
}

impl From<MemReport> for MemState {
    fn from(s: MemReport) -> Self {
        Self {
            used: s.used,
            resident: s.resident,
            device_swap: s.device_swap,
            host_swap: s.host_swap,
            swap_out_bytes: s.swap_out_bytes,
            swap_in_bytes: s.swap_in_bytes,
            swap_out_ns: s.swap_out_ns,
            swap_in_ns: s.swap_in_ns,
            evictions: s.evictions,
            restores: s.restores,
        }
    }
}
