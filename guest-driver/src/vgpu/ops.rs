//! The vGPU request API, in the spirit of the CUDA driver API: each operation has an
//! asynchronous `enqueue_*` form returning a [`Ticket`] (many in flight, one doorbell per
//! batch via [`Stream::submit`]) and a synchronous form that submits and waits.
//! docs/protocol.md defines every request and its result words.

use vgpu_proto::args::{module_kind, BUILTIN_MODULE};
use vgpu_proto::{
    encode_launch, AllocArgs, DeviceAttributes, DeviceInfo, EventArgs, EventElapsedArgs, FreeArgs,
    GetFunctionArgs, KernelArg, LaunchArgs, MemcpyDtoDArgs, MemcpyDtoHArgs, MemcpyHtoDArgs,
    MemsetArgs, ModuleLoadArgs, ModuleUnloadArgs, Opcode, ParamLayout, Request, ShmAtArgs,
    ShmCtlArgs, ShmDtArgs, ShmGetArgs, Status, StorageAttachArgs, MAX_SYMBOL_LEN,
};

use super::stream::{SlotData, Stream, Ticket, MAX_DATA_BUFFERS};
use crate::error::{Error, Result};
use crate::queue::Buffer;
use crate::transport::Transport;

/// Largest single data descriptor; bigger copies are split over several.
const MAX_CHUNK: u64 = 1 << 30;

/// A kernel function of a loaded module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    pub handle: u64,
    pub params: u64,
}

/// A one-dimensional launch of `function` over `n` threads in blocks of `block` threads.
pub fn launch_1d(function: u64, n: u64, block: u32) -> LaunchArgs {
    let block = block.max(1);
    let grid = n.div_ceil(u64::from(block)).clamp(1, u64::from(u32::MAX)) as u32;
    LaunchArgs {
        function,
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        ..LaunchArgs::default()
    }
}

/// An attached storage namespace (`STORAGE_ATTACH`'s result).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageInfo {
    /// What the storage kernels take as their `ns` argument.
    pub handle: u64,
    /// Size in bytes.
    pub bytes: u64,
    /// Logical block size in bytes.
    pub block_size: u64,
    /// The namespace is read-only.
    pub read_only: bool,
}

/// Splits `len` bytes at device address `phys` into descriptors of at most MAX_CHUNK.
fn chunks(phys: u64, len: u64, writable: bool) -> Result<([Buffer; MAX_DATA_BUFFERS], usize)> {
    let mut out = [Buffer::readable(0, 0); MAX_DATA_BUFFERS];
    let mut n = 0;
    let mut off = 0;
    while off < len {
        let part = (len - off).min(MAX_CHUNK);
        let slot = out.get_mut(n).ok_or(Error::TooManyBuffers)?;
        let addr = phys.checked_add(off).ok_or(Error::BufferTooLarge)?;
        *slot = Buffer {
            addr,
            len: part as u32,
            writable,
        };
        n += 1;
        off += part;
    }
    Ok((out, n))
}

impl<T: Transport, const CAP: usize> Stream<T, CAP> {
    /// `GET_INFO`: what the device is and how much of it this vGPU has.
    pub fn get_info(&mut self) -> Result<DeviceInfo> {
        let t = self.enqueue_slot_data(&Request::GetInfo, SlotData::Info)?;
        self.submit();
        self.wait_info(t)
    }

    /// `ENCODE_TENSOR_MAP`: the TMA descriptor the device's GPU driver encodes for `map`
    /// (devices with `features::TENSOR_MAPS`; others answer `NOT_SUPPORTED` or, before
    /// protocol 1.4, `UNKNOWN_OPCODE`).
    pub fn encode_tensor_map(
        &mut self,
        map: &vgpu_proto::TensorMapArgs,
    ) -> Result<[u8; vgpu_proto::TENSOR_MAP_BYTES]> {
        let t = self.enqueue_slot_data(&Request::EncodeTensorMap(*map), SlotData::Info)?;
        self.submit();
        self.wait_tensor_map(t)
    }

