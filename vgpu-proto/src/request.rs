//! Parsing (device side) and encoding (guest side) of the header descriptor: the
//! [`RequestHeader`] followed by the opcode's arguments.

use core::fmt;

use crate::args::*;
use crate::launch::{Deps, KernelArg, KernelArgs, LaunchArgs, MAX_DEPS, MAX_KERNEL_ARGS};
use crate::wire::{WireError, Writer};
use crate::{DeviceInfo, Opcode, RequestHeader, Status};

/// A decoded `LAUNCH`.
#[derive(Clone, Copy, Debug)]
pub struct LaunchRequest<'a> {
    /// The fixed arguments.
    pub launch: LaunchArgs,
    /// `launch.arg_count` kernel arguments.
    pub args: KernelArgs<'a>,
    /// `launch.dep_count` dependency task ids.
    pub deps: Deps<'a>,
    /// The parameter blob: the descriptor's bytes after the dependency ids, at most
    /// `MAX_PARAM_BLOB_BYTES` of them (since 1.2; empty when the descriptor ends there).
    pub blob: &'a [u8],
}

impl<'a> LaunchRequest<'a> {
    /// Checks every `Blob` argument against the parameter blob: its bytes inside it and
    /// all of them together at most `MAX_PARAM_BLOB_BYTES`. Other arguments are not
    /// looked at (their own check is [`KernelArg::typed`]).
    pub fn check_blobs(&self) -> Result<(), crate::ArgError> {
        let mut total = 0u64;
        for a in self.args.iter() {
            if let Ok(crate::ArgValue::Blob { offset, len }) = a.typed() {
                self.blob_bytes(offset, len)
                    .ok_or(crate::ArgError::BlobOutside {
                        offset: u64::from(offset),
                        len,
                    })?;
                total = total.saturating_add(u64::from(len));
            }
        }
        if total > u64::from(crate::MAX_PARAM_BLOB_BYTES) {
            return Err(crate::ArgError::BlobsTooLarge(total));
        }
        Ok(())
    }

    /// The `len` bytes at `offset` of the parameter blob, if they lie inside it.
    pub fn blob_bytes(&self, offset: u32, len: u32) -> Option<&'a [u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        self.blob.get(start..end)
    }
}

/// A decoded request (header descriptor only; data descriptors are the device's business).
#[derive(Clone, Copy, Debug)]
pub enum Request<'a> {
    /// `GET_INFO`.
    GetInfo,
    /// `GET_ATTRIBUTES`.
    GetAttributes,
    /// `ALLOC`.
    Alloc(AllocArgs),
    /// `FREE`.
    Free(FreeArgs),
    /// `MEMCPY_HTOD`.
    MemcpyHtoD(MemcpyHtoDArgs),
    /// `MEMCPY_DTOH`.
    MemcpyDtoH(MemcpyDtoHArgs),
    /// `MEMCPY_DTOD`.
    MemcpyDtoD(MemcpyDtoDArgs),
    /// `MEMSET`.
    Memset(MemsetArgs),
    /// `MODULE_LOAD`.
    ModuleLoad(ModuleLoadArgs),
    /// `MODULE_UNLOAD`.
    ModuleUnload(ModuleUnloadArgs),
    /// `GET_FUNCTION`.
    GetFunction(GetFunctionArgs),
    /// `GET_FUNCTION_LAYOUT`.
    GetFunctionLayout(GetFunctionArgs),
    /// `GET_GLOBAL`.
    GetGlobal(GetGlobalArgs),
    /// `CLUSTER_OCCUPANCY`.
    ClusterOccupancy(crate::ClusterOccupancyArgs),
    /// `LAUNCH`.
    Launch(LaunchRequest<'a>),
    /// `STREAM_SYNC`.
    StreamSync,
    /// `FENCE`.
    Fence,
    /// `EVENT_RECORD`.
    EventRecord(EventArgs),
    /// `EVENT_QUERY`.
    EventQuery(EventArgs),
    /// `EVENT_ELAPSED`.
    EventElapsed(EventElapsedArgs),
    /// `EVENT_DESTROY`.
    EventDestroy(EventArgs),
    /// `SHM_GET`.
    ShmGet(ShmGetArgs),
    /// `SHM_AT`.
    ShmAt(ShmAtArgs),
    /// `SHM_DT`.
    ShmDt(ShmDtArgs),
    /// `SHM_CTL`.
    ShmCtl(ShmCtlArgs),
    /// `STORAGE_ATTACH`.
    StorageAttach(StorageAttachArgs),
    /// `ENCODE_TENSOR_MAP`.
    EncodeTensorMap(crate::TensorMapArgs),
    /// `VA_RESERVE`.
    VaReserve(VaReserveArgs),
    /// `VA_FREE`.
    VaFree(VaFreeArgs),
    /// `MEM_CREATE`.
    MemCreate(MemCreateArgs),
    /// `MEM_RELEASE`.
    MemRelease(MemReleaseArgs),
    /// `MEM_MAP`.
    MemMap(MemMapArgs),
    /// `MEM_UNMAP`.
    MemUnmap(MemUnmapArgs),
    /// `MEM_RETAIN`.
    MemRetain(MemRetainArgs),
    /// `HOST_MAP`.
    HostMap(HostMapArgs),
}

