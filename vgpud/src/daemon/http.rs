//! The REST API: routes, handlers, the JSON extractor (errors naming the field), bearer
//! authentication, and the OpenAPI document (utoipa).

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi};

use super::command::{Command, Reply};
use super::core::Daemon;
use super::error::ApiError;
use crate::api::{
    Attach, ErrorBody, Gpu, GpuDemand, HostMigration, IncomingAccepted, IncomingCommit, IncomingVm,
    MigrateRequest, Migration, MigrationDestination, MigrationSpan, RebalanceEvent,
    RebalancerStatus, ShmObject, StorageAttachment, Vgpu, VgpuCreate, VgpuDemand, VgpuPatch,
    VgpuState, VgpuStats, Vm, VmCreate, VmMigrateRequest, VmState,
};
use vgpu_api::payloads::{Payload, PayloadArg};

mod body;
mod reply;
mod request;
pub(super) mod serve;

pub use body::{parse_json, parse_object, ApiJson};
use body::{RawBody, MAX_BODY};
use request::migrations::{migrate_command, migrate_request};
use request::vms::{vm_move, VmMove};
use request::{id_of, on_id};

type AppState = Arc<Daemon>;

/// The API's routes over `daemon`.
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/gpus", get(list_gpus))
        .route("/v1/vgpus", get(list_vgpus).post(create_vgpu))
        .route(
            "/v1/vgpus/{id}",
            get(get_vgpu).patch(patch_vgpu).delete(delete_vgpu),
        )
        .route("/v1/vgpus/{id}/stats", get(vgpu_stats))
        .route("/v1/vgpus/{id}/migrate", post(migrate_vgpu))
        .route("/v1/shm", get(list_shm))
        .route("/v1/migrations", get(list_migrations))
        .route("/v1/migrations/incoming", post(incoming_migration))
        .route(
            "/v1/migrations/{id}",
            get(get_migration).delete(abort_migration),
        )
        .route("/v1/migrations/{id}/commit", post(commit_migration))
        .route("/v1/rebalancer", get(get_rebalancer))
        .route("/v1/rebalancer/events", get(rebalancer_events))
        .route("/v1/payloads", get(list_payloads))
        .route("/v1/vms", get(list_vms).post(create_vm))
        .route("/v1/vms/{id}", get(get_vm).delete(delete_vm))
        .route("/v1/vms/{id}/console", get(vm_console))
        .route("/v1/vms/{id}/migrate", post(migrate_vm))
        .route("/v1/openapi.json", get(openapi_doc))
        .route("/metrics", get(get_metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(daemon.clone(), auth))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn(body::strict))
        .with_state(daemon)
}

/// The OpenAPI document.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "vgpud",
        description = "The vgpu host daemon: physical GPUs, vGPUs with memory/compute/copy shares, and the VMs that use them. Shares are fractions of one GPU (0..1). Errors answer `{\"error\": ..., \"field\": ...}`. Over TCP every request needs `Authorization: Bearer <token>`.",
        license(name = "Apache-2.0")
    ),
    paths(
        list_gpus, list_vgpus, create_vgpu, get_vgpu, patch_vgpu, delete_vgpu, vgpu_stats,
        migrate_vgpu, list_migrations, get_migration, get_rebalancer, rebalancer_events, list_shm, list_payloads, list_vms, create_vm, get_vm, delete_vm, vm_console, migrate_vm,
        incoming_migration, commit_migration, abort_migration, get_metrics
    ),
    components(schemas(
        Attach, ErrorBody, Gpu, Vgpu, VgpuCreate, VgpuPatch, VgpuState, VgpuStats, Vm, VmCreate,
        VmState, MigrateRequest, ShmObject, Migration, MigrationSpan, StorageAttachment,
        RebalancerStatus, GpuDemand, VgpuDemand, RebalanceEvent, Payload, PayloadArg,
        MigrationDestination, VmMigrateRequest, IncomingVm, IncomingAccepted, IncomingCommit,
        HostMigration
    )),
    modifiers(&BearerAuth),
    tags((name = "vgpud"))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

/// Checks the bearer token when the daemon has one.
async fn auth(State(d): State<AppState>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(token) = d.config().token.as_deref() {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
            let mut r = ApiError::unauthorized().into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            return r;
        }
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found() -> ApiError {
    ApiError::not_found(
        "path",
        "no such endpoint; see docs/api.md or GET /v1/openapi.json",
    )
}

/// List the physical GPUs and their commitments.
#[utoipa::path(get, path = "/v1/gpus", responses((status = 200, body = [Gpu])))]
async fn list_gpus(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::ListGpus).await
}

/// List the shared device memory objects (share groups, sizes, attachments).
#[utoipa::path(get, path = "/v1/shm", responses((status = 200, body = [ShmObject])))]
async fn list_shm(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::ListShm).await
}

