//! A request read off its chain once: the chain's layout walked, the header parsed and
//! checked against the descriptors, a launch checked by the device
//! ([`crate::launch::Checked`]); what comes out ([`Received`]) flows on to a batch or to
//! [`Vgpu::serve`] without being read again.

use std::cell::RefCell;
use std::time::Instant;

use vgpu_proto::{DataShape, Opcode, Request};
use vm_memory::Bytes;

use crate::chain::{Chain, GuestMem, Layout};
use crate::device::{elapsed_ns, Vgpu, HEADER_BUF};
use crate::error::RequestError;
use crate::launch::Checked;

thread_local! {
    /// The header of the request this thread reads, reused: a request parses only the
    /// bytes read into it for that request, so it is not cleared (several KiB) each time.
    static HEADER: RefCell<Box<[u8; HEADER_BUF]>> = RefCell::new(Box::new([0; HEADER_BUF]));
}

/// A chain read once.
pub(crate) struct Received<'m> {
    /// The chain.
    pub chain: Chain<'m>,
    /// Its descriptors, walked once.
    pub layout: Layout,
    /// When it came off the available ring.
    pub start: Instant,
    /// The same moment on the timeline's clock (0 when no timeline is taken).
    pub kick: u64,
    /// The guest's request id (0 when the header did not parse).
    pub id: u64,
    /// The opcode the header names (`None`: unknown, or no header to read).
    pub opcode: Option<Opcode>,
    /// What to do with it.
    pub body: Body,
}

/// What a [`Received`] request asks.
pub(crate) enum Body {
    /// Nothing can be answered: the chain has no usable response descriptor.
    Unanswerable,
    /// Answered with this error: the header or the descriptors are malformed, or a launch
    /// failed the device's checks.
    Refused(RequestError),
    /// A launch that passed the device's checks.
    Launch(Box<Checked>),
    /// Any other request (none of them borrows the header).
    Other(Request<'static>),
}

impl Received<'_> {
    /// Whether it is a LAUNCH that can be answered (checked or refused).
    pub fn is_launch(&self) -> bool {
        self.opcode == Some(Opcode::Launch) && !matches!(self.body, Body::Unanswerable)
    }

    /// The function of a checked launch (0 otherwise).
    pub fn function(&self) -> u64 {
        match &self.body {
            Body::Launch(c) => c.function,
            _ => 0,
        }
    }
}

impl Vgpu {
    /// Reads `chain` once: its layout, its header parsed and checked against the
    /// descriptors, a launch checked.
    pub(crate) fn receive<'m>(&self, mem: &GuestMem, chain: Chain<'m>) -> Received<'m> {
        let start = Instant::now();
        let kick = crate::timeline::stamp();
        let layout = Layout::of(mem, &chain);
        let mut r = Received {
            chain,
            layout,
            start,
            kick,
            id: 0,
            opcode: None,
            body: Body::Unanswerable,
        };
        if r.layout.response.is_none() {
            return r;
        }
        HEADER.with_borrow_mut(|buf| match parse_request(mem, &r.layout, buf) {
            Err((id, opcode, e)) => {
                (r.id, r.opcode, r.body) = (id, opcode, Body::Refused(e));
            }
            Ok((id, req)) => {
                (r.id, r.opcode) = (id, Some(req.opcode()));
                r.body = match check_shape(&req, &r.layout) {
                    Err(e) => Body::Refused(e),
                    Ok(()) => match detach(req) {
                        Ok(other) => Body::Other(other),
                        Err(l) => match self.check_launch(&l) {
                            Ok(c) => Body::Launch(Box::new(c)),
                            Err(e) => Body::Refused(e),
                        },
                    },
                };
            }
        });
        r
    }

    /// Serves a request read by [`Vgpu::receive`] of `queue`. Returns the used length: the
    /// bytes of the writable data descriptors plus the response, or 0 when the chain has
    /// no usable response descriptor (nothing is written then).
    pub(crate) fn serve(&self, queue: u16, mem: &GuestMem, r: Received<'_>) -> u32 {
        let Some(resp) = r.layout.response else {
            tracing::debug!(queue, descriptors = r.layout.count,
                "request without a usable response descriptor (last one must be device-writable, >= 48 bytes, in guest RAM); returned with used length 0");
            self.stats.request(false, elapsed_ns(r.start));
            return 0;
        };
        let opcode = r.opcode.map_or("?", Opcode::name);
        let outcome = match r.body {
            Body::Unanswerable => return 0,
            Body::Refused(e) => Err(e),
            Body::Launch(c) => self.launch_alone(&c),
            Body::Other(req) => self.dispatch(mem, &r.chain, &r.layout, &req),
        };
        self.respond(
            queue,
            mem,
            (&resp, r.layout.data_writable_len),
            (r.id, opcode),
            outcome,
            || elapsed_ns(r.start),
        )
    }
}

