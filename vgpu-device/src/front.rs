//! The worker's front door for its vhost-user frontend (docs/hostile.md, "A tenant's
//! vhost-user frontend"). The frontend is the tenant's side: every message it sends is
//! read here first, and only what this device negotiated and can take goes on to the
//! vhost-user-backend daemon, over a private socket pair:
//!
//! - an allowlist of requests: those the vGPU device uses, each only once its protocol
//!   feature is negotiated; the frontend may ack only protocol features that were offered
//!   (so `ADD_MEM_REG`, `GET_MAX_MEM_SLOTS`, inflight and backend-request channels, never
//!   offered, are refused);
//! - `SET_MEM_TABLE`: at most [`MAX_REGIONS`] regions of at most the worker's
//!   `--max-guest-memory` bytes together ([`DEFAULT_MAX_GUEST_MEMORY`] unless vgpud says
//!   otherwise): what the worker maps and the backend may pin in host memory, charged to
//!   the vGPU as its `pinned_host_bytes`; `ADD_MEM_REG`, were it negotiated, may not take
//!   the total past the same bound;
//! - `SET_LOG_BASE`: the dirty log must be one memfd sealed against shrinking, holding the
//!   log area, which must cover the memory table (a log that could shrink or is too small
//!   would crash the worker with SIGBUS on its next write);
//! - `SET_CONFIG`: the config space is read-only;
//! - ring requests name an existing queue.
//!
//! A refused message does not reach the daemon: the frontend gets a negative
//! `REPLY_ACK` when it asked for one and the connection goes on; a refused request that
//! expects an answer (a `GET_*`) ends the connection. Either way the vGPU's state stays.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Most memory regions a memory table may have (vhost-user's own limit for
/// `SET_MEM_TABLE`).
pub const MAX_REGIONS: usize = 8;
/// Most guest RAM, in bytes, one memory table may map (and the backend pin) when the
/// worker is given no `--max-guest-memory`: vgpud's largest VM (docs/api.md).
pub const DEFAULT_MAX_GUEST_MEMORY: u64 = 64 << 30;
/// Largest message body (vhost-user's `MAX_MSG_SIZE`).
const MAX_BODY: usize = 0x1000;
/// Most descriptors one message may carry.
const MAX_FDS: usize = 32;
const HEADER: usize = 12;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
/// Size of one memory region in `SET_MEM_TABLE`.
const REGION: usize = 32;
/// Guest bytes one byte of the dirty log covers (8 pages of 4 KiB).
const LOG_BYTE_COVERS: u64 = 8 * 4096;

/// One message from the frontend.
struct Msg {
    req: u32,
    flags: u32,
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// What the frontend negotiated so far, and what the device offers.
pub struct Gate {
    /// Protocol features the device offers (`REPLY_ACK` included).
    offered: u64,
    /// Queues the device has.
    queues: u32,
    /// Protocol features the frontend acked.
    acked: u64,
    /// The end of guest-physical memory in the current table.
    ram_end: u64,
    /// Bytes of guest memory in the current table.
    ram_total: u64,
    /// Most bytes of guest memory the frontend may have mapped at once.
    max_guest_memory: u64,
}

/// How a message was judged.
enum Verdict {
    Pass,
    /// Refused, with why.
    Refuse(String),
}

impl Gate {
    /// A gate for a device offering `offered` protocol features over `queues` queues.
    pub fn new(offered: VhostUserProtocolFeatures, queues: u32) -> Self {
        Self {
            offered: (offered | VhostUserProtocolFeatures::REPLY_ACK).bits(),
            queues,
            acked: 0,
            ram_end: 0,
            ram_total: 0,
            max_guest_memory: DEFAULT_MAX_GUEST_MEMORY,
        }
    }

    /// The same gate, allowing at most `bytes` of guest memory mapped at once.
    pub fn with_max_guest_memory(mut self, bytes: u64) -> Self {
        self.max_guest_memory = bytes;
        self
    }

