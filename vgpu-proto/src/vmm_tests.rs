//! The virtual memory opcodes (since 1.5): wire layout, round trips, short arguments.

use crate::*;

fn round_trip(req: Request<'_>, opcode: u32, args_len: usize) -> Request<'static> {
    let mut buf = [0u8; 128];
    let n = req.encode(7, &mut buf).expect("encodes");
    assert_eq!(n, RequestHeader::SIZE + args_len, "{:?}", req.opcode());
    let (h, parsed) = parse_request(&buf[..n]).expect("parses");
    assert_eq!((h.opcode, h.id), (opcode, 7));
    assert_eq!(parsed.opcode(), req.opcode());
    assert_eq!(parsed.data_len(), 0, "no data descriptors");
    assert_eq!(parsed.opcode().data_shape(), DataShape::None);
    let short = parse_request(&buf[..n - 1])
        .map(|_| ())
        .map_err(|(_, e)| e.status());
    assert_eq!(short, Err(Status::BadLength), "{:?} short", req.opcode());
    // Re-encoding what was parsed gives the same bytes.
    let mut again = [0u8; 128];
    let m = parsed.encode(7, &mut again).expect("encodes");
    assert_eq!(&buf[..n], &again[..m]);
    match parsed {
        Request::VaReserve(a) => Request::VaReserve(a),
        Request::VaFree(a) => Request::VaFree(a),
        Request::MemCreate(a) => Request::MemCreate(a),
        Request::MemRelease(a) => Request::MemRelease(a),
        Request::MemMap(a) => Request::MemMap(a),
        Request::MemUnmap(a) => Request::MemUnmap(a),
        Request::MemRetain(a) => Request::MemRetain(a),
        Request::HostMap(a) => Request::HostMap(a),
        other => panic!("parsed as {other:?}"),
    }
}

#[test]
fn every_virtual_memory_request_round_trips() {
    let r = VaReserveArgs {
        size: 8 << 20,
        align: 4 << 20,
        hint: 0x2000_0000_0000,
        flags: 0,
    };
    assert!(
        matches!(round_trip(Request::VaReserve(r), 0x0A00, 32), Request::VaReserve(a) if a == r)
    );
    let f = VaFreeArgs {
        addr: 0x2000_0020_0000,
        size: 2 << 20,
    };
    assert!(matches!(round_trip(Request::VaFree(f), 0x0A01, 16), Request::VaFree(a) if a == f));
    let c = MemCreateArgs {
        size: 2 << 20,
        flags: 0,
    };
    assert!(
        matches!(round_trip(Request::MemCreate(c), 0x0A02, 16), Request::MemCreate(a) if a == c)
    );
    let rel = MemReleaseArgs { handle: 5 };
    assert!(
        matches!(round_trip(Request::MemRelease(rel), 0x0A03, 8), Request::MemRelease(a) if a == rel)
    );
    let m = MemMapArgs {
        addr: 0x2000_0040_0000,
        size: 2 << 20,
        offset: 0,
        handle: 5,
    };
    assert!(matches!(round_trip(Request::MemMap(m), 0x0A04, 32), Request::MemMap(a) if a == m));
    let u = MemUnmapArgs {
        addr: 0x2000_0040_0000,
        size: 2 << 20,
    };
    assert!(matches!(round_trip(Request::MemUnmap(u), 0x0A05, 16), Request::MemUnmap(a) if a == u));
    let ret = MemRetainArgs {
        addr: 0x2000_0040_1000,
    };
    assert!(
        matches!(round_trip(Request::MemRetain(ret), 0x0A06, 8), Request::MemRetain(a) if a == ret)
    );
}

#[test]
fn the_capability_and_version_are_announced() {
    assert_eq!(features::VIRTUAL_MEMORY, 1 << 15);
    const { assert!(VERSION_MINOR >= 5, "virtual memory is there since 1.5") };
    assert_eq!(VMM_GRANULARITY, 2 << 20);
    for op in [
        Opcode::VaReserve,
        Opcode::VaFree,
        Opcode::MemCreate,
        Opcode::MemRelease,
        Opcode::MemMap,
        Opcode::MemUnmap,
        Opcode::MemRetain,
    ] {
        assert_eq!(Opcode::from_u32(op as u32), Some(op));
    }
}

#[test]
fn host_map_round_trips_and_is_announced() {
    let m = HostMapArgs {
        gpa: 1 << 32,
        len: 64 << 20,
        addr: 0x7f12_3456_0000,
    };
    assert!(matches!(round_trip(Request::HostMap(m), 0x0B00, 24), Request::HostMap(a) if a == m));
    assert_eq!(features::HOST_MAP, 1 << 17);
    const { assert!(VERSION_MINOR >= 7, "HOST_MAP is there since 1.7") };
    assert_eq!(Opcode::from_u32(0x0B00), Some(Opcode::HostMap));
    assert_eq!(Opcode::HostMap.name(), "HOST_MAP");
}
