//! Guest-named events: a timestamp per event id.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::error::RequestError;
use vgpu_backend::sync::lock;

/// Most live events per vGPU.
pub const MAX_EVENTS: usize = 4096;

/// The event table of one vGPU.
#[derive(Debug)]
pub struct Events {
    epoch: Instant,
    table: Mutex<HashMap<u64, u64>>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            table: Mutex::new(HashMap::new()),
        }
    }
}

impl Events {
    /// Nanoseconds on the device clock.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records `event` now; returns the timestamp.
    pub fn record(&self, event: u64) -> Result<u64, RequestError> {
        let ts = self.now_ns();
        let mut t = lock(&self.table);
        if !t.contains_key(&event) && t.len() >= MAX_EVENTS {
            return Err(RequestError::TooManyEvents(MAX_EVENTS));
        }
        t.insert(event, ts);
        Ok(ts)
    }

    /// The timestamp of `event`.
    pub fn get(&self, event: u64) -> Result<u64, RequestError> {
        let t = lock(&self.table);
        t.get(&event)
            .copied()
            .ok_or(RequestError::UnknownEvent(event))
    }

    /// Forgets `event`.
    pub fn destroy(&self, event: u64) -> Result<(), RequestError> {
        let mut t = lock(&self.table);
        t.remove(&event)
            .map(|_| ())
            .ok_or(RequestError::UnknownEvent(event))
    }
}
