//! BAND (Gdev Figure 2): a vGPU goes to the tail only when its budget is spent *and* its
//! utilization exceeds its share, and the resource waits a short time before going to a
//! vGPU that is over its share, so a short-burst vGPU's next request can arrive and take
//! it first.

use crate::clock::Nanos;
use crate::exclusive::{exclusive_policy, Exclusive, Rule};
use crate::state::{Accounts, VgpuId};

pub struct BandRule;

impl Rule for BandRule {
    const NAME: &'static str = "band";

    fn lower(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool {
        acc.over_budget(vgpu) && acc.over_share(vgpu, now)
    }

    fn wait_for(acc: &Accounts, _finished: VgpuId, next: VgpuId, now: Nanos) -> bool {
        // Gdev waits when the next vGPU is over its share; we ask whether it would be over
        // after half of its typical burst (see `over_share_after_grant`), which keeps a
        // long-burst vGPU from overshooting by a whole burst at every grant.
        acc.over_share_after_grant(next, now)
    }

    fn preferred(_acc: &Accounts, _vgpu: VgpuId) -> bool {
        true
    }

    fn may_continue(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool {
        // The holder keeps launching unless it is spent and over its share while others
        // wait (Gdev's yield in schedule_compute).
        let others_wait = acc.map.iter().any(|(id, a)| *id != vgpu && a.pending > 0);
        !(others_wait && acc.over_budget(vgpu) && acc.over_share(vgpu, now))
    }

    fn may_lease(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool {
        !acc.over_share(vgpu, now)
    }

    fn urgency(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> Option<f64> {
        // The vGPU furthest below its share (counting half of its typical burst) goes
        // first. Gdev takes the head of a rotating queue, which with more than two vGPUs
        // lets one that is over its share go ahead of one that is starved.
        acc.headroom_after_grant(vgpu, now)
    }

    fn may_take_free(acc: &Accounts, vgpu: VgpuId, now: Nanos, waiting: bool) -> bool {
        // During the time-buffer we wait for a vGPU under its share: an arrival from one
        // over its share would undo the very wait.
        !waiting || !acc.over_share_after_grant(vgpu, now)
    }
}

/// The BAND policy.
pub struct Band(Exclusive<BandRule>);
exclusive_policy!(Band, BandRule);