    fn has(&self, f: VhostUserProtocolFeatures) -> bool {
        self.acked & f.bits() != 0
    }

    fn judge(&mut self, m: &Msg) -> Verdict {
        match self.check(m) {
            Ok(()) => Verdict::Pass,
            Err(why) => Verdict::Refuse(why),
        }
    }

    fn check(&mut self, m: &Msg) -> Result<(), String> {
        use VhostUserProtocolFeatures as P;
        let code =
            FrontendReq::try_from(m.req).map_err(|_| format!("unknown request {}", m.req))?;
        let need = |on: bool, f: &str| {
            if on {
                Ok(())
            } else {
                Err(format!(
                    "{code:?} needs protocol feature {f}, not negotiated"
                ))
            }
        };
        match code {
            FrontendReq::GET_FEATURES
            | FrontendReq::SET_FEATURES
            | FrontendReq::SET_OWNER
            | FrontendReq::GET_PROTOCOL_FEATURES => Ok(()),
            FrontendReq::SET_PROTOCOL_FEATURES => {
                let v = u64_at(&m.body, 0)?;
                if v & !self.offered != 0 {
                    return Err(format!(
                        "protocol features {:#x} were never offered (offered {:#x})",
                        v & !self.offered,
                        self.offered
                    ));
                }
                self.acked = v;
                Ok(())
            }
            FrontendReq::GET_QUEUE_NUM => need(self.has(P::MQ), "MQ"),
            FrontendReq::GET_CONFIG => need(self.has(P::CONFIG), "CONFIG"),
            FrontendReq::SET_CONFIG => Err("the vGPU's config space is read-only".into()),
            FrontendReq::SET_MEM_TABLE => self.memory_table(m),
            FrontendReq::ADD_MEM_REG => {
                need(self.has(P::CONFIGURE_MEM_SLOTS), "CONFIGURE_MEM_SLOTS")?;
                self.add_region(m)
            }
            FrontendReq::SET_LOG_BASE => {
                need(self.has(P::LOG_SHMFD), "LOG_SHMFD")?;
                self.log_base(m)
            }
            FrontendReq::SET_VRING_NUM
            | FrontendReq::SET_VRING_ADDR
            | FrontendReq::SET_VRING_BASE
            | FrontendReq::GET_VRING_BASE
            | FrontendReq::SET_VRING_ENABLE => {
                let index = u32_at(&m.body, 0)?;
                self.queue(code, u64::from(index))
            }
            FrontendReq::SET_VRING_KICK
            | FrontendReq::SET_VRING_CALL
            | FrontendReq::SET_VRING_ERR => {
                // The index is the low byte; bit 8 says "no descriptor".
                let v = u64_at(&m.body, 0)?;
                self.queue(code, v & 0xff)
            }
            other => Err(format!("{other:?} is not served by the vGPU device")),
        }
    }

    fn queue(&self, code: FrontendReq, index: u64) -> Result<(), String> {
        if index < u64::from(self.queues) {
            Ok(())
        } else {
            Err(format!(
                "{code:?} for queue {index}; the device has {}",
                self.queues
            ))
        }
    }

    fn memory_table(&mut self, m: &Msg) -> Result<(), String> {
        let n = u32_at(&m.body, 0)? as usize;
        if n == 0 || n > MAX_REGIONS {
            return Err(format!(
                "a memory table of {n} regions (1 to {MAX_REGIONS})"
            ));
        }
        if m.fds.len() != n || m.body.len() < 8 + n * REGION {
            return Err(format!(
                "a memory table of {n} regions with {} descriptors and {} bytes",
                m.fds.len(),
                m.body.len()
            ));
        }
        let mut total = 0u64;
        let mut end = 0u64;
        for i in 0..n {
            let at = 8 + i * REGION;
            let gpa = u64_at(&m.body, at)?;
            let size = u64_at(&m.body, at + 8)?;
            total = total.saturating_add(size);
            end = end.max(gpa.saturating_add(size));
        }
        self.bounded(total)?;
        self.ram_end = end;
        self.ram_total = total;
        Ok(())
    }

