//! Malformed requests on the queue: unknown opcodes, broken headers, descriptors outside
//! guest RAM or of the wrong direction or length, device pointers outside the allocations,
//! unknown handles and wrong kernel arguments. Each gets its error status and the next
//! valid request on the same queue succeeds.

use super::*;

#[test]
fn unknown_opcode() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let hdr = RequestHeader {
        opcode: 0x7777,
        flags: 0,
        id: 42,
    }
    .to_bytes();
    let (resp, used) = h.send_raw(&hdr, &[]);
    assert_eq!(
        (resp.status(), resp.id, used),
        (Some(Status::UnknownOpcode), 42, 48)
    );
    h.still_works();
}

#[test]
fn malformed_headers() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    // Too short for a header.
    let (resp, _) = h.send_raw(&[1, 0, 0], &[]);
    assert_eq!((resp.status(), resp.id), (Some(Status::BadLength), 0));
    // ALLOC without its arguments.
    let hdr = RequestHeader {
        opcode: Opcode::Alloc as u32,
        flags: 0,
        id: 5,
    }
    .to_bytes();
    assert_eq!(h.send_raw(&hdr, &[]).0.status(), Some(Status::BadLength));
    // Non-zero flags.
    let hdr = RequestHeader {
        opcode: Opcode::StreamSync as u32,
        flags: 3,
        id: 6,
    }
    .to_bytes();
    assert_eq!(
        h.send_raw(&hdr, &[]).0.status(),
        Some(Status::InvalidArgument)
    );
    // Header in a device-writable descriptor.
    let hb = h.put(
        &RequestHeader {
            opcode: Opcode::StreamSync as u32,
            flags: 0,
            id: 7,
        }
        .to_bytes(),
    );
    let resp = h.space(48);
    h.submit(&[w(hb, 16), w(resp, 48)]);
    assert_eq!(
        Response::decode(&h.read(resp, 48)).expect("r").status(),
        Some(Status::BadDescriptor)
    );
    h.still_works();
}

#[test]
fn descriptor_outside_guest_ram() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(4096);
    // Data descriptor past the end of RAM.
    let st = h.status(
        Request::MemcpyHtoD(MemcpyHtoDArgs { dst: d, size: 64 }),
        &[r(RAM - 32, 64)],
    );
    assert_eq!(st, Status::BadDescriptor);
    // Data descriptor whose address + length wraps around 2^64.
    let st = h.status(
        Request::MemcpyHtoD(MemcpyHtoDArgs { dst: d, size: 4096 }),
        &[r(u64::MAX - 100, 4096)],
    );
    assert_eq!(st, Status::BadDescriptor);
    // DtoH into memory outside RAM must not write anything anywhere.
    let st = h.status(
        Request::MemcpyDtoH(MemcpyDtoHArgs { src: d, size: 64 }),
        &[w(RAM + 4096, 64)],
    );
    assert_eq!(st, Status::BadDescriptor);
    // Header outside RAM.
    let resp = h.space(48);
    h.submit(&[r(RAM * 4, 16), w(resp, 48)]);
    assert_eq!(
        Response::decode(&h.read(resp, 48)).expect("r").status(),
        Some(Status::BadDescriptor)
    );
    // Response outside RAM: returned with used length 0.
    let hb = h.put(
        &RequestHeader {
            opcode: Opcode::StreamSync as u32,
            flags: 0,
            id: 1,
        }
        .to_bytes(),
    );
    assert_eq!(h.submit(&[r(hb, 16), w(u64::MAX - 47, 48)]), 0);
    h.still_works();
    assert!(h.vgpu.stats().errors >= 5);
}

