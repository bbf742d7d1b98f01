//! What the node can still give: per profile, one device per slice the GPUs' free memory,
//! compute and copy shares can still hold, plus the slices already handed out (the vGPUs
//! this agent created, found by their labels in vgpud). Pure functions of vgpud's answers,
//! so the device plugin, the DRA driver and the tests see the same numbers.

use std::collections::{BTreeMap, BTreeSet};

use vgpu_api::api::{Gpu, Vgpu, VgpuState};
use vgpu_api::units::fraction_to_permille;

use crate::config::{Config, Profile};

/// At most this many devices of one profile on one GPU (a tiny profile on a big GPU would
/// otherwise list thousands).
pub const MAX_SLOTS_PER_GPU: u32 = 64;

/// The value of the agent label on every vGPU this agent creates.
pub const AGENT: &str = "vgpu-k8s";

/// The label keys of this agent's vGPUs, under the configured domain.
#[derive(Clone, Debug)]
pub struct LabelKeys {
    /// `DOMAIN/agent` = `vgpu-k8s`.
    pub agent: String,
    /// `DOMAIN/resource`: the profile of a device plugin allocation.
    pub resource: String,
    /// `DOMAIN/devices`: the device plugin device IDs it holds, comma-separated.
    pub devices: String,
    /// `DOMAIN/claim`: the ResourceClaim UID of a DRA allocation.
    pub claim: String,
    /// `DOMAIN/device`: the DRA device it serves.
    pub device: String,
}

impl LabelKeys {
    pub fn new(domain: &str) -> Self {
        Self {
            agent: format!("{domain}/agent"),
            resource: format!("{domain}/resource"),
            devices: format!("{domain}/devices"),
            claim: format!("{domain}/claim"),
            device: format!("{domain}/device"),
        }
    }

    /// Whether this agent created `v`.
    pub fn ours(&self, v: &Vgpu) -> bool {
        v.labels.get(&self.agent).map(String::as_str) == Some(AGENT)
    }

    /// The device plugin allocation `v` holds: its profile and device IDs.
    pub fn allocation<'a>(&self, v: &'a Vgpu) -> Option<(&'a str, Vec<String>)> {
        if !self.ours(v) {
            return None;
        }
        let profile = v.labels.get(&self.resource)?;
        let ids = decode_devices(v.labels.get(&self.devices)?)?;
        Some((profile.as_str(), ids))
    }
}

/// The label value naming the device IDs of one GPU's slices: `gpu<G>:<K>,<K>,...` (short
/// enough for vgpud's 256-character label values at 64 slices).
pub fn encode_devices(ids: &[String]) -> Option<String> {
    let mut gpu = None;
    let mut ks = Vec::new();
    for id in ids {
        let (g, k) = parse_device_id(id)?;
        if *gpu.get_or_insert(g) != g {
            return None;
        }
        ks.push(k.to_string());
    }
    Some(format!("gpu{}:{}", gpu?, ks.join(",")))
}

/// The device IDs of an [`encode_devices`] label value.
pub fn decode_devices(s: &str) -> Option<Vec<String>> {
    let (g, ks) = s.strip_prefix("gpu")?.split_once(':')?;
    let g: u32 = g.parse().ok()?;
    ks.split(',')
        .map(|k| k.parse::<u32>().ok().map(|k| device_id(g, k)))
        .collect()
}

/// One advertised device of a profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// `gpu<G>-<K>`.
    pub id: String,
    pub gpu: u32,
    pub healthy: bool,
}

/// The devices of every profile, by profile name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Whether vgpud answered.
    pub reachable: bool,
    pub devices: BTreeMap<String, Vec<Device>>,
}

impl Snapshot {
    /// The same devices, every one unhealthy: what the kubelet is told while vgpud does
    /// not answer.
    pub fn all_unhealthy(&self) -> Snapshot {
        let mut s = self.clone();
        s.reachable = false;
        for d in s.devices.values_mut().flatten() {
            d.healthy = false;
        }
        s
    }
}

