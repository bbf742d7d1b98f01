//! What vgpuctl's programs share with the benchmarks: [`plot`], utilization and x/y
//! charts as PNG files.

pub mod plot;