/// List vGPUs.
#[utoipa::path(get, path = "/v1/vgpus", responses((status = 200, body = [Vgpu])))]
async fn list_vgpus(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::ListVgpus).await
}

/// Create a vGPU: admits its shares on a GPU and starts its worker.
#[utoipa::path(post, path = "/v1/vgpus", request_body = VgpuCreate, responses(
    (status = 201, body = Vgpu, description = "Created; its worker is ready for a VM"),
    (status = 400, body = ErrorBody, description = "Invalid field"),
    (status = 409, body = ErrorBody, description = "Does not fit (memory, shares)"),
    (status = 501, body = ErrorBody, description = "A feature this vgpud lacks"),
    (status = 500, body = ErrorBody, description = "The worker could not start; or created, but the state file could not be written (field state_file): the vGPU would not survive a restart until a later save succeeds"),
))]
async fn create_vgpu(
    State(d): State<AppState>,
    ApiJson(spec): ApiJson<VgpuCreate>,
) -> Result<Reply, ApiError> {
    d.handle(Command::CreateVgpu(spec)).await
}

/// One vGPU.
#[utoipa::path(get, path = "/v1/vgpus/{id}", params(("id" = u32, Path)), responses(
    (status = 200, body = Vgpu), (status = 404, body = ErrorBody)))]
async fn get_vgpu(State(d): State<AppState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, Command::GetVgpu)?).await
}

/// Change a vGPU's shares or priority at run time (forwarded to its worker).
#[utoipa::path(patch, path = "/v1/vgpus/{id}", params(("id" = u32, Path)), request_body = VgpuPatch, responses(
    (status = 200, body = Vgpu), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
    (status = 409, body = ErrorBody, description = "Shares would sum past 100%, or the vGPU is gone"),
    (status = 502, body = ErrorBody, description = "The worker did not take the change"),
    (status = 500, body = ErrorBody, description = "Done, but the state file could not be written (field state_file): the change would not survive a restart until a later save succeeds")))]
async fn patch_vgpu(
    State(d): State<AppState>,
    Path(id): Path<String>,
    ApiJson(patch): ApiJson<VgpuPatch>,
) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, |id| Command::PatchVgpu(id, patch))?)
        .await
}

/// Delete a vGPU (stops its worker). A vGPU a running VM uses answers 409.
#[utoipa::path(delete, path = "/v1/vgpus/{id}", params(("id" = u32, Path)), responses(
    (status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    (status = 500, body = ErrorBody, description = "Done, but the state file could not be written (field state_file): the change would not survive a restart until a later save succeeds")))]
async fn delete_vgpu(State(d): State<AppState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, Command::DeleteVgpu)?).await
}

/// Utilization over the last window, memory and counters of a vGPU.
#[utoipa::path(get, path = "/v1/vgpus/{id}/stats", params(("id" = u32, Path)), responses(
    (status = 200, body = VgpuStats), (status = 404, body = ErrorBody)))]
async fn vgpu_stats(State(d): State<AppState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, Command::VgpuStats)?).await
}

/// Live-migrate a vGPU to another GPU (its VM keeps running; it sees only a pause).
/// Answers 202 with the migration to follow at `GET /v1/migrations/{id}`.
#[utoipa::path(post, path = "/v1/vgpus/{id}/migrate", params(("id" = u32, Path)), request_body = MigrateRequest, responses(
    (status = 202, body = Migration), (status = 404, body = ErrorBody),
    (status = 409, body = ErrorBody), (status = 400, body = ErrorBody)))]
async fn migrate_vgpu(
    State(d): State<AppState>,
    Path(id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Reply, ApiError> {
    let id = id_of(&id)?;
    let req = migrate_request(&body)?;
    // A stopping daemon says so before it judges the request's fields.
    d.check_running()?;
    d.handle(Command::MigrateVgpu(id, migrate_command(req)?))
        .await
}

/// List migrations (running and finished).
#[utoipa::path(get, path = "/v1/migrations", responses((status = 200, body = [Migration])))]
async fn list_migrations(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::ListMigrations).await
}

/// One migration: phase, bytes, rounds, downtime.
#[utoipa::path(get, path = "/v1/migrations/{id}", params(("id" = u32, Path)), responses(
    (status = 200, body = Migration), (status = 404, body = ErrorBody)))]
async fn get_migration(
    State(d): State<AppState>,
    Path(id): Path<String>,
) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, Command::GetMigration)?).await
}

/// The rebalancer (docs/rebalance.md): its mode and settings, each GPU's and vGPU's measured
/// demand (busy + queue wait), overload and idle time, idle GPUs.
#[utoipa::path(get, path = "/v1/rebalancer", responses((status = 200, body = RebalancerStatus)))]
async fn get_rebalancer(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::RebalancerStatus).await
}

