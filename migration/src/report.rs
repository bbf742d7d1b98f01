//! What a migration is asked to do and what it reports.

use std::time::Duration;

/// How to move the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Stop the vGPU, copy everything, switch: the simplest and the longest pause.
    StopCopy,
    /// Copy while the guest runs, re-send what it wrote, stop only for the rest.
    Precopy,
}

/// A migration's parameters.
#[derive(Clone, Copy, Debug)]
pub struct MigrateOptions {
    pub mode: Mode,
    /// Pre-copy stops once the rest is expected to copy within this.
    pub max_downtime: Duration,
    /// Pre-copy rounds at most (a guest writing faster than we copy never converges).
    pub max_rounds: u32,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        Self {
            mode: Mode::Precopy,
            max_downtime: Duration::from_millis(50),
            max_rounds: 8,
        }
    }
}

/// Where a migration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Copying while the guest runs.
    Precopy,
    /// Dispatch stopped; waiting for running work to finish.
    Draining,
    /// Dispatch stopped; copying the rest and switching.
    StopCopy,
    /// On the target.
    Done,
}

impl Phase {
    /// A short name for APIs and logs.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Precopy => "precopy",
            Phase::Draining => "draining",
            Phase::StopCopy => "stop_copy",
            Phase::Done => "done",
        }
    }
}

/// Progress, as the migration goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    pub phase: Phase,
    /// Pre-copy rounds done.
    pub rounds: u32,
    /// Bytes copied so far.
    pub bytes: u64,
    /// Bytes the vGPU holds (the size of one full copy).
    pub total: u64,
    /// Bytes still to copy as last estimated.
    pub dirty: u64,
    /// Time since the start.
    pub elapsed: Duration,
}

/// A finished migration.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub mode: Mode,
    /// Pre-copy rounds.
    pub rounds: u32,
    /// Bytes copied while the guest ran.
    pub precopy_bytes: u64,
    /// Bytes copied while it was stopped.
    pub stop_bytes: u64,
    /// Bytes the vGPU held.
    pub total: u64,
    /// How long dispatch was stopped (the guest's pause).
    pub downtime: Duration,
    /// Of which waiting for running work to finish.
    pub drain: Duration,
    /// From start to resume.
    pub elapsed: Duration,
    /// (phase, start, end) since the start, for timelines.
    pub timeline: Vec<(Phase, Duration, Duration)>,
}
