//! The one connection a migration uses: a unix socket (`unix:PATH`) or TCP
//! (`tcp:HOST:PORT`). The destination listens, the source connects.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// Where a migration stream goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp(String),
}

/// Why an address could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a migration address: give unix:PATH or tcp:HOST:PORT")]
pub struct AddressError(pub String);

impl std::str::FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, AddressError> {
        match s.split_once(':') {
            Some(("unix", p)) if !p.is_empty() => Ok(Self::Unix(p.into())),
            Some(("tcp", a)) if a.contains(':') => Ok(Self::Tcp(a.into())),
            _ => Err(AddressError(s.into())),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
            Self::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A connected migration stream.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// Connects to a listening destination.
    pub fn connect(addr: &Address) -> std::io::Result<Self> {
        Ok(match addr {
            Address::Unix(p) => Self::Unix(UnixStream::connect(p)?),
            Address::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                Self::Tcp(s)
            }
        })
    }

    /// Bounds every blocking read (None: wait forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Self::Unix(s) => s.set_read_timeout(t),
            Self::Tcp(s) => s.set_read_timeout(t),
        }
    }

    /// Bounds every blocking write.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Self::Unix(s) => s.set_write_timeout(t),
            Self::Tcp(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Unix(s) => s.read(buf),
            Self::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Unix(s) => s.write(buf),
            Self::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Unix(s) => s.flush(),
            Self::Tcp(s) => s.flush(),
        }
    }
}

/// A destination waiting for its one incoming VM.
pub enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// Listens on `addr` (a stale unix socket file is replaced).
    pub fn bind(addr: &Address) -> std::io::Result<Self> {
        Ok(match addr {
            Address::Unix(p) => {
                let _ = std::fs::remove_file(p);
                Self::Unix(UnixListener::bind(p)?, p.clone())
            }
            Address::Tcp(a) => Self::Tcp(TcpListener::bind(a)?),
        })
    }

    /// Waits for the source.
    pub fn accept(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Self::Unix(l, _) => Self::unix(l.accept()?.0),
            Self::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        })
    }

    /// Makes `accept` return `WouldBlock` at once when no one waits.
    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Self::Unix(l, _) => l.set_nonblocking(on),
            Self::Tcp(l) => l.set_nonblocking(on),
        }
    }

    fn unix(s: UnixStream) -> Stream {
        Stream::Unix(s)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Self::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            "unix:/tmp/m.sock".parse(),
            Ok(Address::Unix("/tmp/m.sock".into()))
        );
        assert_eq!(
            "tcp:127.0.0.1:4000".parse(),
            Ok(Address::Tcp("127.0.0.1:4000".into()))
        );
        for bad in ["", "unix:", "tcp:host", "/tmp/x", "udp:1:2"] {
            assert!(bad.parse::<Address>().is_err(), "{bad}");
        }
    }
}
