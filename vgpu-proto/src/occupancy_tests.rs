//! `CLUSTER_OCCUPANCY` (since 1.6): wire layout, round trip, short and malformed arguments.

extern crate std;

use crate::*;

fn active(cluster: [u32; 3]) -> ClusterOccupancyArgs {
    ClusterOccupancyArgs {
        function: 0x1_0002,
        block: [128, 1, 1],
        shared_bytes: 64 << 10,
        cluster,
        query: occupancy_query::MAX_ACTIVE_CLUSTERS,
        flags: 0,
        max_dynamic_shared: 64 << 10,
    }
}

#[test]
fn cluster_occupancy_round_trips() {
    let a = ClusterOccupancyArgs {
        flags: OCCUPANCY_NON_PORTABLE,
        ..active([4, 2, 2])
    };
    let mut buf = [0u8; 128];
    let n = Request::ClusterOccupancy(a)
        .encode(11, &mut buf)
        .expect("encodes");
    assert_eq!(n, RequestHeader::SIZE + 48);
    // The layout docs/protocol.md gives: function, block, shared, cluster, query, flags,
    // the function's limit.
    assert_eq!(&buf[..4], &0x0305u32.to_le_bytes());
    assert_eq!(&buf[16..24], &0x1_0002u64.to_le_bytes());
    assert_eq!(&buf[24..28], &128u32.to_le_bytes());
    assert_eq!(&buf[36..40], &(64u32 << 10).to_le_bytes());
    assert_eq!(&buf[40..44], &4u32.to_le_bytes());
    assert_eq!(&buf[56..60], &OCCUPANCY_NON_PORTABLE.to_le_bytes());
    assert_eq!(&buf[60..64], &(64u32 << 10).to_le_bytes());
    let (h, parsed) = parse_request(&buf[..n]).expect("parses");
    assert_eq!((h.opcode, h.id), (0x0305, 11));
    let Request::ClusterOccupancy(back) = parsed else {
        panic!("parsed as {parsed:?}");
    };
    assert_eq!(back, a);
    assert_eq!(back.check(), Ok(()));
    assert_eq!(back.cluster_blocks(), 16);
    assert_eq!(parsed.data_len(), 0);
    assert_eq!(Opcode::ClusterOccupancy.data_shape(), DataShape::None);
    assert_eq!(Opcode::from_u32(0x0305), Some(Opcode::ClusterOccupancy));
    assert_eq!(Opcode::ClusterOccupancy.name(), "CLUSTER_OCCUPANCY");
    // Every byte short of the arguments is refused with BAD_LENGTH, never a panic.
    for len in 0..n {
        let got = parse_request(&buf[..len])
            .map(|_| ())
            .map_err(|(_, e)| e.status());
        assert_eq!(got, Err(Status::BadLength), "{len} bytes");
    }
    assert_eq!(features::CLUSTER_OCCUPANCY, 1 << 16);
    const { assert!(PROTOCOL_VERSION >= 0x0001_0006) };
}

#[test]
fn cluster_occupancy_arguments_are_checked() {
    for c in [[1, 1, 1], [2, 1, 1], [2, 2, 2], [8, 1, 1]] {
        assert_eq!(active(c).check(), Ok(()), "{c:?}");
    }
    // Past the largest cluster a launch may have, up to whole GPCs: the driver's to answer.
    for c in [[17, 1, 1], [4, 4, 2], [18, 1, 1], [32, 1, 1], [4, 4, 4]] {
        let a = ClusterOccupancyArgs {
            flags: OCCUPANCY_NON_PORTABLE,
            ..active(c)
        };
        assert_eq!(a.check(), Ok(()), "{c:?}");
    }
    // Zero, oversized or overflowing clusters.
    for c in [
        [0, 1, 1],
        [65, 1, 1],
        [8, 4, 4],
        [u32::MAX, u32::MAX, u32::MAX],
    ] {
        let a = ClusterOccupancyArgs {
            flags: OCCUPANCY_NON_PORTABLE,
            ..active(c)
        };
        assert_eq!(a.check(), Err(OccupancyError::Cluster(c)), "{c:?}");
    }
    // Above the portable 8 blocks only when the function allows it.
    assert_eq!(
        active([16, 1, 1]).check(),
        Err(OccupancyError::NotPortable([16, 1, 1]))
    );
    // Blocks: zero, more than 1024 threads, and a product that would overflow u32.
    for b in [
        [0, 1, 1],
        [1025, 1, 1],
        [32, 32, 2],
        [u32::MAX, u32::MAX, 2],
    ] {
        let a = ClusterOccupancyArgs {
            block: b,
            ..active([2, 1, 1])
        };
        assert_eq!(a.check(), Err(OccupancyError::Block(b)), "{b:?}");
    }
    let a = ClusterOccupancyArgs {
        shared_bytes: MAX_SHARED_BYTES + 1,
        ..active([2, 1, 1])
    };
    assert_eq!(a.check(), Err(OccupancyError::Shared(MAX_SHARED_BYTES + 1)));
    let a = ClusterOccupancyArgs {
        shared_bytes: u32::MAX,
        ..active([2, 1, 1])
    };
    assert!(a.check().is_err());
    let a = ClusterOccupancyArgs {
        max_dynamic_shared: MAX_SHARED_BYTES + 1,
        ..active([2, 1, 1])
    };
    assert_eq!(a.check(), Err(OccupancyError::Shared(MAX_SHARED_BYTES + 1)));
    // Unknown query and flags.
    let a = ClusterOccupancyArgs {
        query: 2,
        ..active([2, 1, 1])
    };
    assert_eq!(a.check(), Err(OccupancyError::Query(2)));
    for flags in [2, 0x8000_0001, u32::MAX] {
        let a = ClusterOccupancyArgs {
            flags,
            ..active([2, 1, 1])
        };
        assert!(
            matches!(a.check(), Err(OccupancyError::Flags(_))),
            "{flags:#x}"
        );
    }
    // The largest-cluster query takes no cluster.
    let size = ClusterOccupancyArgs {
        query: occupancy_query::MAX_CLUSTER_SIZE,
        ..active([0, 0, 0])
    };
    assert_eq!(size.check(), Ok(()));
    let a = ClusterOccupancyArgs {
        cluster: [2, 1, 1],
        ..size
    };
    assert_eq!(a.check(), Err(OccupancyError::Cluster([2, 1, 1])));
    // Every refusal says what to do in words.
    let e = std::format!("{}", OccupancyError::NotPortable([16, 1, 1]));
    assert!(e.contains("non-portable"), "{e}");
}
