//! The vGPU state stream between a source worker and a destination worker on another
//! host (docs/migration.md, "The vGPU stream").
//!
//! One connection, both directions. Every message is a 16-byte header and a payload:
//! magic `VGPS`, stream version (u16 LE), message type (u16 LE), payload length (u32 LE),
//! reserved (u32, zero). The header is checked (magic, version, type, reserved, length
//! against the type's cap) before a byte of payload is read, so a peer can make the
//! reader hold at most [`MAX_PAYLOAD`] bytes.
//!
//! Versions: 1 has every message but `Variable`, which version 2 adds. Each message is
//! written with the lowest version that has its type, so a stream without module
//! variables is a version 1 stream (an older destination takes it), and a reader takes
//! versions 1 to [`VERSION`], refusing a type its header's version does not have.

use std::io::{Read, Write};

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"VGPS";
/// The newest stream version this build speaks (it reads 1 to this).
pub const VERSION: u16 = 2;
/// Header length.
pub const HEADER: usize = 16;
/// Most bytes of device memory one `Data` message carries.
pub const MAX_DATA: usize = 4 << 20;
/// Longest module image.
pub const MAX_IMAGE: usize = 16 << 20;
/// Longest function name.
pub const MAX_NAME: usize = 4096;
/// Longest token.
pub const MAX_TOKEN: usize = 256;
/// Longest error reason.
pub const MAX_REASON: usize = 4096;
/// The largest payload of any message type (a module image; a `Variable` carries at most
/// `36 + MAX_NAME + MAX_DATA`).
pub const MAX_PAYLOAD: usize = 9 + MAX_IMAGE;
const _: () = assert!(36 + MAX_NAME + MAX_DATA <= MAX_PAYLOAD);

/// Why a stream could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the vGPU stream broke: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a vGPU migration stream (bad magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("vGPU stream version {0} is not supported (this build speaks 1 to {VERSION}); update the older side's vgpu-worker")]
    Version(u16),
    #[error("vGPU stream message type {ty} does not exist in stream version {version}")]
    TypeVersion { ty: u16, version: u16 },
    #[error("unknown vGPU stream message type {0}")]
    Type(u16),
    #[error("the vGPU stream header's reserved field is {0:#x}, not zero")]
    Reserved(u32),
    #[error("vGPU stream message type {ty} of {len} bytes exceeds its cap of {cap}")]
    TooLong { ty: u16, len: usize, cap: usize },
    #[error("vGPU stream message type {ty} is malformed: {why}")]
    Malformed { ty: u16, why: &'static str },
}

/// The kind of a module image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ImageKind {
    Builtin = 0,
    Ptx = 1,
    Binary = 2,
}

/// One message of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Source → destination, first: the one-time token and the vGPU's address range.
    Hello {
        token: &'a [u8],
        va_base: u64,
        va_size: u64,
    },
    /// Place an allocation at `addr`.
    Alloc { addr: u64, size: u64 },
    /// The allocation at `addr` went away.
    Free { addr: u64 },
    /// Bytes of allocation `addr` from `offset` on.
    Data {
        addr: u64,
        offset: u64,
        bytes: &'a [u8],
    },
    /// A loaded module under the guest's handle.
    Module {
        handle: u64,
        kind: ImageKind,
        image: &'a [u8],
    },
    /// A function of a module under the guest's handle.
    Function {
        handle: u64,
        module: u64,
        name: &'a [u8],
    },
    /// Bytes of a module variable (version 2): variable `name` of the module under the
    /// guest's handle `module`, `size` bytes in all, known to the guest at `addr`; `bytes`
    /// go at `offset`.
    Variable {
        module: u64,
        addr: u64,
        size: u64,
        offset: u64,
        name: &'a [u8],
        bytes: &'a [u8],
    },
    /// Everything was sent; the next handle the guest may be given.
    Done { next_handle: u64 },
    /// Destination → source: the state is in place.
    Ack,
    /// Either way: the sender gives up, with the reason.
    Error { reason: &'a str },
}

