//! One vGPU: turns descriptor chains into backend calls and writes the responses.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use vgpu_backend::{Backend, ModuleImage};
use vgpu_grant::{Gate, Resource, Ungated};
use vgpu_proto::args::{module_kind, shm_flags};
use vgpu_proto::{
    features, launch_request_len, DeviceInfo, Opcode, Request, Response, VgpuConfig, MAX_DEPS,
    MAX_KERNEL_ARGS, MAX_MODULE_BYTES, MAX_NAME_LEN, MAX_SYMBOL_LEN, PROTOCOL_VERSION,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::Bytes;

use crate::chain::{for_each_data, gather, Chain, GuestMem, Layout};
use crate::config::DeviceConfig;
use crate::error::{ConfigError, RequestError};
use crate::events::Events;
use crate::launch::LaunchBatch;
use crate::stats::{Stats, StatsSnapshot};
use vgpu_backend::sync::lock;

/// Writes a `WritableInfo` answer into the chain's one data descriptor (check_shape made
/// sure it is one writable descriptor of at least the answer's size).
pub(crate) fn write_answer<'m>(
    mem: &'m GuestMem,
    chain: &Chain<'m>,
    op: Opcode,
    answer: &[u8],
) -> Outcome {
    let d = chain
        .clone()
        .nth(1)
        .ok_or(RequestError::TooFewDescriptors(1))?;
    if !d.is_write_only() || (d.len() as usize) < answer.len() {
        return Err(RequestError::DataDirection {
            opcode: name_of(op),
            index: 1,
            writable: true,
        });
    }
    mem.write_slice(answer, d.addr())
        .map_err(|e| RequestError::GuestMemory {
            addr: d.addr().0,
            reason: e.to_string(),
        })?;
    Ok([answer.len() as u64, 0, 0, 0])
}

/// Largest header descriptor read: a launch with every argument and dependency.
pub(crate) const HEADER_BUF: usize =
    launch_request_len(MAX_KERNEL_ARGS as usize, MAX_DEPS as usize)
        + vgpu_proto::MAX_PARAM_BLOB_BYTES as usize;

pub(crate) type Outcome = Result<[u64; 4], RequestError>;

/// One vGPU's device: config, backend, events, stats.
pub struct Vgpu {
    pub(crate) config: DeviceConfig,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) space: VgpuConfig,
    events: Events,
    pub(crate) stats: Stats,
    pub(crate) alloc_lock: Mutex<()>,
    /// Asked before every copy and kernel: the GPU's scheduler in vgpud decides when it
    /// may start (BAND). A worker started by hand runs ungated.
    pub(crate) gate: Arc<dyn Gate>,
    /// Each kernel's usual backend-call time: the estimate its grant request carries.
    pub(crate) kernel_times: crate::kernel_times::KernelTimes,
    /// Hardware queue slots shared by this vGPU's streams; `None`: a slot per stream.
    pub(crate) slots: Option<Arc<crate::slots::HwSlots>>,
    /// The shared device memory registry; `None`: SHM_* requests are not supported.
    shm: Option<Arc<dyn crate::shm::ShmHost>>,
    /// The vGPU's storage namespaces; `None`: STORAGE_ATTACH is not supported.
    storage: Option<Arc<dyn crate::storage::StorageHost>>,
    /// Each queue's launch batch, kept between doorbells (only its queue thread takes it).
    batches: Vec<Mutex<LaunchBatch>>,
    /// The frontend's DMA memory mapped at its own addresses (`HOST_MAP`).
    pub(crate) host_maps: crate::host_map::HostMaps,
}

impl std::fmt::Debug for Vgpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vgpu")
            .field("config", &self.config)
            .field("backend", self.backend.info())
            .finish()
    }
}