#[test]
fn overflowing_lengths() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(4096);
    let src = h.put(&[1u8; 64]);
    // Size far beyond the data descriptors.
    let st = h.status(
        Request::MemcpyHtoD(MemcpyHtoDArgs {
            dst: d,
            size: u64::MAX,
        }),
        &[r(src, 64)],
    );
    assert_eq!(st, Status::BadLength);
    // Data larger than the size named.
    let st = h.status(
        Request::MemcpyHtoD(MemcpyHtoDArgs { dst: d, size: 32 }),
        &[r(src, 64)],
    );
    assert_eq!(st, Status::BadLength);
    // Device pointer + size wrapping around.
    let st = h.status(
        Request::MemcpyDtoD(MemcpyDtoDArgs {
            dst: d,
            src: u64::MAX - 8,
            size: 64,
        }),
        &[],
    );
    assert_eq!(st, Status::BadDevicePointer);
    let st = h.status(
        Request::Memset(MemsetArgs {
            dst: d,
            count: u64::MAX,
            value: 0,
            elem_size: 4,
        }),
        &[],
    );
    assert_eq!(st, Status::BadDevicePointer);
    // Launch whose element count overflows the pointer extent.
    let m = h.builtin();
    let f = h.get_function(m, "fill")[0];
    let resp = h.launch(
        f,
        &[
            KernelArg::ptr(d, Access::Write),
            KernelArg::u32(1),
            KernelArg::u64(u64::MAX),
        ],
    );
    assert_eq!(resp.status(), Some(Status::BadDevicePointer));
    // Launch with arg_count past the limit.
    let mut buf = [0u8; 128];
    let n = encode_launch(
        &mut buf,
        3,
        &LaunchArgs {
            function: f,
            grid: [1; 3],
            block: [1; 3],
            ..Default::default()
        },
        &[],
        &[],
    )
    .expect("encode");
    buf[52..56].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        h.send_raw(&buf[..n], &[]).0.status(),
        Some(Status::BadArgCount)
    );
    h.still_works();
}

#[test]
fn too_few_descriptors() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    // A lone writable descriptor: it can hold the error.
    let resp = h.space(48);
    assert_eq!(h.submit(&[w(resp, 48)]), 48);
    let got = Response::decode(&h.read(resp, 48)).expect("r");
    assert_eq!((got.status(), got.id), (Some(Status::BadDescriptor), 0));
    // A lone readable descriptor: nowhere to answer; used length 0, queue keeps going.
    let hb = h.put(
        &RequestHeader {
            opcode: Opcode::GetInfo as u32,
            flags: 0,
            id: 1,
        }
        .to_bytes(),
    );
    assert_eq!(h.submit(&[r(hb, 16)]), 0);
    // GET_INFO without its data descriptor.
    assert_eq!(h.status(Request::GetInfo, &[]), Status::BadDescriptor);
    // HtoD without data.
    let d = h.alloc(64);
    assert_eq!(
        h.status(
            Request::MemcpyHtoD(MemcpyHtoDArgs { dst: d, size: 64 }),
            &[]
        ),
        Status::BadLength
    );
    h.still_works();
}

#[test]
fn read_only_where_writable_needed() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(64);
    let buf = h.put(&[0u8; 64]);
    assert_eq!(
        h.status(
            Request::MemcpyDtoH(MemcpyDtoHArgs { src: d, size: 64 }),
            &[r(buf, 64)]
        ),
        Status::BadDescriptor
    );
    assert_eq!(
        h.status(Request::GetInfo, &[r(buf, 128)]),
        Status::BadDescriptor
    );
    // Writable where readable is needed.
    assert_eq!(
        h.status(
            Request::MemcpyHtoD(MemcpyHtoDArgs { dst: d, size: 64 }),
            &[w(buf, 64)]
        ),
        Status::BadDescriptor
    );
    // Read-only response descriptor: nothing written, used length 0.
    let hb = h.put(
        &RequestHeader {
            opcode: Opcode::StreamSync as u32,
            flags: 0,
            id: 1,
        }
        .to_bytes(),
    );
    let resp = h.put(&[0xaa; 48]);
    assert_eq!(h.submit(&[r(hb, 16), r(resp, 48)]), 0);
    assert_eq!(h.read(resp, 48), vec![0xaa; 48]);
    // Response descriptor too short.
    let small = h.put(&[0xbb; 47]);
    assert_eq!(h.submit(&[r(hb, 16), w(small, 47)]), 0);
    assert_eq!(h.read(small, 47), vec![0xbb; 47]);
    // Extra data descriptors on an opcode that takes none.
    assert_eq!(
        h.status(Request::Free(FreeArgs { addr: d }), &[r(buf, 8)]),
        Status::BadDescriptor
    );
    h.still_works();
}

