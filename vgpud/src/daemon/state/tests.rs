//! The records' commitments and the state lock's waiting, on a daemon that starts no
//! process.

use super::super::admission::tests::admit;
use super::super::core::testing::{daemon, spec};
use super::*;

#[test]
fn commitments_count_live_vgpus_and_migration_targets() {
    let d = daemon(2);
    let a = admit(&d, spec(Some(0), 1 << 30, 0.2)).expect("a");
    let b = admit(&d, spec(Some(0), 2 << 30, 0.3)).expect("b");
    d.state.with(|i| {
        let all = i.committed(0, None);
        assert_eq!((all.memory, all.compute), (3 << 30, 500));
        assert_eq!(
            i.committed(0, Some(a)).compute,
            300,
            "except leaves one out"
        );
        // A vGPU moving to GPU 1 counts there too until its migration ends.
        if let Some(r) = i.vgpus.get_mut(&b) {
            r.migrating_to = Some(1);
        }
        assert_eq!(i.committed(1, None).compute, 300);
        assert_eq!(i.vgpus[&b].pools(), vec![0, 1]);
        // Released vGPUs hold nothing.
        if let Some(r) = i.vgpus.get_mut(&a) {
            r.state = VgpuState::Released;
        }
        assert_eq!(i.committed(0, None).compute, 300);
        assert!(i.worker_gone(a) && i.worker_gone(999));
    });
}

#[test]
fn a_change_on_its_way_holds_the_larger_shares() {
    let d = daemon(1);
    let a = admit(&d, spec(Some(0), 1 << 30, 0.6)).expect("a");
    d.state.with(|i| {
        let r = i.vgpus.get_mut(&a).expect("a");
        // Down to 0.2: the room is freed only once the change is applied.
        r.pending = Some(Shares {
            compute: 200,
            copy: 700,
            priority: 0,
        });
        let c = i.committed(0, None);
        assert_eq!((c.compute, c.copy), (600, 700), "the larger of old and new");
        let r = i.vgpus.get_mut(&a).expect("a");
        (r.compute, r.copy, r.pending) = (200, 700, None);
        assert_eq!(i.committed(0, None).compute, 200);
    });
}

#[test]
fn waiting_ends_when_the_condition_holds_or_the_time_is_up() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = std::sync::Arc::new(State::new());
        assert!(
            !s.wait_until(Duration::from_millis(20), |i| i.next_vm > 1)
                .await
        );
        let bump = {
            let s = s.clone();
            tokio::spawn(async move {
                s.with(|i| i.next_vm = 5);
                s.notify();
            })
        };
        assert!(
            s.wait_until(Duration::from_secs(5), |i| i.next_vm == 5)
                .await
        );
        bump.await.expect("task");
    });
}
