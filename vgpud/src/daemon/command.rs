//! Every operation the REST API drives, as one typed command, and the one place that
//! dispatches them ([`Daemon::handle`]). `http/request/` parses and checks a request into
//! a [`Command`]; `http/reply.rs` turns a [`Reply`] into the response.

use std::sync::Arc;

use super::core::Daemon;
use super::error::ApiError;
use super::host_migration;
use super::memory;
use super::metrics;
use super::migration;
use super::migration::MigrateCommand;
use super::rebalancing;
use super::stats;
use super::vgpus;
use super::vms;
use crate::api::{
    Gpu, IncomingAccepted, IncomingCommit, IncomingVm, Migration, RebalanceEvent, RebalancerStatus,
    ShmObject, Vgpu, VgpuCreate, VgpuPatch, VgpuStats, Vm, VmCreate, VmMigrateRequest,
};
use vgpu_api::payloads::Payload;

/// One operation of the REST API, its input parsed and checked.
#[derive(Debug)]
pub enum Command {
    /// `GET /v1/gpus`.
    ListGpus,
    /// `GET /v1/shm`.
    ListShm,
    /// `GET /v1/vgpus`.
    ListVgpus,
    /// `POST /v1/vgpus`.
    CreateVgpu(VgpuCreate),
    /// `GET /v1/vgpus/{id}`.
    GetVgpu(u32),
    /// `PATCH /v1/vgpus/{id}`.
    PatchVgpu(u32, VgpuPatch),
    /// `DELETE /v1/vgpus/{id}`.
    DeleteVgpu(u32),
    /// `GET /v1/vgpus/{id}/stats`.
    VgpuStats(u32),
    /// `POST /v1/vgpus/{id}/migrate`, and `POST /v1/vms/{id}/migrate` within this host (the
    /// VM's vGPU moves).
    MigrateVgpu(u32, MigrateCommand),
    /// `POST /v1/vms/{id}/migrate` with a destination: the whole VM moves to another host.
    MigrateVmToHost(u32, VmMigrateRequest),
    /// `GET /v1/migrations`.
    ListMigrations,
    /// `GET /v1/migrations/{id}`.
    GetMigration(u32),
    /// `POST /v1/migrations/incoming`: another host asks this one to take a VM.
    AdmitIncoming(IncomingVm),
    /// `POST /v1/migrations/{id}/commit`: the source committed an incoming move.
    CommitIncoming(u32, IncomingCommit),
    /// `DELETE /v1/migrations/{id}`: the source gave an incoming move up.
    AbortIncoming(u32),
    /// `GET /v1/rebalancer`.
    RebalancerStatus,
    /// `GET /v1/rebalancer/events?since=`.
    RebalanceEvents { since: u64 },
    /// `GET /v1/payloads`.
    ListPayloads,
    /// `GET /v1/vms`.
    ListVms,
    /// `POST /v1/vms`.
    CreateVm(VmCreate),
    /// `GET /v1/vms/{id}`.
    GetVm(u32),
    /// `DELETE /v1/vms/{id}`.
    DeleteVm(u32),
    /// `GET /v1/vms/{id}/console?offset=`.
    Console { id: u32, offset: u64 },
    /// `GET /metrics`.
    Metrics,
}

/// What a command answers.
#[derive(Debug)]
pub enum Reply {
    Gpus(Vec<Gpu>),
    ShmObjects(Vec<ShmObject>),
    Vgpus(Vec<Vgpu>),
    Vgpu(Vgpu),
    /// A vGPU was created.
    VgpuCreated(Vgpu),
    VgpuStats(VgpuStats),
    /// The object is gone.
    Deleted,
    Migrations(Vec<Migration>),
    Migration(Migration),
    /// A migration was started (it runs on).
    MigrationStarted(Migration),
    /// An incoming VM was admitted.
    IncomingAccepted(IncomingAccepted),
    Rebalancer(RebalancerStatus),
    RebalanceEvents(Vec<RebalanceEvent>),
    Payloads(Vec<Payload>),
    Vms(Vec<Vm>),
    Vm(Vm),
    /// A VM was launched.
    VmCreated(Vm),
    /// Console bytes from the offset asked for.
    Console(Vec<u8>),
    /// The metrics, in the OpenMetrics text format.
    Metrics(String),
}