/// Why a header descriptor could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Fewer than `RequestHeader::SIZE` bytes.
    ShortHeader {
        /// Bytes present.
        len: usize,
    },
    /// The opcode is unknown.
    UnknownOpcode(u32),
    /// Header flags are not 0.
    FlagsSet(u32),
    /// The descriptor ends before the opcode's arguments do.
    ShortArgs {
        /// The opcode.
        opcode: Opcode,
        /// Bytes needed from the start of the descriptor.
        needed: usize,
        /// Bytes present.
        len: usize,
    },
    /// `LAUNCH` with more than `MAX_KERNEL_ARGS` arguments.
    TooManyArgs(u32),
    /// `LAUNCH` with more than `MAX_DEPS` dependencies.
    TooManyDeps(u32),
}

impl ParseError {
    /// The status the device answers with.
    pub fn status(&self) -> Status {
        match self {
            ParseError::ShortHeader { .. } | ParseError::ShortArgs { .. } => Status::BadLength,
            ParseError::UnknownOpcode(_) => Status::UnknownOpcode,
            ParseError::FlagsSet(_) | ParseError::TooManyDeps(_) => Status::InvalidArgument,
            ParseError::TooManyArgs(_) => Status::BadArgCount,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::ShortHeader { len } => write!(
                f,
                "header descriptor has {len} bytes, a request header needs {}",
                RequestHeader::SIZE
            ),
            ParseError::UnknownOpcode(op) => {
                write!(
                    f,
                    "opcode {op:#x} is unknown to protocol version {:#x}",
                    crate::PROTOCOL_VERSION
                )
            }
            ParseError::FlagsSet(fl) => {
                write!(f, "header flags {fl:#x} must be 0 in this protocol version")
            }
            ParseError::ShortArgs {
                opcode,
                needed,
                len,
            } => write!(
                f,
                "{} needs {needed} bytes in its header descriptor (header + arguments), got {len}",
                opcode.name()
            ),
            ParseError::TooManyArgs(n) => {
                write!(
                    f,
                    "launch carries {n} kernel arguments, at most {MAX_KERNEL_ARGS} are allowed"
                )
            }
            ParseError::TooManyDeps(n) => {
                write!(
                    f,
                    "launch names {n} dependencies, at most {MAX_DEPS} are allowed"
                )
            }
        }
    }
}

fn need(opcode: Opcode, body: &[u8], needed: usize) -> Result<(), ParseError> {
    if body.len() < needed {
        Err(ParseError::ShortArgs {
            opcode,
            needed: RequestHeader::SIZE.saturating_add(needed),
            len: RequestHeader::SIZE.saturating_add(body.len()),
        })
    } else {
        Ok(())
    }
}

macro_rules! fixed {
    ($op:expr, $body:expr, $ty:ty, $variant:path) => {{
        need($op, $body, <$ty>::SIZE)?;
        // Cannot fail after `need`, but keep the error path rather than unwrap.
        let a = <$ty>::decode($body).map_err(|_| ParseError::ShortArgs {
            opcode: $op,
            needed: RequestHeader::SIZE + <$ty>::SIZE,
            len: RequestHeader::SIZE + $body.len(),
        })?;
        $variant(a)
    }};
}

