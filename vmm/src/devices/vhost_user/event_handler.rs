//! Event-loop side of a vhost-user device: relays the backend's call eventfds into the
//! guest's interrupt (virtio-mmio needs the InterruptStatus bit set, so the vmm sits in
//! between), and notices the backend hanging up.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::device::Shared;
use crate::virtio::Interrupt;

const SOCKET: u32 = u32::MAX;

pub struct VhostUserEventHandler {
    calls: Vec<EventFd>,
    socket: RawFd,
    shared: Arc<Shared>,
    interrupt: Arc<Interrupt>,
    name: String,
}

impl VhostUserEventHandler {
    pub fn new(
        calls: Vec<EventFd>,
        socket: RawFd,
        shared: Arc<Shared>,
        interrupt: Arc<Interrupt>,
        name: String,
    ) -> Self {
        Self {
            calls,
            socket,
            shared,
            interrupt,
            name,
        }
    }
}

impl MutEventSubscriber for VhostUserEventHandler {
    fn init(&mut self, ops: &mut EventOps) {
        for (i, fd) in self.calls.iter().enumerate() {
            if let Err(e) = ops.add(Events::with_data(fd, i as u32, EventSet::IN)) {
                tracing::error!("cannot watch call eventfd {i}: {e}");
            }
        }
        let hup = EventSet::HANG_UP | EventSet::READ_HANG_UP | EventSet::ERROR;
        if let Err(e) = ops.add(Events::with_data_raw(self.socket, SOCKET, hup)) {
            tracing::error!("cannot watch the vhost-user socket: {e}");
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events.data() == SOCKET {
            tracing::error!(device = %self.name, "vhost-user backend disconnected; the device now reports DEVICE_NEEDS_RESET");
            // The interrupt status bit first: a driver that sees DEVICE_NEEDS_RESET sees
            // the configuration change with it; the interrupt follows both.
            self.interrupt.mark_config();
            self.shared.gone.store(true, Ordering::SeqCst);
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
            let _ = ops.remove(Events::with_data_raw(
                self.socket,
                SOCKET,
                EventSet::empty(),
            ));
            for (i, fd) in self.calls.iter().enumerate() {
                let _ = ops.remove(Events::with_data(fd, i as u32, EventSet::IN));
            }
            self.interrupt.signal_config();
            return;
        }
        if let Some(fd) = self.calls.get(events.data() as usize) {
            if fd.read().is_ok() {
                self.interrupt.signal_used();
            }
        } else {
            tracing::debug!(fd = events.fd(), "event for an unknown call fd");
        }
    }
}