/// `req` as a request that borrows nothing, or the launch it is (the one request that
/// borrows its header's bytes).
fn detach(req: Request<'_>) -> Result<Request<'static>, vgpu_proto::LaunchRequest<'_>> {
    use Request as R;
    Ok(match req {
        R::Launch(l) => return Err(l),
        R::GetInfo => R::GetInfo,
        R::GetAttributes => R::GetAttributes,
        R::Alloc(a) => R::Alloc(a),
        R::Free(a) => R::Free(a),
        R::MemcpyHtoD(a) => R::MemcpyHtoD(a),
        R::MemcpyDtoH(a) => R::MemcpyDtoH(a),
        R::MemcpyDtoD(a) => R::MemcpyDtoD(a),
        R::Memset(a) => R::Memset(a),
        R::ModuleLoad(a) => R::ModuleLoad(a),
        R::ModuleUnload(a) => R::ModuleUnload(a),
        R::GetFunction(a) => R::GetFunction(a),
        R::GetFunctionLayout(a) => R::GetFunctionLayout(a),
        R::GetGlobal(a) => R::GetGlobal(a),
        R::ClusterOccupancy(a) => R::ClusterOccupancy(a),
        R::StreamSync => R::StreamSync,
        R::Fence => R::Fence,
        R::EventRecord(a) => R::EventRecord(a),
        R::EventQuery(a) => R::EventQuery(a),
        R::EventElapsed(a) => R::EventElapsed(a),
        R::EventDestroy(a) => R::EventDestroy(a),
        R::ShmGet(a) => R::ShmGet(a),
        R::ShmAt(a) => R::ShmAt(a),
        R::ShmDt(a) => R::ShmDt(a),
        R::ShmCtl(a) => R::ShmCtl(a),
        R::StorageAttach(a) => R::StorageAttach(a),
        R::EncodeTensorMap(a) => R::EncodeTensorMap(a),
        R::VaReserve(a) => R::VaReserve(a),
        R::VaFree(a) => R::VaFree(a),
        R::MemCreate(a) => R::MemCreate(a),
        R::MemRelease(a) => R::MemRelease(a),
        R::MemMap(a) => R::MemMap(a),
        R::MemUnmap(a) => R::MemUnmap(a),
        R::MemRetain(a) => R::MemRetain(a),
        R::HostMap(a) => R::HostMap(a),
    })
}

/// A parse failure: the request id (0 when unknown), the opcode the header names (when it
/// names a known one) and why.
type ParseError = (u64, Option<Opcode>, RequestError);

/// Reads and parses the header of a chain laid out as `layout` into `buf`: the request id
/// and the request, once the chain's descriptors passed the checks every request needs.
fn parse_request<'b>(
    mem: &GuestMem,
    layout: &Layout,
    buf: &'b mut [u8; HEADER_BUF],
) -> Result<(u64, Request<'b>), ParseError> {
    let Some(header) = layout.header.filter(|_| layout.count >= 2) else {
        return Err((0, None, RequestError::TooFewDescriptors(layout.count)));
    };
    if header.is_write_only() {
        return Err((0, None, RequestError::HeaderWritable));
    }
    if let Some((0, d)) = layout.outside {
        return Err((
            0,
            None,
            RequestError::OutsideGuestMemory {
                index: 0,
                addr: d.addr().0,
                len: d.len(),
            },
        ));
    }
    let n = (header.len() as usize).min(HEADER_BUF);
    let bytes = &mut buf[..n];
    if let Err(e) = mem.read_slice(bytes, header.addr()) {
        let err = RequestError::GuestMemory {
            addr: header.addr().0,
            reason: e.to_string(),
        };
        return Err((0, None, err));
    }
    let (hdr, req) = match vgpu_proto::parse_request(bytes) {
        Ok(v) => v,
        Err((h, e)) => {
            let opcode = h.and_then(|h| Opcode::from_u32(h.opcode));
            return Err((h.map_or(0, |h| h.id), opcode, RequestError::Parse(e)));
        }
    };
    if let Some((index, d)) = layout.outside {
        return Err((
            hdr.id,
            Some(req.opcode()),
            RequestError::OutsideGuestMemory {
                index,
                addr: d.addr().0,
                len: d.len(),
            },
        ));
    }
    Ok((hdr.id, req))
}

/// Checks the data descriptors against what the opcode takes.
fn check_shape(req: &Request<'_>, l: &Layout) -> Result<(), RequestError> {
    let opcode = req.opcode().name();
    let expected = req.data_len();
    match req.opcode().data_shape() {
        DataShape::None if l.data_count != 0 => Err(RequestError::UnexpectedData {
            opcode,
            expected: 0,
            count: l.data_count,
        }),
        DataShape::None => Ok(()),
        DataShape::Readable | DataShape::Writable => {
            let writable = req.opcode().data_shape() == DataShape::Writable;
            let wrong = if writable {
                l.first_readable
            } else {
                l.first_writable
            };
            if let Some(index) = wrong {
                return Err(RequestError::DataDirection {
                    opcode,
                    index,
                    writable,
                });
            }
            if l.data_len != expected {
                return Err(RequestError::DataLength {
                    opcode,
                    expected,
                    got: l.data_len,
                });
            }
            Ok(())
        }
        DataShape::ReadableThenAnswer => {
            // Readable descriptors, then one writable one: the first writable is the last.
            if l.data_count < 2 || l.first_writable != Some(l.data_count) {
                return Err(RequestError::DataDirection {
                    opcode,
                    index: l.first_writable.unwrap_or(l.data_count),
                    writable: l.first_writable.is_none(),
                });
            }
            let readable = l.data_len - l.data_writable_len;
            if readable != expected {
                return Err(RequestError::DataLength {
                    opcode,
                    expected,
                    got: readable,
                });
            }
            let answer = vgpu_proto::ParamLayout::SIZE as u64;
            if l.data_writable_len < answer {
                return Err(RequestError::DataLength {
                    opcode,
                    expected: answer,
                    got: l.data_writable_len,
                });
            }
            Ok(())
        }
        DataShape::WritableInfo => {
            if l.data_count != 1 {
                return Err(RequestError::UnexpectedData {
                    opcode,
                    expected: 1,
                    count: l.data_count,
                });
            }
            if let Some(index) = l.first_readable {
                return Err(RequestError::DataDirection {
                    opcode,
                    index,
                    writable: true,
                });
            }
            if l.data_len < expected {
                return Err(RequestError::DataLength {
                    opcode,
                    expected,
                    got: l.data_len,
                });
            }
            Ok(())
        }
    }
}
