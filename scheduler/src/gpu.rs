//! One physical GPU's schedulers: MRQ keeps compute and copy apart (they overlap on the
//! hardware, so each is accounted against its own share), SDQ puts both through one queue
//! (the comparison Gdev §5.1 draws).

use crate::band::Band;
use crate::clock::Nanos;
use crate::credit::Credit;
use crate::fifo::Fifo;
use crate::state::{Config, Share, VgpuId};
use crate::{Grant, Policy, SchedError};

/// Which resource a request uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Compute,
    Copy,
}

/// Which policy runs a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    Band,
    Credit,
    Fifo,
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "band" => Ok(Self::Band),
            "credit" => Ok(Self::Credit),
            "fifo" => Ok(Self::Fifo),
            _ => Err(format!("unknown policy {s:?}: use band, credit or fifo")),
        }
    }
}

/// Whether compute and copy have their own queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueMode {
    /// Multiple resource queues: compute and copy scheduled and accounted separately.
    Mrq,
    /// Single device queue: one queue for both; a vGPU's share is its compute share.
    Sdq,
}

/// The index of `r`'s engine in per-engine arrays.
fn engine(r: Resource) -> usize {
    match r {
        Resource::Compute => 0,
        Resource::Copy => 1,
    }
}

/// Builds a policy.
pub fn make_policy(kind: PolicyKind, config: Config) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Band => Box::new(Band::new(config)),
        PolicyKind::Credit => Box::new(Credit::new(config)),
        PolicyKind::Fifo => Box::new(Fifo::new(config)),
    }
}

/// The schedulers of one GPU.
///
/// Its clock only moves forward: a `now` earlier than one it was already given (a caller
/// that read the time before waiting for the lock another caller held) counts as that
/// one, so no interval it books can end before it starts.
pub struct GpuScheduler {
    mode: QueueMode,
    compute: Box<dyn Policy>,
    copy: Box<dyn Policy>,
    /// The latest time it was given.
    clock: Nanos,
    /// Each engine's changes of hands (compute, copy).
    hands: [Hands; 2],
}

/// Who was granted an engine last, and how many times a grant went to another vGPU than
/// the one before: on a real GPU each such change is a switch between two workers' CUDA
/// contexts, which the first kernel after it pays for.
#[derive(Clone, Copy, Debug, Default)]
struct Hands {
    last: Option<VgpuId>,
    changes: u64,
}

impl Hands {
    fn granted(&mut self, vgpu: VgpuId) {
        if self.last.is_some_and(|v| v != vgpu) {
            self.changes += 1;
        }
        self.last = Some(vgpu);
    }
}

/// A grant on one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceGrant {
    pub resource: Resource,
    pub grant: Grant,
}

impl GpuScheduler {
    pub fn new(kind: PolicyKind, mode: QueueMode, config: Config) -> Self {
        Self {
            mode,
            compute: make_policy(kind, config),
            copy: make_policy(kind, config),
            clock: 0,
            hands: [Hands::default(); 2],
        }
    }

    /// `now`, moved up to the latest time already seen; that time becomes the clock.
    fn advance(&mut self, now: Nanos) -> Nanos {
        self.clock = self.clock.max(now);
        self.clock
    }

    /// `now`, moved up to the latest time already seen (for a query, which moves nothing).
    fn at(&self, now: Nanos) -> Nanos {
        self.clock.max(now)
    }

    fn policy(&mut self, r: Resource) -> (&mut dyn Policy, Resource) {
        match (self.mode, r) {
            (QueueMode::Sdq, _) | (QueueMode::Mrq, Resource::Compute) => {
                (self.compute.as_mut(), Resource::Compute)
            }
            (QueueMode::Mrq, Resource::Copy) => (self.copy.as_mut(), Resource::Copy),
        }
    }

    /// `grants` of `resource`, tagged with it; each one counted on its engine's hands.
    fn tag(hands: &mut [Hands; 2], grants: Vec<Grant>, resource: Resource) -> Vec<ResourceGrant> {
        let h = &mut hands[engine(resource)];
        grants
            .into_iter()
            .map(|grant| {
                h.granted(grant.vgpu);
                ResourceGrant { resource, grant }
            })
            .collect()
    }

