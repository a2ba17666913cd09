//! Sizes as users write them: `64M`, `1G`, `1GiB`, `500MB`.
//!
//! A bare letter or `iB` is binary (`64M` = 64 MiB, as in dd and rsync); a
//! letter followed by `B` alone is decimal (`500MB` = 500,000,000). A plain
//! number is bytes, except as a rate, where it is KiB/s as in rsync and
//! rclone (`--bwlimit 10000` is 10,000 KiB/s). Fractions are allowed
//! (`1.5G`).

/// Parses a rate in bytes per second: a size, optionally with `/s`
/// (`100MB/s`, `1G`, `500B/s`), or a bare number of KiB/s as rsync and
/// rclone take it; zero is refused.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let bare = !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.');
    let bytes = if bare {
        parse_size(&format!("{t}K"))?
    } else {
        parse_size(t)?
    };
    match bytes {
        0 => Err(format!("invalid rate {s:?}: must be more than 0")),
        n => Ok(n),
    }
}

/// Parses a size in bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected a number like 64M or 1GiB"))?;
    let unit = unit.trim();
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024f64,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {unit:?} (use K, M, G, T, KiB..., KB...)"
            ))
        }
    };
    let v = n * mult;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("invalid size {s:?}: out of range"));
    }
    Ok(v as u64)
}

/// Renders bytes with a binary unit, e.g. `1.5 GiB`.
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100MB/s").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1G").unwrap(), 1 << 30);
        assert_eq!(
            parse_rate("10000").unwrap(),
            10_000 << 10,
            "a bare number is KiB/s"
        );
        assert_eq!(parse_rate("500B/s").unwrap(), 500);
        assert!(parse_rate("0/s").is_err());
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
    }
}