/// Parses a header descriptor. Bytes past what the opcode needs are ignored.
///
/// On error the header (when it could be read) is returned too, so the device can echo
/// the request id.
pub fn parse_request(
    bytes: &[u8],
) -> Result<(RequestHeader, Request<'_>), (Option<RequestHeader>, ParseError)> {
    let header = RequestHeader::decode(bytes)
        .map_err(|_| (None, ParseError::ShortHeader { len: bytes.len() }))?;
    let body = bytes.get(RequestHeader::SIZE..).unwrap_or(&[]);
    parse_body(&header, body)
        .map(|r| (header, r))
        .map_err(|e| (Some(header), e))
}

fn parse_body<'a>(header: &RequestHeader, body: &'a [u8]) -> Result<Request<'a>, ParseError> {
    let op = Opcode::from_u32(header.opcode).ok_or(ParseError::UnknownOpcode(header.opcode))?;
    if header.flags != 0 {
        return Err(ParseError::FlagsSet(header.flags));
    }
    Ok(match op {
        Opcode::GetInfo => Request::GetInfo,
        Opcode::GetAttributes => Request::GetAttributes,
        Opcode::Alloc => fixed!(op, body, AllocArgs, Request::Alloc),
        Opcode::Free => fixed!(op, body, FreeArgs, Request::Free),
        Opcode::MemcpyHtoD => fixed!(op, body, MemcpyHtoDArgs, Request::MemcpyHtoD),
        Opcode::MemcpyDtoH => fixed!(op, body, MemcpyDtoHArgs, Request::MemcpyDtoH),
        Opcode::MemcpyDtoD => fixed!(op, body, MemcpyDtoDArgs, Request::MemcpyDtoD),
        Opcode::Memset => fixed!(op, body, MemsetArgs, Request::Memset),
        Opcode::ModuleLoad => fixed!(op, body, ModuleLoadArgs, Request::ModuleLoad),
        Opcode::ModuleUnload => fixed!(op, body, ModuleUnloadArgs, Request::ModuleUnload),
        Opcode::GetFunction => fixed!(op, body, GetFunctionArgs, Request::GetFunction),
        Opcode::GetFunctionLayout => {
            fixed!(op, body, GetFunctionArgs, Request::GetFunctionLayout)
        }
        Opcode::GetGlobal => fixed!(op, body, GetGlobalArgs, Request::GetGlobal),
        Opcode::ClusterOccupancy => {
            fixed!(
                op,
                body,
                crate::ClusterOccupancyArgs,
                Request::ClusterOccupancy
            )
        }
        Opcode::Launch => Request::Launch(parse_launch(body)?),
        Opcode::StreamSync => Request::StreamSync,
        Opcode::Fence => Request::Fence,
        Opcode::EventRecord => fixed!(op, body, EventArgs, Request::EventRecord),
        Opcode::EventQuery => fixed!(op, body, EventArgs, Request::EventQuery),
        Opcode::EventElapsed => fixed!(op, body, EventElapsedArgs, Request::EventElapsed),
        Opcode::EventDestroy => fixed!(op, body, EventArgs, Request::EventDestroy),
        Opcode::ShmGet => fixed!(op, body, ShmGetArgs, Request::ShmGet),
        Opcode::ShmAt => fixed!(op, body, ShmAtArgs, Request::ShmAt),
        Opcode::ShmDt => fixed!(op, body, ShmDtArgs, Request::ShmDt),
        Opcode::ShmCtl => fixed!(op, body, ShmCtlArgs, Request::ShmCtl),
        Opcode::StorageAttach => fixed!(op, body, StorageAttachArgs, Request::StorageAttach),
        Opcode::EncodeTensorMap => {
            fixed!(op, body, crate::TensorMapArgs, Request::EncodeTensorMap)
        }
        Opcode::VaReserve => fixed!(op, body, VaReserveArgs, Request::VaReserve),
        Opcode::VaFree => fixed!(op, body, VaFreeArgs, Request::VaFree),
        Opcode::MemCreate => fixed!(op, body, MemCreateArgs, Request::MemCreate),
        Opcode::MemRelease => fixed!(op, body, MemReleaseArgs, Request::MemRelease),
        Opcode::MemMap => fixed!(op, body, MemMapArgs, Request::MemMap),
        Opcode::MemUnmap => fixed!(op, body, MemUnmapArgs, Request::MemUnmap),
        Opcode::MemRetain => fixed!(op, body, MemRetainArgs, Request::MemRetain),
        Opcode::HostMap => fixed!(op, body, HostMapArgs, Request::HostMap),
    })
}