impl Daemon {
    /// Runs `cmd`: every operation of the REST API passes through here.
    pub async fn handle(self: &Arc<Self>, cmd: Command) -> Result<Reply, ApiError> {
        Ok(match cmd {
            Command::ListGpus => Reply::Gpus(stats::gpus(self)),
            Command::ListShm => Reply::ShmObjects(memory::shm_objects(&self.shm_lock())),
            Command::ListVgpus => Reply::Vgpus(vgpus::list_vgpus(&self.state)),
            Command::CreateVgpu(spec) => Reply::VgpuCreated(vgpus::create_vgpu(self, spec).await?),
            Command::GetVgpu(id) => Reply::Vgpu(vgpus::get_vgpu(&self.state, id)?),
            Command::PatchVgpu(id, patch) => Reply::Vgpu(vgpus::patch_vgpu(self, id, patch).await?),
            Command::DeleteVgpu(id) => {
                vgpus::delete_vgpu(self, id).await?;
                Reply::Deleted
            }
            Command::VgpuStats(id) => Reply::VgpuStats(stats::vgpu_stats(self, id).await?),
            Command::MigrateVgpu(id, how) => {
                Reply::MigrationStarted(migration::migrate_vgpu(self, id, how).await?)
            }
            Command::MigrateVmToHost(id, req) => {
                Reply::MigrationStarted(host_migration::migrate_vm_to_host(self, id, req).await?)
            }
            Command::ListMigrations => Reply::Migrations(migration::migrations(&self.state)),
            Command::GetMigration(id) => Reply::Migration(migration::migration(&self.state, id)?),
            Command::AdmitIncoming(req) => {
                Reply::IncomingAccepted(host_migration::incoming_vm(self, req).await?)
            }
            Command::CommitIncoming(id, c) => {
                Reply::Migration(host_migration::commit_incoming(self, id, c).await?)
            }
            Command::AbortIncoming(id) => {
                Reply::Migration(host_migration::abort_incoming(self, id).await?)
            }
            Command::RebalancerStatus => Reply::Rebalancer(rebalancing::rebalancer_status(self)),
            Command::RebalanceEvents { since } => {
                Reply::RebalanceEvents(self.rb().events_since(since))
            }
            Command::ListPayloads => Reply::Payloads(vms::payloads(&self.cfg)),
            Command::ListVms => Reply::Vms(vms::list_vms(&self.state)),
            Command::CreateVm(req) => Reply::VmCreated(vms::create_vm(self, req).await?),
            Command::GetVm(id) => Reply::Vm(vms::get_vm(&self.state, id)?),
            Command::DeleteVm(id) => {
                vms::delete_vm(self, id).await?;
                Reply::Deleted
            }
            Command::Console { id, offset } => Reply::Console(vms::console(self, id, offset)?),
            Command::Metrics => Reply::Metrics(
                metrics::render(self)
                    .map_err(|e| ApiError::internal(format!("cannot render metrics: {e}")))?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::admission::tests::admit;
    use super::super::core::testing::{daemon, spec};
    use super::*;

    fn run(d: &Arc<Daemon>, cmd: Command) -> Result<Reply, ApiError> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(d.handle(cmd))
    }

    #[test]
    fn commands_reach_the_daemon_and_answer_what_it_holds() {
        let d = Arc::new(daemon(2));
        let a = admit(&d, spec(Some(1), 1 << 30, 0.25)).expect("admitted");
        match run(&d, Command::ListGpus) {
            Ok(Reply::Gpus(g)) => assert_eq!(g[1].vgpus, vec![a]),
            other => panic!("{other:?}"),
        }
        match run(&d, Command::GetVgpu(a)) {
            Ok(Reply::Vgpu(v)) => assert_eq!((v.id, v.gpu), (a, 1)),
            other => panic!("{other:?}"),
        }
        let e = run(&d, Command::GetVgpu(a + 1)).expect_err("no such vGPU");
        assert_eq!(e.status, axum::http::StatusCode::NOT_FOUND);
        let e = run(&d, Command::GetVm(7)).expect_err("no such VM");
        assert!(e.error.contains("no VM 7"), "{e}");
        assert!(matches!(run(&d, Command::ListVms), Ok(Reply::Vms(v)) if v.is_empty()));
        match run(&d, Command::Metrics) {
            Ok(Reply::Metrics(text)) => assert!(text.contains("vgpu"), "{text}"),
            other => panic!("{other:?}"),
        }
    }
}
