//! `POST /v1/vms/{id}/migrate`: where the VM moves.

use super::super::super::error::ApiError;
use super::super::body::parse_object;
use super::migrations::migrate_request;
use crate::api::{MigrateRequest, VmMigrateRequest};

/// Where a VM moves: to another host (the body names a destination), or its vGPU to
/// another GPU of this host.
#[derive(Debug)]
pub(in crate::daemon::http) enum VmMove {
    ToHost(VmMigrateRequest),
    ToGpu(MigrateRequest),
}

/// The body of `POST /v1/vms/{id}/migrate`.
pub(in crate::daemon::http) fn vm_move(body: &[u8]) -> Result<VmMove, ApiError> {
    let to_host = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v.get("destination").is_some());
    if to_host {
        return parse_object::<VmMigrateRequest>(body).map(VmMove::ToHost);
    }
    migrate_request(body).map(VmMove::ToGpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_sends_the_vm_to_another_host() {
        assert!(matches!(vm_move(b""), Ok(VmMove::ToGpu(_))));
        assert!(matches!(
            vm_move(br#"{"target_gpu": 1}"#),
            Ok(VmMove::ToGpu(r)) if r.target_gpu == Some(1)
        ));
        let e = vm_move(br#"{"destination": 3}"#).expect_err("not a destination");
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        let e = vm_move(br#"{"bogus": 1}"#).expect_err("unknown field");
        assert_eq!(e.field.as_deref(), Some("bogus"));
    }
}