fn parse_launch(body: &[u8]) -> Result<LaunchRequest<'_>, ParseError> {
    let op = Opcode::Launch;
    let launch = fixed!(op, body, LaunchArgs, core::convert::identity);
    if launch.arg_count > MAX_KERNEL_ARGS {
        return Err(ParseError::TooManyArgs(launch.arg_count));
    }
    if launch.dep_count > MAX_DEPS {
        return Err(ParseError::TooManyDeps(launch.dep_count));
    }
    // Bounded by the checks above: at most 32 * 16 + 16 * 4 bytes, no overflow.
    let args_len = launch.arg_count as usize * KernelArg::SIZE;
    let deps_len = launch.dep_count as usize * 4;
    let total = LaunchArgs::SIZE + args_len + deps_len;
    need(op, body, total)?;
    let args_end = LaunchArgs::SIZE + args_len;
    let short = ParseError::ShortArgs {
        opcode: op,
        needed: RequestHeader::SIZE + total,
        len: RequestHeader::SIZE + body.len(),
    };
    let args = body.get(LaunchArgs::SIZE..args_end).ok_or(short)?;
    let deps = body.get(args_end..total).ok_or(short)?;
    let rest = body.get(total..).unwrap_or(&[]);
    let blob = rest
        .get(..crate::MAX_PARAM_BLOB_BYTES as usize)
        .unwrap_or(rest);
    Ok(LaunchRequest {
        launch,
        args: KernelArgs::new(args),
        deps: Deps::new(deps),
        blob,
    })
}