const T_HELLO: u16 = 1;
const T_ALLOC: u16 = 2;
const T_FREE: u16 = 3;
const T_DATA: u16 = 4;
const T_MODULE: u16 = 5;
const T_FUNCTION: u16 = 6;
const T_DONE: u16 = 7;
const T_ACK: u16 = 8;
const T_ERROR: u16 = 9;
const T_VARIABLE: u16 = 10;

/// The first stream version that has message type `ty`.
fn since(ty: u16) -> u16 {
    match ty {
        T_VARIABLE => 2,
        _ => 1,
    }
}

/// The payload cap of message type `ty`, or None for an unknown type.
fn cap(ty: u16) -> Option<usize> {
    Some(match ty {
        T_HELLO => 16 + MAX_TOKEN,
        T_ALLOC => 16,
        T_FREE => 8,
        T_DATA => 16 + MAX_DATA,
        T_MODULE => 9 + MAX_IMAGE,
        T_FUNCTION => 16 + MAX_NAME,
        T_DONE => 8,
        T_ACK => 0,
        T_ERROR => MAX_REASON,
        T_VARIABLE => 36 + MAX_NAME + MAX_DATA,
        _ => return None,
    })
}

fn u64_at(p: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = p.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

impl<'a> Message<'a> {
    fn ty(&self) -> u16 {
        match self {
            Message::Hello { .. } => T_HELLO,
            Message::Alloc { .. } => T_ALLOC,
            Message::Free { .. } => T_FREE,
            Message::Data { .. } => T_DATA,
            Message::Module { .. } => T_MODULE,
            Message::Function { .. } => T_FUNCTION,
            Message::Done { .. } => T_DONE,
            Message::Ack => T_ACK,
            Message::Error { .. } => T_ERROR,
            Message::Variable { .. } => T_VARIABLE,
        }
    }

    /// Decodes a payload of type `ty` (its length already checked against the cap).
    pub fn decode(ty: u16, p: &'a [u8]) -> Result<Self, WireError> {
        let bad = |why| WireError::Malformed { ty, why };
        let exact = |n: usize| {
            if p.len() == n {
                Ok(())
            } else {
                Err(bad("wrong length"))
            }
        };
        let word = |at| u64_at(p, at).ok_or(bad("too short"));
        match ty {
            T_HELLO => Ok(Message::Hello {
                va_base: word(0)?,
                va_size: word(8)?,
                token: &p[16..],
            }),
            T_ALLOC => {
                exact(16)?;
                Ok(Message::Alloc {
                    addr: word(0)?,
                    size: word(8)?,
                })
            }
            T_FREE => {
                exact(8)?;
                Ok(Message::Free { addr: word(0)? })
            }
            T_DATA => Ok(Message::Data {
                addr: word(0)?,
                offset: word(8)?,
                bytes: &p[16..],
            }),
            T_MODULE => {
                let handle = word(0)?;
                let kind = match p.get(8) {
                    Some(0) => ImageKind::Builtin,
                    Some(1) => ImageKind::Ptx,
                    Some(2) => ImageKind::Binary,
                    _ => return Err(bad("unknown image kind")),
                };
                Ok(Message::Module {
                    handle,
                    kind,
                    image: &p[9..],
                })
            }
            T_FUNCTION => Ok(Message::Function {
                handle: word(0)?,
                module: word(8)?,
                name: &p[16..],
            }),
            T_DONE => {
                exact(8)?;
                Ok(Message::Done {
                    next_handle: word(0)?,
                })
            }
            T_ACK => {
                exact(0)?;
                Ok(Message::Ack)
            }
            T_ERROR => Ok(Message::Error {
                reason: std::str::from_utf8(p).map_err(|_| bad("reason is not UTF-8"))?,
            }),
            T_VARIABLE => {
                let n = p
                    .get(32..36)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_le_bytes)
                    .ok_or(bad("too short"))? as usize;
                if n == 0 || n > MAX_NAME {
                    return Err(bad("variable name length out of range"));
                }
                let name = p.get(36..36 + n).ok_or(bad("name runs past the payload"))?;
                let bytes = &p[36 + n..];
                if bytes.len() > MAX_DATA {
                    return Err(bad("more variable bytes than one message carries"));
                }
                Ok(Message::Variable {
                    module: word(0)?,
                    addr: word(8)?,
                    size: word(16)?,
                    offset: word(24)?,
                    name,
                    bytes,
                })
            }
            other => Err(WireError::Type(other)),
        }
    }

    /// Writes the message (one `write_all` of header and payload).
    pub fn write(&self, w: &mut impl Write) -> Result<(), WireError> {
        let mut p = Vec::new();
        match self {
            Message::Hello {
                token,
                va_base,
                va_size,
            } => {
                p.extend_from_slice(&va_base.to_le_bytes());
                p.extend_from_slice(&va_size.to_le_bytes());
                p.extend_from_slice(token);
            }
            Message::Alloc { addr, size } => {
                p.extend_from_slice(&addr.to_le_bytes());
                p.extend_from_slice(&size.to_le_bytes());
            }
            Message::Free { addr } => p.extend_from_slice(&addr.to_le_bytes()),
            Message::Data {
                addr,
                offset,
                bytes,
            } => {
                p.extend_from_slice(&addr.to_le_bytes());
                p.extend_from_slice(&offset.to_le_bytes());
                p.extend_from_slice(bytes);
            }
            Message::Module {
                handle,
                kind,
                image,
            } => {
                p.extend_from_slice(&handle.to_le_bytes());
                p.push(*kind as u8);
                p.extend_from_slice(image);
            }
            Message::Function {
                handle,
                module,
                name,
            } => {
                p.extend_from_slice(&handle.to_le_bytes());
                p.extend_from_slice(&module.to_le_bytes());
                p.extend_from_slice(name);
            }
            Message::Variable {
                module,
                addr,
                size,
                offset,
                name,
                bytes,
            } => {
                for w in [module, addr, size, offset] {
                    p.extend_from_slice(&w.to_le_bytes());
                }
                // Bounded by the cap checked below.
                p.extend_from_slice(&(name.len().min(u32::MAX as usize) as u32).to_le_bytes());
                p.extend_from_slice(name);
                p.extend_from_slice(bytes);
            }
            Message::Done { next_handle } => p.extend_from_slice(&next_handle.to_le_bytes()),
            Message::Ack => {}
            Message::Error { reason } => {
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                p.extend_from_slice(&reason.as_bytes()[..end]);
            }
        }
        let ty = self.ty();
        let limit = cap(ty).unwrap_or(0);
        if p.len() > limit {
            return Err(WireError::TooLong {
                ty,
                len: p.len(),
                cap: limit,
            });
        }
        let mut msg = Vec::with_capacity(HEADER + p.len());
        msg.extend_from_slice(&MAGIC);
        msg.extend_from_slice(&since(ty).to_le_bytes());
        msg.extend_from_slice(&ty.to_le_bytes());
        // Bounded by the cap above, which fits in u32.
        msg.extend_from_slice(&(p.len() as u32).to_le_bytes());
        msg.extend_from_slice(&0u32.to_le_bytes());
        msg.extend_from_slice(&p);
        w.write_all(&msg)?;
        Ok(())
    }
}