#[test]
fn device_pointer_outside_allocations() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(4096);
    let src = h.put(&[7u8; 64]);
    for dst in [0, d - 64, d + 4096 - 32, d + 2 * MIB, u64::MAX - 63] {
        let st = h.status(
            Request::MemcpyHtoD(MemcpyHtoDArgs { dst, size: 64 }),
            &[r(src, 64)],
        );
        assert_eq!(st, Status::BadDevicePointer, "dst {dst:#x}");
    }
    let out = h.space(64);
    assert_eq!(
        h.status(
            Request::MemcpyDtoH(MemcpyDtoHArgs {
                src: d + 4090,
                size: 64
            }),
            &[w(out, 64)]
        ),
        Status::BadDevicePointer
    );
    let m = h.builtin();
    let f = h.get_function(m, "vector_add")[0];
    let args = [
        KernelArg::ptr(d, Access::Read),
        KernelArg::ptr(d + 8 * MIB, Access::Read),
        KernelArg::ptr(d, Access::Write),
        KernelArg::u32(16),
    ];
    assert_eq!(h.launch(f, &args).status(), Some(Status::BadDevicePointer));
    // Declared READ for the output: refused as a bad argument type.
    let args = [
        KernelArg::ptr(d, Access::Read),
        KernelArg::ptr(d, Access::Read),
        KernelArg::ptr(d, Access::Read),
        KernelArg::u32(16),
    ];
    assert_eq!(h.launch(f, &args).status(), Some(Status::BadArgType));
    // Nothing was written into the allocation by the failed requests.
    assert_eq!(h.dtoh(d, 64), vec![0u8; 64]);
    h.still_works();
}

#[test]
fn double_free() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(4096);
    h.ok(Request::Free(FreeArgs { addr: d }), &[]);
    assert_eq!(
        h.status(Request::Free(FreeArgs { addr: d }), &[]),
        Status::BadDevicePointer
    );
    assert_eq!(
        h.status(Request::Free(FreeArgs { addr: 12345 }), &[]),
        Status::BadDevicePointer
    );
    h.still_works();
    let e = h.alloc(4096);
    assert_eq!(e, d, "freed range reused");
}

#[test]
fn unknown_function_and_module() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let m = h.builtin();
    let name = h.put(b"no_such_kernel");
    let st = h.status(
        Request::GetFunction(GetFunctionArgs {
            module: m,
            name_len: 14,
        }),
        &[r(name, 14)],
    );
    assert_eq!(st, Status::UnknownFunction);
    assert_eq!(
        h.launch(0xdead_beef, &[]).status(),
        Some(Status::UnknownFunction)
    );
    let name = h.put(b"builtin");
    let st = h.status(
        Request::GetFunction(GetFunctionArgs {
            module: m + 99,
            name_len: 7,
        }),
        &[r(name, 7)],
    );
    assert_eq!(st, Status::UnknownModule);
    let bad = h.put(b"cublas");
    let st = h.status(
        Request::ModuleLoad(ModuleLoadArgs {
            kind: module_kind::BUILTIN,
            flags: 0,
            size: 6,
        }),
        &[r(bad, 6)],
    );
    assert_eq!(st, Status::UnknownModule);
    let ptx = h.put(b".version 8.0\n.target sm_90\n");
    let st = h.status(
        Request::ModuleLoad(ModuleLoadArgs {
            kind: module_kind::PTX,
            flags: 0,
            size: 27,
        }),
        &[r(ptx, 27)],
    );
    assert_eq!(st, Status::NotSupported);
    let st = h.status(
        Request::ModuleLoad(ModuleLoadArgs {
            kind: 9,
            flags: 0,
            size: 7,
        }),
        &[r(name, 7)],
    );
    assert_eq!(st, Status::InvalidArgument);
    let st = h.status(
        Request::GetFunction(GetFunctionArgs {
            module: m,
            name_len: 0,
        }),
        &[],
    );
    assert_eq!(st, Status::InvalidArgument);
    h.ok(Request::ModuleUnload(ModuleUnloadArgs { module: m }), &[]);
    assert_eq!(
        h.status(Request::ModuleUnload(ModuleUnloadArgs { module: m }), &[]),
        Status::UnknownModule
    );
    h.still_works();
}

