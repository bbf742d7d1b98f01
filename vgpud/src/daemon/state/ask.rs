//! A vGPU request as admission and placement read it.

use std::collections::BTreeMap;

use super::VgpuRec;
use crate::api;

/// A validated vGPU request (shares in per-mille).
#[derive(Debug)]
pub(in crate::daemon) struct VgpuAsk {
    pub(in crate::daemon) gpu: Option<u32>,
    pub(in crate::daemon) memory: u64,
    pub(in crate::daemon) compute: u32,
    pub(in crate::daemon) copy: u32,
    pub(in crate::daemon) priority: i32,
    pub(in crate::daemon) oversubscribe: bool,
    pub(in crate::daemon) share_group: Option<String>,
    pub(in crate::daemon) queues: u16,
    pub(in crate::daemon) storage: Vec<api::StorageAttachment>,
    pub(in crate::daemon) name: Option<String>,
    pub(in crate::daemon) labels: BTreeMap<String, String>,
    pub(in crate::daemon) kernel_deadline_ms: Option<u32>,
}

impl VgpuAsk {
    /// What vGPU `rec` holds, as a request (for moving it or changing its shares): a
    /// change on its way counts with the larger of its old and new shares.
    pub(in crate::daemon) fn of(rec: &VgpuRec) -> Self {
        let (compute, copy) = rec.held();
        Self {
            gpu: Some(rec.gpu()),
            memory: rec.memory(),
            compute,
            copy,
            priority: rec.priority(),
            oversubscribe: rec.oversubscribe(),
            share_group: None,
            queues: rec.queues(),
            storage: Vec::new(),
            name: None,
            labels: BTreeMap::new(),
            kernel_deadline_ms: rec.kernel_deadline_ms(),
        }
    }
}
