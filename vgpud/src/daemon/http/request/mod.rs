//! Requests parsed and checked into [`Command`]s (one file per resource): each function
//! takes what its route extracted (path segments, the body, the query) and answers the
//! command, or the error naming the field that is wrong.

pub(super) mod migrations;
pub(super) mod vms;

use super::super::command::Command;
use super::super::error::ApiError;

/// Parses an `{id}` path segment.
pub(super) fn id_of(raw: &str) -> Result<u32, ApiError> {
    raw.parse::<u32>().map_err(|_| {
        ApiError::bad(
            "id",
            format!("{raw:?} is not an id; ids are whole numbers such as 1"),
        )
    })
}

/// A command on the object whose `{id}` path segment is `raw`.
pub(super) fn on_id(raw: &str, cmd: impl FnOnce(u32) -> Command) -> Result<Command, ApiError> {
    id_of(raw).map(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_whole_numbers() {
        assert!(matches!(
            on_id("7", Command::GetVgpu),
            Ok(Command::GetVgpu(7))
        ));
        for raw in ["-1", "x", "", "4294967296", "1.0"] {
            let e = on_id(raw, Command::GetVm).expect_err(raw);
            assert_eq!(e.field.as_deref(), Some("id"), "{raw}");
        }
    }
}
