//! Assembles a VM from a `VmConfig` and runs it to the end.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{IoEventAddress, Kvm, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::Killable;

use crate::arch::{gdt, paging};
use crate::boot::linux;
use crate::config::{Guest, VmConfig};
use crate::devices::bus::{lock, Bus, BusDevice};
use crate::devices::legacy::{DebugExit, ExitState, PostCode, I8042};
use crate::devices::serial::SerialDevice;
use crate::devices::vhost_user::{VhostUserDevice, VhostUserError, VhostUserEventHandler};
use crate::idle::IdleWake;
use crate::migration::snapshot::{VmDescription, SNAPSHOT_VERSION};
use crate::vcpu_control::VcpuControl;
use crate::virtio::mmio::{reg, MmioTransport};
use crate::virtio::Interrupt;
use crate::{api, boot_info, layout, loader, memory, signals, vcpu};

/// The virtio device ID of a vGPU (docs/protocol.md).
pub const VGPU_DEVICE_ID: u32 = 0x5647;

/// Why the VM could not be built or run. Each message names the problem and what to do.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot open /dev/kvm: {0}; this host needs KVM and read/write access to /dev/kvm")]
    Kvm(kvm_ioctls::Error),
    #[error("KVM refused to {0}: {1}")]
    KvmSetup(&'static str, kvm_ioctls::Error),
    #[error("--vcpus {0} is out of range: give 1 to 16")]
    Vcpus(u8),
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    #[error(transparent)]
    Load(#[from] loader::LoadError),
    #[error(transparent)]
    BootInfo(#[from] boot_info::BootInfoError),
    #[error(transparent)]
    Linux(#[from] linux::LinuxBootError),
    #[error("cannot write the boot page tables or GDT: {0}")]
    BootTables(vm_memory::GuestMemoryError),
    #[error(transparent)]
    VhostUser(#[from] VhostUserError),
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    #[error("cannot set up the vmm's event loop: {0}")]
    EventLoop(String),
    #[error("cannot place a device: {0}")]
    Bus(#[from] crate::devices::bus::BusError),
    #[error("cannot open the control socket: {0}")]
    Api(std::io::Error),
}

/// One KVM memory slot: where guest RAM sits in the guest and in this process.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub slot: u32,
    pub gpa: u64,
    pub len: u64,
    pub hva: u64,
}

/// A vGPU's virtio-mmio transport, typed (the bus holds the same device untyped).
pub type VgpuTransport = Arc<Mutex<MmioTransport<VhostUserDevice>>>;

/// What another thread (the control API, a migration) needs to reach the running VM.
pub struct VmHandles {
    pub vm: VmFd,
    pub mem: GuestMemoryMmap,
    pub slots: Vec<Slot>,
    pub serial: Arc<Mutex<SerialDevice<std::io::Stdout>>>,
    pub transports: Vec<VgpuTransport>,
    pub control: Arc<VcpuControl>,
    pub exit: Arc<ExitState>,
    /// The VM's shape, as a migration's destination needs it.
    pub description: VmDescription,
    /// The VM has the in-kernel PIT (Linux guests).
    pub has_pit: bool,
}

impl VmHandles {
    /// (Re)registers every memory slot with `flags` (0, or KVM_MEM_LOG_DIRTY_PAGES).
    pub fn set_slot_flags(&self, flags: u32) -> Result<(), kvm_ioctls::Error> {
        for s in &self.slots {
            let r = kvm_userspace_memory_region {
                slot: s.slot,
                guest_phys_addr: s.gpa,
                memory_size: s.len,
                userspace_addr: s.hva,
                flags,
            };
            // SAFETY: the same live mapping the slot was created with, owned by `mem`,
            // which lives as long as the VM fd; only the flags change.
            unsafe { self.vm.set_user_memory_region(r) }?;
        }
        Ok(())
    }
}

/// How the VM's memory and vCPUs start.
pub enum Boot<'a> {
    /// Load the configured guest and start it from its entry point.
    Fresh,
    /// An empty VM of `description`'s shape; a migration stream fills RAM and restores
    /// every vCPU and device before it runs.
    Incoming(&'a VmDescription),
}

/// What was loaded into guest memory.
enum Loaded {
    Payload(loader::Loaded),
    Linux(linux::LinuxEntry),
    /// Nothing: a migration fills guest RAM.
    Incoming,
}

/// Watches the end of the VM (guest exit, reset, crash) and SIGTERM/SIGINT.
struct ExitWatcher {
    exit: Arc<ExitState>,
    term: EventFd,
    done: Arc<AtomicBool>,
}

impl MutEventSubscriber for ExitWatcher {
    fn init(&mut self, ops: &mut EventOps) {
        for (fd, data) in [(&self.exit.evt, 0), (&self.term, 1)] {
            if let Err(e) = ops.add(Events::with_data(fd, data, EventSet::IN)) {
                tracing::error!("cannot watch the exit eventfd: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.data() == 1 {
            let _ = self.term.read();
            tracing::info!("SIGTERM/SIGINT: shutting the VM down");
            // 128 + SIGTERM, as a shell reports a terminated process.
            self.exit.request(128 + libc::SIGTERM);
        } else {
            let _ = self.exit.evt.read();
        }
        self.done.store(true, Ordering::SeqCst);
    }
}

/// A VM ready to run.
pub struct Vm {
    vcpu_fds: Vec<kvm_ioctls::VcpuFd>,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    exit: Arc<ExitState>,
    events: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>,
    done: Arc<AtomicBool>,
    serial: Arc<Mutex<SerialDevice<std::io::Stdout>>>,
    report_timing: bool,
    /// A Linux guest (not a payload).
    linux: bool,
    /// vCPUs that start parked (restored from a migration).
    start_parked: Vec<bool>,
    /// Where the control API listens, if anywhere.
    api_socket: Option<std::path::PathBuf>,
    handles: Arc<VmHandles>,
    /// Wakes idling vCPUs on a device interrupt (the idle port).
    idle: Arc<IdleWake>,
}

impl Vm {
    /// Builds everything; nothing runs yet.
    pub fn build(
        config: &VmConfig,
        started: Instant,
        report_timing: bool,
    ) -> Result<Self, VmError> {
        Self::assemble(config, started, report_timing, Boot::Fresh)
    }

    /// Builds the VM `boot` asks for.
    pub fn assemble(
        config: &VmConfig,
        started: Instant,
        report_timing: bool,
        boot: Boot<'_>,
    ) -> Result<Self, VmError> {
        let incoming = matches!(boot, Boot::Incoming(_));
        if !vcpu::check_count(config.vcpus) {
            return Err(VmError::Vcpus(config.vcpus));
        }
        if let Guest::Payload { arg, .. } = &config.guest {
            if arg.len() > layout::ARG_MAX {
                return Err(boot_info::BootInfoError::ArgTooLong(arg.len()).into());
            }
        }
        if config.vgpus.len() > layout::MAX_MMIO_DEVICES {
            return Err(boot_info::BootInfoError::TooManyDevices(config.vgpus.len()).into());
        }
        let mem = memory::create_guest_memory(config.memory)?;
        let low_end = layout::ram_regions(config.memory)[0].1;
        let loaded = match &config.guest {
            _ if incoming => Loaded::Incoming,
            Guest::Payload { path, .. } => {
                Loaded::Payload(loader::load_payload(&mem, path, low_end)?)
            }
            Guest::Linux(linux_config) => {
                if config.vcpus > 1 {
                    tracing::warn!(
                        "the vmm writes no MP or ACPI tables: a Linux guest sees one vCPU"
                    );
                }
                let announce: Vec<_> = (0..config.vgpus.len())
                    .map(|i| linux::MmioAnnounce {
                        base: layout::mmio_base(i),
                        size: layout::MMIO_SIZE,
                        gsi: layout::MMIO_GSI_BASE + i as u32,
                    })
                    .collect();
                let mut linux_config = linux_config.clone();
                let extra = config.cpu_profile.linux_params();
                if !extra.is_empty() {
                    linux_config.cmdline = format!("{} {extra}", linux_config.cmdline);
                }
                Loaded::Linux(linux::load(&mem, &linux_config, config.memory, &announce)?)
            }
        };

        let kvm = Kvm::new().map_err(VmError::Kvm)?;
        let vm = kvm
            .create_vm()
            .map_err(|e| VmError::KvmSetup("create a VM", e))?;
        vm.set_tss_address(layout::KVM_TSS_ADDR as usize)
            .map_err(|e| VmError::KvmSetup("set the TSS address", e))?;
        vm.set_identity_map_address(layout::KVM_IDENTITY_MAP_ADDR)
            .map_err(|e| VmError::KvmSetup("set the identity map address", e))?;
        vm.create_irq_chip()
            .map_err(|e| VmError::KvmSetup("create the interrupt controller", e))?;
        let linux_guest = match boot {
            Boot::Fresh => matches!(loaded, Loaded::Linux(_)),
            Boot::Incoming(d) => d.linux,
        };
        if linux_guest {
            // Linux calibrates its clocks against the PIT; payloads never touch it.
            let pit = kvm_pit_config {
                flags: KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            if let Err(e) = vm.create_pit2(pit) {
                tracing::warn!("KVM has no in-kernel PIT ({e}); Linux falls back to other clocks");
            }
        }
        let mut slots = Vec::new();
        for (slot, region) in mem.iter().enumerate() {
            let host = mem.get_host_address(region.start_addr()).map_err(|_| {
                VmError::KvmSetup("map guest memory", kvm_ioctls::Error::new(libc::EFAULT))
            })?;
            let r = kvm_userspace_memory_region {
                slot: slot as u32,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: host as u64,
                flags: 0,
            };
            // SAFETY: the region is a live mapping of `region.len()` bytes owned by `mem`,
            // which the Vm keeps for as long as the VM fd exists.
            unsafe { vm.set_user_memory_region(r) }
                .map_err(|e| VmError::KvmSetup("register guest memory", e))?;
            slots.push(Slot {
                slot: r.slot,
                gpa: r.guest_phys_addr,
                len: r.memory_size,
                hva: r.userspace_addr,
            });
        }

        // Boot structures (a migrated VM brings its own in RAM).
        let cr3 = if incoming {
            layout::PML4_ADDR
        } else {
            for (i, entry) in gdt::GDT.iter().enumerate() {
                mem.write_obj(*entry, GuestAddress(layout::GDT_ADDR + i as u64 * 8))
                    .map_err(VmError::BootTables)?;
            }
            paging::write(&mem).map_err(VmError::BootTables)?
        };

        let exit =
            Arc::new(ExitState::new(started).map_err(|e| VmError::EventLoop(e.to_string()))?);
        let mut events = EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new()
            .map_err(|e| VmError::EventLoop(format!("{e:?}")))?;
        let done = Arc::new(AtomicBool::new(false));

        // Port devices.
        let mut pio = Bus::default();
        let serial_irq =
            EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?;
        vm.register_irqfd(&serial_irq, layout::COM1_IRQ)
            .map_err(|e| VmError::KvmSetup("route the serial interrupt", e))?;
        let serial = Arc::new(Mutex::new(SerialDevice::new(serial_irq, std::io::stdout())));
        pio.insert(serial.clone(), u64::from(layout::COM1_BASE), 8)?;
        pio.insert(
            Arc::new(Mutex::new(DebugExit(exit.clone()))),
            u64::from(layout::DEBUG_EXIT_PORT),
            4,
        )?;
        pio.insert(
            Arc::new(Mutex::new(I8042::new(exit.clone()))),
            u64::from(layout::I8042_DATA_PORT),
            5,
        )?;
        pio.insert(
            Arc::new(Mutex::new(PostCode)),
            u64::from(layout::POST_PORT),
            1,
        )?;

        // virtio-mmio devices.
        let mut mmio = Bus::default();
        let mut transports = Vec::new();
        let mut interrupts = Vec::new();
        let mut idle_calls = Vec::new();
        for (i, spec) in config.vgpus.iter().enumerate() {
            if i >= layout::MAX_MMIO_DEVICES {
                return Err(boot_info::BootInfoError::TooManyDevices(config.vgpus.len()).into());
            }
            let base = layout::mmio_base(i);
            let gsi = layout::MMIO_GSI_BASE + i as u32;
            let device = VhostUserDevice::connect(&spec.socket, VGPU_DEVICE_ID)?;
            for (q, kick) in device.kick_fds().iter().enumerate() {
                vm.register_ioevent(
                    kick,
                    &IoEventAddress::Mmio(base + reg::QUEUE_NOTIFY),
                    q as u32,
                )
                .map_err(|e| VmError::KvmSetup("register a queue doorbell", e))?;
            }
            let irq =
                EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?;
            vm.register_irqfd(&irq, gsi)
                .map_err(|e| VmError::KvmSetup("route a device interrupt", e))?;
            let interrupt = Arc::new(Interrupt::new(irq));
            let calls = device
                .call_fds()
                .iter()
                .map(EventFd::try_clone)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| VmError::EventLoop(e.to_string()))?;
            for c in &calls {
                idle_calls.push(
                    c.try_clone()
                        .map_err(|e| VmError::EventLoop(e.to_string()))?,
                );
            }
            interrupts.push(interrupt.clone());
            let handler = VhostUserEventHandler::new(
                calls,
                device.socket_fd(),
                device.shared(),
                interrupt.clone(),
                spec.socket.display().to_string(),
            );
            events.add_subscriber(Arc::new(Mutex::new(handler)));
            let transport: VgpuTransport = Arc::new(Mutex::new(MmioTransport::new(
                device,
                mem.clone(),
                interrupt,
            )));
            transports.push(transport.clone());
            let on_bus: Arc<Mutex<dyn BusDevice>> = transport;
            mmio.insert(on_bus, base, layout::MMIO_SIZE)?;
        }
        let idle =
            Arc::new(IdleWake::new(idle_calls).map_err(|e| VmError::EventLoop(e.to_string()))?);
        for i in &interrupts {
            i.wake_idle_vcpus(idle.clone());
        }

        let term =
            EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmError::EventLoop(e.to_string()))?;
        signals::install_term(&term).map_err(|e| VmError::EventLoop(e.to_string()))?;
        signals::install_kick().map_err(|e| VmError::EventLoop(e.to_string()))?;
        events.add_subscriber(Arc::new(Mutex::new(ExitWatcher {
            exit: exit.clone(),
            term,
            done: done.clone(),
        })));

        let supported = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| VmError::KvmSetup("report its CPUID", e))?;
        let entry = match &loaded {
            // Overwritten by the migrated state before the vCPU runs.
            Loaded::Incoming => vcpu::Entry::Payload { rip: 0, cr3 },
            Loaded::Payload(l) => vcpu::Entry::Payload { rip: l.entry, cr3 },
            Loaded::Linux(l) => vcpu::Entry::Linux {
                rip: l.entry,
                cr3,
                zero_page: linux::ZERO_PAGE_ADDR,
            },
        };
        let vcpu_fds = (0..config.vcpus)
            .map(|i| vcpu::create(&vm, &supported, i, config.vcpus, entry, config.cpu_profile))
            .collect::<Result<Vec<_>, _>>()?;
        // KVM reports the guest TSC rate per vCPU; all of ours run at the same rate.
        let tsc_khz = vcpu_fds
            .first()
            .and_then(|v| v.get_tsc_khz().ok())
            .unwrap_or(0);
        if let (Guest::Payload { arg, .. }, Loaded::Payload(l)) = (&config.guest, &loaded) {
            let info = boot_info::build(
                config.memory,
                config.vcpus,
                u64::from(tsc_khz),
                arg.len(),
                config.vgpus.len(),
            )?;
            boot_info::write(&mem, &info, arg)?;
            tracing::debug!(entry = l.entry, end = l.end, "payload loaded");
        }

        let msrs = crate::migration::vcpu_state::msr_list(&kvm).unwrap_or_else(|e| {
            tracing::warn!("{e}; a migration of this VM carries no MSRs");
            Vec::new()
        });
        let control = Arc::new(VcpuControl::new(vcpu_fds.len(), msrs));
        let description = VmDescription {
            snapshot_version: SNAPSHOT_VERSION,
            memory: config.memory,
            vcpus: config.vcpus,
            vgpus: config.vgpus.len(),
            linux: linux_guest,
            cpu_profile: config.cpu_profile.name().into(),
            token: None,
        };
        Ok(Self {
            start_parked: vec![false; vcpu_fds.len()],
            vcpu_fds,
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            exit: exit.clone(),
            events,
            done,
            serial: serial.clone(),
            report_timing,
            linux: linux_guest,
            api_socket: config.api_socket.clone(),
            idle,
            handles: Arc::new(VmHandles {
                vm,
                mem,
                slots,
                serial,
                transports,
                control,
                exit,
                description,
                has_pit: linux_guest,
            }),
        })
    }

    /// The handles a migration or the control API use.
    pub fn handles(&self) -> &Arc<VmHandles> {
        &self.handles
    }

    /// The vCPUs, before `run` starts them (a migration's destination restores them).
    pub fn vcpu_fds(&self) -> &[kvm_ioctls::VcpuFd] {
        &self.vcpu_fds
    }

    /// Marks which vCPUs start parked.
    pub fn set_start_parked(&mut self, parked: Vec<bool>) {
        self.start_parked = parked;
    }

    /// Runs until the guest exits, resets, crashes, or a signal asks us to stop. Returns
    /// the exit code.
    pub fn run(mut self) -> Result<i32, VmError> {
        let stop = Arc::new(AtomicBool::new(false));
        let _api = match &self.api_socket {
            Some(path) => {
                Some(api::ApiServer::start(path, self.handles.clone()).map_err(VmError::Api)?)
            }
            None => None,
        };
        let mut threads = Vec::new();
        for (i, fd) in std::mem::take(&mut self.vcpu_fds).into_iter().enumerate() {
            let ctx = vcpu::VcpuContext {
                pio: self.pio.clone(),
                mmio: self.mmio.clone(),
                exit: self.exit.clone(),
                stop: stop.clone(),
                mem: self.handles.mem.clone(),
                assist_software_interrupts: self.linux,
                control: self.handles.control.clone(),
                start_parked: self.start_parked.get(i).copied().unwrap_or(false),
                idle: self.idle.clone(),
            };
            threads.push(vcpu::spawn(fd, i as u8, ctx)?);
        }
        while !self.done.load(Ordering::SeqCst) {
            if let Err(e) = self.events.run_with_timeout(1000) {
                tracing::warn!("event loop: {e:?}");
            }
        }
        self.handles.control.shutdown();
        stop_vcpus(&stop, threads);
        lock(&self.serial).flush();
        let _ = std::io::stdout().flush();
        if self.report_timing {
            if let Some(us) = self.exit.first_io_us() {
                eprintln!("vmm-timing: first_guest_io_us={us}");
            }
        }
        Ok(self.exit.code())
    }
}

/// Stops every vCPU thread: the flag ends its loop, the kick signal gets it out of KVM_RUN
/// (a halted vCPU sleeps in the kernel until then). Repeated until each has joined, since
/// a kick sent just before a thread re-enters KVM_RUN is lost.
fn stop_vcpus(stop: &AtomicBool, threads: Vec<JoinHandle<()>>) {
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        while !t.is_finished() {
            let _ = t.kill(signals::vcpu_kick_signal());
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = t.join();
    }
}
