//! Helpers shared by commands: size parsing and human-readable units.

use anyhow::{bail, Result};

/// Parses sizes such as `4096`, `128K`, `1M`, `4G` (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let m: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => bail!("bad size '{s}': use a number with an optional K, M, G or T suffix"),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| {
        anyhow::anyhow!("bad size '{s}': use a number with an optional K, M, G or T suffix")
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| anyhow::anyhow!("size '{s}' is too large"))
}

/// Human-readable binary units the way compsize prints them (`36M`, `1.2G`, `512K`, `100B`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("128K").unwrap(), 131072);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn human_units() {
        assert_eq!(human(100), "100B");
        assert_eq!(human(36 << 20), "36M");
        assert_eq!(human(1288490188), "1.2G");
    }
}