    /// `ADD_MEM_REG`: one region more, within the same bound as a whole table.
    fn add_region(&mut self, m: &Msg) -> Result<(), String> {
        if m.fds.len() != 1 {
            return Err(format!(
                "a memory region with {} descriptors (one)",
                m.fds.len()
            ));
        }
        // A u64 of padding, then the region as in a table.
        let gpa = u64_at(&m.body, 8)?;
        let size = u64_at(&m.body, 16)?;
        let total = self.ram_total.saturating_add(size);
        self.bounded(total)?;
        self.ram_end = self.ram_end.max(gpa.saturating_add(size));
        self.ram_total = total;
        Ok(())
    }

    /// Whether `total` bytes of guest memory may be mapped and pinned for this vGPU.
    fn bounded(&self, total: u64) -> Result<(), String> {
        if total > self.max_guest_memory {
            return Err(format!(
                "{total} bytes of guest memory; this vGPU's worker maps and pins at most {} \
                 (its --max-guest-memory: the VM's memory size when vgpud launched the VM \
                 with it)",
                self.max_guest_memory
            ));
        }
        Ok(())
    }

    fn log_base(&self, m: &Msg) -> Result<(), String> {
        let size = u64_at(&m.body, 0)?;
        let offset = u64_at(&m.body, 8)?;
        let [fd] = m.fds.as_slice() else {
            return Err(format!(
                "a dirty log with {} descriptors (one memfd)",
                m.fds.len()
            ));
        };
        // SAFETY: F_GET_SEALS on a descriptor this message carries; no memory is passed.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(format!(
                "the dirty log is not a memfd ({}); send a memfd sealed with F_SEAL_SHRINK",
                io::Error::last_os_error()
            ));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(format!(
                "the dirty log's memfd may still shrink (seals {seals:#x}); seal it with F_SEAL_SHRINK"
            ));
        }
        let file_size = File::from(fd.try_clone().map_err(|e| e.to_string())?)
            .metadata()
            .map_err(|e| format!("cannot read the dirty log's size: {e}"))?
            .len();
        let end = offset
            .checked_add(size)
            .ok_or_else(|| "the dirty log's offset and size overflow".to_owned())?;
        if end > file_size {
            return Err(format!(
                "the dirty log maps bytes {offset:#x}..{end:#x} of a memfd of {file_size:#x}"
            ));
        }
        let need = self.ram_end.div_ceil(LOG_BYTE_COVERS);
        if size < need {
            return Err(format!(
                "a dirty log of {size} bytes; guest memory up to {:#x} needs {need}",
                self.ram_end
            ));
        }
        Ok(())
    }
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| "a message body too short for its request".to_owned())
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, String> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| "a message body too short for its request".to_owned())
}

/// Reads one message: `None` at end of stream.
fn recv(s: &UnixStream) -> io::Result<Option<Msg>> {
    let mut hdr = [0u8; HEADER];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: hdr.as_mut_ptr().cast(),
        iov_len: HEADER,
    }];
    // SAFETY: the iovec points at `hdr`, which outlives the call and takes any bytes.
    let (n, nfds) = unsafe { s.recv_with_fds(&mut iov, &mut raw) }.map_err(io::Error::from)?;
    // SAFETY: recvmsg made these descriptors ours; each is wrapped once and closed on drop.
    let fds: Vec<OwnedFd> = raw[..nfds]
        .iter()
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    (&*s).read_exact(&mut hdr[n..])?;
    let word = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
    let (req, flags, size) = (word(0), word(4), word(8) as usize);
    if size > MAX_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {size} bytes (at most {MAX_BODY})"),
        ));
    }
    let mut body = vec![0u8; size];
    (&*s).read_exact(&mut body)?;
    Ok(Some(Msg {
        req,
        flags,
        body,
        fds,
    }))
}

