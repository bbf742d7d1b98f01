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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Migration;

    fn migration() -> Migration {
        Migration {
            id: 1,
            vgpu: 2,
            source_gpu: 0,
            target_gpu: 1,
            mode: "precopy".into(),
            state: "running".into(),
            phase: "copying".into(),
            rounds: 0,
            bytes: 0,
            total_bytes: 0,
            dirty_bytes: 0,
            downtime_ms: None,
            elapsed_ms: 0.0,
            error: None,
            timeline: Vec::new(),
            host: None,
        }
    }

    #[test]
    fn replies_carry_their_status_and_content_type() {
        let started = Reply::MigrationStarted(migration()).into_response();
        assert_eq!(started.status(), StatusCode::ACCEPTED);
        assert_eq!(started.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(
            Reply::Migration(migration()).into_response().status(),
            StatusCode::OK
        );
        assert_eq!(
            Reply::Deleted.into_response().status(),
            StatusCode::NO_CONTENT
        );
        let console = Reply::Console(b"boot\n".to_vec()).into_response();
        assert_eq!(console.status(), StatusCode::OK);
        assert_eq!(
            console.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        let metrics = Reply::Metrics("# EOF\n".into()).into_response();
        assert!(metrics.headers()[header::CONTENT_TYPE]
            .to_str()
            .is_ok_and(|t| t.starts_with("application/openmetrics-text")));
    }
}