    /// `GET_ATTRIBUTES`: the physical GPU's attributes (devices with
    /// `features::ATTRIBUTES`; others answer `UNKNOWN_OPCODE` or `NOT_SUPPORTED`).
    pub fn get_attributes(&mut self) -> Result<DeviceAttributes> {
        let t = self.enqueue_slot_data(&Request::GetAttributes, SlotData::Info)?;
        self.submit();
        self.wait_attributes(t)
    }

    pub fn enqueue_alloc(&mut self, size: u64) -> Result<Ticket> {
        self.enqueue(&Request::Alloc(AllocArgs { size, flags: 0 }))
    }

    /// Allocates `size` bytes of device memory; returns its device address.
    pub fn alloc(&mut self, size: u64) -> Result<u64> {
        let t = self.enqueue_alloc(size)?;
        self.submit();
        Ok(self.wait(t)?[0])
    }

    pub fn enqueue_free(&mut self, addr: u64) -> Result<Ticket> {
        self.enqueue(&Request::Free(FreeArgs { addr }))
    }

    pub fn free(&mut self, addr: u64) -> Result<()> {
        self.call(&Request::Free(FreeArgs { addr })).map(drop)
    }

    /// Copies `len` bytes at guest-physical `src` to device address `dst`.
    ///
    /// # Safety
    /// `src..src + len` must be guest memory the caller owns, physically contiguous, and
    /// left unchanged until the request completes.
    pub unsafe fn enqueue_htod(&mut self, dst: u64, src: u64, len: u64) -> Result<Ticket> {
        let (bufs, n) = chunks(src, len, false)?;
        let req = Request::MemcpyHtoD(MemcpyHtoDArgs { dst, size: len });
        // SAFETY: the caller upholds enqueue_with_data's contract for the source range.
        unsafe { self.enqueue_with_data(&req, &bufs[..n]) }
    }

    /// Copies `src` to device address `dst` and waits.
    pub fn memcpy_htod(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        let phys = self.transport().virt_to_phys(src.as_ptr())?;
        // SAFETY: `src` is borrowed until we return, and we return only once the device
        // completed the request or was reset (wait's timeout and error paths), so it
        // never reads the buffer after the borrow ends.
        let t = unsafe { self.enqueue_htod(dst, phys, src.len() as u64)? };
        self.submit();
        self.wait(t).map(drop)
    }

    /// Copies `len` bytes from device address `src` to guest-physical `dst`.
    ///
    /// # Safety
    /// `dst..dst + len` must be guest memory the caller owns, physically contiguous, and
    /// neither read nor written by the CPU until the request completes.
    pub unsafe fn enqueue_dtoh(&mut self, dst: u64, len: u64, src: u64) -> Result<Ticket> {
        let (bufs, n) = chunks(dst, len, true)?;
        let req = Request::MemcpyDtoH(MemcpyDtoHArgs { src, size: len });
        // SAFETY: the caller upholds enqueue_with_data's contract for the destination.
        unsafe { self.enqueue_with_data(&req, &bufs[..n]) }
    }

    /// Copies from device address `src` into `dst` and waits.
    pub fn memcpy_dtoh(&mut self, dst: &mut [u8], src: u64) -> Result<()> {
        let phys = self.transport().virt_to_phys(dst.as_mut_ptr())?;
        // SAFETY: `dst` is mutably borrowed until we return, and we return only once the
        // device completed the request or was reset, so no write lands after that.
        let t = unsafe { self.enqueue_dtoh(phys, dst.len() as u64, src)? };
        self.submit();
        self.wait(t).map(drop)
    }

    pub fn enqueue_dtod(&mut self, dst: u64, src: u64, size: u64) -> Result<Ticket> {
        self.enqueue(&Request::MemcpyDtoD(MemcpyDtoDArgs { dst, src, size }))
    }

