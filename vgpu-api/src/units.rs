//! Sizes, bandwidths and shares as people write them on command lines.

/// A size with an optional binary suffix: `4096`, `64K`, `512M`, `1G`, `2GiB`, `1T`.
/// `8GB` is refused: it means 8e9 bytes to some and 8 GiB to others.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Some(num) = t
        .strip_suffix("B")
        .filter(|n| n.chars().last().is_some_and(|c| "kKmMgGtT".contains(c)))
    {
        let (n, unit) = num.split_at(num.len() - 1);
        let unit = unit.to_ascii_uppercase();
        return Err(format!(
            "{s:?}: {unit}B is ambiguous (decimal or binary); sizes here are binary: write {n}{unit} or {n}{unit}iB for {n} {unit}iB ({n} x 2^{}), or the number of bytes",
            match unit.as_str() { "K" => 10, "M" => 20, "G" => 30, _ => 40 }
        ));
    }
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(format!(
                        "{s:?}: unknown size suffix {c:?}; use K, M, G or T"
                    ))
                }
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write e.g. 1G, 512M or 4096"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// A bandwidth in bytes/s with an optional decimal suffix: `12G` = 12e9 B/s, `1.5GB/s`, `0`.
pub fn parse_bandwidth(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("B/s")
        .or_else(|| t.strip_suffix("/s"))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1e3,
                'M' => 1e6,
                'G' => 1e9,
                'T' => 1e12,
                _ => {
                    return Err(format!(
                        "{s:?}: unknown bandwidth suffix {c:?}; use K, M, G or T"
                    ))
                }
            };
            (&t[..t.len() - 1], mult)
        }
        _ => (t, 1.0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a bandwidth; write e.g. 12G or 0"))?;
    let bytes = v * mult;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// A share as a fraction in 0..=1, from `0.3` or `30%`.
pub fn parse_share_fraction(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let frac = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a share; write a fraction (0.3) or a percentage (30%)"))?;
    if !(0.0..=1.0).contains(&frac) {
        return Err(format!("{s:?} is outside 0..1 (0%..100%) of the GPU"));
    }
    Ok(frac)
}

/// A share as per-mille (the wire format's unit), from `0.3` or `30%`.
pub fn parse_share(s: &str) -> Result<u32, String> {
    parse_share_fraction(s).map(fraction_to_permille)
}

/// Per-mille from a fraction already checked to lie in 0..=1.
pub fn fraction_to_permille(f: f64) -> u32 {
    (f * 1000.0).round().clamp(0.0, 1000.0) as u32
}

/// A fraction from per-mille.
pub fn permille_to_fraction(p: u32) -> f64 {
    f64::from(p) / 1000.0
}

/// `1073741824` as `1.0 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_bandwidths_shares() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_bandwidth("12G"), Ok(12_000_000_000));
        assert_eq!(parse_bandwidth("1.5GB/s"), Ok(1_500_000_000));
        let e = parse_size("8GB").expect_err("8GB is ambiguous");
        assert!(e.contains("write 8G or 8GiB"), "{e}");
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_bandwidth("0"), Ok(0));
        assert!(parse_bandwidth("-1G").is_err());
        assert!(parse_bandwidth("fast").is_err());
        assert_eq!(parse_share("0.3"), Ok(300));
        assert_eq!(parse_share("30%"), Ok(300));
        assert_eq!(parse_share("1"), Ok(1000));
        assert!(parse_share("1.5").is_err());
        assert!(parse_share("300").is_err());
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(12), "12 B");
    }
}
