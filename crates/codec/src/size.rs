//! Byte sizes as people write and read them: the one parser for every size option (`128K`,
//! `4G`, `1TiB`, mount options such as `cache=64M`) and the compsize-style printer.

/// A size string that is not a non-negative whole number with an optional unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("bad size '{0}': use a number with an optional K, M, G or T suffix (binary units)")]
    Malformed(String),
    #[error("bad size '{0}': a size cannot be negative")]
    Negative(String),
    #[error("size '{0}' is too large")]
    TooLarge(String),
}

/// Parses `4096`, `128K`, `1M`, `4G`, `2T` (binary units, case-insensitive), each unit also
/// spelled with a `B` or `iB` suffix (`64MiB`, `64MB`: both 64 x 2^20), and a bare `B`.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(SizeError::Negative(s.to_string()));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.trim_start().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(SizeError::Malformed(s.to_string())),
    };
    if digits.is_empty() {
        return Err(SizeError::Malformed(s.to_string()));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| SizeError::TooLarge(s.to_string()))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::TooLarge(s.to_string()))
}

/// Binary units the way compsize prints them (`36M`, `1.2G`, `512K`, `100B`).
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
    fn units_and_suffixes() {
        for (s, v) in [
            ("4096", 4096),
            ("0", 0),
            ("128K", 128 << 10),
            ("512k", 512 << 10),
            ("1M", 1 << 20),
            ("64MB", 64 << 20),
            ("2MiB", 2 << 20),
            ("1GiB", 1 << 30),
            ("4G", 4 << 30),
            ("2T", 2 << 40),
            ("1tib", 1 << 40),
            ("3TB", 3 << 40),
            ("100B", 100),
            (" 8K ", 8 << 10),
            ("16 M", 16 << 20),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_size() {
        for s in ["", "M", "K4", "12X", "1.5G", "1P", "4 GiBs", "0x10", "+5G"] {
            assert_eq!(parse_size(s), Err(SizeError::Malformed(s.into())), "{s}");
        }
        assert_eq!(parse_size("-5G"), Err(SizeError::Negative("-5G".into())));
        assert_eq!(parse_size("-1"), Err(SizeError::Negative("-1".into())));
        for s in ["99999999999T", "99999999999999999999", "16777216T"] {
            assert_eq!(parse_size(s), Err(SizeError::TooLarge(s.into())), "{s}");
        }
        assert_eq!(parse_size("16777215T"), Ok(16777215 << 40));
    }

    #[test]
    fn the_message_is_one_clear_line() {
        let e = parse_size("-5G").unwrap_err().to_string();
        assert_eq!(e, "bad size '-5G': a size cannot be negative");
    }

    #[test]
    fn human_units() {
        assert_eq!(human(100), "100B");
        assert_eq!(human(36 << 20), "36M");
        assert_eq!(human(1288490188), "1.2G");
        assert_eq!(human(u64::MAX), "16384P");
    }
}
