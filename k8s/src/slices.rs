//! ResourceSlices (resource.k8s.io/v1) describing what the DRA driver offers: one slice per
//! GPU in the node's pool, each with a counter set (`gpu-<G>`: `memory` in bytes,
//! `compute` and `copy` in per mille of the GPU) holding what DRA may use there (what is
//! free plus what DRA claims hold), and per profile the devices (`gpu-<G>-<profile>-<K>`)
//! that many slices of it could fill, each consuming its profile's amounts, so the
//! scheduler never allocates more than the GPU can give.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use vgpu_api::api::{Gpu, Vgpu, VgpuState};
use vgpu_api::units::fraction_to_permille;

use crate::config::{Config, Profile};
use crate::inventory::LabelKeys;

/// At most this many devices in one slice (the API's limit for devices that consume
/// counters).
pub const MAX_DEVICES_PER_SLICE: usize = 64;

/// A DRA device's name.
pub fn device_name(gpu: u32, profile: &str, k: u32) -> String {
    format!("gpu-{gpu}-{profile}-{k}")
}

/// The GPU and profile of a device name this driver published.
pub fn parse_device_name<'a>(config: &'a Config, name: &str) -> Option<(u32, &'a Profile)> {
    let rest = name.strip_prefix("gpu-")?;
    let (g, rest) = rest.split_once('-')?;
    let gpu: u32 = g.parse().ok()?;
    let (profile, k) = rest.rsplit_once('-')?;
    let k: u32 = k.parse().ok()?;
    let p = config.profile(profile)?;
    (device_name(gpu, &p.name, k) == name).then_some((gpu, p))
}

/// What DRA may use on a GPU: its free memory and shares plus what DRA claims hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub memory_bytes: u64,
    pub compute_permille: u32,
    pub copy_permille: u32,
}

/// Capacity of `gpu` for DRA, given every vGPU vgpud lists.
pub fn capacity(keys: &LabelKeys, gpu: &Gpu, vgpus: &[Vgpu]) -> Capacity {
    let mut c = Capacity {
        memory_bytes: gpu.memory_free_bytes,
        compute_permille: 1000u32.saturating_sub(fraction_to_permille(gpu.compute_committed)),
        copy_permille: 1000u32.saturating_sub(fraction_to_permille(gpu.copy_committed)),
    };
    for v in vgpus {
        let holds = !matches!(v.state, VgpuState::Failed { .. } | VgpuState::Released);
        if v.gpu == gpu.index && holds && keys.ours(v) && v.labels.contains_key(&keys.claim) {
            c.memory_bytes = c.memory_bytes.saturating_add(v.memory_bytes);
            c.compute_permille += fraction_to_permille(v.compute_share);
            c.copy_permille += fraction_to_permille(v.copy_share);
        }
    }
    c.compute_permille = c.compute_permille.min(1000);
    c.copy_permille = c.copy_permille.min(1000);
    c
}

fn qty(n: u64) -> Quantity {
    Quantity(n.to_string())
}

fn counters(memory: u64, compute: u32, copy: u32) -> BTreeMap<String, Counter> {
    BTreeMap::from([
        ("memory".to_owned(), Counter { value: qty(memory) }),
        (
            "compute".to_owned(),
            Counter {
                value: qty(compute.into()),
            },
        ),
        (
            "copy".to_owned(),
            Counter {
                value: qty(copy.into()),
            },
        ),
    ])
}

/// The node's slices, one per GPU, in the pool named after the node; `generation` is the
/// pool's (bump it on every change).
pub fn build(
    config: &Config,
    node: &str,
    generation: i64,
    gpus: &[Gpu],
    vgpus: &[Vgpu],
) -> Vec<ResourceSlice> {
    let keys = LabelKeys::new(&config.domain);
    let count = i64::try_from(gpus.len()).unwrap_or(i64::MAX);
    let profiles_per_gpu = config.profiles.len().max(1);
    gpus.iter()
        .map(|gpu| {
            let g = gpu.index;
            let cap = capacity(&keys, gpu, vgpus);
            let set = format!("gpu-{g}");
            let mut devices = Vec::new();
            for p in config.profiles.iter().filter(|p| p.on_gpu(g)) {
                let by = |have: u64, each: u64| have.checked_div(each).unwrap_or(u64::MAX);
                let slots = by(cap.memory_bytes, p.memory_bytes)
                    .min(by(cap.compute_permille.into(), p.compute_permille.into()))
                    .min(by(cap.copy_permille.into(), p.copy_permille.into()))
                    .min((MAX_DEVICES_PER_SLICE / profiles_per_gpu) as u64);
                for k in 0..u32::try_from(slots).unwrap_or(0) {
                    let attributes = BTreeMap::from([
                        (
                            "gpu".to_owned(),
                            DeviceAttribute {
                                int: Some(g.into()),
                                ..Default::default()
                            },
                        ),
                        (
                            "gpuName".to_owned(),
                            DeviceAttribute {
                                string: Some(gpu.name.clone()),
                                ..Default::default()
                            },
                        ),
                        (
                            "backend".to_owned(),
                            DeviceAttribute {
                                string: Some(gpu.backend.clone()),
                                ..Default::default()
                            },
                        ),
                        (
                            "profile".to_owned(),
                            DeviceAttribute {
                                string: Some(p.name.clone()),
                                ..Default::default()
                            },
                        ),
                    ]);
                    let capacity = BTreeMap::from([
                        (
                            "memory".to_owned(),
                            DeviceCapacity {
                                value: qty(p.memory_bytes),
                                ..Default::default()
                            },
                        ),
                        (
                            "compute".to_owned(),
                            DeviceCapacity {
                                value: qty(p.compute_permille.into()),
                                ..Default::default()
                            },
                        ),
                        (
                            "copy".to_owned(),
                            DeviceCapacity {
                                value: qty(p.copy_permille.into()),
                                ..Default::default()
                            },
                        ),
                    ]);
                    devices.push(Device {
                        name: device_name(g, &p.name, k),
                        attributes: Some(attributes),
                        capacity: Some(capacity),
                        consumes_counters: Some(vec![DeviceCounterConsumption {
                            counter_set: set.clone(),
                            counters: counters(p.memory_bytes, p.compute_permille, p.copy_permille),
                        }]),
                        ..Default::default()
                    });
                }
            }
            ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(slice_name(node, &config.domain, g)),
                    ..Default::default()
                },
                spec: ResourceSliceSpec {
                    driver: config.domain.clone(),
                    node_name: Some(node.to_owned()),
                    pool: ResourcePool {
                        name: node.to_owned(),
                        generation,
                        resource_slice_count: count,
                    },
                    shared_counters: Some(vec![CounterSet {
                        name: set,
                        counters: counters(
                            gpu.memory_bytes.min(cap.memory_bytes),
                            cap.compute_permille,
                            cap.copy_permille,
                        ),
                    }]),
                    devices: Some(devices),
                    ..Default::default()
                },
            }
        })
        .collect()
}

/// The object name of GPU `gpu`'s slice on `node`.
pub fn slice_name(node: &str, domain: &str, gpu: u32) -> String {
    format!("{node}-{}-gpu-{gpu}", domain.replace('.', "-"))
}