impl Vgpu {
    /// A vGPU served by `backend`.
    pub fn new(config: DeviceConfig, backend: Arc<dyn Backend>) -> Result<Self, ConfigError> {
        config.validate()?;
        let info = backend.info();
        let mut space = config.config_space(info.features, info.va_base, info.va_size);
        // Virtual memory management is offered when the whole backend stack offers it.
        if backend.virtual_memory().is_some() {
            space.features |= features::VIRTUAL_MEMORY;
        } else {
            space.features &= !features::VIRTUAL_MEMORY;
        }
        let batches = (0..config.num_queues)
            .map(|_| Mutex::new(LaunchBatch::default()))
            .collect();
        let host_maps = crate::host_map::HostMaps::new(backend.clone());
        Ok(Self {
            config,
            backend,
            space,
            events: Events::default(),
            stats: Stats::default(),
            alloc_lock: Mutex::new(()),
            gate: Arc::new(Ungated),
            kernel_times: Default::default(),
            slots: None,
            shm: None,
            storage: None,
            batches,
            host_maps,
        })
    }

    /// `queue`'s launch batch, emptied; `None` for a queue the device does not have.
    pub(crate) fn batch(&self, queue: u16) -> Option<std::sync::MutexGuard<'_, LaunchBatch>> {
        let mut b = lock(self.batches.get(usize::from(queue))?);
        b.clear();
        Some(b)
    }

    /// Serves SHM_* requests through `host` and says so in the config space.
    pub fn with_shm(mut self, host: Arc<dyn crate::shm::ShmHost>) -> Self {
        self.space.features |= vgpu_proto::features::SHM;
        self.shm = Some(host);
        self
    }

    /// Serves STORAGE_ATTACH through `host` and says so in the config space (feature bit
    /// STORAGE). The backend runs the storage kernels over the same namespaces.
    pub fn with_storage(mut self, host: Arc<dyn crate::storage::StorageHost>) -> Self {
        self.space.features |= vgpu_proto::features::STORAGE;
        self.storage = Some(host);
        self
    }

    /// Limits this vGPU's concurrent kernels to `slots` hardware queues, handed out by
    /// `policy` when streams outnumber them.
    pub fn with_slots(mut self, slots: Arc<crate::slots::HwSlots>) -> Self {
        self.slots = Some(slots);
        self
    }

    /// Puts every copy and kernel behind `gate` (the grant path to vgpud's scheduler).
    pub fn with_gate(mut self, gate: Arc<dyn Gate>) -> Self {
        self.gate = gate;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The config space the guest reads.
    pub fn config_space(&self) -> &VgpuConfig {
        &self.space
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Serves one request of `queue`. Returns the used length: the bytes of the writable
    /// data descriptors plus the response, or 0 when the chain has no usable response
    /// descriptor (nothing is written then).
    pub fn process_chain(&self, queue: u16, mem: &GuestMem, chain: Chain<'_>) -> u32 {
        let r = self.receive(mem, chain);
        self.serve(queue, mem, r)
    }

    /// Writes the response of request `id` (`opcode`'s name) into `resp` and counts it, with
    /// `busy_ns()` of busy time; returns the used length (the chain's `data_writable_len`
    /// bytes of writable data plus the response), or 0 when the response could not be
    /// written.
    pub(crate) fn respond(
        &self,
        queue: u16,
        mem: &GuestMem,
        (resp, data_writable_len): (&Descriptor, u64),
        (id, opcode): (u64, &'static str),
        outcome: Outcome,
        busy_ns: impl FnOnce() -> u64,
    ) -> u32 {
        let response = match &outcome {
            Ok(result) => Response::ok(id, *result),
            Err(e) => {
                tracing::debug!(queue, id, opcode, status = %e.status(), error = %e, "request failed");
                Response::new(id, e.status())
            }
        };
        let ok = outcome.is_ok();
        if let Err(e) = mem.write_slice(&response.to_bytes(), resp.addr()) {
            tracing::warn!(queue, id, error = %e, "could not write the response; returned with used length 0");
            self.stats.request(false, busy_ns());
            return 0;
        }
        self.stats.request(ok, busy_ns());
        tracing::trace!(queue, id, opcode, ok, "request done");
        let used = data_writable_len.saturating_add(Response::SIZE as u64);
        u32::try_from(used).unwrap_or(u32::MAX)
    }

    pub(crate) fn dispatch<'m>(
        &self,
        mem: &'m GuestMem,
        chain: &Chain<'m>,
        layout: &Layout,
        req: &Request<'_>,
    ) -> Outcome {
        let b = &*self.backend;
        let op = req.opcode();
        let name = op.name();
        match req {
            Request::GetInfo => self.get_info(mem, chain),
            Request::GetAttributes => {
                let attributes = self.backend.info().attributes.to_bytes();
                write_answer(mem, chain, op, &attributes)
            }
            Request::Alloc(a) => {
                if a.flags != 0 {
                    return Err(RequestError::invalid(
                        op,
                        format!("flags {:#x} must be 0", a.flags),
                    ));
                }
                self.alloc(a.size)
            }
            Request::Free(a) => b.free(a.addr).map(|()| [0; 4]).map_err(Into::into),
            Request::MemcpyHtoD(a) => {
                b.check_range(a.dst, a.size)?;
                let _permit = crate::timeline::acquire(&*self.gate, Resource::Copy);
                for_each_data(mem, chain, layout, name, false, a.size, |off, s| {
                    let dst =
                        a.dst
                            .checked_add(off)
                            .ok_or(vgpu_backend::BackendError::BadPointer {
                                addr: a.dst,
                                len: a.size,
                            })?;
                    b.copy_htod(dst, s)?;
                    Ok(())
                })?;
                self.stats.htod(a.size);
                Ok([a.size, 0, 0, 0])
            }
            Request::MemcpyDtoH(a) => {
                b.check_range(a.src, a.size)?;
                let _permit = crate::timeline::acquire(&*self.gate, Resource::Copy);
                for_each_data(mem, chain, layout, name, true, a.size, |off, s| {
                    let src =
                        a.src
                            .checked_add(off)
                            .ok_or(vgpu_backend::BackendError::BadPointer {
                                addr: a.src,
                                len: a.size,
                            })?;
                    b.copy_dtoh(src, s)?;
                    Ok(())
                })?;
                self.stats.dtoh(a.size);
                Ok([a.size, 0, 0, 0])
            }
            Request::MemcpyDtoD(a) => {
                b.check_range(a.dst, a.size)?;
                b.check_range(a.src, a.size)?;
                let _permit = crate::timeline::acquire(&*self.gate, Resource::Copy);
                let n = b.copy_dtod(a.dst, a.src, a.size)?;
                self.stats.dtod(n);
                Ok([n, 0, 0, 0])
            }
            Request::Memset(a) => {
                let _permit = crate::timeline::acquire(&*self.gate, Resource::Copy);
                let n = b.memset(a.dst, a.value, a.elem_size, a.count)?;
                self.stats.dtod(n);
                Ok([n, 0, 0, 0])
            }
            Request::ModuleLoad(a) => self.module_load(mem, chain, layout, a),
            Request::ModuleUnload(a) => b
                .modules()
                .module_unload(a.module)
                .map(|()| [0; 4])
                .map_err(Into::into),
            Request::GetFunction(a) => {
                let name = symbol(mem, chain, layout, op, a.name_len)?;
                let f = b.modules().get_function(a.module, &name)?;
                Ok([f.handle, u64::from(f.param_count), 0, 0])
            }
            Request::GetFunctionLayout(a) => self.get_function_layout(mem, chain, layout, a),
            Request::GetGlobal(a) => {
                if self.space.features & features::GLOBALS == 0 {
                    return Err(RequestError::NotSupported {
                        opcode: name,
                        why: "this device's modules declare no variables (capability bit GLOBALS is clear: built-in kernels only)",
                    });
                }
                let name = symbol(mem, chain, layout, op, a.name_len)?;
                let (addr, size) = b.modules().module_global(a.module, &name)?;
                Ok([addr, size, 0, 0])
            }
            // Launches are checked when read and served by the launch path; one that
            // reaches here is served the same way.
            Request::Launch(l) => self.check_launch(l).and_then(|c| self.launch_alone(&c)),
            Request::StreamSync => Ok([0; 4]),
            Request::Fence => {
                b.synchronize();
                Ok([0; 4])
            }
            Request::EventRecord(e) => Ok([self.events.record(e.event)?, 0, 0, 0]),
            Request::EventQuery(e) => Ok([1, self.events.get(e.event)?, 0, 0]),
            Request::EventElapsed(e) => {
                let ns = self
                    .events
                    .get(e.end)?
                    .saturating_sub(self.events.get(e.start)?);
                Ok([ns, ns / 1000, 0, 0])
            }
            Request::EventDestroy(e) => self.events.destroy(e.event).map(|()| [0; 4]),
            Request::ShmGet(_) | Request::ShmAt(_) | Request::ShmDt(_) | Request::ShmCtl(_) => {
                self.shm_request(name, req)
            }
            Request::StorageAttach(a) => {
                let Some(host) = &self.storage else {
                    return Err(RequestError::NotSupported {
                        opcode: name,
                        why: "this vGPU has no storage namespaces (capability bit STORAGE is clear); the operator attaches them with `storage` in the vGPU's spec",
                    });
                };
                if a.flags != 0 {
                    return Err(RequestError::invalid(
                        op,
                        format!("flags {:#x} must be 0", a.flags),
                    ));
                }
                let at = host.attach(a.namespace)?;
                Ok([
                    at.handle,
                    at.bytes,
                    u64::from(at.block_size),
                    u64::from(at.read_only),
                ])
            }
            Request::EncodeTensorMap(map) => self.encode_tensor_map(mem, chain, map),
            Request::ClusterOccupancy(a) => self.cluster_occupancy(a),
            Request::VaReserve(_)
            | Request::VaFree(_)
            | Request::MemCreate(_)
            | Request::MemRelease(_)
            | Request::MemMap(_)
            | Request::MemUnmap(_)
            | Request::MemRetain(_) => self.vmm_request(req),
            Request::HostMap(a) => self.host_map(mem, a),
        }
    }

    fn shm_request(&self, name: &'static str, req: &Request<'_>) -> Outcome {
        let Some(host) = &self.shm else {
            return Err(RequestError::NotSupported {
                opcode: name,
                why: "shared device memory is not available on this device (capability bit SHM is clear); run the vGPU under vgpud",
            });
        };
        match req {
            Request::ShmGet(a) => {
                if a.flags & !(shm_flags::CREATE | shm_flags::EXCLUSIVE) != 0 {
                    return Err(RequestError::Invalid {
                        opcode: name,
                        what: format!("unknown flags {:#x}; use CREATE and EXCLUSIVE", a.flags),
                    });
                }
                Ok([host.get(a.key, a.size, a.flags)?, 0, 0, 0])
            }
            Request::ShmAt(a) => {
                if a.flags & !1 != 0 {
                    return Err(RequestError::Invalid {
                        opcode: name,
                        what: format!(
                            "unknown flags {:#x}; bit 0 (read-only) is the only one",
                            a.flags
                        ),
                    });
                }
                Ok([host.attach(a.shmid, a.flags & 1 != 0)?, 0, 0, 0])
            }
            Request::ShmDt(a) => host.detach(a.addr).map(|()| [0; 4]).map_err(Into::into),
            Request::ShmCtl(a) => {
                if a.flags != 0 {
                    return Err(RequestError::Invalid {
                        opcode: name,
                        what: "flags must be 0".into(),
                    });
                }
                Ok(host.ctl(a.shmid, a.cmd)?)
            }
            _ => Err(RequestError::Invalid {
                opcode: name,
                what: "not a shared memory request".into(),
            }),
        }
    }

    fn get_info<'m>(&self, mem: &'m GuestMem, chain: &Chain<'m>) -> Outcome {
        let info = self.backend.info();
        let usage = self.backend.memory_usage();
        let di = DeviceInfo {
            version: PROTOCOL_VERSION,
            vgpu_id: self.config.vgpu_id,
            num_queues: u32::from(self.config.num_queues),
            backend: info.kind,
            features: self.space.features,
            memory_share: self.config.memory_share,
            memory_used: usage.used,
            va_base: info.va_base,
            va_size: info.va_size,
            compute_share: self.config.compute_share,
            copy_share: self.config.copy_share,
            copy_bandwidth: info.copy_bandwidth,
            alloc_granularity: info.alloc_granularity,
            compute_units: info.compute_units,
            max_kernel_args: MAX_KERNEL_ARGS,
            device_memory: info.device_memory,
            name: DeviceInfo::pad_name(&info.name),
        };
        write_answer(mem, chain, Opcode::GetInfo, &di.to_bytes())
    }

    fn alloc(&self, size: u64) -> Outcome {
        // Serialise allocations so two queues cannot both squeeze past the share.
        let _g = lock(&self.alloc_lock);
        let gran = self.backend.info().alloc_granularity.max(1);
        let used = self.backend.memory_usage().used;
        let share = self.config.memory_share;
        let charge = size.checked_add(gran - 1).map(|s| s / gran * gran);
        match charge.and_then(|c| c.checked_add(used)) {
            Some(total) if total <= share || size == 0 => {}
            _ => {
                return Err(RequestError::ShareExhausted {
                    requested: charge.unwrap_or(size),
                    used,
                    share,
                });
            }
        }
        let a = self.backend.alloc(size)?;
        Ok([a.addr, a.charged, 0, 0])
    }

    fn module_load<'m>(
        &self,
        mem: &'m GuestMem,
        chain: &Chain<'m>,
        layout: &Layout,
        a: &vgpu_proto::ModuleLoadArgs,
    ) -> Outcome {
        let op = Opcode::ModuleLoad;
        if a.flags != 0 {
            return Err(RequestError::invalid(
                op,
                format!("flags {:#x} must be 0", a.flags),
            ));
        }
        let code_kind = |feature: u64, what: &str| -> Result<(), RequestError> {
            if self.backend.info().features & feature == 0 {
                return Err(RequestError::NotSupported {
                    opcode: name_of(op),
                    why: if feature == features::PTX {
                        "this device runs only the built-in kernels (sim backend); load module \"builtin\", or use a cuda vGPU for PTX"
                    } else {
                        "this device has no GPU code to run a cubin or fatbin on (sim backend); load module \"builtin\", or use a cuda vGPU"
                    },
                });
            }
            if a.size == 0 || a.size > MAX_MODULE_BYTES {
                return Err(RequestError::invalid(
                    op,
                    format!("{what} size {} must be 1..={MAX_MODULE_BYTES}", a.size),
                ));
            }
            Ok(())
        };
        let mut bytes = vec![0u8; MAX_NAME_LEN as usize];
        match a.kind {
            module_kind::BUILTIN => {
                if a.size == 0 || a.size > MAX_NAME_LEN {
                    return Err(RequestError::invalid(
                        op,
                        format!("module name length {} must be 1..={MAX_NAME_LEN}", a.size),
                    ));
                }
            }
            module_kind::PTX => code_kind(features::PTX, "PTX")?,
            module_kind::BINARY => code_kind(features::BINARY_MODULES, "cubin/fatbin")?,
            k => {
                return Err(RequestError::invalid(
                    op,
                    format!(
                        "module kind {k} is unknown; use 0 (built-in), 1 (PTX) or 2 (cubin/fatbin)"
                    ),
                ))
            }
        }
        // Bounded above: at most MAX_MODULE_BYTES.
        bytes.resize(a.size as usize, 0);
        gather(mem, chain, layout, name_of(op), a.size, &mut bytes)?;
        let image = match a.kind {
            module_kind::BUILTIN => ModuleImage::Builtin(&bytes),
            module_kind::PTX => ModuleImage::Ptx(&bytes),
            _ => ModuleImage::Binary(&bytes),
        };
        // The module's memory counts against the share like an allocation: checked and
        // charged under the allocation lock, before the backend compiles anything.
        let _g = lock(&self.alloc_lock);
        let footprint = vgpu_backend::module_footprint(&image);
        let used = self.backend.memory_usage().used;
        let share = self.config.memory_share;
        if used.checked_add(footprint).is_none_or(|t| t > share) {
            return Err(RequestError::ShareExhausted {
                requested: footprint,
                used,
                share,
            });
        }
        let handle = self.backend.modules().module_load(image)?;
        Ok([handle, footprint, 0, 0])
    }

    /// `GET_FUNCTION_LAYOUT`: `GET_FUNCTION` plus the parameter layout, written into the
    /// chain's last data descriptor (check_shape made sure it is the one writable one).
    fn get_function_layout<'m>(
        &self,
        mem: &'m GuestMem,
        chain: &Chain<'m>,
        layout: &Layout,
        a: &vgpu_proto::GetFunctionArgs,
    ) -> Outcome {
        let op = Opcode::GetFunctionLayout;
        let names = Layout {
            data_count: layout.data_count.saturating_sub(1),
            ..Layout::default()
        };
        let name = symbol(mem, chain, &names, op, a.name_len)?;
        let f = self.backend.modules().get_function(a.module, &name)?;
        let params = self.backend.modules().param_layout(f.handle)?;
        let d = chain
            .clone()
            .nth(layout.data_count)
            .ok_or(RequestError::TooFewDescriptors(layout.count))?;
        mem.write_slice(&params.to_bytes(), d.addr())
            .map_err(|e| RequestError::GuestMemory {
                addr: d.addr().0,
                reason: e.to_string(),
            })?;
        let buffer = (0..f.param_count as usize)
            .filter_map(|i| params.get(i))
            .map(|(o, s)| u64::from(o) + u64::from(s))
            .max()
            .unwrap_or(0);
        // The function's attributes after the layout, when the descriptor has room for
        // them and the backend reports them (since 1.3).
        let room = vgpu_proto::ParamLayout::SIZE + vgpu_proto::FunctionAttributes::SIZE;
        let mut written = 0;
        if u64::from(d.len()) >= room as u64 {
            if let Ok(attrs) = self.backend.modules().function_attributes(f.handle) {
                let at = vm_memory::Address::checked_add(
                    &d.addr(),
                    vgpu_proto::ParamLayout::SIZE as u64,
                )
                .ok_or(RequestError::TooFewDescriptors(layout.count))?;
                mem.write_slice(&attrs.to_bytes(), at)
                    .map_err(|e| RequestError::GuestMemory {
                        addr: at.0,
                        reason: e.to_string(),
                    })?;
                written = vgpu_proto::FunctionAttributes::SIZE as u64;
            }
        }
        Ok([f.handle, u64::from(f.param_count), buffer, written])
    }
}

fn name_of(op: Opcode) -> &'static str {
    op.name()
}

pub(crate) fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A kernel or variable name of `len` bytes from the request's data descriptors, checked
/// against `MAX_SYMBOL_LEN` before anything is read.
fn symbol<'m>(
    mem: &'m GuestMem,
    chain: &Chain<'m>,
    layout: &Layout,
    op: Opcode,
    len: u64,
) -> Result<Vec<u8>, RequestError> {
    if len == 0 || len > MAX_SYMBOL_LEN {
        return Err(RequestError::invalid(
            op,
            format!("name length {len} must be 1..={MAX_SYMBOL_LEN}"),
        ));
    }
    let mut name = vec![0u8; len as usize];
    gather(mem, chain, layout, name_of(op), len, &mut name)?;
    Ok(name)
}