    /// Device-to-device copy (overlap allowed).
    pub fn memcpy_dtod(&mut self, dst: u64, src: u64, size: u64) -> Result<()> {
        self.call(&Request::MemcpyDtoD(MemcpyDtoDArgs { dst, src, size }))
            .map(drop)
    }

    pub fn enqueue_memset(
        &mut self,
        dst: u64,
        value: u32,
        count: u64,
        elem_size: u32,
    ) -> Result<Ticket> {
        self.enqueue(&Request::Memset(MemsetArgs {
            dst,
            count,
            value,
            elem_size,
        }))
    }

    /// Sets `count` elements of `elem_size` bytes (1, 2 or 4) at `dst` to `value`.
    pub fn memset(&mut self, dst: u64, value: u32, count: u64, elem_size: u32) -> Result<()> {
        let t = self.enqueue_memset(dst, value, count, elem_size)?;
        self.submit();
        self.wait(t).map(drop)
    }

    /// Loads a built-in module by name (`"builtin"`); returns its handle.
    pub fn load_module_builtin(&mut self, name: &str) -> Result<u64> {
        let req = Request::ModuleLoad(ModuleLoadArgs {
            kind: module_kind::BUILTIN,
            flags: 0,
            size: name.len() as u64,
        });
        let t = self.enqueue_slot_data(&req, SlotData::Readable(name.as_bytes()))?;
        self.submit();
        Ok(self.wait(t)?[0])
    }

    /// Loads the module every device offers.
    pub fn load_builtin(&mut self) -> Result<u64> {
        self.load_module_builtin(BUILTIN_MODULE)
    }

    /// Loads a PTX module from `ptx` (devices with the PTX capability only).
    pub fn load_module_ptx(&mut self, ptx: &[u8]) -> Result<u64> {
        self.load_module_image(module_kind::PTX, ptx)
    }

    /// Loads a cubin or fatbin image (devices with `features::BINARY_MODULES` only;
    /// others answer `NOT_SUPPORTED`).
    pub fn load_module_binary(&mut self, image: &[u8]) -> Result<u64> {
        self.load_module_image(module_kind::BINARY, image)
    }

    fn load_module_image(&mut self, kind: u32, ptx: &[u8]) -> Result<u64> {
        let phys = self.transport().virt_to_phys(ptx.as_ptr())?;
        let (bufs, n) = chunks(phys, ptx.len() as u64, false)?;
        let req = Request::ModuleLoad(ModuleLoadArgs {
            kind,
            flags: 0,
            size: ptx.len() as u64,
        });
        // SAFETY: `ptx` is borrowed until we return, and we return only once the request
        // completed or the device was reset.
        let t = unsafe { self.enqueue_with_data(&req, &bufs[..n])? };
        self.submit();
        Ok(self.wait(t)?[0])
    }

    pub fn unload_module(&mut self, module: u64) -> Result<()> {
        self.call(&Request::ModuleUnload(ModuleUnloadArgs { module }))
            .map(drop)
    }

    /// Looks up a function of a loaded module by name.
    pub fn get_function(&mut self, module: u64, name: &str) -> Result<Function> {
        if name.len() as u64 > MAX_SYMBOL_LEN {
            return Err(Error::RequestTooLarge);
        }
        let req = Request::GetFunction(GetFunctionArgs {
            module,
            name_len: name.len() as u64,
        });
        let t = self.enqueue_slot_data(&req, SlotData::Readable(name.as_bytes()))?;
        self.submit();
        let r = self.wait(t)?;
        Ok(Function {
            handle: r[0],
            params: r[1],
        })
    }

