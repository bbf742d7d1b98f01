//! The migration stream's framing (docs/migration.md, "Whole-VM migration between
//! hosts"): every message is a 16-byte header (magic `VGMM`, version, message type,
//! payload length, reserved zero) and its payload. The incoming stream is untrusted: every
//! length is checked against a per-type cap before anything is read or allocated, and RAM
//! runs are checked against the destination's guest memory before a byte is written.

use std::io::{Read, Write};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::snapshot::{VmDescription, VmSnapshot};

/// `VGMM`, little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"VGMM");
/// The stream format version; a peer speaking another one is refused.
pub const WIRE_VERSION: u16 = 1;
pub const HEADER_LEN: usize = 16;
/// Largest RAM run one message carries (the source sends at most this much per message).
pub const MAX_RAM_RUN: usize = 4 << 20;
/// Largest VM description.
pub const MAX_DESCRIPTION: usize = 64 << 10;
/// Largest device and vCPU state (16 vCPUs of a few tens of KiB each, with room).
pub const MAX_STATE: usize = 16 << 20;
/// Largest error message.
pub const MAX_ERROR: usize = 4 << 10;

/// Message types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// Source to destination, first: the VM's shape (JSON `VmDescription`).
    Describe = 1,
    /// Source to destination: guest RAM, a little-endian u64 guest physical address and the
    /// bytes from there.
    Ram = 2,
    /// Source to destination, after the last RAM: vCPU and device state (JSON `VmSnapshot`).
    State = 3,
    /// Destination to source: everything is restored; waiting for the commit.
    Ready = 4,
    /// Source to destination: the source has stopped for good; run the VM.
    Commit = 5,
    /// Either way: the sender gives up; the payload says why (UTF-8).
    Error = 6,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Self::Describe,
            2 => Self::Ram,
            3 => Self::State,
            4 => Self::Ready,
            5 => Self::Commit,
            6 => Self::Error,
            _ => return None,
        })
    }

    /// The most payload bytes a message of this type may have.
    pub fn max_len(self) -> usize {
        match self {
            Self::Describe => MAX_DESCRIPTION,
            Self::Ram => 8 + MAX_RAM_RUN,
            Self::State => MAX_STATE,
            Self::Ready | Self::Commit => 0,
            Self::Error => MAX_ERROR,
        }
    }
}

/// Why the stream cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the migration stream failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the migration stream ended in the middle of a message")]
    Truncated,
    #[error("the peer closed the migration stream")]
    Closed,
    #[error("not a vmm migration stream (bad magic {0:#010x})")]
    BadMagic(u32),
    #[error("the peer speaks migration stream version {0}; this vmm speaks {WIRE_VERSION}")]
    Version(u16),
    #[error("unknown message type {0} in the migration stream")]
    UnknownKind(u16),
    #[error("a {kind:?} message of {len} bytes exceeds its limit of {max} bytes")]
    TooLong { kind: Kind, len: usize, max: usize },
    #[error("the header's reserved field is {0:#x}, not zero")]
    Reserved(u32),
    #[error("a RAM message is shorter than its address or carries no bytes")]
    ShortRam,
    #[error("RAM run {gpa:#x}+{len:#x} lies outside this VM's guest memory")]
    OutsideRam { gpa: u64, len: usize },
    #[error("a {0:?} message's JSON is invalid: {1}")]
    Json(Kind, serde_json::Error),
    #[error("the peer reported an error: {0}")]
    Peer(String),
    #[error("expected a {want} message, got {got:?}")]
    Unexpected { want: &'static str, got: Kind },
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub len: usize,
}

/// Checks a header's magic, version, type, reserved field and length cap.
pub fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let magic = u32_at(0);
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != WIRE_VERSION {
        return Err(WireError::Version(version));
    }
    let raw_kind = u16::from_le_bytes([b[6], b[7]]);
    let kind = Kind::from_u16(raw_kind).ok_or(WireError::UnknownKind(raw_kind))?;
    let len = u32_at(8) as usize;
    let reserved = u32_at(12);
    if reserved != 0 {
        return Err(WireError::Reserved(reserved));
    }
    if len > kind.max_len() {
        return Err(WireError::TooLong {
            kind,
            len,
            max: kind.max_len(),
        });
    }
    Ok(Header { kind, len })
}

