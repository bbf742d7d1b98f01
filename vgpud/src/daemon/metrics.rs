//! `GET /metrics`: Prometheus text exposition, built fresh from the daemon's state at each
//! scrape (so vGPUs that are gone never linger as stale series).

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use super::core::Daemon;
use super::rebalancing;
use super::state::State;
use super::stats;
use super::workers::pool;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
}

/// A vGPU's labels: `vgpu`, `gpu`, and `name` when it has one.
type VgpuLabels = Vec<(String, String)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

type FGauge = Family<GpuLabels, Gauge<f64, AtomicU64>>;
type VGauge = Family<VgpuLabels, Gauge<f64, AtomicU64>>;
type VCounter = Family<VgpuLabels, Counter<u64>>;

/// The names of the vGPUs that have one.
fn vgpu_names(state: &State) -> BTreeMap<u32, String> {
    state.with(|i| {
        i.vgpus
            .values()
            .filter_map(|r| r.name().clone().map(|n| (r.id(), n)))
            .collect()
    })
}

fn vgpu_labels(vgpu: u32, gpu: u32, names: &BTreeMap<u32, String>) -> VgpuLabels {
    let mut l = vec![
        ("vgpu".into(), vgpu.to_string()),
        ("gpu".into(), gpu.to_string()),
    ];
    if let Some(n) = names.get(&vgpu) {
        l.push(("name".into(), n.clone()));
    }
    l
}

fn fgauge(reg: &mut Registry, name: &str, help: &str) -> FGauge {
    let f = FGauge::default();
    reg.register(name, help, f.clone());
    f
}

fn vgauge(reg: &mut Registry, name: &str, help: &str) -> VGauge {
    let f = VGauge::default();
    reg.register(name, help, f.clone());
    f
}

fn vcounter(reg: &mut Registry, name: &str, help: &str) -> VCounter {
    let f = VCounter::default();
    reg.register(name, help, f.clone());
    f
}

/// The metrics now, as Prometheus/OpenMetrics text.
pub fn render(d: &Daemon) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::with_prefix("vgpud");
    gpu_metrics(&mut reg, d);
    vgpu_metrics(&mut reg, d);
    rebalancer_metrics(&mut reg, d);
    vm_metrics(&mut reg, d);
    let mut out = String::new();
    encode(&mut out, &reg)?;
    Ok(out)
}

/// Each physical GPU's memory and commitments.
fn gpu_metrics(reg: &mut Registry, d: &Daemon) {
    let gpu_mem = fgauge(
        reg,
        "gpu_memory_bytes",
        "Device memory of each physical GPU",
    );
    let gpu_mem_c = fgauge(
        reg,
        "gpu_memory_committed_bytes",
        "Memory promised to live vGPUs",
    );
    let gpu_comp_c = fgauge(
        reg,
        "gpu_compute_committed_ratio",
        "Sum of live vGPUs' compute shares",
    );
    let gpu_copy_c = fgauge(
        reg,
        "gpu_copy_committed_ratio",
        "Sum of live vGPUs' copy shares",
    );
    let handovers = Family::<GpuLabels, Counter<u64>>::default();
    reg.register(
        "gpu_compute_handovers",
        "Times the compute engine went from one vGPU to another (a context switch on a real GPU)",
        handovers.clone(),
    );
    let copy_handovers = Family::<GpuLabels, Counter<u64>>::default();
    reg.register(
        "gpu_copy_handovers",
        "Times the copy engine went from one vGPU to another",
        copy_handovers.clone(),
    );
    for g in stats::gpus(d) {
        let l = GpuLabels {
            gpu: g.index.to_string(),
        };
        handovers.get_or_create(&l).inc_by(g.compute_handovers);
        copy_handovers.get_or_create(&l).inc_by(g.copy_handovers);
        gpu_mem.get_or_create(&l).set(g.memory_bytes as f64);
        gpu_mem_c
            .get_or_create(&l)
            .set(g.memory_committed_bytes as f64);
        gpu_comp_c.get_or_create(&l).set(g.compute_committed);
        gpu_copy_c.get_or_create(&l).set(g.copy_committed);
    }
    let pool = fgauge(
        reg,
        "gpu_worker_pool_idle",
        "Idle pool workers (GPU backend built, waiting for a vGPU) of each physical GPU",
    );
    for (gpu, idle) in pool::pool_sizes(d) {
        let l = GpuLabels {
            gpu: gpu.to_string(),
        };
        pool.get_or_create(&l).set(idle as f64);
    }
}