/// Events query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    /// Only events with this id or later (for following the log).
    #[serde(default)]
    since: u64,
}

/// The rebalancer's decision log, oldest first (the latest 1000): every migration it
/// started and every overload, idle GPU or refusal it noticed, each with its reason.
#[utoipa::path(get, path = "/v1/rebalancer/events", params(EventsQuery), responses(
    (status = 200, body = [RebalanceEvent]), (status = 400, body = ErrorBody)))]
async fn rebalancer_events(
    State(d): State<AppState>,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Reply, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad("since", format!("{e}; give ?since=<event id>")))?;
    d.handle(Command::RebalanceEvents { since: q.since }).await
}

/// The payload ELFs in vgpud's --payload-dir (empty without one), each with what it does
/// and its arguments (docs/payloads.md).
#[utoipa::path(get, path = "/v1/payloads", responses((status = 200, body = [Payload])))]
async fn list_payloads(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::ListPayloads).await
}

/// List VMs.
#[utoipa::path(get, path = "/v1/vms", responses((status = 200, body = [Vm])))]
async fn list_vms(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::ListVms).await
}

/// Launch a VM, with an existing vGPU (`vgpu_id`) or a new one (`vgpu`).
#[utoipa::path(post, path = "/v1/vms", request_body = VmCreate, responses(
    (status = 201, body = Vm, description = "Launched (state starting, then running)"),
    (status = 400, body = ErrorBody), (status = 409, body = ErrorBody),
    (status = 501, body = ErrorBody, description = "Linux guests (kernel/initrd/cmdline): this vgpud boots payloads only"),
    (status = 500, body = ErrorBody, description = "The VM could not start; or launched, but the state file could not be written (field state_file)")))]
async fn create_vm(
    State(d): State<AppState>,
    ApiJson(req): ApiJson<VmCreate>,
) -> Result<Reply, ApiError> {
    d.handle(Command::CreateVm(req)).await
}

/// One VM.
#[utoipa::path(get, path = "/v1/vms/{id}", params(("id" = u32, Path)), responses(
    (status = 200, body = Vm), (status = 404, body = ErrorBody)))]
async fn get_vm(State(d): State<AppState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, Command::GetVm)?).await
}

/// Stop (SIGTERM, then SIGKILL) and remove a VM; its inline vGPU goes with it.
#[utoipa::path(delete, path = "/v1/vms/{id}", params(("id" = u32, Path)), responses(
    (status = 204), (status = 404, body = ErrorBody),
    (status = 500, body = ErrorBody, description = "Done, but the state file could not be written (field state_file): the change would not survive a restart until a later save succeeds")))]
async fn delete_vm(State(d): State<AppState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, Command::DeleteVm)?).await
}

/// Console query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
struct ConsoleQuery {
    /// Return the output from this byte on (for following a running VM).
    #[serde(default)]
    offset: u64,
}

/// The VM's serial console (and vmm messages) captured so far, as text.
#[utoipa::path(get, path = "/v1/vms/{id}/console", params(("id" = u32, Path), ConsoleQuery), responses(
    (status = 200, content_type = "text/plain", body = String), (status = 404, body = ErrorBody)))]
async fn vm_console(
    State(d): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<ConsoleQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Reply, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad("offset", format!("{e}; give ?offset=<bytes>")))?;
    let offset = q.offset;
    d.handle(on_id(&id, |id| Command::Console { id, offset })?)
        .await
}

/// Live-migrate a VM's vGPU to another GPU (a `MigrateRequest`, see
/// `POST /v1/vgpus/{id}/migrate`), or, with `destination` (a `VmMigrateRequest`), the
/// whole VM with its vGPU to another vgpud: that daemon admits it first (its 409 or 401
/// comes back as it is, nothing moved), then the move runs on.
#[utoipa::path(post, path = "/v1/vms/{id}/migrate", params(("id" = u32, Path)), request_body = MigrateRequest, responses(
    (status = 202, body = Migration), (status = 404, body = ErrorBody),
    (status = 409, body = ErrorBody), (status = 400, body = ErrorBody),
    (status = 401, body = ErrorBody, description = "The destination vgpud refused the token"),
    (status = 502, body = ErrorBody, description = "The destination vgpud could not be reached")))]
