//! The request header (first descriptor) and the response (last descriptor).

use crate::status::Status;
use crate::wire::wire_struct;

wire_struct! {
    /// The start of every request, at offset 0 of the first (device-readable) descriptor.
    /// The opcode's argument struct follows immediately, in the same descriptor.
    pub struct RequestHeader, size 16 {
        /// An [`crate::Opcode`] value.
        pub opcode: u32,
        /// Must be 0 in this version (the device answers `InvalidArgument` otherwise).
        pub flags: u32,
        /// A guest-chosen request id, echoed in the response.
        pub id: u64,
    }
}

wire_struct! {
    /// What the device writes at offset 0 of the last (device-writable) descriptor.
    pub struct Response, size 48 {
        /// A [`Status`] value.
        pub status: u32,
        /// 0.
        pub reserved: u32,
        /// The request's `id` (0 when the header could not be read).
        pub id: u64,
        /// Opcode-specific result words (docs/protocol.md lists them); 0 when unused.
        pub result: [u64; 4],
    }
}

impl Response {
    /// A response with `status` and no results.
    pub fn new(id: u64, status: Status) -> Self {
        Self {
            status: status as u32,
            reserved: 0,
            id,
            result: [0; 4],
        }
    }

    /// A successful response with result words.
    pub fn ok(id: u64, result: [u64; 4]) -> Self {
        Self {
            status: Status::Ok as u32,
            reserved: 0,
            id,
            result,
        }
    }

    /// The status, or `None` for a code this version does not know.
    pub fn status(&self) -> Option<Status> {
        Status::from_u32(self.status)
    }
}
