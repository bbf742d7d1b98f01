//! The guest-facing request path: `vgpu_proto::parse_request` on arbitrary header bytes
//! (and an encode/parse round trip of whatever parses), then whole descriptor chains with
//! fuzzer-chosen addresses, lengths, flags and `next` links (loops, indirect tables,
//! addresses past guest RAM and near 2^64) served by `vgpu_device::Vgpu` over a sim GPU.
//! Invariants 1 and 2: every chain gets a response or a used length of 0, never a panic, a
//! hang or an access outside guest RAM.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use vgpu_backend::{SimConfig, SimGpu};
use vgpu_device::{DeviceConfig, GuestMem, Vgpu};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

const RAM: u64 = 4 << 20;
const QSIZE: u16 = 16;
/// Header bytes of record `i` go to `HDR + i * 4096`.
const HDR: u64 = 1 << 20;
/// Data descriptors of kind 1 point into `DATA..RAM`.
const DATA: u64 = 2 << 20;

struct World {
    mem: GuestMem,
    vgpu: Vgpu,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let sim = SimGpu::new(SimConfig {
            memory: 16 << 20,
            va_size: 1 << 30,
            threads: 1,
            // `spin` lasts duration / speed: keep the longest a guest may ask for short.
            speed: 1e6,
            ..SimConfig::default()
        })
        .expect("sim");
        let cfg = DeviceConfig {
            vgpu_id: 1,
            num_queues: 1,
            queue_size: QSIZE,
            memory_share: 8 << 20,
            compute_share: 500,
            copy_share: 500,
            batch: vgpu_device::BatchLimits::default(),
        };
        World {
            mem: GuestMem::from_ranges(&[(GuestAddress(0), RAM as usize)]).expect("guest ram"),
            vgpu: Vgpu::new(cfg, Arc::new(sim)).expect("vgpu"),
        }
    })
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.0.get(..4)?;
        self.0 = &self.0[4..];
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn parse_only(bytes: &[u8]) {
    match vgpu_proto::parse_request(bytes) {
        Ok((hdr, req)) => {
            let _ = req.data_len();
            let mut out = [0u8; 2048];
            let n = req.encode(hdr.id, &mut out).expect("a parsed request re-encodes");
            let (h2, r2) = vgpu_proto::parse_request(&out[..n]).expect("re-encoded parses");
            assert_eq!(h2.id, hdr.id);
            assert_eq!(r2.opcode(), req.opcode());
            assert_eq!(r2.data_len(), req.data_len());
        }
        Err((_, e)) => {
            let _ = e.status();
            let _ = e.to_string();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    parse_only(data);
    let w = world();
    let vq = MockSplitQueue::new(&w.mem, QSIZE);
    let mut q: Queue = vq.create_queue().expect("queue");
    let mut inp = Input(data);
    let mut heads = Vec::new();
    // Records: [ndesc][ndesc x (kind u8, off u32, len u32, next u8)][hlen u8][header bytes]
    let mut slot = 0u16;
    for rec in 0..4u64 {
        let Some(n) = inp.u8() else { break };
        let n = u16::from(n % 8) + 1;
        if slot + n > QSIZE {
            break;
        }
        let head = slot;
        for i in 0..n {
            let (Some(kind), Some(off), Some(len), Some(next)) =
                (inp.u8(), inp.u32(), inp.u32(), inp.u8())
            else {
                return;
            };
            let addr = match (kind >> 2) & 3 {
                0 => HDR + rec * 4096 + u64::from(off % 4096),
                1 => DATA + u64::from(off) % (RAM - DATA),
                2 => RAM.wrapping_sub(u64::from(off % 8192)),
                _ => u64::MAX - u64::from(off),
            };
            let len = if kind & 0x10 != 0 { len } else { len % 0x1_0000 };
            // bit 0: WRITE; bit 1: INDIRECT; NEXT links to the following slot unless
            // bit 5 asks for a fuzzer-chosen `next` (loops, out of range).
            let mut flags = 0u16;
            if kind & 1 != 0 {
                flags |= virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
            }
            if kind & 2 != 0 {
                flags |= virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT as u16;
            }
            let nxt = if kind & 0x20 != 0 {
                u16::from(next)
            } else {
                slot + 1
            };
            if i + 1 < n || kind & 0x40 != 0 {
                flags |= virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
            }
            let d = RawDescriptor::from(Descriptor::new(addr, len, flags, nxt));
            vq.desc_table().store(slot, d).expect("store");
            slot += 1;
        }
        let hlen = usize::from(inp.u8().unwrap_or(0));
        let hdr = inp.take(hlen).to_vec();
        w.mem
            .write_slice(&hdr, GuestAddress(HDR + rec * 4096))
            .expect("write header");
        heads.push(head);
    }
    for (i, h) in heads.iter().enumerate() {
        vq.avail()
            .ring()
            .ref_at(i)
            .expect("avail slot")
            .store(*h);
    }
    vq.avail().idx().store(heads.len() as u16);
    let mut served = 0;
    while let Some(chain) = q.pop_descriptor_chain(&w.mem) {
        let head = chain.head_index();
        let used = w.vgpu.process_chain(0, &w.mem, chain);
        q.add_used(&w.mem, head, used).expect("add_used");
        served += 1;
        assert!(served <= heads.len(), "more chains than were offered");
    }
});
