//! A read-only mapping of a shared object (`SHM_AT` with the read-only flag) on the sim
//! backend: the sim maps it `PROT_READ`, so every write path (HtoD, memset, a DtoD
//! destination, a kernel's WRITE or READ_WRITE pointer) must be refused with
//! `BAD_DEVICE_POINTER` before it touches the bytes. Were it not, the write would fault
//! this test process (SIGSEGV), as it faulted the worker.

use std::os::fd::AsFd;

use vgpu_backend::sim::shared_object;
use vgpu_backend::{
    Access, ArgValue, Backend, BackendError, LaunchConfig, LaunchOne, ModuleImage, SimConfig,
    SimGpu,
};
use vgpu_proto::Status;
use vm_memory::VolatileSlice;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 8192;

fn gpu() -> SimGpu {
    SimGpu::new(SimConfig {
        memory: 64 * MIB,
        va_size: 1 << 30,
        threads: 2,
        ..SimConfig::default()
    })
    .expect("sim gpu")
}

fn refused(r: vgpu_backend::Result<impl std::fmt::Debug>, what: &str) {
    match r {
        Err(e @ BackendError::ReadOnly { .. }) => {
            assert_eq!(e.status(), Status::BadDevicePointer, "{what}");
            assert!(e.to_string().contains("read-only"), "{what}: {e}");
        }
        other => panic!("{what}: expected a read-only refusal, got {other:?}"),
    }
}

fn ptr(addr: u64, access: Access) -> ArgValue {
    ArgValue::Ptr { addr, access }
}

const CFG: LaunchConfig = LaunchConfig {
    grid: [1; 3],
    block: [1; 3],
    shared_bytes: 0,
};

#[test]
fn every_write_into_a_read_only_mapping_is_refused_and_the_bytes_stay() {
    let g = gpu();
    let object = shared_object(SIZE).expect("shared object");
    let rw = g
        .shared_memory()
        .expect("shared memory")
        .import(
            object.as_fd().try_clone_to_owned().expect("dup"),
            SIZE,
            false,
        )
        .expect("read-write mapping");
    let ro = g
        .shared_memory()
        .expect("shared memory")
        .import(object, SIZE, true)
        .expect("read-only mapping");
    let own = g.alloc(SIZE).expect("alloc").addr;

    let mut pattern: Vec<u8> = (0..SIZE).map(|i| (i * 7 + 3) as u8).collect();
    g.copy_htod(rw, &VolatileSlice::from(&mut pattern[..]))
        .expect("writing through the read-write mapping");

    let mut junk = vec![0xEEu8; SIZE as usize];
    refused(g.copy_htod(ro, &VolatileSlice::from(&mut junk[..])), "HtoD");
    refused(
        g.copy_htod(ro + 100, &VolatileSlice::from(&mut junk[..16])),
        "HtoD inside",
    );
    refused(g.memset(ro, 0xAB, 1, SIZE), "memset");
    refused(g.memset(ro + 4, 0xAB, 4, 1), "memset of one word");
    refused(g.copy_dtod(ro, own, SIZE), "DtoD destination");

    let m = g
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin module");
    let fill = g.modules().get_function(m, b"fill").expect("fill").handle;
    let checksum = g
        .modules()
        .get_function(m, b"checksum")
        .expect("checksum")
        .handle;
    refused(
        g.launch_one(
            fill,
            &CFG,
            &[ptr(ro, Access::Write), ArgValue::U32(1), ArgValue::U64(16)],
        ),
        "kernel WRITE pointer",
    );
    refused(
        g.launch_one(
            checksum,
            &CFG,
            &[
                ptr(own, Access::Read),
                ArgValue::U64(16),
                ptr(ro + 8, Access::ReadWrite),
            ],
        ),
        "kernel READ_WRITE pointer",
    );

    // Reads through the read-only mapping work, and see the bytes unchanged.
    let mut back = vec![0u8; SIZE as usize];
    g.copy_dtoh(ro, &VolatileSlice::from(&mut back[..]))
        .expect("reading the read-only mapping");
    assert_eq!(back, pattern, "no refused write changed a byte");
    g.copy_dtod(own, ro, SIZE)
        .expect("a read-only mapping as a DtoD source");
    g.launch_one(
        checksum,
        &CFG,
        &[
            ptr(ro, Access::Read),
            ArgValue::U64(SIZE),
            ptr(own, Access::Write),
        ],
    )
    .expect("a kernel reading the read-only mapping");

    // The read-write mapping of the same object still takes writes.
    g.memset(rw, 0x5A, 1, SIZE)
        .expect("memset through the read-write mapping");
    g.copy_dtoh(ro, &VolatileSlice::from(&mut back[..]))
        .expect("dtoh");
    assert!(back.iter().all(|b| *b == 0x5A));
}
