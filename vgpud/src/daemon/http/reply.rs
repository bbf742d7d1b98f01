//! A command's [`Reply`] as the HTTP response: status, content type, body.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::super::command::Reply;

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Gpus(v) => Json(v).into_response(),
            Reply::ShmObjects(v) => Json(v).into_response(),
            Reply::Vgpus(v) => Json(v).into_response(),
            Reply::Vgpu(v) => Json(v).into_response(),
            Reply::VgpuCreated(v) => (StatusCode::CREATED, Json(v)).into_response(),
            Reply::VgpuStats(v) => Json(v).into_response(),
            Reply::Deleted => StatusCode::NO_CONTENT.into_response(),
            Reply::Migrations(v) => Json(v).into_response(),
            Reply::Migration(v) => Json(v).into_response(),
            Reply::MigrationStarted(v) => (StatusCode::ACCEPTED, Json(v)).into_response(),
            Reply::IncomingAccepted(v) => (StatusCode::CREATED, Json(v)).into_response(),
            Reply::Rebalancer(v) => Json(v).into_response(),
            Reply::RebalanceEvents(v) => Json(v).into_response(),
            Reply::Payloads(v) => Json(v).into_response(),
            Reply::Vms(v) => Json(v).into_response(),
            Reply::Vm(v) => Json(v).into_response(),
            Reply::VmCreated(v) => (StatusCode::CREATED, Json(v)).into_response(),
            Reply::Console(data) => {
                ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], data).into_response()
            }
            Reply::Metrics(text) => (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                text,
            )
                .into_response(),
        }
    }
}