impl Request<'_> {
    /// The request's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::GetInfo => Opcode::GetInfo,
            Request::GetAttributes => Opcode::GetAttributes,
            Request::Alloc(_) => Opcode::Alloc,
            Request::Free(_) => Opcode::Free,
            Request::MemcpyHtoD(_) => Opcode::MemcpyHtoD,
            Request::MemcpyDtoH(_) => Opcode::MemcpyDtoH,
            Request::MemcpyDtoD(_) => Opcode::MemcpyDtoD,
            Request::Memset(_) => Opcode::Memset,
            Request::ModuleLoad(_) => Opcode::ModuleLoad,
            Request::ModuleUnload(_) => Opcode::ModuleUnload,
            Request::GetFunction(_) => Opcode::GetFunction,
            Request::GetFunctionLayout(_) => Opcode::GetFunctionLayout,
            Request::GetGlobal(_) => Opcode::GetGlobal,
            Request::ClusterOccupancy(_) => Opcode::ClusterOccupancy,
            Request::Launch(_) => Opcode::Launch,
            Request::StreamSync => Opcode::StreamSync,
            Request::Fence => Opcode::Fence,
            Request::EventRecord(_) => Opcode::EventRecord,
            Request::EventQuery(_) => Opcode::EventQuery,
            Request::EventElapsed(_) => Opcode::EventElapsed,
            Request::EventDestroy(_) => Opcode::EventDestroy,
            Request::ShmGet(_) => Opcode::ShmGet,
            Request::ShmAt(_) => Opcode::ShmAt,
            Request::ShmDt(_) => Opcode::ShmDt,
            Request::ShmCtl(_) => Opcode::ShmCtl,
            Request::StorageAttach(_) => Opcode::StorageAttach,
            Request::EncodeTensorMap(_) => Opcode::EncodeTensorMap,
            Request::VaReserve(_) => Opcode::VaReserve,
            Request::VaFree(_) => Opcode::VaFree,
            Request::MemCreate(_) => Opcode::MemCreate,
            Request::MemRelease(_) => Opcode::MemRelease,
            Request::MemMap(_) => Opcode::MemMap,
            Request::MemUnmap(_) => Opcode::MemUnmap,
            Request::MemRetain(_) => Opcode::MemRetain,
            Request::HostMap(_) => Opcode::HostMap,
        }
    }

    /// Bytes the data descriptors must add up to: exactly this many for `Readable` and
    /// `Writable` shapes and the readable part of `ReadableThenAnswer`, at least this many
    /// for `WritableInfo`, 0 otherwise.
    pub fn data_len(&self) -> u64 {
        match self {
            Request::GetInfo => DeviceInfo::SIZE as u64,
            Request::GetAttributes => crate::DeviceAttributes::SIZE as u64,
            Request::MemcpyHtoD(a) => a.size,
            Request::MemcpyDtoH(a) => a.size,
            Request::ModuleLoad(a) => a.size,
            Request::GetFunction(a) | Request::GetFunctionLayout(a) => a.name_len,
            Request::GetGlobal(a) => a.name_len,
            Request::EncodeTensorMap(_) => crate::TENSOR_MAP_BYTES as u64,
            _ => 0,
        }
    }

    /// Writes the header descriptor (header + arguments) for this request into `out`.
    /// Returns the bytes written.
    pub fn encode(&self, id: u64, out: &mut [u8]) -> Result<usize, WireError> {
        if let Request::Launch(l) = self {
            let mut args = [KernelArg::default(); MAX_KERNEL_ARGS as usize];
            let mut n = 0;
            for (slot, a) in args.iter_mut().zip(l.args.iter()) {
                *slot = a;
                n += 1;
            }
            let mut deps = [0u32; MAX_DEPS as usize];
            let mut d = 0;
            for (slot, t) in deps.iter_mut().zip(l.deps.iter()) {
                *slot = t;
                d += 1;
            }
            return crate::launch::encode_launch_with_blob(
                out,
                id,
                &l.launch,
                args.get(..n).unwrap_or(&[]),
                deps.get(..d).unwrap_or(&[]),
                l.blob,
            );
        }
        let header = RequestHeader {
            opcode: self.opcode() as u32,
            flags: 0,
            id,
        };
        let mut w = Writer::new(out);
        w.bytes(&header.to_bytes())?;
        match self {
            Request::GetInfo
            | Request::GetAttributes
            | Request::StreamSync
            | Request::Fence
            | Request::Launch(_) => {}
            Request::Alloc(a) => w.bytes(&a.to_bytes())?,
            Request::Free(a) => w.bytes(&a.to_bytes())?,
            Request::MemcpyHtoD(a) => w.bytes(&a.to_bytes())?,
            Request::MemcpyDtoH(a) => w.bytes(&a.to_bytes())?,
            Request::MemcpyDtoD(a) => w.bytes(&a.to_bytes())?,
            Request::Memset(a) => w.bytes(&a.to_bytes())?,
            Request::ModuleLoad(a) => w.bytes(&a.to_bytes())?,
            Request::ModuleUnload(a) => w.bytes(&a.to_bytes())?,
            Request::GetFunction(a) | Request::GetFunctionLayout(a) => w.bytes(&a.to_bytes())?,
            Request::GetGlobal(a) => w.bytes(&a.to_bytes())?,
            Request::ClusterOccupancy(a) => w.bytes(&a.to_bytes())?,
            Request::EventRecord(a) | Request::EventQuery(a) | Request::EventDestroy(a) => {
                w.bytes(&a.to_bytes())?
            }
            Request::EventElapsed(a) => w.bytes(&a.to_bytes())?,
            Request::ShmGet(a) => w.bytes(&a.to_bytes())?,
            Request::ShmAt(a) => w.bytes(&a.to_bytes())?,
            Request::ShmDt(a) => w.bytes(&a.to_bytes())?,
            Request::ShmCtl(a) => w.bytes(&a.to_bytes())?,
            Request::StorageAttach(a) => w.bytes(&a.to_bytes())?,
            Request::EncodeTensorMap(a) => w.bytes(&a.to_bytes())?,
            Request::VaReserve(a) => w.bytes(&a.to_bytes())?,
            Request::VaFree(a) => w.bytes(&a.to_bytes())?,
            Request::MemCreate(a) => w.bytes(&a.to_bytes())?,
            Request::MemRelease(a) => w.bytes(&a.to_bytes())?,
            Request::MemMap(a) => w.bytes(&a.to_bytes())?,
            Request::MemUnmap(a) => w.bytes(&a.to_bytes())?,
            Request::MemRetain(a) => w.bytes(&a.to_bytes())?,
            Request::HostMap(a) => w.bytes(&a.to_bytes())?,
        }
        Ok(w.pos())
    }
}
