//! Swapping through the pager and shared objects.

use super::*;

/// Swapping on each backend: a pager with room for half of its data keeps every
/// byte through evictions to host memory and API-driven restores, and a kernel restores
/// what its pointers reach.
#[test]
fn pager_keeps_every_byte_through_swapping() {
    use std::sync::Arc;
    use vgpu_backend::pager::{LocalBroker, Pager};
    let mut backends: Vec<(&str, Arc<dyn Backend>)> = vec![("sim", Arc::new(sim(256 * MIB)))];
    match cuda_skip() {
        None => backends.push(("cuda", Arc::new(cuda(256 * MIB)))),
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
    for (name, inner) in backends {
        let broker = LocalBroker::new(16 * MIB, 0);
        // 128 MiB beside what the backend charged at start (cuda: its context reserve).
        let share = 128 * MIB + inner.memory_usage().used;
        let p = Arc::new(Pager::new(inner, broker.member(1, 0), share));
        broker.attach(1, &p);
        let bufs: Vec<u64> = (0..4)
            .map(|_| p.alloc(8 * MIB).expect("alloc").addr)
            .collect();
        for (i, a) in bufs.iter().enumerate() {
            put(&*p, *a, &pattern(8 << 20, i as u8)).expect("fill");
        }
        for round in 0..2u8 {
            for (i, a) in bufs.iter().enumerate() {
                let want = pattern(8 << 20, i as u8 + round * 16);
                assert_eq!(
                    get(&*p, *a, 8 << 20).expect("read"),
                    want,
                    "{name}: buffer {i}"
                );
                put(&*p, *a, &pattern(8 << 20, i as u8 + (round + 1) * 16)).expect("write");
            }
        }
        // A kernel on a swapped-out buffer: `fill` on bufs[0] after the others pushed it out.
        let f = builtin(&*p, "fill");
        p.launch_one(
            f,
            &LaunchConfig {
                grid: [64, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
            },
            &[
                w(bufs[0]),
                ArgValue::U32(0x0707_0707),
                ArgValue::U64(2 << 20),
            ],
        )
        .expect("fill");
        assert!(
            get(&*p, bufs[0], 8 << 20)
                .expect("read")
                .iter()
                .all(|v| *v == 7),
            "{name}"
        );
        let s = p.state();
        assert!(s.evictions > 0 && s.restores > 0, "{name}: {s:?}");
        eprintln!("{name}: pager {s:?}");
    }
}

/// A shared object (`export` makes one of `size` bytes) mapped read-write by one vGPU and
/// read-only by another: the bytes are the same memory, the read-only mapping refuses
/// writes before they reach the device, nothing is charged to the mappers, and the
/// mappings go with `free`.
fn shared_object_case(
    name: &str,
    export: &dyn Fn(u64) -> std::os::fd::OwnedFd,
    a: &dyn Backend,
    b: &dyn Backend,
) {
    const SIZE: u64 = 3 * MIB + 4096;
    let fd = export(SIZE);
    let dup = fd.try_clone().expect("dup");
    let (used_a, used_b) = (a.memory_usage().used, b.memory_usage().used);
    let wa = a
        .shared_memory()
        .expect("shared memory")
        .import(fd, SIZE, false)
        .expect("import read-write");
    let rb = b
        .shared_memory()
        .expect("shared memory")
        .import(dup, SIZE, true)
        .expect("import read-only");
    assert_eq!(
        get(b, rb, 4096).expect("fresh"),
        vec![0; 4096],
        "{name}: zeroed"
    );
    let bytes = pattern(SIZE as usize, 7);
    put(a, wa, &bytes).expect("write through the read-write mapping");
    a.synchronize();
    assert_eq!(get(b, rb, SIZE as usize).expect("read"), bytes, "{name}");
    assert_eq!(status(put(b, rb, &[1])), Status::BadDevicePointer, "{name}");
    assert_eq!(
        status(b.memset(rb, 0, 1, 1)),
        Status::BadDevicePointer,
        "{name}"
    );
    assert_eq!(
        status(b.copy_dtod(rb, rb + 4096, 16)),
        Status::BadDevicePointer
    );
    assert_eq!(
        status(a.check_range(wa, SIZE + 1)),
        Status::BadDevicePointer,
        "{name}"
    );
    assert_eq!(a.memory_usage().used, used_a, "{name}: not charged");
    assert_eq!(b.memory_usage().used, used_b, "{name}: not charged");
    // A kernel's WRITE pointer into the read-only mapping is refused before it runs (on a
    // GPU the write would fault and lose the context); the bytes stay, the backend serves.
    let fill = builtin(b, "fill");
    let fill_args = [w(rb), ArgValue::U32(0xdead_beef), ArgValue::U64(16)];
    assert_eq!(
        status(b.launch_one(fill, &CFG, &fill_args)),
        Status::BadDevicePointer,
        "{name}: kernel write into a read-only mapping"
    );
    assert_eq!(get(b, rb, 64).expect("read"), bytes[..64], "{name}: intact");
    b.free(rb).expect("detach read-only");
    a.free(wa).expect("detach read-write");
    assert!(get(a, wa, 1).is_err(), "{name}: unmapped");
}

#[test]
fn shared_objects_map_read_write_and_read_only() {
    let (a, b) = (sim(64 * MIB), sim(64 * MIB));
    let export = |size| {
        a.shared_memory()
            .expect("shared memory")
            .export(size)
            .expect("export")
    };
    shared_object_case("sim", &export, &a, &b);
    // The sim's object is sealed: nobody can shrink it under a mapper.
    let fd = a
        .shared_memory()
        .expect("shared memory")
        .export(MIB)
        .expect("export");
    // SAFETY: plain fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::F_GET_SEALS) };
    assert_eq!(seals, vgpu_backend::sim::SHARED_SEALS, "sim: sealed");
    assert!(
        a.shared_memory().expect("shared memory").export(0).is_err(),
        "sim: an empty object is refused"
    );
    match cuda_skip() {
        None => {
            let (a, b) = (cuda(64 * MIB), cuda(64 * MIB));
            let export = |size| {
                a.shared_memory()
                    .expect("shared memory")
                    .export(size)
                    .expect("export")
            };
            shared_object_case("cuda", &export, &a, &b);
            let fd = a
                .shared_memory()
                .expect("shared memory")
                .export(MIB)
                .expect("export");
            let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
            // SAFETY: fstat writes one stat into `st` (zeroed, so valid either way).
            let rc = unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd), st.as_mut_ptr()) };
            // SAFETY: zero-initialised and written by fstat.
            let st = unsafe { st.assume_init() };
            eprintln!(
                "cuda: exported object fstat rc {rc} mode {:o} size {} rdev {:#x}",
                st.st_mode, st.st_size, st.st_rdev
            );
        }
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}
