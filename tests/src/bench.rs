//! Benchmark figures: each printed as `name: value unit | anchor: value unit | ratio: x`
//! and collected as JSON, the format every benchmark uses (docs/PERFORMANCE.md).

use std::path::Path;
use std::time::Duration;

use crate::run::Outcome;

/// One measured figure beside its anchor, measured in the same run.
#[derive(Debug, Clone)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    pub unit: String,
    pub anchor_name: String,
    pub anchor: f64,
    pub anchor_unit: String,
}

impl Figure {
    /// value / anchor.
    pub fn ratio(&self) -> f64 {
        if self.anchor == 0.0 {
            f64::NAN
        } else {
            self.value / self.anchor
        }
    }

    pub fn line(&self) -> String {
        format!(
            "{}: {:.2} {} | anchor ({}): {:.2} {} | ratio: {:.2}x",
            self.name,
            self.value,
            self.unit,
            self.anchor_name,
            self.anchor,
            self.anchor_unit,
            self.ratio()
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name, "value": self.value, "unit": self.unit,
            "anchor_name": self.anchor_name, "anchor": self.anchor, "anchor_unit": self.anchor_unit,
            "ratio": self.ratio(),
        })
    }
}

/// Prints each figure and writes them all to `json_path`.
pub fn report(figures: &[Figure], json_path: &Path) -> std::io::Result<()> {
    for f in figures {
        println!("{}", f.line());
    }
    if let Some(dir) = json_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let doc = serde_json::Value::Array(figures.iter().map(Figure::json).collect());
    std::fs::write(
        json_path,
        serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )?;
    println!("(written to {})", json_path.display());
    Ok(())
}

/// The value of `BENCH <name> <value> <unit>` in a payload's console output.
pub fn bench_value(out: &Outcome, name: &str) -> Option<f64> {
    out.stdout.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some("BENCH") && it.next() == Some(name))
            .then(|| it.next().and_then(|v| v.parse().ok()))
            .flatten()
    })
}

/// Median of a non-empty sample.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A generous deadline for one benchmark VM.
pub const VM_DEADLINE: Duration = Duration::from_secs(300);