    /// Looks up a function and its parameter layout (devices with
    /// `features::PARAM_LAYOUT`); also returns the parameter buffer's size.
    pub fn get_function_layout(
        &mut self,
        module: u64,
        name: &str,
    ) -> Result<(Function, ParamLayout, u64)> {
        if name.len() as u64 > MAX_SYMBOL_LEN {
            return Err(Error::RequestTooLarge);
        }
        let req = Request::GetFunctionLayout(GetFunctionArgs {
            module,
            name_len: name.len() as u64,
        });
        let t = self.enqueue_slot_data(&req, SlotData::NameThenLayout(name.as_bytes()))?;
        self.submit();
        let (r, layout) = self.wait_layout(t)?;
        Ok((
            Function {
                handle: r[0],
                params: r[1],
            },
            layout,
            r[2],
        ))
    }

    /// [`Self::get_function_layout`] and the function's attributes, when the device
    /// reports them (`features::FUNCTION_ATTRIBUTES`).
    #[allow(clippy::type_complexity)]
    pub fn get_function_layout_attributes(
        &mut self,
        module: u64,
        name: &str,
    ) -> Result<(
        Function,
        ParamLayout,
        u64,
        Option<vgpu_proto::FunctionAttributes>,
    )> {
        if name.len() as u64 > MAX_SYMBOL_LEN {
            return Err(Error::RequestTooLarge);
        }
        let req = Request::GetFunctionLayout(GetFunctionArgs {
            module,
            name_len: name.len() as u64,
        });
        let t = self.enqueue_slot_data(&req, SlotData::NameThenLayout(name.as_bytes()))?;
        self.submit();
        let (r, layout, attrs) = self.wait_layout_attributes(t)?;
        Ok((
            Function {
                handle: r[0],
                params: r[1],
            },
            layout,
            r[2],
            attrs,
        ))
    }

    /// A function's thread block cluster occupancy as the device's GPU driver answers it
    /// (`CLUSTER_OCCUPANCY`, devices with `features::CLUSTER_OCCUPANCY`): clusters that run
    /// at once, or the blocks of the largest cluster, as `args.query` asks.
    pub fn cluster_occupancy(&mut self, args: &vgpu_proto::ClusterOccupancyArgs) -> Result<u64> {
        Ok(self.call(&Request::ClusterOccupancy(*args))?[0])
    }

    /// Looks up a module variable by name (devices with `features::GLOBALS`): its device
    /// address and size.
    pub fn get_global(&mut self, module: u64, name: &str) -> Result<(u64, u64)> {
        if name.len() as u64 > MAX_SYMBOL_LEN {
            return Err(Error::RequestTooLarge);
        }
        let req = Request::GetGlobal(vgpu_proto::GetGlobalArgs {
            module,
            name_len: name.len() as u64,
        });
        let t = self.enqueue_slot_data(&req, SlotData::Readable(name.as_bytes()))?;
        self.submit();
        let r = self.wait(t)?;
        Ok((r[0], r[1]))
    }

    /// Enqueues a kernel launch whose `Blob` arguments point into `blob` (devices with
    /// `features::PARAM_BLOBS`). The whole request lives in the slot's header area:
    /// `Error::RequestTooLarge` when the arguments and the blob do not fit it.
    pub fn enqueue_launch_with_blob(
        &mut self,
        launch: &LaunchArgs,
        args: &[KernelArg],
        deps: &[u32],
        blob: &[u8],
    ) -> Result<Ticket> {
        // SAFETY: no data descriptors: the launch and its blob live entirely in the slot.
        unsafe {
            self.enqueue_encoded(
                Opcode::Launch as u32,
                |id, out| {
                    vgpu_proto::encode_launch_with_blob(out, id, launch, args, deps, blob).ok()
                },
                &[],
            )
        }
    }