/// Each vGPU's utilization, shares, memory and counters.
fn vgpu_metrics(reg: &mut Registry, d: &Daemon) {
    let comp_u = vgauge(
        reg,
        "vgpu_compute_utilization_ratio",
        "Kernel time over wall time in the stats window",
    );
    let copy_u = vgauge(
        reg,
        "vgpu_copy_utilization_ratio",
        "Copied bytes over the GPU's copy bandwidth in the stats window",
    );
    let comp_s = vgauge(reg, "vgpu_compute_share_ratio", "Guaranteed compute share");
    let copy_s = vgauge(reg, "vgpu_copy_share_ratio", "Guaranteed copy share");
    let mem_share = vgauge(
        reg,
        "vgpu_memory_share_bytes",
        "Memory the vGPU may allocate",
    );
    let mem_used = vgauge(reg, "vgpu_memory_used_bytes", "Memory allocated");
    let mem_res = vgauge(
        reg,
        "vgpu_memory_resident_bytes",
        "Allocated memory in device memory",
    );
    let mem_swap = vgauge(
        reg,
        "vgpu_memory_swapped_bytes",
        "Allocated memory swapped to host memory",
    );
    let live = vgauge(reg, "vgpu_live", "1 while the vGPU's worker runs");
    let requests = vcounter(reg, "vgpu_requests", "Requests completed");
    let errors = vcounter(
        reg,
        "vgpu_request_errors",
        "Requests answered with an error",
    );
    let kernels = vcounter(reg, "vgpu_kernels", "Kernels completed");
    let kernel_ns = vcounter(
        reg,
        "vgpu_kernel_nanoseconds",
        "Device time of completed kernels",
    );
    let htod = vcounter(reg, "vgpu_htod_bytes", "Bytes copied host to device");
    let dtoh = vcounter(reg, "vgpu_dtoh_bytes", "Bytes copied device to host");
    let comp_over = vcounter(
        reg,
        "vgpu_compute_overruns",
        "Requests that held the compute engine past the vGPU's kernel deadline",
    );
    let copy_over = vcounter(
        reg,
        "vgpu_copy_overruns",
        "Requests that held the copy engine past the vGPU's kernel deadline",
    );
    let violations = vcounter(
        reg,
        "vgpu_grant_violations",
        "Implausible values the vGPU's worker wrote on its grant page",
    );
    let names = vgpu_names(&d.state);
    for s in stats::all_stats(d) {
        let l = vgpu_labels(s.vgpu, s.gpu, &names);
        comp_u.get_or_create(&l).set(s.compute_utilization);
        if let Some(c) = s.copy_utilization {
            copy_u.get_or_create(&l).set(c);
        }
        comp_s.get_or_create(&l).set(s.compute_share);
        copy_s.get_or_create(&l).set(s.copy_share);
        mem_share.get_or_create(&l).set(s.memory_share_bytes as f64);
        mem_used.get_or_create(&l).set(s.memory_used_bytes as f64);
        mem_res
            .get_or_create(&l)
            .set(s.memory_resident_bytes as f64);
        mem_swap
            .get_or_create(&l)
            .set(s.memory_swapped_bytes as f64);
        live.get_or_create(&l).set(if s.live { 1.0 } else { 0.0 });
        requests.get_or_create(&l).inc_by(s.requests);
        errors.get_or_create(&l).inc_by(s.errors);
        kernels.get_or_create(&l).inc_by(s.kernels);
        kernel_ns.get_or_create(&l).inc_by(s.kernel_ns);
        htod.get_or_create(&l).inc_by(s.bytes_htod);
        dtoh.get_or_create(&l).inc_by(s.bytes_dtoh);
        comp_over.get_or_create(&l).inc_by(s.compute_overruns);
        copy_over.get_or_create(&l).inc_by(s.copy_overruns);
        violations.get_or_create(&l).inc_by(u64::from(s.violations));
    }
}