/// The device ID of slot `k` of a profile on GPU `gpu`.
pub fn device_id(gpu: u32, k: u32) -> String {
    format!("gpu{gpu}-{k}")
}

/// The GPU and slot of a device ID.
pub fn parse_device_id(id: &str) -> Option<(u32, u32)> {
    let (g, k) = id.strip_prefix("gpu")?.split_once('-')?;
    let gpu = g.parse().ok()?;
    let k = k.parse().ok()?;
    (device_id(gpu, k) == id).then_some((gpu, k))
}

/// How many more slices of `p` fit what `gpu` has free.
pub fn free_slots(p: &Profile, gpu: &Gpu) -> u32 {
    let by = |free: u64, each: u64| {
        free.checked_div(each)
            .unwrap_or(u64::from(MAX_SLOTS_PER_GPU))
    };
    let compute_free = 1000u32.saturating_sub(fraction_to_permille(gpu.compute_committed));
    let copy_free = 1000u32.saturating_sub(fraction_to_permille(gpu.copy_committed));
    let n = by(gpu.memory_free_bytes, p.memory_bytes)
        .min(by(compute_free.into(), p.compute_permille.into()))
        .min(by(copy_free.into(), p.copy_permille.into()))
        .min(MAX_SLOTS_PER_GPU.into());
    u32::try_from(n).unwrap_or(MAX_SLOTS_PER_GPU)
}

/// Every profile's devices: on each GPU the profile is offered on, the slices this agent
/// handed out (healthy unless their vGPU failed) and then the free ones, numbered from 0
/// skipping those in use. A GPU vgpud no longer lists keeps its handed-out devices,
/// unhealthy.
pub fn snapshot(config: &Config, gpus: &[Gpu], vgpus: &[Vgpu]) -> Snapshot {
    let keys = LabelKeys::new(&config.domain);
    let mut devices = BTreeMap::new();
    for p in &config.profiles {
        // Handed-out device IDs of this profile: id -> healthy.
        let mut held: BTreeMap<(u32, u32), bool> = BTreeMap::new();
        for v in vgpus {
            let Some((profile, ids)) = keys.allocation(v) else {
                continue;
            };
            if profile != p.name {
                continue;
            }
            let failed = matches!(v.state, VgpuState::Failed { .. });
            let gpu_listed = gpus.iter().any(|g| g.index == v.gpu);
            for id in &ids {
                if let Some(gk) = parse_device_id(id) {
                    held.insert(gk, !failed && gpu_listed);
                }
            }
        }
        let mut list = Vec::new();
        let gpu_ids: BTreeSet<u32> = gpus
            .iter()
            .map(|g| g.index)
            .chain(held.keys().map(|(g, _)| *g))
            .collect();
        for gi in gpu_ids {
            for (&(g, k), &healthy) in held.range((gi, 0)..=(gi, u32::MAX)) {
                list.push(Device {
                    id: device_id(g, k),
                    gpu: g,
                    healthy,
                });
            }
            let Some(gpu) = gpus.iter().find(|g| g.index == gi) else {
                continue;
            };
            if !p.on_gpu(gi) {
                continue;
            }
            let mut free = free_slots(p, gpu);
            let mut k = 0u32;
            while free > 0 {
                if !held.contains_key(&(gi, k)) {
                    list.push(Device {
                        id: device_id(gi, k),
                        gpu: gi,
                        healthy: true,
                    });
                    free -= 1;
                }
                k += 1;
            }
        }
        devices.insert(p.name.clone(), list);
    }
    Snapshot {
        reachable: true,
        devices,
    }
}

