//! Benchmark output: one `BENCH <name> <value> <unit>` line per figure on the console,
//! the format the bench harness parses (docs/payload-abi.md).

use crate::time::{rdtsc, ticks_to_ns_f64};

/// Prints one figure.
pub fn report(name: &str, value: f64, unit: &str) {
    crate::println!("BENCH {name} {value:.1} {unit}");
}

/// Prints the mean cost of one iteration: in ns when the TSC frequency is known, else in
/// cycles (with the unit saying so, never a guessed conversion).
pub fn report_per_iter(name: &str, ticks: u64, iters: u64) {
    let per_iter = ticks as f64 / iters.max(1) as f64;
    match ticks_to_ns_f64(per_iter) {
        Some(ns) => report(name, ns, "ns"),
        None => report(name, per_iter, "cycles"),
    }
}

/// Runs `f` `iters` times and returns the TSC ticks taken by all of them.
pub fn measure(iters: u64, mut f: impl FnMut(u64)) -> u64 {
    let start = rdtsc();
    for i in 0..iters {
        f(i);
    }
    rdtsc().saturating_sub(start)
}

/// `bench!(name, value, unit)` prints a figure; `bench!(name, iters, || body)` times
/// `iters` runs of the closure and prints ns (or cycles) per iteration.
#[macro_export]
macro_rules! bench {
    ($name:expr, $iters:expr, || $body:expr) => {{
        let iters: u64 = $iters;
        let ticks = $crate::bench::measure(iters, |_| {
            $body;
        });
        $crate::bench::report_per_iter($name, ticks, iters);
    }};
    ($name:expr, $value:expr, $unit:expr) => {
        $crate::bench::report($name, ($value) as f64, $unit)
    };
}
