//! A producer/consumer dataflow through shared device memory (one object the producer's
//! backend exports, `SharedMemory::export`, mapped by both address spaces) vs through
//! host memory (DtoH then HtoD), several sizes, on the sim backend or on a real GPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use vgpu_backend::{
    require_shared_memory, Access, ArgValue, Backend, BackendError, CudaConfig, CudaGpu, LaunchOne,
    ModuleImage,
};

use super::{fail, get, ms, ptr, put, CFG, MIB};
use crate::bench::{median, Figure};

/// A producer's and a consumer's backend, each able to hold two buffers of the size given.
pub(super) type Pair<'a> = &'a dyn Fn(u64) -> (Arc<dyn Backend>, Arc<dyn Backend>);

/// One producer -> consumer pass of `bytes`; its makespan. The producer fills the buffer
/// with the f32 `value`; the consumer sums it on the device; both results are checked, and
/// every byte the consumer saw. Everything it mapped is freed again.
fn dataflow(
    producer: &dyn Backend,
    consumer: &dyn Backend,
    bytes: u64,
    shm: bool,
    value: f32,
) -> Result<Duration, String> {
    let e = |e: BackendError| e.to_string();
    let n = bytes / 4;
    let (fill_module, fill) = builtin(producer, b"fill")?;
    let (reduce_module, reduce) = builtin(consumer, b"reduce_sum")?;
    let sum = consumer.alloc(4).map_err(e)?.addr;
    let mut host = vec![0xa5u8; bytes as usize];
    let (src, dst) = if shm {
        let (exporter, importer) = (
            require_shared_memory(producer).map_err(e)?,
            require_shared_memory(consumer).map_err(e)?,
        );
        let fd = exporter.export(bytes).map_err(e)?;
        let dup = fd
            .try_clone()
            .map_err(|err| format!("duplicating the object's descriptor: {err}"))?;
        (
            exporter.import(dup, bytes, false).map_err(e)?,
            importer.import(fd, bytes, true).map_err(e)?,
        )
    } else {
        (
            producer.alloc(bytes).map_err(e)?.addr,
            consumer.alloc(bytes).map_err(e)?.addr,
        )
    };
    let start = Instant::now();
    producer
        .launch_one(
            fill,
            &CFG,
            &[
                ptr(src, Access::Write),
                ArgValue::U32(value.to_bits()),
                ArgValue::U64(n),
            ],
        )
        .map_err(e)?;
    if !shm {
        get(producer, src, &mut host).map_err(e)?;
        put(consumer, dst, &mut host).map_err(e)?;
    }
    consumer
        .launch_one(
            reduce,
            &CFG,
            &[
                ptr(dst, Access::Read),
                ptr(sum, Access::Write),
                ArgValue::U64(n),
            ],
        )
        .map_err(e)?;
    let makespan = start.elapsed();
    let mut s = [0u8; 4];
    get(consumer, sum, &mut s).map_err(e)?;
    let got = f32::from_le_bytes(s);
    let want = (n as f64 * f64::from(value)) as f32;
    if got != want {
        return Err(format!("dataflow {bytes} bytes: sum {got}, want {want}"));
    }
    get(consumer, dst, &mut host).map_err(e)?;
    let bits = value.to_bits().to_le_bytes();
    if let Some(i) = host.chunks_exact(4).position(|w| w != bits.as_slice()) {
        return Err(format!(
            "dataflow {bytes} bytes: word {i} is {:?}, want {bits:?}",
            &host[i * 4..i * 4 + 4]
        ));
    }
    for (b, addr) in [(producer, src), (consumer, dst), (consumer, sum)] {
        b.free(addr).map_err(e)?;
    }
    producer.modules().module_unload(fill_module).map_err(e)?;
    consumer.modules().module_unload(reduce_module).map_err(e)?;
    Ok(makespan)
}