    /// [`Self::enqueue_launch_with_blob`] for a launch of any size: the request is written
    /// into the caller's DMA memory `header` (at least
    /// `launch_request_len(args.len(), deps.len()) + blob.len()` bytes).
    ///
    /// # Safety
    /// `header` must stay allocated, and unwritten by the CPU, until the request completes.
    pub unsafe fn enqueue_launch_in(
        &mut self,
        header: &mut crate::DmaRegion,
        launch: &LaunchArgs,
        args: &[KernelArg],
        deps: &[u32],
        blob: &[u8],
    ) -> Result<Ticket> {
        // SAFETY: the caller keeps `header` until the request completes.
        unsafe {
            self.enqueue_with_header(Opcode::Launch as u32, header, |id, out| {
                vgpu_proto::encode_launch_with_blob(out, id, launch, args, deps, blob).ok()
            })
        }
    }

    /// Enqueues a kernel launch. `launch.arg_count`/`dep_count` are set from the slices.
    pub fn enqueue_launch(
        &mut self,
        launch: &LaunchArgs,
        args: &[KernelArg],
        deps: &[u32],
    ) -> Result<Ticket> {
        // SAFETY: no data descriptors: the launch lives entirely in the slot.
        unsafe {
            self.enqueue_encoded(
                Opcode::Launch as u32,
                |id, out| encode_launch(out, id, launch, args, deps).ok(),
                &[],
            )
        }
    }

    /// Launches a kernel and waits; returns its device time in ns.
    pub fn launch(&mut self, launch: &LaunchArgs, args: &[KernelArg]) -> Result<u64> {
        let t = self.enqueue_launch(launch, args, &[])?;
        self.submit();
        Ok(self.wait(t)?[0])
    }

    pub fn enqueue_stream_sync(&mut self) -> Result<Ticket> {
        self.enqueue(&Request::StreamSync)
    }

    /// Completes once every earlier request on this stream has.
    pub fn stream_sync(&mut self) -> Result<()> {
        self.call(&Request::StreamSync).map(drop)
    }

    pub fn enqueue_fence(&mut self) -> Result<Ticket> {
        self.enqueue(&Request::Fence)
    }

    /// Completes once what the vGPU's other streams were executing has completed.
    pub fn fence(&mut self) -> Result<()> {
        self.call(&Request::Fence).map(drop)
    }

    pub fn enqueue_event_record(&mut self, event: u64) -> Result<Ticket> {
        self.enqueue(&Request::EventRecord(EventArgs { event }))
    }

    /// Records `event` (a guest-chosen id) after all earlier work on this stream; returns
    /// its device timestamp in ns.
    pub fn event_record(&mut self, event: u64) -> Result<u64> {
        Ok(self.call(&Request::EventRecord(EventArgs { event }))?[0])
    }