/// Reads one message; `buf` holds its payload (it grows to the message's length, at most
/// [`MAX_PAYLOAD`]).
pub fn read_message<'b>(r: &mut impl Read, buf: &'b mut Vec<u8>) -> Result<Message<'b>, WireError> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    let magic: [u8; 4] = [h[0], h[1], h[2], h[3]];
    if magic != MAGIC {
        return Err(WireError::Magic(magic));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if !(1..=VERSION).contains(&version) {
        return Err(WireError::Version(version));
    }
    let ty = u16::from_le_bytes([h[6], h[7]]);
    if cap(ty).is_some() && since(ty) > version {
        return Err(WireError::TypeVersion { ty, version });
    }
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let reserved = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
    if reserved != 0 {
        return Err(WireError::Reserved(reserved));
    }
    let limit = cap(ty).ok_or(WireError::Type(ty))?;
    if len > limit {
        return Err(WireError::TooLong {
            ty,
            len,
            cap: limit,
        });
    }
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf)?;
    Message::decode(ty, buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: Message<'_>) {
        let mut out = Vec::new();
        m.write(&mut out).expect("write");
        let mut buf = Vec::new();
        let back = read_message(&mut &out[..], &mut buf).expect("read");
        assert_eq!(back, m);
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(Message::Hello {
            token: b"secret",
            va_base: 1 << 40,
            va_size: 1 << 30,
        });
        round_trip(Message::Alloc { addr: 7, size: 9 });
        round_trip(Message::Free { addr: 7 });
        round_trip(Message::Data {
            addr: 1,
            offset: 2,
            bytes: &[1, 2, 3],
        });
        round_trip(Message::Module {
            handle: 3,
            kind: ImageKind::Ptx,
            image: b".version",
        });
        round_trip(Message::Function {
            handle: 4,
            module: 3,
            name: b"saxpy",
        });
        round_trip(Message::Variable {
            module: 3,
            addr: 0x7000,
            size: 16,
            offset: 8,
            name: b"counter",
            bytes: &[9; 8],
        });
        round_trip(Message::Done { next_handle: 5 });
        round_trip(Message::Ack);
        round_trip(Message::Error { reason: "no room" });
    }

    #[test]
    fn messages_carry_the_lowest_version_that_has_them() {
        let mut out = Vec::new();
        Message::Alloc { addr: 1, size: 2 }
            .write(&mut out)
            .expect("write");
        assert_eq!(
            u16::from_le_bytes([out[4], out[5]]),
            1,
            "an older reader takes it"
        );
        let mut var = Vec::new();
        Message::Variable {
            module: 1,
            addr: 2,
            size: 8,
            offset: 0,
            name: b"v",
            bytes: &[0; 8],
        }
        .write(&mut var)
        .expect("write");
        assert_eq!(u16::from_le_bytes([var[4], var[5]]), 2);
        // A variable under a version 1 header is refused before its payload is read.
        var[4] = 1;
        let mut buf = Vec::new();
        assert!(matches!(
            read_message(&mut &var[..HEADER], &mut buf),
            Err(WireError::TypeVersion {
                ty: T_VARIABLE,
                version: 1
            })
        ));
        // Names and bytes must lie inside the payload.
        for (n, why) in [(0u32, "empty name"), (u32::MAX, "name past the end")] {
            let mut p = vec![0u8; 32];
            p.extend_from_slice(&n.to_le_bytes());
            p.push(b'v');
            assert!(
                matches!(
                    Message::decode(T_VARIABLE, &p),
                    Err(WireError::Malformed { .. })
                ),
                "{why}"
            );
        }
    }

    #[test]
    fn bad_headers_are_refused_before_the_payload_is_read() {
        let mut ok = Vec::new();
        Message::Alloc { addr: 1, size: 2 }
            .write(&mut ok)
            .expect("write");
        let mut buf = Vec::new();
        let mut m = ok.clone();
        m[0] = b'X';
        assert!(matches!(
            read_message(&mut &m[..], &mut buf),
            Err(WireError::Magic(_))
        ));
        let mut m = ok.clone();
        m[4] = 9;
        assert!(matches!(
            read_message(&mut &m[..], &mut buf),
            Err(WireError::Version(9))
        ));
        let mut m = ok.clone();
        m[6] = 99;
        assert!(matches!(
            read_message(&mut &m[..], &mut buf),
            Err(WireError::Type(99))
        ));
        let mut m = ok.clone();
        m[12] = 1;
        assert!(matches!(
            read_message(&mut &m[..], &mut buf),
            Err(WireError::Reserved(1))
        ));
        // A huge length is refused from the header alone (no payload follows).
        let mut m = ok[..HEADER].to_vec();
        m[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_message(&mut &m[..], &mut buf),
            Err(WireError::TooLong { .. })
        ));
        assert!(buf.capacity() < 1024);
        // A short fixed-size payload is malformed.
        let mut m = ok[..HEADER].to_vec();
        m[8..12].copy_from_slice(&8u32.to_le_bytes());
        m.extend_from_slice(&[0; 8]);
        assert!(matches!(
            read_message(&mut &m[..], &mut buf),
            Err(WireError::Malformed { .. })
        ));
        // Truncated.
        assert!(matches!(
            read_message(&mut &ok[..20], &mut buf),
            Err(WireError::Io(_))
        ));
    }
}