#[test]
fn wrong_argument_count_and_kinds() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let d = h.alloc(4096);
    let m = h.builtin();
    let f = h.get_function(m, "saxpy")[0];
    let resp = h.launch(f, &[KernelArg::f32(2.0), KernelArg::ptr(d, Access::Read)]);
    assert_eq!(resp.status(), Some(Status::BadArgCount));
    let resp = h.launch(
        f,
        &[
            KernelArg::u32(2),
            KernelArg::ptr(d, Access::Read),
            KernelArg::ptr(d, Access::ReadWrite),
            KernelArg::u32(4),
        ],
    );
    assert_eq!(resp.status(), Some(Status::BadArgType));
    let mut bad = KernelArg::f32(2.0);
    bad.kind = 77;
    let resp = h.launch(
        f,
        &[
            bad,
            KernelArg::ptr(d, Access::Read),
            KernelArg::ptr(d, Access::ReadWrite),
            KernelArg::u32(4),
        ],
    );
    assert_eq!(resp.status(), Some(Status::BadArgType));
    // Bad geometry.
    let mut buf = [0u8; 256];
    let la = LaunchArgs {
        function: f,
        grid: [1, 0, 1],
        block: [1; 3],
        ..Default::default()
    };
    let n = encode_launch(&mut buf, 1, &la, &[], &[]).expect("encode");
    assert_eq!(
        h.send_raw(&buf[..n], &[]).0.status(),
        Some(Status::InvalidArgument)
    );
    let la = LaunchArgs {
        function: f,
        grid: [1; 3],
        block: [1024, 2, 1],
        ..Default::default()
    };
    let n = encode_launch(&mut buf, 2, &la, &[], &[]).expect("encode");
    assert_eq!(
        h.send_raw(&buf[..n], &[]).0.status(),
        Some(Status::InvalidArgument)
    );
    // Found by fuzzing: a block whose thread count overflows u64. A wrapping product
    // would be 0 here and pass the limit; it must be refused, not panic.
    for block in [[u32::MAX, u32::MAX, u32::MAX], [1 << 31, 1 << 31, 4]] {
        let la = LaunchArgs {
            function: f,
            grid: [1; 3],
            block,
            ..Default::default()
        };
        let n = encode_launch(&mut buf, 2, &la, &[], &[]).expect("encode");
        assert_eq!(
            h.send_raw(&buf[..n], &[]).0.status(),
            Some(Status::InvalidArgument),
            "{block:?}"
        );
    }
    let la = LaunchArgs {
        function: f,
        grid: [1; 3],
        block: [1; 3],
        task_id: 4,
        ..Default::default()
    };
    let n = encode_launch(&mut buf, 3, &la, &[], &[4]).expect("encode");
    assert_eq!(
        h.send_raw(&buf[..n], &[]).0.status(),
        Some(Status::InvalidArgument)
    );
    // Flags: unknown bits and malformed clusters are refused; a well-formed cluster is
    // refused as not supported by this sim device, which runs no clusters.
    for (flags, grid, want) in [
        (2, [1, 1, 1], Status::InvalidArgument),
        (
            vgpu_proto::LAUNCH_CLUSTER | 1 << 16 | 1 << 24,
            [1, 1, 1],
            Status::InvalidArgument,
        ),
        (
            LaunchArgs::cluster_flags([4, 4, 2]),
            [4, 4, 2],
            Status::InvalidArgument,
        ),
        (
            LaunchArgs::cluster_flags([2, 1, 1]),
            [3, 1, 1],
            Status::InvalidArgument,
        ),
        (
            LaunchArgs::cluster_flags([2, 1, 1]),
            [4, 1, 1],
            Status::NotSupported,
        ),
    ] {
        let la = LaunchArgs {
            function: f,
            grid,
            block: [1; 3],
            flags,
            ..Default::default()
        };
        let n = encode_launch(&mut buf, 3, &la, &[], &[]).expect("encode");
        assert_eq!(
            h.send_raw(&buf[..n], &[]).0.status(),
            Some(want),
            "flags {flags:#x} grid {grid:?}"
        );
    }
    // A correct saxpy with task-graph fields still runs.
    let la = LaunchArgs {
        function: f,
        grid: [1; 3],
        block: [1; 3],
        task_id: 5,
        rank: 10,
        ..Default::default()
    };
    let args = [
        KernelArg::f32(2.0),
        KernelArg::ptr(d, Access::Read),
        KernelArg::ptr(d, Access::ReadWrite),
        KernelArg::u32(4),
    ];
    let n = encode_launch(&mut buf, 4, &la, &args, &[1, 2]).expect("encode");
    assert_eq!(h.send_raw(&buf[..n], &[]).0.status(), Some(Status::Ok));
    h.still_works();
}