/// GetPreferredAllocation's choice: the `must` devices, then `size` in all from `available`
/// on as few GPUs as possible: the GPU of the `must` devices first, then the GPU whose free
/// devices fit what is left most tightly (so big GPUs stay whole for big requests), else
/// the GPUs with the most free devices first.
pub fn preferred(available: &[String], must: &[String], size: usize) -> Vec<String> {
    let mut chosen: Vec<String> = must.to_vec();
    let mut by_gpu: BTreeMap<u32, Vec<(u32, String)>> = BTreeMap::new();
    for id in available {
        if chosen.contains(id) {
            continue;
        }
        if let Some((g, k)) = parse_device_id(id) {
            by_gpu.entry(g).or_default().push((k, id.clone()));
        }
    }
    for list in by_gpu.values_mut() {
        list.sort();
    }
    let must_gpus: BTreeSet<u32> = must
        .iter()
        .filter_map(|id| parse_device_id(id).map(|(g, _)| g))
        .collect();
    let take = |chosen: &mut Vec<String>, list: &mut Vec<(u32, String)>| {
        while chosen.len() < size && !list.is_empty() {
            let (_, id) = list.remove(0);
            chosen.push(id);
        }
    };
    for g in &must_gpus {
        if let Some(list) = by_gpu.get_mut(g) {
            take(&mut chosen, list);
        }
    }
    while chosen.len() < size {
        let left = size - chosen.len();
        let fit = by_gpu
            .iter()
            .filter(|(_, l)| l.len() >= left)
            .min_by_key(|(g, l)| (l.len(), **g))
            .map(|(g, _)| *g);
        let pick = fit.or_else(|| {
            by_gpu
                .iter()
                .filter(|(_, l)| !l.is_empty())
                .max_by_key(|(g, l)| (l.len(), std::cmp::Reverse(**g)))
                .map(|(g, _)| *g)
        });
        let Some(g) = pick else { break };
        if let Some(list) = by_gpu.get_mut(&g) {
            take(&mut chosen, list);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, free: u64, compute: f64) -> Gpu {
        serde_json::from_value(serde_json::json!({
            "index": index, "name": format!("sim-{index}"), "backend": "sim",
            "memory_bytes": 8u64 << 30, "memory_committed_bytes": (8u64 << 30) - free,
            "memory_free_bytes": free, "memory_shared_bytes": 0, "oversubscribed_pool_bytes": 0,
            "oversubscribed_resident_bytes": 0, "swap_area_bytes": 0, "swap_area_used_bytes": 0,
            "copy_bandwidth": 0, "speed": 1.0, "compute_committed": compute,
            "copy_committed": compute, "vgpus": []
        }))
        .expect("a Gpu")
    }

    fn config() -> Config {
        Config::parse(r#"{"profiles": [{"name": "g2-25", "memory": "2G", "compute": 0.25}]}"#)
            .expect("config")
    }

    fn ids(s: &Snapshot) -> Vec<(String, bool)> {
        s.devices["g2-25"]
            .iter()
            .map(|d| (d.id.clone(), d.healthy))
            .collect()
    }

    #[test]
    fn free_shares_give_the_device_count_and_handed_out_slices_keep_their_ids() {
        let c = config();
        // GPU 0: 8G, nothing committed: 4 slices by compute and memory. GPU 1: 30% left.
        let s = snapshot(&c, &[gpu(0, 8 << 30, 0.0), gpu(1, 8 << 30, 0.7)], &[]);
        assert_eq!(
            ids(&s),
            [
                ("gpu0-0", true),
                ("gpu0-1", true),
                ("gpu0-2", true),
                ("gpu0-3", true),
                ("gpu1-0", true)
            ]
            .map(|(i, h)| (i.to_owned(), h))
        );
        // gpu0-1 handed out (its vGPU now counts in GPU 0's committed shares): 3 free.
        let mut v: Vgpu = serde_json::from_value(serde_json::json!({
            "id": 7, "gpu": 0, "memory_bytes": 2u64 << 30, "compute_share": 0.25, "copy_share": 0.25,
            "priority": 0, "oversubscribe": false, "share_group": null, "queues": 1,
            "state": {"kind": "ready"}, "vm": null, "owned_by_vm": false, "socket": "/s",
            "worker_pid": null,
            "labels": {"vgpu.dev/agent": "vgpu-k8s", "vgpu.dev/resource": "g2-25", "vgpu.dev/devices": "gpu0:1"}
        }))
        .expect("a Vgpu");
        let s = snapshot(&c, &[gpu(0, 6 << 30, 0.25)], std::slice::from_ref(&v));
        assert_eq!(
            ids(&s),
            [
                ("gpu0-1", true),
                ("gpu0-0", true),
                ("gpu0-2", true),
                ("gpu0-3", true)
            ]
            .map(|(i, h)| (i.to_owned(), h))
        );
        // Its vGPU failed: that device is unhealthy; its GPU gone: too, the rest with it.
        v.state = VgpuState::Failed { reason: "x".into() };
        let s = snapshot(&c, &[gpu(0, 6 << 30, 0.25)], std::slice::from_ref(&v));
        assert_eq!(
            s.devices["g2-25"][0],
            Device {
                id: "gpu0-1".into(),
                gpu: 0,
                healthy: false
            }
        );
        v.state = VgpuState::Ready;
        let s = snapshot(&c, &[], std::slice::from_ref(&v));
        assert_eq!(ids(&s), [("gpu0-1".to_owned(), false)]);
        // Memory short: 1 slice.
        let s = snapshot(&c, &[gpu(0, 3 << 30, 0.0)], &[]);
        assert_eq!(ids(&s).len(), 1);
        assert!(s.all_unhealthy().devices["g2-25"]
            .iter()
            .all(|d| !d.healthy));
    }

    #[test]
    fn a_gpus_slices_fit_one_label_value() {
        let ids: Vec<String> = (0..MAX_SLOTS_PER_GPU).map(|k| device_id(12, k)).collect();
        let label = encode_devices(&ids).expect("one GPU");
        assert!(label.len() <= 256, "{}", label.len());
        assert_eq!(decode_devices(&label), Some(ids));
        assert_eq!(encode_devices(&["gpu0-1".into(), "gpu1-1".into()]), None);
        assert_eq!(encode_devices(&[]), None);
        for bad in ["gpu1:", "gpu1:x", "gpux:1", "1:1"] {
            assert_eq!(decode_devices(bad), None, "{bad}");
        }
    }

    #[test]
    fn device_ids_round_trip_and_reject_lookalikes() {
        assert_eq!(parse_device_id(&device_id(3, 12)), Some((3, 12)));
        for bad in [
            "gpu", "gpu1", "gpu-1", "gpux-1", "gpu01-1", "gpu1-01", "cpu1-1", "gpu1-1-1",
        ] {
            assert_eq!(parse_device_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn preferred_allocations_pack_onto_the_fewest_gpus() {
        let avail: Vec<String> = [
            "gpu0-0", "gpu0-1", "gpu0-2", "gpu1-0", "gpu1-1", "gpu1-2", "gpu1-3",
        ]
        .map(String::from)
        .to_vec();
        // 3 fit GPU 0 exactly: the tightest fit.
        assert_eq!(preferred(&avail, &[], 3), ["gpu0-0", "gpu0-1", "gpu0-2"]);
        // 4 fit GPU 1 only.
        assert_eq!(
            preferred(&avail, &[], 4),
            ["gpu1-0", "gpu1-1", "gpu1-2", "gpu1-3"]
        );
        // A must-include device pulls its GPU first.
        assert_eq!(
            preferred(&avail, &["gpu1-2".into()], 2),
            ["gpu1-2", "gpu1-0"]
        );
        // 5 cannot fit one GPU: the fullest first, then the rest.
        let five = preferred(&avail, &[], 5);
        assert_eq!(five, ["gpu1-0", "gpu1-1", "gpu1-2", "gpu1-3", "gpu0-0"]);
        assert_eq!(preferred(&avail, &[], 20).len(), 7);
    }
}
