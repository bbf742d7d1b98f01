//! Xen's Credit scheduler applied to a GPU resource: a vGPU whose budget is spent goes to
//! the tail, vGPUs with budget (UNDER) run before those without (OVER), and nothing waits.
//! It presumes preemptive, always-busy work, which GPU bursts are not (Gdev §5.2): the
//! baseline BAND is measured against.

use crate::clock::Nanos;
use crate::exclusive::{exclusive_policy, Exclusive, Rule};
use crate::state::{Accounts, VgpuId};

pub struct CreditRule;

impl Rule for CreditRule {
    const NAME: &'static str = "credit";

    fn lower(acc: &Accounts, vgpu: VgpuId, _now: Nanos) -> bool {
        acc.over_budget(vgpu)
    }

    fn preferred(acc: &Accounts, vgpu: VgpuId) -> bool {
        !acc.over_budget(vgpu)
    }

    fn may_continue(acc: &Accounts, vgpu: VgpuId, _now: Nanos) -> bool {
        let others_wait = acc.map.iter().any(|(id, a)| *id != vgpu && a.pending > 0);
        !(others_wait && acc.over_budget(vgpu))
    }

    fn may_lease(_acc: &Accounts, _vgpu: VgpuId, _now: Nanos) -> bool {
        // Xen's Credit as Gdev measured it: no holding between requests.
        false
    }
}

/// The Credit policy.
pub struct Credit(Exclusive<CreditRule>);
exclusive_policy!(Credit, CreditRule);
