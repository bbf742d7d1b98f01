//! A batch answered from inside the backend's call, the moment its kernels ended
//! (`Backend::launch_then`, `Vgpu::run_batch_then`), or after the call when not every
//! launch of it went to the GPU and succeeded.

use super::*;

impl Ring {
    /// The used index the guest could see when the last backend call's `ended` returned.
    fn used_at_end(&self) -> u16 {
        *self
            .backend
            .used_at_end
            .lock()
            .expect("lock")
            .last()
            .expect("a launch_then call")
    }
}

fn statuses(out: Vec<Option<Response>>) -> Vec<Status> {
    out.into_iter()
        .map(|r| r.expect("response").status().expect("status"))
        .collect()
}

#[test]
fn a_lone_launch_is_answered_and_in_the_used_ring_before_the_backend_call_returns() {
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(64);
    let fill = ring.function("fill");
    for value in 1..4 {
        ring.post_launch(la(fill), &fill_args(buf, value, 16), &[]);
        let before = ring.completed;
        assert_eq!(statuses(ring.kick()), vec![Status::Ok]);
        assert_eq!(
            ring.used_at_end(),
            before.wrapping_add(1),
            "completed while the backend call was still open"
        );
        assert_eq!(
            ring.dtoh_words(buf, 16),
            vec![value; 16],
            "the kernel's writes"
        );
    }
    assert_eq!(
        ring.calls(),
        vec![1, 1, 1],
        "each launch a backend call of its own"
    );
}

#[test]
fn a_batch_of_launches_that_all_succeed_is_completed_inside_the_call() {
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(4 * 64);
    let fill = ring.function("fill");
    ring.be.vgpu().kernel_times.record(fill, 1000);
    for i in 0..4u32 {
        ring.post_launch(
            la(fill),
            &fill_args(buf + u64::from(i) * 64, i + 7, 16),
            &[],
        );
    }
    let before = ring.completed;
    assert_eq!(statuses(ring.kick()), vec![Status::Ok; 4]);
    assert_eq!(ring.calls().last(), Some(&4), "one batch");
    assert_eq!(ring.used_at_end(), before.wrapping_add(4));
    let words = ring.dtoh_words(buf, 64);
    for i in 0..4u32 {
        assert_eq!(words[(i * 16) as usize..][..16], [i + 7; 16]);
    }
}

#[test]
fn a_batch_with_a_refused_launch_is_answered_after_the_call_in_ring_order() {
    let mut ring = Ring::new(wide_window(), false);
    let buf = ring.alloc(64);
    let fill = ring.function("fill");
    ring.be.vgpu().kernel_times.record(fill, 1000);
    ring.post_launch(la(fill), &fill_args(buf, 1, 16), &[]);
    // No threads in a block: refused by the device's checks, answered in its place.
    let empty = LaunchArgs {
        block: [0, 1, 1],
        ..la(fill)
    };
    ring.post_launch(empty, &fill_args(buf, 2, 16), &[]);
    ring.post_launch(la(fill), &fill_args(buf, 3, 16), &[]);
    let before = ring.completed;
    let out = statuses(ring.kick());
    assert_eq!(out[0], Status::Ok);
    assert_ne!(out[1], Status::Ok, "the refused launch gets its error");
    assert_eq!(out[2], Status::Ok);
    assert_eq!(
        ring.used_at_end(),
        before,
        "nothing completed inside the call"
    );
    assert_eq!(ring.dtoh_words(buf, 16), vec![3; 16]);
}

#[test]
fn a_faulting_launch_is_answered_with_its_fault_after_the_call() {
    let mut ring = Ring::new(wide_window(), false);
    let (src, idx, dst) = (ring.alloc(64), ring.alloc(64), ring.alloc(64));
    let g = ring.function("gather");
    // idx[0] = 9 is past src_len = 4: the gather faults.
    gather(&mut ring, g, (src, idx, dst), 9);
    let before = ring.completed;
    assert_eq!(statuses(ring.kick()), vec![Status::KernelFault]);
    assert_eq!(ring.used_at_end(), before, "answered after the call");
    // The queue goes on.
    let buf = ring.alloc(64);
    let fill = ring.function("fill");
    ring.post_launch(la(fill), &fill_args(buf, 5, 16), &[]);
    assert_eq!(statuses(ring.kick()), vec![Status::Ok]);
    assert_eq!(ring.dtoh_words(buf, 16), vec![5; 16]);
}
