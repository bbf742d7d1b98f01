//! A tiny safe little-endian reader/writer and the `wire_struct!` macro that gives every
//! wire struct a `#[repr(C)]` layout, a compile-time size check and `decode`/`encode`.

use core::fmt;

/// Why bytes could not be read as (or written from) a wire struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The buffer is shorter than the structure needs.
    Short {
        /// Bytes the structure needs from the read/write position.
        needed: usize,
        /// Bytes that were left in the buffer.
        available: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Short { needed, available } => write!(
                f,
                "buffer too short: {needed} bytes needed, {available} available; \
                 size the buffer from the struct's SIZE constant"
            ),
        }
    }
}

/// Reads little-endian fields from a byte slice, front to back, without `unsafe`.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let available = self.buf.len().saturating_sub(self.pos);
        let end = self.pos.checked_add(n).ok_or(WireError::Short {
            needed: n,
            available,
        })?;
        let s = self.buf.get(self.pos..end).ok_or(WireError::Short {
            needed: n,
            available,
        })?;
        self.pos = end;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let s = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
}

/// Writes little-endian fields into a byte slice, front to back.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes written so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Appends `src`.
    pub fn bytes(&mut self, src: &[u8]) -> Result<(), WireError> {
        let available = self.buf.len().saturating_sub(self.pos);
        let needed = src.len();
        let end = self
            .pos
            .checked_add(needed)
            .ok_or(WireError::Short { needed, available })?;
        let dst = self
            .buf
            .get_mut(self.pos..end)
            .ok_or(WireError::Short { needed, available })?;
        dst.copy_from_slice(src);
        self.pos = end;
        Ok(())
    }
}

/// A field type that has a fixed little-endian wire encoding.
pub trait Field: Sized {
    /// Encoded size in bytes (equal to `size_of::<Self>()`).
    const SIZE: usize;
    /// Reads one value.
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError>;
    /// Writes one value.
    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError>;
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
            fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
                w.bytes(&self.to_le_bytes())
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64, i32);

impl<const N: usize> Field for [u8; N] {
    const SIZE: usize = N;
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        r.array()
    }
    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.bytes(self)
    }
}

impl Field for [u32; 3] {
    const SIZE: usize = 12;
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok([u32::read(r)?, u32::read(r)?, u32::read(r)?])
    }
    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.iter().try_for_each(|v| v.write(w))
    }
}

impl Field for [u32; 5] {
    const SIZE: usize = 20;
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok([
            u32::read(r)?,
            u32::read(r)?,
            u32::read(r)?,
            u32::read(r)?,
            u32::read(r)?,
        ])
    }
    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.iter().try_for_each(|v| v.write(w))
    }
}

impl Field for [i32; 3] {
    const SIZE: usize = 12;
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok([i32::read(r)?, i32::read(r)?, i32::read(r)?])
    }
    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.iter().try_for_each(|v| v.write(w))
    }
}

impl Field for [u64; 5] {
    const SIZE: usize = 40;
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok([
            u64::read(r)?,
            u64::read(r)?,
            u64::read(r)?,
            u64::read(r)?,
            u64::read(r)?,
        ])
    }
    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.iter().try_for_each(|v| v.write(w))
    }
}

impl Field for [u64; 4] {
    const SIZE: usize = 32;
    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok([u64::read(r)?, u64::read(r)?, u64::read(r)?, u64::read(r)?])
    }
    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.iter().try_for_each(|v| v.write(w))
    }
}

/// Declares a `#[repr(C)]` wire struct whose in-memory layout equals its little-endian
/// wire layout (checked at compile time: no padding, fixed size), with `decode`, `encode`
/// and `to_bytes`.
macro_rules! wire_struct {
    (
        $(#[$m:meta])*
        pub struct $name:ident, size $size:literal {
            $( $(#[$fm:meta])* pub $f:ident : $t:ty ),* $(,)?
        }
    ) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        pub struct $name {
            $( $(#[$fm])* pub $f: $t ),*
        }

        const _: () = assert!(core::mem::size_of::<$name>() == $size);
        const _: () = assert!(0 $(+ <$t as $crate::wire::Field>::SIZE)* == $size);

        impl $name {
            /// Encoded size in bytes.
            pub const SIZE: usize = $size;

            /// Reads the struct from the first `SIZE` bytes of `buf` (extra bytes are
            /// ignored: a newer minor version may append fields).
            pub fn decode(buf: &[u8]) -> Result<Self, $crate::wire::WireError> {
                let mut r = $crate::wire::Reader::new(buf);
                Ok(Self { $( $f: $crate::wire::Field::read(&mut r)? ),* })
            }

            /// Writes the struct into the first `SIZE` bytes of `out`; returns `SIZE`.
            pub fn encode(&self, out: &mut [u8]) -> Result<usize, $crate::wire::WireError> {
                let mut w = $crate::wire::Writer::new(out);
                $( $crate::wire::Field::write(&self.$f, &mut w)?; )*
                Ok(w.pos())
            }

            /// The struct's wire bytes.
            pub fn to_bytes(&self) -> [u8; $size] {
                let mut b = [0u8; $size];
                // Cannot fail: `b` is exactly SIZE bytes, checked at compile time above.
                let _ = self.encode(&mut b);
                b
            }
        }
    };
}
pub(crate) use wire_struct;