async fn migrate_vm(
    State(d): State<AppState>,
    Path(id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Reply, ApiError> {
    // The VM is looked up before its body is judged (404 first).
    let vm = match d.handle(Command::GetVm(id_of(&id)?)).await? {
        Reply::Vm(vm) => vm,
        other => {
            return Err(ApiError::internal(format!(
                "GET of a VM answered {other:?}"
            )))
        }
    };
    let req = match vm_move(&body)? {
        VmMove::ToHost(req) => return d.handle(Command::MigrateVmToHost(vm.id, req)).await,
        VmMove::ToGpu(req) => req,
    };
    let vgpu = vm
        .vgpu
        .ok_or_else(|| ApiError::conflict("id", format!("VM {} has no vGPU to migrate", vm.id)))?;
    d.check_running()?;
    d.handle(Command::MigrateVgpu(vgpu, migrate_command(req)?))
        .await
}

/// Another vgpud asks to move a VM here: admitted with this daemon's admission rule (409
/// with the reason when it does not fit), its vGPU's worker and its vmm then wait for the
/// streams at the addresses answered.
#[utoipa::path(post, path = "/v1/migrations/incoming", request_body = IncomingVm, responses(
    (status = 201, body = IncomingAccepted), (status = 400, body = ErrorBody),
    (status = 409, body = ErrorBody, description = "Does not fit (memory, shares)")))]
async fn incoming_migration(
    State(d): State<AppState>,
    ApiJson(req): ApiJson<IncomingVm>,
) -> Result<Reply, ApiError> {
    d.handle(Command::AdmitIncoming(req)).await
}

/// The source of an incoming VM says it moved: the VM is this daemon's now, its console
/// continuing the one it had.
#[utoipa::path(post, path = "/v1/migrations/{id}/commit", params(("id" = u32, Path)), request_body = IncomingCommit, responses(
    (status = 200, body = Migration), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn commit_migration(
    State(d): State<AppState>,
    Path(id): Path<String>,
    ApiJson(c): ApiJson<IncomingCommit>,
) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, |id| Command::CommitIncoming(id, c))?)
        .await
}

/// The source of an incoming VM gives the move up: the VM and its vGPU reserved here go.
#[utoipa::path(delete, path = "/v1/migrations/{id}", params(("id" = u32, Path)), responses(
    (status = 200, body = Migration), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn abort_migration(
    State(d): State<AppState>,
    Path(id): Path<String>,
) -> Result<Reply, ApiError> {
    d.handle(on_id(&id, Command::AbortIncoming)?).await
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, content_type = "text/plain", body = String)))]
async fn get_metrics(State(d): State<AppState>) -> Result<Reply, ApiError> {
    d.handle(Command::Metrics).await
}

async fn openapi_doc() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}

/// The OpenAPI document of the API, pretty-printed JSON with a trailing newline (what
/// `vgpud --print-openapi` prints and docs/openapi.json holds).
pub fn openapi_json() -> String {
    let mut s = openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()));
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn json_errors_name_the_field() {
        let e =
            parse_json::<VgpuCreate>(br#"{"memory_bytes": 1, "compute_share": 0.1, "bogus": 1}"#)
                .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("bogus"));
        assert!(e.error.contains("unknown field"), "{e}");
        let e = parse_json::<VgpuCreate>(br#"{"compute_share": 0.1}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("memory_bytes"));
        let e = parse_json::<VmCreate>(
            br#"{"payload": "/x", "vgpu": {"memory_bytes": "lots", "compute_share": 0.1}}"#,
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("vgpu.memory_bytes"));
        let e = parse_json::<VmCreate>(br#"{"payload": "/x", "vgpu": {"memory_bytes": 1}}"#)
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("vgpu.compute_share"));
        let e = parse_json::<VgpuCreate>(br#"{"memory_bytes": 1,"#).unwrap_err();
        assert_eq!(e.field, None);
        assert!(e.error.contains("well-formed"), "{e}");
        let e = parse_json::<VgpuPatch>(br#"{} x"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse_json::<VgpuPatch>(b"  ").unwrap_err();
        assert!(e.error.contains("empty"), "{e}");
        let ok = parse_json::<VgpuPatch>(br#"{"priority": 3}"#).expect("valid");
        assert_eq!(ok.priority, Some(3));
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn committed_spec_matches_the_code() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = openapi_json();
        assert!(
            committed == generated,
            "docs/openapi.json is out of date with the code; regenerate it with\n  cargo run -p vgpud --bin vgpud -- --print-openapi > docs/openapi.json"
        );
    }

    #[test]
    fn every_route_is_in_the_spec() {
        let doc = openapi();
        let paths: Vec<&String> = doc.paths.paths.keys().collect();
        for p in [
            "/v1/gpus",
            "/v1/vgpus",
            "/v1/vgpus/{id}",
            "/v1/vgpus/{id}/stats",
            "/v1/vgpus/{id}/migrate",
            "/v1/vms",
            "/v1/vms/{id}",
            "/v1/vms/{id}/console",
            "/v1/vms/{id}/migrate",
            "/metrics",
        ] {
            assert!(
                paths.iter().any(|k| k.as_str() == p),
                "{p} missing from the spec"
            );
        }
    }
}
