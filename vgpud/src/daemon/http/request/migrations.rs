//! `POST /v1/vgpus/{id}/migrate` and `POST /v1/vms/{id}/migrate`: the body checked into a
//! [`MigrateCommand`].

use super::super::super::error::ApiError;
use super::super::super::migration::{MigrateCommand, DEFAULT_MAX_DOWNTIME_MS};
use super::super::body::parse_object;
use crate::api::MigrateRequest;
use crate::control::MigrationMode;

/// A migrate body: empty (every default) or a [`MigrateRequest`] object.
pub(in crate::daemon::http) fn migrate_request(body: &[u8]) -> Result<MigrateRequest, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(MigrateRequest::default());
    }
    parse_object::<MigrateRequest>(body)
}

/// `req` checked: a known mode, a downtime budget of 1 to 600000 ms.
pub(in crate::daemon::http) fn migrate_command(
    req: MigrateRequest,
) -> Result<MigrateCommand, ApiError> {
    let mode = match req.mode.as_deref().unwrap_or("precopy") {
        "precopy" => MigrationMode::Precopy,
        "stop_copy" => MigrationMode::StopCopy,
        other => {
            return Err(ApiError::bad(
                "mode",
                format!("{other:?}: use \"precopy\" or \"stop_copy\""),
            ))
        }
    };
    let max_downtime_ms = req.max_downtime_ms.unwrap_or(DEFAULT_MAX_DOWNTIME_MS);
    if max_downtime_ms == 0 || max_downtime_ms > 600_000 {
        return Err(ApiError::bad(
            "max_downtime_ms",
            format!("{max_downtime_ms}: give 1 to 600000 ms"),
        ));
    }
    Ok(MigrateCommand {
        target_gpu: req.target_gpu,
        mode,
        max_downtime_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn migrate_requests_become_commands() {
        let cmd = migrate_command(migrate_request(b"").expect("empty body")).expect("defaults");
        assert_eq!(cmd, MigrateCommand::to(None));
        let req = migrate_request(br#"{"mode": "stop_copy", "target_gpu": 1}"#).expect("valid");
        let cmd = migrate_command(req).expect("valid");
        assert_eq!(
            (cmd.mode, cmd.target_gpu),
            (MigrationMode::StopCopy, Some(1))
        );
        for (body, field) in [
            (&br#"{"mode": "live"}"#[..], "mode"),
            (br#"{"max_downtime_ms": 0}"#, "max_downtime_ms"),
            (br#"{"max_downtime_ms": 600001}"#, "max_downtime_ms"),
        ] {
            let req = migrate_request(body).expect("well-formed");
            let e = migrate_command(req).expect_err("invalid");
            assert_eq!(
                (e.status, e.field.as_deref()),
                (StatusCode::BAD_REQUEST, Some(field))
            );
        }
    }
}
