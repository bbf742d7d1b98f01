//! Round trips and malformed bytes.

use crate::*;

fn encode(req: &Request<'_>, id: u64) -> ([u8; 1024], usize) {
    let mut buf = [0u8; 1024];
    let n = req.encode(id, &mut buf).expect("buffer is large enough");
    (buf, n)
}

#[test]
fn struct_sizes_match_docs() {
    assert_eq!(RequestHeader::SIZE, 16);
    assert_eq!(Response::SIZE, 48);
    assert_eq!(VgpuConfig::SIZE, 56);
    assert_eq!(DeviceInfo::SIZE, 128);
    assert_eq!(LaunchArgs::SIZE, 56);
    assert_eq!(KernelArg::SIZE, 16);
    assert_eq!(launch_request_len(2, 1), 16 + 56 + 32 + 4);
}

#[test]
fn header_layout_is_little_endian() {
    let h = RequestHeader {
        opcode: 0x0100,
        flags: 0,
        id: 0x1122_3344_5566_7788,
    };
    let b = h.to_bytes();
    assert_eq!(&b[..4], &[0x00, 0x01, 0, 0]);
    assert_eq!(&b[8..], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
    assert_eq!(RequestHeader::decode(&b), Ok(h));
}

#[test]
fn response_round_trip() {
    let r = Response::ok(7, [1, 2, 3, u64::MAX]);
    let b = r.to_bytes();
    assert_eq!(Response::decode(&b), Ok(r));
    assert_eq!(
        Response::decode(&b).map(|r| r.status()),
        Ok(Some(Status::Ok))
    );
    let e = Response::new(9, Status::BadDevicePointer);
    assert_eq!(
        Response::decode(&e.to_bytes()).map(|r| r.status()),
        Ok(Some(Status::BadDevicePointer))
    );
}

#[test]
fn config_and_info_round_trip() {
    let c = VgpuConfig {
        version: PROTOCOL_VERSION,
        vgpu_id: 3,
        num_queues: 4,
        max_kernel_args: MAX_KERNEL_ARGS,
        features: features::BUILTIN_KERNELS | features::EVENTS,
        memory_share: 1 << 30,
        compute_share: 700,
        copy_share: 300,
        va_base: 0x2000_0000_0000,
        va_size: 1 << 40,
    };
    assert_eq!(VgpuConfig::decode(&c.to_bytes()), Ok(c));
    let i = DeviceInfo {
        vgpu_id: 3,
        name: DeviceInfo::pad_name("sim-gpu"),
        ..Default::default()
    };
    let d = DeviceInfo::decode(&i.to_bytes()).expect("decodes");
    assert_eq!(d, i);
    assert_eq!(d.name_str(), "sim-gpu");
    assert_eq!(DeviceInfo::pad_name("é".repeat(40).as_str()).len(), 32);
}

#[test]
fn every_fixed_request_round_trips() {
    let reqs = [
        Request::GetInfo,
        Request::Alloc(AllocArgs {
            size: 4096,
            flags: 0,
        }),
        Request::Free(FreeArgs {
            addr: 0x2000_0000_0000,
        }),
        Request::MemcpyHtoD(MemcpyHtoDArgs { dst: 1, size: 2 }),
        Request::MemcpyDtoH(MemcpyDtoHArgs { src: 3, size: 4 }),
        Request::MemcpyDtoD(MemcpyDtoDArgs {
            dst: 5,
            src: 6,
            size: 7,
        }),
        Request::Memset(MemsetArgs {
            dst: 8,
            count: 9,
            value: 10,
            elem_size: 4,
        }),
        Request::ModuleLoad(ModuleLoadArgs {
            kind: module_kind::BUILTIN,
            flags: 0,
            size: 7,
        }),
        Request::ModuleUnload(ModuleUnloadArgs { module: 1 }),
        Request::GetFunction(GetFunctionArgs {
            module: 1,
            name_len: 10,
        }),
        Request::StreamSync,
        Request::Fence,
        Request::EventRecord(EventArgs { event: 1 }),
        Request::EventQuery(EventArgs { event: 2 }),
        Request::EventElapsed(EventElapsedArgs { start: 1, end: 2 }),
        Request::EventDestroy(EventArgs { event: 3 }),
        Request::ShmGet(ShmGetArgs {
            key: 1,
            size: 2,
            flags: shm_flags::CREATE,
        }),
        Request::ShmAt(ShmAtArgs { shmid: 1, flags: 0 }),
        Request::ShmDt(ShmDtArgs { addr: 1 }),
        Request::ShmCtl(ShmCtlArgs {
            shmid: 1,
            cmd: shm_cmd::STAT,
            flags: 0,
        }),
        Request::StorageAttach(StorageAttachArgs {
            namespace: 1,
            flags: 0,
        }),
    ];
    for (i, req) in reqs.iter().enumerate() {
        let (buf, n) = encode(req, i as u64 + 100);
        let (h, parsed) = parse_request(&buf[..n]).expect("parses");
        assert_eq!(h.id, i as u64 + 100);
        assert_eq!(parsed.opcode(), req.opcode());
        let (buf2, n2) = encode(&parsed, h.id);
        assert_eq!(&buf[..n], &buf2[..n2], "{:?}", req.opcode());
        // Every opcode but the argument-less ones rejects a descriptor cut by one byte.
        if n > RequestHeader::SIZE {
            let (_, e) = parse_request(&buf[..n - 1]).expect_err("short");
            assert_eq!(e.status(), Status::BadLength);
        }
    }
}

#[test]
fn launch_round_trip() {
    let launch = LaunchArgs {
        function: 42,
        grid: [4, 1, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
        task_id: 5,
        rank: 900,
        ..Default::default()
    };
    let args = [
        KernelArg::ptr(0x1000, Access::Read),
        KernelArg::ptr(0x2000, Access::ReadWrite),
        KernelArg::f32(2.5),
        KernelArg::u32(7),
        KernelArg::u64(u64::MAX),
        KernelArg::f64(-1.0),
    ];
    let mut buf = [0u8; 512];
    let n = encode_launch(&mut buf, 77, &launch, &args, &[1, 2, 3]).expect("fits");
    assert_eq!(n, launch_request_len(6, 3));
    let (h, req) = parse_request(&buf[..n]).expect("parses");
    assert_eq!(h.id, 77);
    let Request::Launch(l) = req else {
        panic!("not a launch")
    };
    assert_eq!(l.launch.arg_count, 6);
    assert_eq!(l.launch.dep_count, 3);
    assert_eq!(l.launch.rank, 900);
    assert!(l.args.iter().eq(args.iter().copied()));
    assert_eq!(
        l.args.get(2).map(|a| a.typed()),
        Some(Ok(ArgValue::F32(2.5)))
    );
    assert_eq!(
        l.args.get(1).map(|a| a.typed()),
        Some(Ok(ArgValue::Ptr {
            addr: 0x2000,
            access: Access::ReadWrite
        }))
    );
    assert!(l.deps.iter().eq([1, 2, 3]));
    let mut buf2 = [0u8; 512];
    let n2 = req.encode(77, &mut buf2).expect("fits");
    assert_eq!(&buf[..n], &buf2[..n2]);
    // One byte short of the last dependency.
    let (_, e) = parse_request(&buf[..n - 1]).expect_err("short");
    assert_eq!(e.status(), Status::BadLength);
}

#[test]
fn malformed_headers() {
    assert_eq!(
        parse_request(&[]).expect_err("empty").1.status(),
        Status::BadLength
    );
    assert_eq!(parse_request(&[0; 15]).expect_err("15").0, None);

    let mut b = RequestHeader {
        opcode: 0xdead,
        flags: 0,
        id: 5,
    }
    .to_bytes();
    let (h, e) = parse_request(&b).expect_err("unknown");
    assert_eq!(
        (h.map(|h| h.id), e),
        (Some(5), ParseError::UnknownOpcode(0xdead))
    );
    assert_eq!(e.status(), Status::UnknownOpcode);

    b = RequestHeader {
        opcode: Opcode::Fence as u32,
        flags: 1,
        id: 6,
    }
    .to_bytes();
    assert_eq!(
        parse_request(&b).expect_err("flags").1.status(),
        Status::InvalidArgument
    );

    // ALLOC header without its arguments.
    b = RequestHeader {
        opcode: Opcode::Alloc as u32,
        flags: 0,
        id: 6,
    }
    .to_bytes();
    assert_eq!(
        parse_request(&b).expect_err("short").1,
        ParseError::ShortArgs {
            opcode: Opcode::Alloc,
            needed: 32,
            len: 16
        }
    );
}

#[test]
fn launch_counts_are_bounded() {
    let mut buf = [0u8; 2048];
    let launch = LaunchArgs {
        grid: [1; 3],
        block: [1; 3],
        ..Default::default()
    };
    let n = encode_launch(&mut buf, 1, &launch, &[], &[]).expect("fits");
    // Patch arg_count (offset 16 + 36) to something huge: must not overflow or read past.
    buf[52..56].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        parse_request(&buf[..n]).expect_err("too many").1,
        ParseError::TooManyArgs(u32::MAX)
    );
    buf[52..56].copy_from_slice(&MAX_KERNEL_ARGS.to_le_bytes());
    assert_eq!(
        parse_request(&buf[..n]).expect_err("short").1.status(),
        Status::BadLength
    );
    buf[52..56].copy_from_slice(&0u32.to_le_bytes());
    buf[64..68].copy_from_slice(&(MAX_DEPS + 1).to_le_bytes());
    assert_eq!(
        parse_request(&buf[..n]).expect_err("deps").1,
        ParseError::TooManyDeps(MAX_DEPS + 1)
    );
}

#[test]
fn kernel_arg_checks() {
    let bad_kind = KernelArg {
        kind: 9,
        access: 0,
        value: 0,
    };
    assert_eq!(bad_kind.typed(), Err(ArgError::UnknownKind(9)));
    let bad_access = KernelArg {
        kind: ArgKind::Ptr as u32,
        access: 4,
        value: 0,
    };
    assert_eq!(bad_access.typed(), Err(ArgError::UnknownAccess(4)));
    let access_on_value = KernelArg {
        kind: ArgKind::U32 as u32,
        access: 1,
        value: 0,
    };
    assert_eq!(access_on_value.typed(), Err(ArgError::AccessOnValue));
    let high = KernelArg {
        kind: ArgKind::F32 as u32,
        access: 0,
        value: 1 << 32,
    };
    assert_eq!(high.typed(), Err(ArgError::HighBitsSet));
    assert!(Access::ReadWrite.covers(Access::Write));
    assert!(!Access::Read.covers(Access::Write));
    assert!(!Access::Write.covers(Access::Read));
}

#[test]
fn enums_round_trip() {
    for op in Opcode::ALL {
        assert_eq!(Opcode::from_u32(op as u32), Some(op));
    }
    for s in Status::ALL {
        assert_eq!(Status::from_u32(s as u32), Some(s));
    }
    assert_eq!(Status::from_u32(10_000), None);
    assert!(version_compatible(PROTOCOL_VERSION));
    assert!(version_compatible(PROTOCOL_VERSION + 5));
    assert!(!version_compatible(PROTOCOL_VERSION + (1 << 16)));
}

#[test]
fn builtins() {
    assert!(builtin::find(b"vector_add").is_some());
    assert!(builtin::find(b"nope").is_none());
    assert_eq!(
        builtin::fnv1a64(builtin::FNV_OFFSET, b""),
        0xcbf2_9ce4_8422_2325
    );
    // Published FNV-1a 64 test vector.
    assert_eq!(
        builtin::fnv1a64(builtin::FNV_OFFSET, b"a"),
        0xaf63_dc4c_8601_ec8c
    );
    assert_eq!(
        builtin::fnv1a64(builtin::FNV_OFFSET, b"foobar"),
        0x8594_4171_f739_67e8
    );
}

#[test]
fn short_buffers_error_instead_of_panicking() {
    let mut small = [0u8; 8];
    assert!(Response::ok(1, [0; 4]).encode(&mut small).is_err());
    assert!(Request::Alloc(AllocArgs { size: 1, flags: 0 })
        .encode(1, &mut small)
        .is_err());
    assert!(encode_launch(&mut small, 1, &LaunchArgs::default(), &[], &[]).is_err());
}

#[test]
fn raw_bytes_arguments_and_parameter_layouts() {
    let a = KernelArg::bytes(&[0xef, 0xbe]).expect("two bytes");
    assert_eq!(
        (a.kind, a.access, a.value),
        (ArgKind::Bytes as u32, 2, 0xbeef)
    );
    assert_eq!(
        a.typed(),
        Ok(ArgValue::Bytes {
            len: 2,
            bits: 0xbeef
        })
    );
    assert_eq!(a.typed().map(|v| v.kind()), Ok(ArgKind::Bytes));
    assert!(KernelArg::bytes(&[]).is_none());
    assert!(KernelArg::bytes(&[0; 9]).is_none());
    let eight = KernelArg::bytes(&[0xff; 8]).expect("eight");
    assert_eq!(
        eight.typed(),
        Ok(ArgValue::Bytes {
            len: 8,
            bits: u64::MAX
        })
    );
    let high = KernelArg {
        value: 0x1_0000,
        ..a
    };
    assert_eq!(high.typed(), Err(ArgError::HighBitsSet));
    for n in [0, 9, 256] {
        let bad = KernelArg { access: n, ..a };
        assert_eq!(bad.typed(), Err(ArgError::BadByteCount(n)));
    }
    let mut l = ParamLayout::default();
    l.set(0, 0, 8);
    l.set(31, 500, 4);
    l.set(32, 1, 1);
    let back = ParamLayout::decode(&l.to_bytes()).expect("decode");
    assert_eq!(back, l);
    assert_eq!(back.get(0), Some((0, 8)));
    assert_eq!(back.get(31), Some((500, 4)));
    assert_eq!(back.get(32), None);
    assert!(ParamLayout::decode(&[0; 10]).is_err());
    assert_eq!(Opcode::from_u32(0x0303), Some(Opcode::GetFunctionLayout));
    assert_eq!(Opcode::from_u32(0x0002), Some(Opcode::GetAttributes));
}

#[test]
fn get_global_round_trips() {
    let req = Request::GetGlobal(GetGlobalArgs {
        module: 7,
        name_len: 5,
    });
    let (buf, n) = encode(&req, 9);
    assert_eq!(n, 16 + 16);
    let (h, back) = parse_request(&buf[..n]).expect("parses");
    assert_eq!(h.id, 9);
    assert_eq!(back.opcode(), Opcode::GetGlobal);
    assert_eq!(back.data_len(), 5);
    assert_eq!(Opcode::GetGlobal.data_shape(), DataShape::Readable);
    assert_eq!(Opcode::from_u32(0x0304), Some(Opcode::GetGlobal));
    assert!(matches!(
        parse_request(&buf[..n - 1]),
        Err((Some(_), ParseError::ShortArgs { .. }))
    ));
    const { assert!(PROTOCOL_VERSION >= 0x0001_0006) };
}

/// A `LAUNCH` with `args` and the blob `blob` after one dependency id, parsed back.
fn launch_with_blob(args: &[KernelArg], blob: &[u8], buf: &mut [u8]) -> usize {
    let launch = LaunchArgs {
        function: 1,
        grid: [1; 3],
        block: [1; 3],
        task_id: 2,
        ..LaunchArgs::default()
    };
    encode_launch_with_blob(buf, 3, &launch, args, &[1], blob).expect("fits")
}

#[test]
fn blob_arguments_point_into_the_parameter_blob() {
    let mut blob = [0u8; 88];
    for (i, b) in blob.iter_mut().enumerate() {
        *b = i as u8;
    }
    let args = [
        KernelArg::u32(5),
        KernelArg::blob(0, 24).expect("24 bytes"),
        KernelArg::blob(24, 64).expect("64 bytes"),
    ];
    let mut buf = [0u8; 512];
    let n = launch_with_blob(&args, &blob, &mut buf);
    assert_eq!(n, launch_request_len(3, 1) + 88);
    let (_, req) = parse_request(&buf[..n]).expect("parses");
    let Request::Launch(l) = req else {
        panic!("not a launch")
    };
    assert_eq!(l.blob.len(), 88);
    assert_eq!(l.check_blobs(), Ok(()));
    let second = l.args.get(1).expect("three arguments").typed();
    assert_eq!(second, Ok(ArgValue::Blob { offset: 0, len: 24 }));
    assert_eq!(second.map(|v| v.kind()), Ok(ArgKind::Blob));
    assert_eq!(l.blob_bytes(24, 64), Some(&blob[24..88]));
    // Re-encoding keeps the blob.
    let (again, m) = encode(&req, 3);
    assert_eq!(&again[..m], &buf[..n]);
}

#[test]
fn hostile_blob_arguments_are_refused() {
    // Byte counts out of range.
    for len in [0, MAX_PARAM_BLOB_BYTES + 1, u32::MAX] {
        let a = KernelArg {
            kind: ArgKind::Blob as u32,
            access: len,
            value: 0,
        };
        assert_eq!(a.typed(), Err(ArgError::BadBlobLength(len)));
    }
    assert!(KernelArg::blob(0, 0).is_none());
    assert!(KernelArg::blob(0, MAX_PARAM_BLOB_BYTES + 1).is_none());
    // An offset that does not fit in 32 bits or past the largest blob.
    let far = KernelArg {
        kind: ArgKind::Blob as u32,
        access: 16,
        value: u64::MAX,
    };
    assert!(matches!(far.typed(), Err(ArgError::BlobOutside { .. })));
    let mut buf = [0u8; 9000];
    // Offset past the end of the blob, and offset + length overflowing it.
    for arg in [
        KernelArg::blob(40, 16).expect("ok"),
        KernelArg::blob(30, 16).expect("ok"),
        KernelArg::blob(MAX_PARAM_BLOB_BYTES - 1, 16).expect("ok"),
    ] {
        let n = launch_with_blob(&[arg], &[0u8; 40], &mut buf);
        let Ok((_, Request::Launch(l))) = parse_request(&buf[..n]) else {
            panic!("parses")
        };
        assert!(
            matches!(l.check_blobs(), Err(ArgError::BlobOutside { .. })),
            "{arg:?}"
        );
    }
    // Two arguments each inside a blob that the request makes longer than allowed: only
    // the first MAX_PARAM_BLOB_BYTES bytes count as the blob.
    let big = [7u8; 5000];
    let n = launch_with_blob(
        &[
            KernelArg::blob(0, 4096).expect("ok"),
            KernelArg::blob(4000, 900).expect("ok"),
        ],
        &big,
        &mut buf,
    );
    let Ok((_, Request::Launch(l))) = parse_request(&buf[..n]) else {
        panic!("parses")
    };
    assert_eq!(l.blob.len(), MAX_PARAM_BLOB_BYTES as usize);
    assert!(matches!(l.check_blobs(), Err(ArgError::BlobOutside { .. })));
    // Overlapping arguments that add up to more than the limit.
    let n = launch_with_blob(
        &[
            KernelArg::blob(0, 4096).expect("ok"),
            KernelArg::blob(0, 16).expect("ok"),
        ],
        &big[..4096],
        &mut buf,
    );
    let Ok((_, Request::Launch(l))) = parse_request(&buf[..n]) else {
        panic!("parses")
    };
    assert_eq!(l.check_blobs(), Err(ArgError::BlobsTooLarge(4112)));
}

#[test]
fn a_cluster_travels_in_the_launch_flags_and_every_bad_one_is_refused() {
    let at = |grid: [u32; 3], flags: u32| LaunchArgs {
        grid,
        block: [128, 1, 1],
        flags,
        ..LaunchArgs::default()
    };
    assert_eq!(at([7, 1, 1], 0).cluster(), Ok([1, 1, 1]));
    let f = LaunchArgs::cluster_flags([2, 1, 1]);
    assert_eq!(f, 1 | 2 << 8 | 1 << 16 | 1 << 24);
    assert_eq!(at([132, 2, 1], f).cluster(), Ok([2, 1, 1]));
    assert_eq!(LaunchArgs::cluster_flags([1, 1, 1]), 0);
    let f = LaunchArgs::cluster_flags([4, 2, 2]);
    assert_eq!(at([8, 4, 2], f).cluster(), Ok([4, 2, 2]));
    // Not a whole number of clusters.
    assert_eq!(
        at([7, 1, 1], LaunchArgs::cluster_flags([2, 1, 1])).cluster(),
        Err(ClusterError::Grid {
            grid: [7, 1, 1],
            cluster: [2, 1, 1]
        })
    );
    // Too many blocks, a size of 0, unknown bits.
    let big = LaunchArgs::cluster_flags([8, 4, 1]);
    assert_eq!(
        at([8, 4, 1], big).cluster(),
        Err(ClusterError::Size([8, 4, 1]))
    );
    let zero = LAUNCH_CLUSTER | 2 << 8 | 1 << 24;
    assert_eq!(
        at([2, 2, 2], zero).cluster(),
        Err(ClusterError::Size([2, 0, 1]))
    );
    assert_eq!(at([2, 1, 1], 2).cluster(), Err(ClusterError::Flags(2)));
    assert_eq!(
        at([2, 1, 1], 0x80 | LAUNCH_CLUSTER).cluster(),
        Err(ClusterError::Flags(0x81))
    );
    struct Text([u8; 160], usize);
    impl core::fmt::Write for Text {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let end = self.1 + s.len();
            self.0
                .get_mut(self.1..end)
                .ok_or(core::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.1 = end;
            Ok(())
        }
    }
    let mut t = Text([0; 160], 0);
    core::fmt::write(&mut t, format_args!("{}", ClusterError::Size([8, 4, 1]))).unwrap();
    assert!(core::str::from_utf8(&t.0[..t.1])
        .unwrap()
        .contains("at most 16 blocks"));
}