/// Encodes a header.
pub fn encode_header(kind: Kind, len: usize) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    b[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    b[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    b
}

/// One decoded message; a RAM run borrows the reader's buffer.
#[derive(Debug)]
pub enum Message<'a> {
    Describe(VmDescription),
    Ram { gpa: u64, data: &'a [u8] },
    State(Box<VmSnapshot>),
    Ready,
    Commit,
    Error(String),
}

impl Message<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            Self::Describe(_) => Kind::Describe,
            Self::Ram { .. } => Kind::Ram,
            Self::State(_) => Kind::State,
            Self::Ready => Kind::Ready,
            Self::Commit => Kind::Commit,
            Self::Error(_) => Kind::Error,
        }
    }
}

/// Reads exactly `buf.len()` bytes; a clean end before the first byte is `Closed` when
/// `at_boundary`, any other short read `Truncated`.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8], at_boundary: bool) -> Result<(), WireError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 && at_boundary => return Err(WireError::Closed),
            Ok(0) => return Err(WireError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(WireError::Io(e)),
        }
    }
    Ok(())
}

/// Reads one message. `buf` is reused between calls and never grows beyond the largest
/// cap (`MAX_STATE`).
pub fn read_message<'b, R: Read>(
    r: &mut R,
    buf: &'b mut Vec<u8>,
) -> Result<Message<'b>, WireError> {
    let mut hb = [0u8; HEADER_LEN];
    read_full(r, &mut hb, true)?;
    let h = decode_header(&hb)?;
    // The buffer only grows (to at most the largest cap), so a run of RAM messages
    // costs no allocation or clearing.
    if buf.len() < h.len {
        buf.resize(h.len, 0);
    }
    read_full(r, &mut buf[..h.len], false)?;
    let buf: &'b [u8] = &buf[..h.len];
    Ok(match h.kind {
        Kind::Describe => {
            Message::Describe(serde_json::from_slice(buf).map_err(|e| WireError::Json(h.kind, e))?)
        }
        Kind::State => Message::State(Box::new(
            serde_json::from_slice(buf).map_err(|e| WireError::Json(h.kind, e))?,
        )),
        Kind::Ram => {
            if buf.len() <= 8 {
                return Err(WireError::ShortRam);
            }
            let (a, data) = buf.split_at(8);
            let mut gpa = [0u8; 8];
            gpa.copy_from_slice(a);
            Message::Ram {
                gpa: u64::from_le_bytes(gpa),
                data,
            }
        }
        Kind::Ready => Message::Ready,
        Kind::Commit => Message::Commit,
        Kind::Error => Message::Error(String::from_utf8_lossy(buf).into_owned()),
    })
}

/// Writes a message of `kind` whose payload is the concatenation of `parts`.
pub fn write_message<W: Write>(w: &mut W, kind: Kind, parts: &[&[u8]]) -> Result<(), WireError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(len <= kind.max_len());
    w.write_all(&encode_header(kind, len))?;
    for p in parts {
        w.write_all(p)?;
    }
    Ok(())
}

/// Writes a JSON message.
pub fn write_json<W: Write, T: serde::Serialize>(
    w: &mut W,
    kind: Kind,
    v: &T,
) -> Result<(), WireError> {
    let body = serde_json::to_vec(v).map_err(|e| WireError::Json(kind, e))?;
    if body.len() > kind.max_len() {
        return Err(WireError::TooLong {
            kind,
            len: body.len(),
            max: kind.max_len(),
        });
    }
    write_message(w, kind, &[&body])
}

/// Writes an error message, cut to the cap.
pub fn write_error<W: Write>(w: &mut W, why: &str) -> Result<(), WireError> {
    let mut end = why.len().min(MAX_ERROR);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    write_message(w, Kind::Error, &[&why.as_bytes()[..end]])
}

