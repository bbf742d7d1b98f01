//! The destination's first look at a connection to its stream port: only the source that
//! was given the move's one-time token may start the move. Anyone else who found the port
//! first (another local user, a port scan) is told why and closed, and the destination
//! keeps waiting for its source (docs/migration.md).

use std::io::{Cursor, Read, Write};
use std::time::Duration;

use crate::wire::{read_message, Message};
use crate::MigrationError;

/// How long a connection gets to send its hello before it is closed.
pub const HELLO_WAIT: Duration = Duration::from_secs(5);

/// Tokens compared without an early exit.
fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads the hello `conn` opens with: its bytes (for [`Replayed`], so that the receiver
/// reads and checks it again in full) when it carries `token`, else why not.
pub fn screen_source(conn: &mut impl Read, token: &[u8]) -> Result<Vec<u8>, MigrationError> {
    let mut buf = Vec::new();
    let m = read_message(conn, &mut buf).map_err(|e| MigrationError::Stream(e.to_string()))?;
    let Message::Hello { token: t, .. } = &m else {
        return Err(MigrationError::Refused(
            "the stream does not start with a hello".into(),
        ));
    };
    if !same_token(t, token) {
        return Err(MigrationError::Refused(
            "the source presented a wrong token".into(),
        ));
    }
    let mut head = Vec::new();
    m.write(&mut head)
        .map_err(|e| MigrationError::Stream(e.to_string()))?;
    Ok(head)
}

/// Tells a screened-out connection why, best effort.
pub fn refuse(conn: &mut impl Write, e: &MigrationError) {
    let _ = Message::Error {
        reason: &e.to_string(),
    }
    .write(conn);
}

/// A stream whose first bytes, already read by [`screen_source`], are read again.
pub struct Replayed<S> {
    head: Cursor<Vec<u8>>,
    inner: S,
}

impl<S> Replayed<S> {
    /// `inner`, with `head` read before its bytes.
    pub fn new(head: Vec<u8>, inner: S) -> Self {
        Self {
            head: Cursor::new(head),
            inner,
        }
    }
}

impl<S: Read> Read for Replayed<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.head.read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

impl<S: Write> Write for Replayed<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(token: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        Message::Hello {
            token,
            va_base: 1 << 40,
            va_size: 1 << 30,
        }
        .write(&mut v)
        .expect("encode");
        v
    }

    #[test]
    fn only_the_right_token_passes_and_its_hello_is_read_again() {
        let e = screen_source(&mut &hello(b"guessed")[..], b"right-token").expect_err("wrong");
        assert!(e.to_string().contains("wrong token"), "{e}");
        let e = screen_source(&mut &[0xffu8; 64][..], b"right-token").expect_err("garbage");
        assert!(!e.to_string().is_empty());
        assert!(
            screen_source(&mut &[][..], b"right-token").is_err(),
            "no bytes"
        );
        let mut stream = hello(b"right-token");
        stream.extend_from_slice(b"rest");
        let mut r = &stream[..];
        let head = screen_source(&mut r, b"right-token").expect("right token");
        let mut replayed = Replayed::new(head, r);
        let mut buf = Vec::new();
        match read_message(&mut replayed, &mut buf).expect("hello again") {
            Message::Hello { token, va_base, .. } => {
                assert_eq!((token, va_base), (&b"right-token"[..], 1 << 40));
            }
            m => panic!("{m:?}"),
        }
        let mut rest = String::new();
        replayed.read_to_string(&mut rest).expect("rest");
        assert_eq!(rest, "rest");
    }
}