/// Sends `m` whole, its descriptors with its first bytes.
fn send(s: &UnixStream, m: &Msg) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(HEADER + m.body.len());
    bytes.extend_from_slice(&m.req.to_le_bytes());
    bytes.extend_from_slice(&m.flags.to_le_bytes());
    bytes.extend_from_slice(&(m.body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&m.body);
    let fds: Vec<RawFd> = m.fds.iter().map(AsRawFd::as_raw_fd).collect();
    let n = s
        .send_with_fds(&[bytes.as_slice()], &fds)
        .map_err(io::Error::from)?;
    (&*s).write_all(&bytes[n..])
}

/// The negative `REPLY_ACK` for request `m`.
fn nack(s: &UnixStream, m: &Msg) -> io::Result<()> {
    send(
        s,
        &Msg {
            req: m.req,
            flags: FLAG_VERSION | FLAG_REPLY,
            body: 1u64.to_le_bytes().to_vec(),
            fds: Vec::new(),
        },
    )
}

/// Whether request `req` always has an answer (the frontend waits for it; `SET_LOG_BASE`
/// is answered with the log area).
fn answers(req: u32) -> bool {
    matches!(
        FrontendReq::try_from(req),
        Ok(FrontendReq::GET_FEATURES
            | FrontendReq::GET_PROTOCOL_FEATURES
            | FrontendReq::GET_VRING_BASE
            | FrontendReq::GET_QUEUE_NUM
            | FrontendReq::GET_CONFIG
            | FrontendReq::GET_INFLIGHT_FD
            | FrontendReq::GET_MAX_MEM_SLOTS
            | FrontendReq::GET_SHARED_OBJECT
            | FrontendReq::SET_LOG_BASE
            | FrontendReq::SET_DEVICE_STATE_FD
            | FrontendReq::CHECK_DEVICE_STATE)
    ) || FrontendReq::try_from(req).is_err()
}

/// Tells the daemon over its channel `daemon` that the last frontend is gone
/// (`RESET_OWNER`, no answer), so that the next one may claim it with `SET_OWNER`.
pub fn reset_owner(daemon: &UnixStream) -> io::Result<()> {
    send(
        daemon,
        &Msg {
            req: FrontendReq::RESET_OWNER as u32,
            flags: FLAG_VERSION,
            body: Vec::new(),
            fds: Vec::new(),
        },
    )
}

/// How a frontend connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The frontend hung up (or the daemon's side closed).
    Gone,
    /// A refused request that expects an answer: the connection was closed.
    Refused(String),
}