/// The rebalancer's view: each GPU's and vGPU's demand, overload and idle time.
fn rebalancer_metrics(reg: &mut Registry, d: &Daemon) {
    let rb = rebalancing::rebalancer_status(d);
    let load = fgauge(
        reg,
        "gpu_demand_ratio",
        "Smoothed demand (busy + queue wait) over capacity, max of compute and copy",
    );
    let overloaded = fgauge(
        reg,
        "gpu_overloaded",
        "1 while the GPU has been overloaded for a whole rebalancer window",
    );
    let idle = fgauge(reg, "gpu_idle", "1 while the GPU holds no vGPU");
    let over_s = Family::<GpuLabels, Counter<f64, AtomicU64>>::default();
    reg.register(
        "gpu_overload_seconds",
        "Time the GPU's demand was above the overload threshold",
        over_s.clone(),
    );
    let idle_s = Family::<GpuLabels, Counter<f64, AtomicU64>>::default();
    reg.register(
        "gpu_idle_seconds",
        "Time the GPU held no vGPU",
        idle_s.clone(),
    );
    for g in &rb.gpus {
        let l = GpuLabels {
            gpu: g.gpu.to_string(),
        };
        load.get_or_create(&l).set(g.load);
        overloaded
            .get_or_create(&l)
            .set(if g.overloaded { 1.0 } else { 0.0 });
        idle.get_or_create(&l).set(if g.idle { 1.0 } else { 0.0 });
        over_s.get_or_create(&l).inc_by(g.overload_ms as f64 / 1e3);
        idle_s.get_or_create(&l).inc_by(g.idle_ms as f64 / 1e3);
    }
    let vdemand = vgauge(
        reg,
        "vgpu_demand_ratio",
        "Smoothed demand on its GPU (busy + queue wait), max of compute and copy",
    );
    let vwait = vgauge(
        reg,
        "vgpu_queue_wait_ratio",
        "Fraction of the last interval with requests waiting for a grant (compute)",
    );
    let names = vgpu_names(&d.state);
    for v in &rb.vgpus {
        let l = vgpu_labels(v.vgpu, v.gpu, &names);
        vdemand
            .get_or_create(&l)
            .set(v.compute_demand.max(v.copy_demand));
        vwait.get_or_create(&l).set(v.compute_wait);
    }
    let moves = Counter::<u64>::default();
    reg.register(
        "rebalance_migrations",
        "Migrations the rebalancer started",
        moves.clone(),
    );
    moves.inc_by(rb.migrations);
}

/// VMs by state.
fn vm_metrics(reg: &mut Registry, d: &Daemon) {
    let vms = Family::<StateLabels, Gauge>::default();
    reg.register("vms", "VMs by state", vms.clone());
    for (state, n) in stats::vm_states(&d.state) {
        vms.get_or_create(&StateLabels {
            state: state.to_owned(),
        })
        .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::super::admission::tests::admit;
    use super::super::core::testing::{daemon, spec};
    use super::*;
    use crate::api::VgpuCreate;

    #[test]
    fn a_named_vgpu_carries_its_name_and_a_forgotten_one_leaves() {
        let d = daemon(1);
        let a = admit(
            &d,
            VgpuCreate {
                name: Some("train-a".into()),
                ..spec(Some(0), 1 << 20, 0.1)
            },
        )
        .expect("a");
        let b = admit(&d, spec(Some(0), 1 << 20, 0.1)).expect("b");
        let text = render(&d).expect("render");
        assert!(
            text.contains(&format!(
                "vgpud_vgpu_live{{vgpu=\"{a}\",gpu=\"0\",name=\"train-a\"}}"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("vgpud_vgpu_live{{vgpu=\"{b}\",gpu=\"0\"}}")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "vgpud_vgpu_compute_overruns_total{{vgpu=\"{b}\",gpu=\"0\"}} 0"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "vgpud_vgpu_grant_violations_total{{vgpu=\"{b}\",gpu=\"0\"}} 0"
            )),
            "{text}"
        );
        assert!(
            text.contains("vgpud_gpu_compute_handovers_total{gpu=\"0\"} 0"),
            "{text}"
        );
        d.state.with(|i| i.vgpus.remove(&a));
        let text = render(&d).expect("render");
        assert!(!text.contains(&format!("vgpu=\"{a}\"")), "{text}");
    }
}
