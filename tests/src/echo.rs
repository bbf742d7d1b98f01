//! A vhost-user backend that echoes: for every chain on queue 0 it copies the readable
//! descriptors' bytes, in order, into the writable ones and reports how many it wrote.
//! The e2e test and the doorbell benchmark drive the vmm's vhost-user frontend with it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackendMut, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueOwnedT;
use vm_memory::{Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// Echo backend state.
pub struct Echo {
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    event_idx: bool,
    /// Chains served so far.
    pub served: u64,
}

impl Echo {
    pub fn new() -> Self {
        Self {
            mem: None,
            event_idx: false,
            served: 0,
        }
    }

    fn process(&mut self, vring: &VringRwLock) -> std::io::Result<bool> {
        let Some(mem) = self.mem.as_ref().map(|m| m.memory()) else {
            return Ok(false);
        };
        let chains: Vec<_> = vring
            .get_mut()
            .get_queue_mut()
            .iter(mem.clone())
            .map_err(|e| std::io::Error::other(format!("{e:?}")))?
            .collect();
        let any = !chains.is_empty();
        for chain in chains {
            let head = chain.head_index();
            let descs: Vec<_> = chain.clone().collect();
            let mut data = Vec::new();
            for d in descs.iter().filter(|d| !d.is_write_only()) {
                let mut buf = vec![0u8; d.len() as usize];
                if mem.read_slice(&mut buf, d.addr()).is_err() {
                    buf.clear();
                }
                data.extend_from_slice(&buf);
            }
            let mut written = 0usize;
            for d in descs.iter().filter(|d| d.is_write_only()) {
                let n = (d.len() as usize).min(data.len() - written);
                if n == 0 {
                    break;
                }
                if mem
                    .write_slice(&data[written..written + n], d.addr())
                    .is_ok()
                {
                    written += n;
                }
            }
            vring
                .add_used(head, written as u32)
                .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
            self.served += 1;
        }
        if any {
            let notify = if self.event_idx {
                vring.needs_notification().unwrap_or(true)
            } else {
                true
            };
            if notify {
                vring.signal_used_queue()?;
            }
        }
        Ok(any)
    }
}

impl Default for Echo {
    fn default() -> Self {
        Self::new()
    }
}

impl VhostUserBackendMut for Echo {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        1
    }

    fn max_queue_size(&self) -> usize {
        256
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_RING_F_EVENT_IDX) | VHOST_USER_F_PROTOCOL_FEATURES
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG
    }

    fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // Config space "ECHO" repeated, so a guest can check the read-through path.
        (offset..offset.saturating_add(size))
            .map(|i| b"ECHO"[(i % 4) as usize])
            .collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Without one, dropping the daemon waits forever for the vring thread.
        new_event_consumer_and_notifier(EventFlag::empty()).ok()
    }

    fn update_memory(&mut self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            return Ok(());
        };
        if self.event_idx {
            loop {
                vring
                    .disable_notification()
                    .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
                self.process(vring)?;
                if !vring
                    .enable_notification()
                    .map_err(|e| std::io::Error::other(format!("{e:?}")))?
                {
                    break;
                }
            }
        } else {
            self.process(vring)?;
        }
        Ok(())
    }
}

/// An echo backend serving one connection on `socket` in a background thread.
pub struct EchoServer {
    pub backend: Arc<Mutex<Echo>>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    /// Binds `socket` (replacing a stale file) and serves the first frontend that connects.
    pub fn start(socket: &Path) -> std::io::Result<Self> {
        let mut listener =
            Listener::new(socket, true).map_err(|e| std::io::Error::other(e.to_string()))?;
        let backend = Arc::new(Mutex::new(Echo::new()));
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = VhostUserDaemon::new("echo".into(), backend.clone(), mem)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let thread = std::thread::spawn(move || {
            if let Err(e) = daemon.start(&mut listener) {
                eprintln!("echo backend: {e}");
                return;
            }
            let _ = daemon.wait();
        });
        Ok(Self {
            backend,
            thread: Some(thread),
        })
    }

    /// Waits for the connection to end (the vmm exited).
    pub fn join(mut self) -> u64 {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.backend.lock().map(|b| b.served).unwrap_or(0)
    }
}