/// Carries one frontend connection to the daemon's end `daemon`, through `gate`, until
/// either side closes. Answers come back unchanged (they carry no descriptors in what the
/// device negotiates).
pub fn carry(frontend: UnixStream, daemon: UnixStream, gate: &mut Gate, vgpu: u32) -> Ended {
    let (Ok(f_back), Ok(d_back)) = (frontend.try_clone(), daemon.try_clone()) else {
        return Ended::Gone;
    };
    // Answers: daemon -> frontend, byte for byte.
    let answers_thread = std::thread::Builder::new()
        .name("vhost-answers".into())
        .spawn(move || {
            let mut d = d_back;
            let mut f = f_back;
            let _ = io::copy(&mut d, &mut f);
            let _ = f.shutdown(std::net::Shutdown::Both);
        });
    // Refusals logged one by one; past that, counted (a frontend cannot flood the log).
    const LOGGED: u32 = 4;
    let mut refused = 0u32;
    let ended = loop {
        let m = match recv(&frontend) {
            Ok(Some(m)) => m,
            Ok(None) => break Ended::Gone,
            Err(e) => {
                tracing::debug!(vgpu, error = %e, "frontend connection ended");
                break Ended::Gone;
            }
        };
        match gate.judge(&m) {
            Verdict::Pass => {
                if send(&daemon, &m).is_err() {
                    break Ended::Gone;
                }
            }
            Verdict::Refuse(why) => {
                refused = refused.saturating_add(1);
                if refused <= LOGGED {
                    tracing::warn!(vgpu, request = m.req, %why, "refused a frontend request");
                } else {
                    tracing::debug!(vgpu, request = m.req, %why, "refused a frontend request");
                }
                let ack = gate.has(VhostUserProtocolFeatures::REPLY_ACK)
                    && m.flags & FLAG_NEED_REPLY != 0;
                if ack && !answers(m.req) {
                    if nack(&frontend, &m).is_err() {
                        break Ended::Gone;
                    }
                } else if answers(m.req) {
                    break Ended::Refused(why);
                }
                // Otherwise the frontend asked for no answer: the request is dropped.
            }
        }
    };
    if refused > LOGGED {
        tracing::warn!(
            vgpu,
            refused,
            "refused frontend requests on this connection"
        );
    }
    let _ = frontend.shutdown(std::net::Shutdown::Both);
    let _ = daemon.shutdown(std::net::Shutdown::Both);
    if let Ok(t) = answers_thread {
        let _ = t.join();
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(req: FrontendReq, body: &[u8], fds: Vec<OwnedFd>) -> Msg {
        Msg {
            req: req as u32,
            flags: FLAG_VERSION,
            body: body.to_vec(),
            fds,
        }
    }

    fn memfd(size: u64, seals: i32) -> OwnedFd {
        // SAFETY: a fresh memfd with a constant name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"front-test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: `fd` is fresh and ours; ftruncate and fcntl only act on it.
        unsafe {
            let fd = OwnedFd::from_raw_fd(fd);
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), size as libc::off_t), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
            }
            fd
        }
    }

    fn words(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn gate() -> Gate {
        let offered = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::LOG_SHMFD;
        let mut g = Gate::new(offered, 2);
        let acked = (offered | VhostUserProtocolFeatures::REPLY_ACK).bits();
        let m = msg(
            FrontendReq::SET_PROTOCOL_FEATURES,
            &words(&[acked]),
            Vec::new(),
        );
        assert!(g.check(&m).is_ok());
        g
    }

    #[test]
    fn only_offered_features_and_served_requests_pass() {
        let mut g = gate();
        let slots = VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits();
        let m = msg(
            FrontendReq::SET_PROTOCOL_FEATURES,
            &words(&[slots]),
            Vec::new(),
        );
        assert!(g
            .check(&m)
            .expect_err("never offered")
            .contains("never offered"));
        for req in [
            FrontendReq::ADD_MEM_REG,
            FrontendReq::REM_MEM_REG,
            FrontendReq::GET_MAX_MEM_SLOTS,
            FrontendReq::SET_INFLIGHT_FD,
            FrontendReq::SET_BACKEND_REQ_FD,
            FrontendReq::RESET_OWNER,
            FrontendReq::SET_CONFIG,
        ] {
            assert!(g.check(&msg(req, &[0; 40], Vec::new())).is_err(), "{req:?}");
        }
        let unknown = Msg {
            req: 999,
            flags: FLAG_VERSION,
            body: Vec::new(),
            fds: Vec::new(),
        };
        assert!(g.check(&unknown).is_err());
        assert!(answers(999) && answers(FrontendReq::GET_MAX_MEM_SLOTS as u32));
        // Ring requests name an existing queue (2 here); KICK/CALL carry it in the low byte.
        let ring = |req, index: u64| msg(req, &words(&[index]), Vec::new());
        assert!(g.check(&ring(FrontendReq::SET_VRING_NUM, 1)).is_ok());
        assert!(g.check(&ring(FrontendReq::SET_VRING_NUM, 2)).is_err());
        assert!(g.check(&ring(FrontendReq::SET_VRING_KICK, 0x101)).is_ok());
        assert!(g.check(&ring(FrontendReq::SET_VRING_CALL, 0x102)).is_err());
        // A short body is refused, not read past.
        assert!(g
            .check(&msg(FrontendReq::SET_VRING_NUM, &[1], Vec::new()))
            .is_err());
        // Features not acked yet are refused.
        let mut fresh = Gate::new(VhostUserProtocolFeatures::MQ, 1);
        assert!(fresh
            .check(&msg(FrontendReq::GET_QUEUE_NUM, &[], Vec::new()))
            .is_err());
    }

    #[test]
    fn memory_tables_are_bounded_and_logs_must_be_sealed_and_cover_them() {
        let mut g = gate();
        let table = |regions: &[(u64, u64)]| {
            let mut b = Vec::new();
            b.extend_from_slice(&(regions.len() as u32).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            for (gpa, size) in regions {
                b.extend_from_slice(&words(&[*gpa, *size, 0x7f00_0000_0000, 0]));
            }
            let fds = regions.iter().map(|_| memfd(0, 0)).collect();
            msg(FrontendReq::SET_MEM_TABLE, &b, fds)
        };
        let nine: Vec<(u64, u64)> = (0..9).map(|i| (i << 30, 1 << 30)).collect();
        assert!(g.check(&table(&nine)).is_err(), "9 regions");
        assert!(
            g.check(&table(&[(0, DEFAULT_MAX_GUEST_MEMORY + 4096)]))
                .is_err(),
            "too big"
        );
        // A worker given a smaller bound holds its frontend to it.
        let mut small = gate().with_max_guest_memory(1 << 30);
        assert!(small.check(&table(&[(0, 1 << 30)])).is_ok());
        let two = table(&[(0, 1 << 30), (1 << 32, 4096)]);
        assert!(small
            .check(&two)
            .expect_err("over the bound")
            .contains("at most 1073741824"));
        // ADD_MEM_REG, were it offered and negotiated, adds to the same total.
        let slots = VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        let mut adding = Gate::new(slots, 1).with_max_guest_memory(1 << 30);
        let ack = (slots | VhostUserProtocolFeatures::REPLY_ACK).bits();
        let features = msg(
            FrontendReq::SET_PROTOCOL_FEATURES,
            &words(&[ack]),
            Vec::new(),
        );
        assert!(adding.check(&features).is_ok());
        assert!(adding.check(&table(&[(0, 1 << 29)])).is_ok());
        let add = |size: u64| {
            let body = words(&[0, 1 << 32, size, 0x7f00_0000_0000, 0]);
            msg(FrontendReq::ADD_MEM_REG, &body, vec![memfd(0, 0)])
        };
        assert!(adding.check(&add(1 << 29)).is_ok());
        assert!(adding.check(&add(4096)).is_err(), "past the bound");
        assert!(g.check(&table(&[(0, 64 << 20)])).is_ok());
        let area = (64u64 << 20) / LOG_BYTE_COVERS;
        let log = |size: u64, fd| msg(FrontendReq::SET_LOG_BASE, &words(&[size, 0]), vec![fd]);
        assert!(
            g.check(&log(area, memfd(0, libc::F_SEAL_SHRINK))).is_err(),
            "0 bytes"
        );
        assert!(g.check(&log(area, memfd(area, 0))).is_err(), "unsealed");
        assert!(
            g.check(&log(area / 2, memfd(area, libc::F_SEAL_SHRINK)))
                .is_err(),
            "short"
        );
        assert!(g
            .check(&log(area, memfd(area, libc::F_SEAL_SHRINK)))
            .is_ok());
        let two = msg(
            FrontendReq::SET_LOG_BASE,
            &words(&[area, 0]),
            vec![
                memfd(area, libc::F_SEAL_SHRINK),
                memfd(area, libc::F_SEAL_SHRINK),
            ],
        );
        assert!(g.check(&two).is_err(), "two descriptors");
        let overflow = msg(
            FrontendReq::SET_LOG_BASE,
            &words(&[area, u64::MAX]),
            vec![memfd(area, libc::F_SEAL_SHRINK)],
        );
        assert!(g.check(&overflow).is_err(), "offset overflow");
    }
}
