//! Bringing a controller up through its registers, the same code for the emulated
//! controller, a VFIO-bound device and the test register model: disable, program the
//! admin queue (AQA/ASQ/ACQ), enable (CC) and wait for CSTS.RDY, identify, then create
//! and delete I/O queue pairs with admin commands.

use crate::bar::{Bar, DmaMapper};
use crate::error::{Error, Result};
use crate::memory::{DmaRegion, DmaSlice};
use crate::nvme::identify::{ControllerInfo, NamespaceInfo};
use crate::nvme::sqe::{CNS_CONTROLLER, CNS_NAMESPACE};
use crate::nvme::{regs, Sqe, PAGE_SIZE};
use crate::queue::{queue_memory_bytes, QueuePair, QueueSetup};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct DriverOptions {
    /// Admin queue depth (power of two, at most 4096).
    pub admin_depth: u32,
    /// Upper bound on waiting for CSTS changes and admin completions.
    pub timeout: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            admin_depth: 32,
            timeout: Duration::from_secs(5),
        }
    }
}

pub struct Driver {
    bar: Arc<dyn Bar>,
    dma: Arc<dyn DmaMapper>,
    dstrd: u32,
    mqes: u32,
    admin: QueuePair,
    /// Serialises identify calls that share the identify page.
    scratch: Mutex<DmaSlice>,
    controller: ControllerInfo,
    namespace: NamespaceInfo,
    io_queues: u16,
}