/// Copies a RAM run into guest memory after checking that all of it lies inside one
/// region of `mem`.
pub fn apply_ram(mem: &GuestMemoryMmap, gpa: u64, data: &[u8]) -> Result<(), WireError> {
    let outside = || WireError::OutsideRam {
        gpa,
        len: data.len(),
    };
    gpa.checked_add(data.len() as u64).ok_or_else(outside)?;
    // get_slice fails on an address or range not backed by one region.
    let slice = mem
        .get_slice(GuestAddress(gpa), data.len())
        .map_err(|_| outside())?;
    // SAFETY: `slice` covers `data.len()` bytes of a live guest mapping (checked above);
    // `data` is a separate buffer of that length.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), slice.ptr_guard_mut().as_ptr(), data.len())
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram_msg(gpa: u64, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        write_message(&mut v, Kind::Ram, &[&gpa.to_le_bytes(), data]).unwrap();
        v
    }

    #[test]
    fn round_trip() {
        let mut s = ram_msg(0x1000, &[1, 2, 3]);
        write_message(&mut s, Kind::Commit, &[]).unwrap();
        write_error(&mut s, "no room").unwrap();
        let mut r = s.as_slice();
        let mut buf = Vec::new();
        match read_message(&mut r, &mut buf).unwrap() {
            Message::Ram { gpa, data } => {
                assert_eq!(gpa, 0x1000);
                assert_eq!(data, &[1, 2, 3]);
            }
            m => panic!("{m:?}"),
        }
        assert!(matches!(
            read_message(&mut r, &mut buf).unwrap(),
            Message::Commit
        ));
        assert!(
            matches!(read_message(&mut r, &mut buf).unwrap(), Message::Error(e) if e == "no room")
        );
        assert!(matches!(
            read_message(&mut r, &mut buf),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn hostile_headers_are_refused_before_reading_the_payload() {
        let mut buf = Vec::new();
        let mut h = encode_header(Kind::State, MAX_STATE + 1);
        assert!(matches!(
            read_message(&mut h.as_slice(), &mut buf),
            Err(WireError::TooLong { .. })
        ));
        assert!(buf.capacity() < MAX_STATE);
        h = encode_header(Kind::Ram, 16);
        h[0] ^= 1;
        assert!(matches!(
            read_message(&mut h.as_slice(), &mut buf),
            Err(WireError::BadMagic(_))
        ));
        h = encode_header(Kind::Ram, 16);
        h[4] = 9;
        assert!(matches!(
            read_message(&mut h.as_slice(), &mut buf),
            Err(WireError::Version(9))
        ));
        h = encode_header(Kind::Ram, 16);
        h[6] = 77;
        assert!(matches!(
            read_message(&mut h.as_slice(), &mut buf),
            Err(WireError::UnknownKind(77))
        ));
        h = encode_header(Kind::Ram, 16);
        h[12] = 1;
        assert!(matches!(
            read_message(&mut h.as_slice(), &mut buf),
            Err(WireError::Reserved(1))
        ));
        let full = ram_msg(0, &[0; 64]);
        assert!(matches!(
            read_message(&mut &full[..40], &mut buf),
            Err(WireError::Truncated)
        ));
        assert!(matches!(
            read_message(&mut &full[..7], &mut buf),
            Err(WireError::Truncated)
        ));
        let short = {
            let mut v = Vec::new();
            write_message(&mut v, Kind::Ram, &[&[1, 2, 3]]).unwrap();
            v
        };
        assert!(matches!(
            read_message(&mut short.as_slice(), &mut buf),
            Err(WireError::ShortRam)
        ));
        let mut bad_json = Vec::new();
        write_message(&mut bad_json, Kind::State, &[b"{not json"]).unwrap();
        assert!(matches!(
            read_message(&mut bad_json.as_slice(), &mut buf),
            Err(WireError::Json(..))
        ));
    }

    #[test]
    fn the_fuzz_seed_is_a_valid_handover() {
        let seed = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/seeds/migration_stream/handover"
        ))
        .unwrap();
        let mut r = seed.as_slice();
        let mut buf = Vec::new();
        let mut kinds = Vec::new();
        loop {
            match read_message(&mut r, &mut buf) {
                Ok(m) => kinds.push(m.kind()),
                Err(WireError::Closed) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(
            kinds,
            [Kind::Describe, Kind::Ram, Kind::State, Kind::Commit]
        );
    }

    #[test]
    fn ram_outside_guest_memory_is_refused() {
        use vm_memory::Bytes;
        let mem = crate::memory::create_guest_memory(4 << 20).unwrap();
        apply_ram(&mem, 0x1000, &[7; 16]).unwrap();
        let mut b = [0u8; 16];
        mem.read_slice(&mut b, GuestAddress(0x1000)).unwrap();
        assert_eq!(b, [7; 16]);
        for (gpa, len) in [
            (4 << 20, 1),
            ((4 << 20) - 8, 16),
            (u64::MAX - 4, 8),
            (0xD000_0000, 4),
        ] {
            assert!(
                matches!(
                    apply_ram(&mem, gpa, &vec![1; len]),
                    Err(WireError::OutsideRam { .. })
                ),
                "{gpa:#x}"
            );
        }
    }
}