/// The built-in module loaded on `b` and its function `name`: (module, function).
fn builtin(b: &dyn Backend, name: &[u8]) -> Result<(u64, u64), String> {
    let m = b
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .map_err(|e| format!("builtin module: {e}"))?;
    let f = b
        .modules()
        .get_function(m, name)
        .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(name)))?;
    Ok((m, f.handle))
}

/// The dataflow's figures for each of `sizes`, the median of `reps` runs each way, on the
/// backends `pair` makes (`bar` counts `sizes.len() * reps * 2` steps).
pub(super) fn figures(
    pair: Pair<'_>,
    sizes: &[u64],
    reps: usize,
    bar: &ProgressBar,
) -> Vec<Figure> {
    let mut out = Vec::new();
    for &bytes in sizes {
        let one = |shm: bool| -> f64 {
            let v: Vec<f64> = (0..reps)
                .map(|i| {
                    bar.set_message(format!(
                        "dataflow {} MiB, {}",
                        bytes / MIB,
                        if shm { "shm" } else { "through host" }
                    ));
                    let (producer, consumer) = pair(bytes);
                    let d = dataflow(&*producer, &*consumer, bytes, shm, (i + 1) as f32)
                        .unwrap_or_else(|e| fail(e));
                    bar.inc(1);
                    ms(d)
                })
                .collect();
            median(v)
        };
        let (via_shm, via_host) = (one(true), one(false));
        let label = format!("{} MiB", bytes / MIB);
        out.push(super::fig(
            format!("dataflow makespan, {label}: producer fill -> consumer reduce via shm"),
            via_shm,
            "ms",
            "through host memory (DtoH + HtoD)",
            via_host,
        ));
        out.push(Figure {
            name: format!("dataflow makespan improvement with shm, {label}"),
            value: (1.0 - via_shm / via_host) * 100.0,
            unit: "%".into(),
            anchor_name: "Gdev's best case".into(),
            anchor: 49.0,
            anchor_unit: "%".into(),
        });
    }
    out
}

/// The dataflow on GPU 0 of this machine: a producer's and a consumer's backend (two
/// contexts' address spaces in this process, as two workers have), the object exported
/// by the producer's and imported by both, as vgpud's workers do.
pub fn run_cuda() -> Vec<Figure> {
    let sizes: [u64; 5] = [4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB];
    let reps = 5;
    let probe = CudaGpu::probe().unwrap_or_else(|e| fail(format!("cuda: {e}")));
    println!("cuda GPU 0: {} ({} device(s))", probe.name, probe.devices);
    let largest = sizes.iter().copied().max().unwrap_or(MIB);
    let memory = 2 * largest + 256 * MIB;
    let make = |k: u64| -> Arc<dyn Backend> {
        Arc::new(
            CudaGpu::new(CudaConfig {
                ordinal: 0,
                memory,
                va_base: vgpu_backend::DEFAULT_VA_BASE + k * (64 << 30),
                va_size: 16 << 30,
                ..CudaConfig::default()
            })
            .unwrap_or_else(|e| fail(format!("cuda backend: {e}"))),
        )
    };
    let (producer, consumer) = (make(0), make(1));
    let bar = ProgressBar::new((sizes.len() * reps * 2) as u64);
    let pair = |_: u64| (producer.clone(), consumer.clone());
    let out = figures(&pair, &sizes, reps, &bar);
    bar.finish_and_clear();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dataflow_checks_out_both_ways_on_sim() {
        let p = super::super::Params {
            copy_bandwidth: 0,
            speed: 1.0,
        };
        let gpu = || -> Arc<dyn Backend> { super::super::sim(p, 64 * MIB) };
        let (producer, consumer) = (gpu(), gpu());
        for shm in [true, false] {
            dataflow(&*producer, &*consumer, 4 * MIB, shm, 3.0).expect("dataflow");
        }
        assert_eq!(producer.memory_usage().used, 0, "everything freed");
        assert_eq!(consumer.memory_usage().used, 0, "everything freed");
    }
}