    /// Adds a vGPU with its compute and copy shares.
    pub fn add(
        &mut self,
        vgpu: VgpuId,
        compute: Share,
        copy: Share,
        now: Nanos,
    ) -> Result<(), SchedError> {
        let now = self.advance(now);
        self.compute.add(vgpu, compute, now)?;
        if self.mode == QueueMode::Mrq {
            if let Err(e) = self.copy.add(vgpu, copy, now) {
                self.compute.remove(vgpu, now);
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn remove(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<ResourceGrant> {
        let now = self.advance(now);
        let mut g = Self::tag(
            &mut self.hands,
            self.compute.remove(vgpu, now),
            Resource::Compute,
        );
        if self.mode == QueueMode::Mrq {
            let copy = self.copy.remove(vgpu, now);
            g.extend(Self::tag(&mut self.hands, copy, Resource::Copy));
        }
        g
    }

    pub fn set_shares(
        &mut self,
        vgpu: VgpuId,
        compute: Share,
        copy: Share,
    ) -> Result<(), SchedError> {
        self.compute.set_share(vgpu, compute)?;
        if self.mode == QueueMode::Mrq {
            self.copy.set_share(vgpu, copy)?;
        }
        Ok(())
    }

    pub fn submit(
        &mut self,
        vgpu: VgpuId,
        r: Resource,
        now: Nanos,
    ) -> Result<Vec<ResourceGrant>, SchedError> {
        let now = self.advance(now);
        let (p, tag) = self.policy(r);
        let _engine = tracing::trace_span!("engine", ?tag).entered();
        let grants = p.submit(vgpu, now)?;
        Ok(Self::tag(&mut self.hands, grants, tag))
    }

    pub fn complete(
        &mut self,
        vgpu: VgpuId,
        r: Resource,
        started: Nanos,
        now: Nanos,
    ) -> Result<Vec<ResourceGrant>, SchedError> {
        let now = self.advance(now);
        let (p, tag) = self.policy(r);
        let _engine = tracing::trace_span!("engine", ?tag).entered();
        let grants = p.complete(vgpu, started, now)?;
        Ok(Self::tag(&mut self.hands, grants, tag))
    }

    pub fn tick(&mut self, now: Nanos) -> Vec<ResourceGrant> {
        let now = self.advance(now);
        let mut g = {
            let _engine = tracing::trace_span!("engine", tag = ?Resource::Compute).entered();
            let grants = self.compute.tick(now);
            Self::tag(&mut self.hands, grants, Resource::Compute)
        };
        if self.mode == QueueMode::Mrq {
            let _engine = tracing::trace_span!("engine", tag = ?Resource::Copy).entered();
            let grants = self.copy.tick(now);
            g.extend(Self::tag(&mut self.hands, grants, Resource::Copy));
        }
        g
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        let c = self.compute.next_deadline();
        match self.mode {
            QueueMode::Sdq => c,
            QueueMode::Mrq => match (c, self.copy.next_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }

    pub fn utilization(&self, vgpu: VgpuId, r: Resource, now: Nanos) -> Option<f64> {
        let now = self.at(now);
        match (self.mode, r) {
            (QueueMode::Mrq, Resource::Copy) => self.copy.utilization(vgpu, now),
            _ => self.compute.utilization(vgpu, now),
        }
    }

    pub fn busy_total(&self, vgpu: VgpuId, r: Resource) -> Option<Nanos> {
        match (self.mode, r) {
            (QueueMode::Mrq, Resource::Copy) => self.copy.busy_total(vgpu),
            _ => self.compute.busy_total(vgpu),
        }
    }

    /// `count` requests of `vgpu` on `r` started under its lease.
    pub fn start_leased(
        &mut self,
        vgpu: VgpuId,
        r: Resource,
        count: u32,
        now: Nanos,
    ) -> Result<(), SchedError> {
        let now = self.advance(now);
        self.policy(r).0.start_leased(vgpu, count, now)
    }

    /// Until when `vgpu` may start requests on `r` without asking.
    pub fn lease(&self, vgpu: VgpuId, r: Resource, now: Nanos) -> Option<Nanos> {
        let now = self.at(now);
        match (self.mode, r) {
            (QueueMode::Mrq, Resource::Copy) => self.copy.lease(vgpu, now),
            _ => self.compute.lease(vgpu, now),
        }
    }

    /// Sets `vgpu`'s kernel deadline on both resources (0: the configured default).
    pub fn set_deadline(&mut self, vgpu: VgpuId, deadline: Nanos) -> Result<(), SchedError> {
        self.compute.set_deadline(vgpu, deadline)?;
        if self.mode == QueueMode::Mrq {
            self.copy.set_deadline(vgpu, deadline)?;
        }
        Ok(())
    }

    /// How many times `vgpu` overran its deadline on `r`.
    pub fn overruns(&self, vgpu: VgpuId, r: Resource) -> Option<u64> {
        match (self.mode, r) {
            (QueueMode::Mrq, Resource::Copy) => self.copy.overruns(vgpu),
            _ => self.compute.overruns(vgpu),
        }
    }

    /// The waiting vGPU that would get `r` next if its holder released it now (a hint
    /// for waking its worker early; see `Policy::next_in_line`).
    pub fn next_in_line(&self, r: Resource, now: Nanos) -> Option<VgpuId> {
        let now = self.at(now);
        match (self.mode, r) {
            (QueueMode::Mrq, Resource::Copy) => self.copy.next_in_line(now),
            _ => self.compute.next_in_line(now),
        }
    }

    /// How many times `r` went to another vGPU than the one granted it before (with one
    /// queue for both engines, compute's count). A policy that grants on arrival (FIFO)
    /// counts each grant that alternates.
    pub fn handovers(&self, r: Resource) -> u64 {
        match (self.mode, r) {
            (QueueMode::Mrq, Resource::Copy) => self.hands[engine(Resource::Copy)].changes,
            _ => self.hands[engine(Resource::Compute)].changes,
        }
    }

    pub fn policy_name(&self) -> &'static str {
        self.compute.name()
    }

    pub fn mode(&self) -> QueueMode {
        self.mode
    }
}
