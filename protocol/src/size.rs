//! Human-readable byte sizes, as used by the environment contract (`SMORE_MEMORY_LIMIT=2GiB`), the
//! node config and the simulated GPU (`SMORE_SIM_MEMORY=80GiB`).
//!
//! Accepted: a plain integer (bytes) or an integer / decimal followed by a unit: `B`, `KiB`, `MiB`,
//! `GiB`, `TiB` (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000), case-insensitive, with
//! optional white space between number and unit. `K`, `M`, `G`, `T` alone mean the binary units, as
//! in `nvidia-smi` and most container runtimes, and the Kubernetes quantity spellings `Ki`, `Mi`,
//! `Gi`, `Ti` (`2Gi`, `512Mi`) are the binary units too. A fraction of a byte (`0.5`, `1.5B`) is
//! refused: it is almost always a size whose unit was forgotten.

use std::fmt;

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    input: String,
    reason: &'static str,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid size {:?}: {} (expected bytes or a number with a unit such as 512MiB, 2GiB, 1.5GB)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for SizeError {}

/// Parses a size string into bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim();
    if num.is_empty() {
        return Err(err("no number"));
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(err("unknown unit")),
    };
    if let Ok(whole) = num.parse::<u64>() {
        return whole
            .checked_mul(multiplier)
            .ok_or_else(|| err("too large"));
    }
    let value: f64 = num.parse().map_err(|_| err("not a number"))?;
    if multiplier == 1 {
        return Err(err(
            "a fraction of a byte (a unit such as MiB or GiB is missing?)",
        ));
    }
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("too large"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with the largest binary unit that keeps the value readable (`1.5GiB`, `300MiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, unit) in UNITS {
        if bytes >= unit {
            let v = bytes as f64 / unit as f64;
            return if bytes.is_multiple_of(unit) {
                format!("{}{name}", bytes / unit)
            } else {
                format!("{v:.2}{name}")
            };
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("2 gib").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("4k").unwrap(), 4096);
    }

    #[test]
    fn parses_kubernetes_quantities() {
        assert_eq!(parse_size("2Gi").unwrap(), 2 << 30);
        assert_eq!(parse_size("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_size("64Ki").unwrap(), 64 << 10);
        assert_eq!(parse_size("1Ti").unwrap(), 1 << 40);
        assert_eq!(parse_size("1.5Gi").unwrap(), 3 << 29);
    }

    #[test]
    fn refuses_a_fraction_of_a_byte() {
        for bad in ["0.5", "1.5B", "0.5 b"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("fraction of a byte"), "{bad}: {e}");
        }
    }

    #[test]
    fn refuses_garbage() {
        for bad in ["", "GiB", "12XB", "-1", "1.2.3MiB", "99999999999TiB"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.to_string().contains("invalid size"), "{bad}: {e}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for b in [0u64, 512, 1 << 20, 300 << 20, 3 << 29, 80 << 30] {
            let s = format_size(b);
            assert_eq!(parse_size(&s).unwrap(), b, "{s}");
        }
    }
}
