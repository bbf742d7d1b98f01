//! A transport's state for migration: saved while the VM is paused, checked and restored
//! on the destination (the snapshot comes from the network, so nothing in it is trusted).

use super::{MmioTransport, QueueState};
use crate::migration::snapshot::{QueueSnapshot, TransportSnapshot, VringSnapshot};
use crate::virtio::status::*;
use crate::virtio::{ActivateError, VirtioDevice};

/// Why a transport state could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum TransportRestoreError {
    #[error("the device has {here} queues here but {there} in the snapshot")]
    QueueCount { here: usize, there: usize },
    #[error("queue {0}'s size or maximum does not match this device")]
    QueueSize(usize),
    #[error("queue {0}'s rings lie outside guest memory or are misaligned")]
    BadQueue(usize),
    #[error("the snapshot's driver features {0:#x} are not all offered by this device")]
    Features(u64),
    #[error("the device backend cannot restart: {0}")]
    Backend(#[from] ActivateError),
}

impl<D: VirtioDevice> MmioTransport<D> {
    /// The registers, queue configuration and interrupt status.
    pub fn snapshot(&self) -> TransportSnapshot {
        TransportSnapshot {
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queue_sel: self.queue_sel,
            queues: self
                .queues
                .iter()
                .map(|q| QueueSnapshot {
                    max: q.max,
                    size: q.size,
                    ready: q.ready,
                    desc: q.desc,
                    driver: q.driver,
                    device: q.device,
                })
                .collect(),
            active: self.active,
            interrupt_status: self.interrupt.status(),
        }
    }

    /// Stops an active device's rings (vhost-user: GET_VRING_BASE) and returns their bases.
    pub fn pause_device(&mut self) -> Result<Vec<VringSnapshot>, ActivateError> {
        if !self.active {
            return Ok(Vec::new());
        }
        let bases = self.device.pause_rings()?;
        // A completion the backend signalled before it stopped becomes the interrupt
        // status the snapshot carries.
        if self.device.take_pending_calls() {
            self.interrupt.signal_used();
        }
        Ok(bases)
    }

    /// Starts an active device again with its rings at `bases`.
    pub fn resume_device(&mut self, bases: &[VringSnapshot]) -> Result<(), TransportRestoreError> {
        if !self.active {
            return Ok(());
        }
        let mut configs = Vec::new();
        for (i, q) in self.queues.iter().enumerate() {
            if q.ready {
                configs.push(
                    self.validate_queue(i as u16, q)
                        .ok_or(TransportRestoreError::BadQueue(i))?,
                );
            }
        }
        self.device
            .resume_rings(&self.mem, self.driver_features, &configs, bases)?;
        self.device.kick_all();
        Ok(())
    }

    /// Takes the migrated state `s` and, when the device was active, starts its backend
    /// with the rings at `bases`. Checks everything first; on error the transport is reset.
    pub fn restore(
        &mut self,
        s: &TransportSnapshot,
        bases: &[VringSnapshot],
    ) -> Result<(), TransportRestoreError> {
        if s.queues.len() != self.queues.len() {
            return Err(TransportRestoreError::QueueCount {
                here: self.queues.len(),
                there: s.queues.len(),
            });
        }
        for (i, (q, mine)) in s.queues.iter().zip(&self.queues).enumerate() {
            if q.max != mine.max || q.size > q.max {
                return Err(TransportRestoreError::QueueSize(i));
            }
        }
        if s.driver_features & !self.device.features() != 0 {
            return Err(TransportRestoreError::Features(s.driver_features));
        }
        self.status = s.status & (ACKNOWLEDGE | DRIVER | DRIVER_OK | FEATURES_OK | FAILED);
        self.device_features_sel = s.device_features_sel;
        self.driver_features_sel = s.driver_features_sel;
        self.driver_features = s.driver_features;
        self.queue_sel = s.queue_sel;
        for (q, mine) in s.queues.iter().zip(self.queues.iter_mut()) {
            *mine = QueueState {
                max: mine.max,
                size: q.size,
                ready: q.ready,
                desc: q.desc,
                driver: q.driver,
                device: q.device,
            };
        }
        self.interrupt.restore_status(s.interrupt_status);
        self.active = s.active && self.status & DRIVER_OK != 0;
        if let Err(e) = self.resume_device(bases) {
            self.active = false;
            self.reset();
            return Err(e);
        }
        Ok(())
    }
}
