//! The register programming the VFIO path uses (`Driver` over `Bar`), run against the
//! emulated controller's register model and against models of broken controllers.

mod common;

use common::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vgpu_storage::bar::{Bar, DmaMapper, Doorbell};
use vgpu_storage::controller::{Driver, DriverOptions, EmulatedController, EmulatedOptions};
use vgpu_storage::nvme::{regs, NvmeStatus};
use vgpu_storage::queue::queue_memory_bytes;
use vgpu_storage::{DmaRegion, DmaSlice, Error, Result};

/// Records every register write on its way to the model.
struct Recording<B> {
    inner: B,
    writes: Mutex<Vec<(u64, u32)>>,
}

impl<B: Bar> Bar for Recording<B> {
    fn read32(&self, offset: u64) -> u32 {
        self.inner.read32(offset)
    }
    fn write32(&self, offset: u64, value: u32) {
        self.writes.lock().unwrap().push((offset, value));
        self.inner.write32(offset, value)
    }
    fn doorbell(&self, offset: u64) -> Result<Doorbell> {
        self.inner.doorbell(offset)
    }
}

#[test]
fn driver_programs_admin_queue_then_enables_and_creates_io_queues() {
    let f = pattern_file("bar", 1 << 12);
    let ctrl = EmulatedController::start(EmulatedOptions::new(&f.0)).unwrap();
    let bar = Arc::new(Recording {
        inner: ctrl.bar(),
        writes: Mutex::new(Vec::new()),
    });
    let dma: Arc<dyn DmaMapper> = Arc::new(ctrl.bar());
    let d = Driver::init(bar.clone(), dma, &DriverOptions::default()).unwrap();

    let writes = bar.writes.lock().unwrap().clone();
    let pos = |off: u64| writes.iter().position(|w| w.0 == off).unwrap();
    let enable = writes
        .iter()
        .position(|w| w.0 == regs::CC && w.1 & regs::CC_EN != 0)
        .unwrap();
    assert!(pos(regs::AQA) < enable && pos(regs::ASQ) < enable && pos(regs::ACQ) < enable);
    let cc = bar.read32(regs::CC);
    assert_eq!(regs::cc_iosqes(cc), 6);
    assert_eq!(regs::cc_iocqes(cc), 4);
    assert_eq!(regs::cc_mps(cc), 0);
    assert_eq!(bar.read32(regs::AQA), (31 << 16) | 31);
    assert_eq!(bar.read32(regs::CSTS) & regs::CSTS_RDY, regs::CSTS_RDY);
    assert_eq!(d.namespace().blocks, 64);
    assert_eq!(d.controller().model, "vgpu emulated NVMe");
    assert_eq!(d.io_queues(), 64);

    let mem = || DmaSlice::whole(DmaRegion::host(queue_memory_bytes(16)).unwrap());
    let t = Duration::from_secs(1);
    let q1 = d.create_queue_pair(1, 16, mem(), t).unwrap();
    // Same id twice, an id above the grant, a depth above CAP.MQES.
    assert!(matches!(
        d.create_queue_pair(1, 16, mem(), t),
        Err(Error::Status(NvmeStatus::InvalidQueueIdentifier))
    ));
    assert!(matches!(
        d.create_queue_pair(65, 16, mem(), t),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        d.create_queue_pair(2, 8192, mem(), t),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(q1.qid(), 1);
    d.delete_queue_pair(1).unwrap();
    assert!(matches!(
        d.delete_queue_pair(1),
        Err(Error::Status(NvmeStatus::InvalidQueueIdentifier))
    ));
    d.shutdown().unwrap();
    assert_eq!(bar.read32(regs::CSTS) & regs::CSTS_RDY, 0);
    // A second bring-up of the same controller works (reset path).
    let d2 = Driver::init(bar.clone(), Arc::new(ctrl.bar()), &DriverOptions::default()).unwrap();
    d2.create_queue_pair(1, 16, mem(), t).unwrap();
}

#[test]
fn enable_with_an_unmapped_admin_queue_sets_fatal_status() {
    let f = pattern_file("cfs", 1 << 12);
    let ctrl = EmulatedController::start(EmulatedOptions::new(&f.0)).unwrap();
    let bar = ctrl.bar();
    let unmapped = DmaRegion::host(8192).unwrap();
    bar.write32(regs::AQA, (3 << 16) | 3);
    bar.write64(regs::ASQ, unmapped.iova());
    bar.write64(regs::ACQ, unmapped.iova() + 4096);
    bar.write32(regs::CC, regs::CC_CONFIG | regs::CC_EN);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while bar.read32(regs::CSTS) & regs::CSTS_CFS == 0 {
        assert!(std::time::Instant::now() < deadline, "CFS never set");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(bar.read32(regs::CSTS) & regs::CSTS_RDY, 0);
    // Disabling clears the fatal state; the driver can then bring it up properly.
    bar.write32(regs::CC, 0);
    while bar.read32(regs::CSTS) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "reset never cleared CSTS"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    Driver::init(
        Arc::new(bar.clone()),
        Arc::new(bar),
        &DriverOptions::default(),
    )
    .unwrap();
}

/// A controller model frozen in one CSTS value.
struct Frozen {
    csts: u32,
    doorbells: Arc<Vec<std::sync::atomic::AtomicU32>>,
}

impl Bar for Frozen {
    fn read32(&self, offset: u64) -> u32 {
        match offset {
            regs::CAP => 0x3ff,           // MQES 1023, TO 0
            o if o == regs::CAP + 4 => 0, // DSTRD 0
            regs::CSTS => self.csts,
            _ => 0,
        }
    }
    fn write32(&self, _offset: u64, _value: u32) {}
    fn doorbell(&self, offset: u64) -> Result<Doorbell> {
        let i = ((offset - regs::DOORBELL_BASE) / 4) as usize;
        let keep: Arc<dyn Send + Sync> = self.doorbells.clone();
        // SAFETY: index within the vector kept alive by `keep`.
        Ok(unsafe { Doorbell::new(&self.doorbells[i], None, keep) })
    }
}

struct NoIommu;
impl DmaMapper for NoIommu {
    fn map(&self, _region: &Arc<DmaRegion>) -> Result<()> {
        Ok(())
    }
}

fn frozen(csts: u32) -> Arc<Frozen> {
    Arc::new(Frozen {
        csts,
        doorbells: Arc::new((0..8).map(|_| Default::default()).collect()),
    })
}

#[test]
fn a_controller_that_never_becomes_ready_times_out() {
    let opts = DriverOptions {
        timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let r = Driver::init(frozen(0), Arc::new(NoIommu), &opts);
    assert!(
        matches!(r, Err(Error::ControllerTimeout { state: "ready", .. })),
        "{:?}",
        r.err()
    );
    // Stuck ready while we want it disabled.
    let r = Driver::init(frozen(regs::CSTS_RDY), Arc::new(NoIommu), &opts);
    assert!(
        matches!(
            r,
            Err(Error::ControllerTimeout {
                state: "disabled",
                ..
            })
        ),
        "{:?}",
        r.err()
    );
}

#[test]
fn fatal_status_and_a_vanished_device_are_reported() {
    let opts = DriverOptions {
        timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let r = Driver::init(frozen(regs::CSTS_CFS), Arc::new(NoIommu), &opts);
    assert!(matches!(r, Err(Error::ControllerFatal)), "{:?}", r.err());
    // All-ones reads: the device fell off the bus.
    let r = Driver::init(frozen(u32::MAX), Arc::new(NoIommu), &opts);
    assert!(matches!(r, Err(Error::ControllerFatal)), "{:?}", r.err());
}