fn wait_csts(bar: &dyn Bar, want_ready: bool, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let csts = bar.read32(regs::CSTS);
        if csts == u32::MAX {
            // All-ones reads mean the device fell off the bus.
            return Err(Error::ControllerFatal);
        }
        if want_ready && csts & regs::CSTS_CFS != 0 {
            return Err(Error::ControllerFatal);
        }
        if (csts & regs::CSTS_RDY != 0) == want_ready {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(Error::ControllerTimeout {
                state: if want_ready { "ready" } else { "disabled" },
                waited: timeout,
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Driver {
    /// Reset and enable the controller, identify it and namespace 1.
    pub fn init(bar: Arc<dyn Bar>, dma: Arc<dyn DmaMapper>, opts: &DriverOptions) -> Result<Self> {
        let cap = bar.read64(regs::CAP);
        let mqes = regs::cap_mqes(cap);
        let dstrd = regs::cap_dstrd(cap);
        let ready_timeout =
            Duration::from_millis(regs::cap_timeout_ms(cap).max(500)).min(opts.timeout);
        let admin_depth = opts.admin_depth.min(mqes).min(4096);

        if bar.read32(regs::CC) & regs::CC_EN != 0 {
            bar.write32(regs::CC, 0);
        }
        wait_csts(&*bar, false, ready_timeout)?;

        let mem = DmaRegion::host(queue_memory_bytes(admin_depth) + PAGE_SIZE)?;
        dma.map(&mem)?;
        let qmem = DmaSlice::new(mem.clone(), 0, queue_memory_bytes(admin_depth))?;
        let scratch = DmaSlice::new(mem, queue_memory_bytes(admin_depth), PAGE_SIZE)?;
        let admin = QueuePair::new(QueueSetup {
            qid: 0,
            depth: admin_depth,
            memory: qmem,
            sq_doorbell: bar.doorbell(regs::doorbell_offset(0, false, dstrd))?,
            cq_doorbell: bar.doorbell(regs::doorbell_offset(0, true, dstrd))?,
            timeout: opts.timeout,
        })?;
        bar.write32(regs::AQA, ((admin_depth - 1) << 16) | (admin_depth - 1));
        bar.write64(regs::ASQ, admin.sq_iova());
        bar.write64(regs::ACQ, admin.cq_iova());
        bar.write32(regs::CC, regs::CC_CONFIG | regs::CC_EN);
        wait_csts(&*bar, true, ready_timeout)?;

        let mut d = Driver {
            bar,
            dma,
            dstrd,
            mqes,
            admin,
            scratch: Mutex::new(scratch),
            controller: ControllerInfo {
                vid: 0,
                serial: String::new(),
                model: String::new(),
                max_transfer: 0,
                namespaces: 0,
            },
            namespace: NamespaceInfo {
                nsid: 1,
                blocks: 0,
                block_size: 512,
            },
            io_queues: 0,
        };
        let page = d.identify(CNS_CONTROLLER, 0)?;
        d.controller = ControllerInfo::parse(&page);
        let page = d.identify(CNS_NAMESPACE, 1)?;
        d.namespace = NamespaceInfo::parse(1, &page);
        let granted = d
            .admin
            .execute(Sqe::set_number_of_queues(u16::MAX - 1, u16::MAX - 1))?;
        d.io_queues = ((granted.dw0 & 0xffff) as u16)
            .min((granted.dw0 >> 16) as u16)
            .saturating_add(1);
        tracing::info!(model = %d.controller.model, blocks = d.namespace.blocks, block_size = d.namespace.block_size, io_queues = d.io_queues, "NVMe controller ready");
        Ok(d)
    }

    fn identify(&self, cns: u32, nsid: u32) -> Result<Box<[u8; PAGE_SIZE]>> {
        let buf = self
            .scratch
            .lock()
            .map_err(|_| Error::InvalidArgument("identify buffer lock poisoned".into()))?;
        self.admin.execute(Sqe::identify(cns, nsid, buf.iova()))?;
        let mut page = Box::new([0u8; PAGE_SIZE]);
        buf.read_to(&mut page[..]);
        Ok(page)
    }

    pub fn controller(&self) -> &ControllerInfo {
        &self.controller
    }
    pub fn namespace(&self) -> NamespaceInfo {
        self.namespace
    }
    /// I/O queue pairs the controller granted.
    pub fn io_queues(&self) -> u16 {
        self.io_queues
    }
    pub fn max_queue_entries(&self) -> u32 {
        self.mqes
    }
    pub fn dma(&self) -> &Arc<dyn DmaMapper> {
        &self.dma
    }
    pub fn bar(&self) -> &Arc<dyn Bar> {
        &self.bar
    }

    /// Create I/O queue pair `qid` in caller memory (at least `queue_memory_bytes(depth)`,
    /// page-aligned); the memory is mapped for the device here.
    pub fn create_queue_pair(
        &self,
        qid: u16,
        depth: u32,
        memory: DmaSlice,
        timeout: Duration,
    ) -> Result<QueuePair> {
        if qid == 0 || qid > self.io_queues {
            return Err(Error::InvalidArgument(format!(
                "queue id {qid} outside 1..={} granted by the controller",
                self.io_queues
            )));
        }
        if depth > self.mqes {
            return Err(Error::InvalidArgument(format!(
                "queue depth {depth} above the controller's maximum {}",
                self.mqes
            )));
        }
        self.dma.map(memory.region())?;
        let qp = QueuePair::new(QueueSetup {
            qid,
            depth,
            memory,
            sq_doorbell: self
                .bar
                .doorbell(regs::doorbell_offset(qid, false, self.dstrd))?,
            cq_doorbell: self
                .bar
                .doorbell(regs::doorbell_offset(qid, true, self.dstrd))?,
            timeout,
        })?;
        self.admin
            .execute(Sqe::create_io_cq(qid, depth, qp.cq_iova()))?;
        if let Err(e) = self
            .admin
            .execute(Sqe::create_io_sq(qid, depth, qp.sq_iova(), qid))
        {
            let _ = self.admin.execute(Sqe::delete_io_cq(qid));
            return Err(e);
        }
        Ok(qp)
    }

    pub fn delete_queue_pair(&self, qid: u16) -> Result<()> {
        self.admin.execute(Sqe::delete_io_sq(qid))?;
        self.admin.execute(Sqe::delete_io_cq(qid))?;
        Ok(())
    }

    /// Normal shutdown (CC.SHN), then disable. Data written before is durable after.
    pub fn shutdown(&self) -> Result<()> {
        let cc = self.bar.read32(regs::CC);
        self.bar
            .write32(regs::CC, (cc & !regs::CC_SHN_MASK) | regs::CC_SHN_NORMAL);
        let start = Instant::now();
        while self.bar.read32(regs::CSTS) & regs::CSTS_SHST_MASK != regs::CSTS_SHST_DONE {
            if start.elapsed() > Duration::from_secs(2) {
                return Err(Error::ControllerTimeout {
                    state: "shut down",
                    waited: Duration::from_secs(2),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.bar.write32(regs::CC, 0);
        wait_csts(&*self.bar, false, Duration::from_secs(2))
    }
}