    /// The event's timestamp once it has been recorded, `None` while it has not.
    pub fn event_query(&mut self, event: u64) -> Result<Option<u64>> {
        match self.call(&Request::EventQuery(EventArgs { event })) {
            Ok(r) if r[0] == 1 => Ok(Some(r[1])),
            Ok(_) => Ok(None),
            Err(Error::Device {
                status: Status::NotReady,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Nanoseconds from `start` to `end`.
    pub fn event_elapsed(&mut self, start: u64, end: u64) -> Result<u64> {
        Ok(self.call(&Request::EventElapsed(EventElapsedArgs { start, end }))?[0])
    }

    pub fn event_destroy(&mut self, event: u64) -> Result<()> {
        self.call(&Request::EventDestroy(EventArgs { event }))
            .map(drop)
    }

    /// Reserves `size` bytes of device addresses (`VA_RESERVE`, devices with
    /// `features::VIRTUAL_MEMORY`); returns the first address.
    pub fn va_reserve(&mut self, size: u64, align: u64, hint: u64) -> Result<u64> {
        let args = vgpu_proto::VaReserveArgs {
            size,
            align,
            hint,
            flags: 0,
        };
        Ok(self.call(&Request::VaReserve(args))?[0])
    }

    /// Frees a reserved range (`VA_FREE`).
    pub fn va_free(&mut self, addr: u64, size: u64) -> Result<()> {
        self.call(&Request::VaFree(vgpu_proto::VaFreeArgs { addr, size }))
            .map(drop)
    }

    /// Creates a physical allocation (`MEM_CREATE`); returns its handle and the bytes
    /// charged.
    pub fn mem_create(&mut self, size: u64) -> Result<(u64, u64)> {
        let r = self.call(&Request::MemCreate(vgpu_proto::MemCreateArgs {
            size,
            flags: 0,
        }))?;
        Ok((r[0], r[1]))
    }

    /// Drops one reference to a physical allocation's handle (`MEM_RELEASE`).
    pub fn mem_release(&mut self, handle: u64) -> Result<()> {
        self.call(&Request::MemRelease(vgpu_proto::MemReleaseArgs { handle }))
            .map(drop)
    }

    /// Maps `size` bytes of `handle` from `offset` at `addr` (`MEM_MAP`).
    pub fn mem_map(&mut self, addr: u64, size: u64, offset: u64, handle: u64) -> Result<()> {
        let args = vgpu_proto::MemMapArgs {
            addr,
            size,
            offset,
            handle,
        };
        self.call(&Request::MemMap(args)).map(drop)
    }

    /// Unmaps the mappings inside `[addr, addr + size)` (`MEM_UNMAP`).
    pub fn mem_unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        self.call(&Request::MemUnmap(vgpu_proto::MemUnmapArgs { addr, size }))
            .map(drop)
    }

    /// The handle of the allocation mapped at `addr`, retained (`MEM_RETAIN`): [handle,
    /// allocation size, mapping start, mapping size].
    pub fn mem_retain(&mut self, addr: u64) -> Result<[u64; 4]> {
        self.call(&Request::MemRetain(vgpu_proto::MemRetainArgs { addr }))
    }

    /// Asks the device to make the `len` bytes of DMA memory at device address `gpa`
    /// reachable by the GPU at this process's address `addr` of the same bytes
    /// (`HOST_MAP`, devices with `features::HOST_MAP`; a process transport only).
    pub fn host_map(&mut self, gpa: u64, len: u64, addr: u64) -> Result<()> {
        self.call(&Request::HostMap(vgpu_proto::HostMapArgs {
            gpa,
            len,
            addr,
        }))
        .map(drop)
    }

    /// Creates or looks up a shared device memory object; returns its id.
    pub fn shm_get(&mut self, key: u64, size: u64, flags: u64) -> Result<u64> {
        Ok(self.call(&Request::ShmGet(ShmGetArgs { key, size, flags }))?[0])
    }

    /// Maps a shared object; returns its device address.
    pub fn shm_at(&mut self, shmid: u64, flags: u64) -> Result<u64> {
        Ok(self.call(&Request::ShmAt(ShmAtArgs { shmid, flags }))?[0])
    }

    pub fn shm_dt(&mut self, addr: u64) -> Result<()> {
        self.call(&Request::ShmDt(ShmDtArgs { addr })).map(drop)
    }

    /// `cmd` from `vgpu_proto::args::shm_cmd`; returns the result words.
    pub fn shm_ctl(&mut self, shmid: u64, cmd: u32) -> Result<[u64; 4]> {
        self.call(&Request::ShmCtl(ShmCtlArgs {
            shmid,
            cmd,
            flags: 0,
        }))
    }

    /// Attaches a storage namespace; returns the handle the storage kernels take as `ns`.
    pub fn storage_attach(&mut self, namespace: u64) -> Result<u64> {
        Ok(self.storage_attach_info(namespace)?.handle)
    }

    /// Attaches a storage namespace; returns its handle, size, block size and mode.
    pub fn storage_attach_info(&mut self, namespace: u64) -> Result<StorageInfo> {
        let r = self.call(&Request::StorageAttach(StorageAttachArgs {
            namespace,
            flags: 0,
        }))?;
        Ok(StorageInfo {
            handle: r[0],
            bytes: r[1],
            block_size: r[2],
            read_only: r[3] != 0,
        })
    }
}
