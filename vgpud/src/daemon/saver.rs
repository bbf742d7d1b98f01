//! The state file writer's own state (its operations are in `persistence.rs`).

/// The writer's state: one save at a time, each of the state as it is then.
#[derive(Debug, Default)]
pub(super) struct Saver {
    /// Set once a graceful stop wrote its final state: later changes are the stop's own.
    pub(super) frozen: bool,
    /// The last save failed (logged once until one succeeds).
    pub(super) failing: bool,
    /// Every save ticket up to this one is covered by a finished write.
    pub(super) saved_through: u64,
    /// That write's error, if it failed.
    pub(super) last_error: Option<String>,
}
