//! The compsize-style usage report: figures, the text table, and the small record that carries
//! one file's figures through the `compfs.usage` virtual xattr.
//!
//! The table layout and units copy compsize (`compsize.c`: `print_table()` prints
//! `"%-10s %-8s %-12s %-12s %-12s"`, percentages as `"%3.0f%%"`, and `human_bytes()` shifts by
//! 1024 while the value is at least 10240, then prints `" %d.%d%c"` above 1023 or `"%4d%c"`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::error::RecordError;

/// Disk, uncompressed and referenced bytes of one codec (or of all: TOTAL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Bytes the extents occupy on disk (compressed size).
    pub disk: u64,
    /// Bytes the extents hold once decompressed.
    pub uncompressed: u64,
    /// Bytes the files reference (differs from `uncompressed` for partially used extents).
    pub referenced: u64,
}

impl Figures {
    fn add(&mut self, o: &Figures) {
        self.disk += o.disk;
        self.uncompressed += o.uncompressed;
        self.referenced += o.referenced;
    }
}

/// compsize's figures for a set of files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageReport {
    pub files: u64,
    pub regular_extents: u64,
    pub refs: u64,
    pub inline: u64,
    /// Bytes of the inline data (inside the metadata; also counted in their codec's row),
    /// printed as their own `inline` row after the codec rows.
    pub inline_bytes: Figures,
    /// Bytes of extents and inline data compressed with a store-trained dictionary (also
    /// counted in their codec's row), printed as their own `dict` row after `inline`.
    pub dict_bytes: Figures,
    /// Per codec name (`none`, `zlib`, `lzo`, `zstd`, `lz4`).
    pub per_codec: BTreeMap<String, Figures>,
    /// Per codec and level as recorded per extent (`zstd:1`, `zlib:9`; codecs without levels
    /// by name alone): the rows after the codec rows, so a user sees what is left to recompress.
    pub per_level: BTreeMap<String, Figures>,
}

/// btrfs's compression type order (BTRFS_COMPRESS_NONE, ZLIB, LZO, ZSTD), then lz4; compsize
/// prints its rows in this order.
const CODEC_ORDER: [&str; 5] = ["none", "zlib", "lzo", "zstd", "lz4"];

/// Record header of the `compfs.usage` xattr value.
const RECORD_MAGIC: &str = "compfs-usage 1";

impl UsageReport {
    /// TOTAL row: the sum over codecs.
    pub fn total(&self) -> Figures {
        let mut t = Figures::default();
        for f in self.per_codec.values() {
            t.add(f);
        }
        t
    }

    /// Adds another report (of disjoint files) to this one.
    pub fn merge(&mut self, o: &UsageReport) {
        self.files += o.files;
        self.regular_extents += o.regular_extents;
        self.refs += o.refs;
        self.inline += o.inline;
        self.inline_bytes.add(&o.inline_bytes);
        self.dict_bytes.add(&o.dict_bytes);
        for (k, f) in &o.per_codec {
            self.per_codec.entry(k.clone()).or_default().add(f);
        }
        for (k, f) in &o.per_level {
            self.per_level.entry(k.clone()).or_default().add(f);
        }
    }

    /// Codec-and-level rows (`zstd:1`, `zstd:9`) in codec order, then by level; codecs without
    /// levels have no rows here (their codec row says it all).
    fn level_rows(&self) -> Vec<(&str, Figures)> {
        let mut rows: Vec<(usize, i64, &str, Figures)> = self
            .per_level
            .iter()
            .filter(|(_, f)| **f != Figures::default())
            .filter_map(|(k, f)| {
                let (codec, level) = k.split_once(':')?;
                let order = CODEC_ORDER
                    .iter()
                    .position(|c| *c == codec)
                    .unwrap_or(CODEC_ORDER.len());
                Some((order, level.parse().unwrap_or(i64::MAX), k.as_str(), *f))
            })
            .collect();
        rows.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
        rows.into_iter().map(|(_, _, k, f)| (k, f)).collect()
    }

    /// Codec rows in compsize's order; names compfs does not know come last, sorted.
    fn rows(&self) -> Vec<(&str, Figures)> {
        let mut rows: Vec<(&str, Figures)> = CODEC_ORDER
            .iter()
            .filter_map(|n| self.per_codec.get(*n).map(|f| (*n, *f)))
            .collect();
        for (k, f) in &self.per_codec {
            if !CODEC_ORDER.contains(&k.as_str()) {
                rows.push((k.as_str(), *f));
            }
        }
        rows.retain(|(_, f)| *f != Figures::default());
        rows
    }

    /// The report as compsize prints it; `bytes` = `-b`.
    pub fn render(&self, bytes: bool) -> String {
        let mut out = format!(
            "Processed {} files, {} regular extents ({} refs), {} inline.\n",
            self.files, self.regular_extents, self.refs, self.inline
        );
        let total = self.total();
        if total == Figures::default() {
            return out;
        }
        line(
            &mut out,
            "Type",
            "Perc",
            "Disk Usage",
            "Uncompressed",
            "Referenced",
        );
        let row = |out: &mut String, name: &str, f: &Figures| {
            line(
                out,
                name,
                &percent(f.disk, f.uncompressed),
                &size(f.disk, bytes),
                &size(f.uncompressed, bytes),
                &size(f.referenced, bytes),
            )
        };
        row(&mut out, "TOTAL", &total);
        for (name, f) in self.rows() {
            row(&mut out, name, &f);
        }
        for (name, f) in self.level_rows() {
            row(&mut out, name, &f);
        }
        if self.inline_bytes != Figures::default() {
            row(&mut out, "inline", &self.inline_bytes);
        }
        if self.dict_bytes != Figures::default() {
            row(&mut out, "dict", &self.dict_bytes);
        }
        out
    }

    /// Encodes the report as the value of the `compfs.usage` xattr.
    pub fn to_record(&self) -> Vec<u8> {
        let mut s = format!(
            "{RECORD_MAGIC}\nfiles {}\nextents {}\nrefs {}\ninline {}\n",
            self.files, self.regular_extents, self.refs, self.inline
        );
        for (k, f) in &self.per_codec {
            let _ = writeln!(
                s,
                "codec {k} {} {} {}",
                f.disk, f.uncompressed, f.referenced
            );
        }
        for (k, f) in &self.per_level {
            let _ = writeln!(
                s,
                "level {k} {} {} {}",
                f.disk, f.uncompressed, f.referenced
            );
        }
        let f = &self.inline_bytes;
        if *f != Figures::default() {
            let _ = writeln!(
                s,
                "inline-bytes {} {} {}",
                f.disk, f.uncompressed, f.referenced
            );
        }
        let f = &self.dict_bytes;
        if *f != Figures::default() {
            let _ = writeln!(
                s,
                "dict-bytes {} {} {}",
                f.disk, f.uncompressed, f.referenced
            );
        }
        s.into_bytes()
    }

    /// Decodes a `compfs.usage` xattr value; rejects anything malformed.
    pub fn from_record(v: &[u8]) -> Result<UsageReport, RecordError> {
        let text = std::str::from_utf8(v).map_err(|_| RecordError::new("not UTF-8"))?;
        let mut lines = text.lines();
        if lines.next() != Some(RECORD_MAGIC) {
            return Err(RecordError::new("missing 'compfs-usage 1' header"));
        }
        let mut r = UsageReport::default();
        let mut seen = [false; 4];
        for l in lines {
            let fields: Vec<&str> = l.split(' ').collect();
            let num = |s: &str| {
                s.parse::<u64>()
                    .map_err(|_| RecordError::new(format!("bad number '{s}' in line '{l}'")))
            };
            match fields.as_slice() {
                ["files", n] => (r.files, seen[0]) = (num(n)?, true),
                ["extents", n] => (r.regular_extents, seen[1]) = (num(n)?, true),
                ["refs", n] => (r.refs, seen[2]) = (num(n)?, true),
                ["inline", n] => (r.inline, seen[3]) = (num(n)?, true),
                ["inline-bytes", d, u, rf] => {
                    r.inline_bytes = Figures {
                        disk: num(d)?,
                        uncompressed: num(u)?,
                        referenced: num(rf)?,
                    }
                }
                ["dict-bytes", d, u, rf] => {
                    r.dict_bytes = Figures {
                        disk: num(d)?,
                        uncompressed: num(u)?,
                        referenced: num(rf)?,
                    }
                }
                ["codec", name, d, u, rf] if !name.is_empty() => {
                    let f = Figures {
                        disk: num(d)?,
                        uncompressed: num(u)?,
                        referenced: num(rf)?,
                    };
                    if r.per_codec.insert((*name).to_string(), f).is_some() {
                        return Err(RecordError::new(format!("codec '{name}' listed twice")));
                    }
                }
                ["level", name, d, u, rf] if !name.is_empty() => {
                    let f = Figures {
                        disk: num(d)?,
                        uncompressed: num(u)?,
                        referenced: num(rf)?,
                    };
                    if r.per_level.insert((*name).to_string(), f).is_some() {
                        return Err(RecordError::new(format!("level '{name}' listed twice")));
                    }
                }
                _ => return Err(RecordError::new(format!("unexpected line '{l}'"))),
            }
        }
        if seen.contains(&false) {
            return Err(RecordError::new("a count line is missing"));
        }
        Ok(r)
    }
}

fn line(out: &mut String, a: &str, b: &str, c: &str, d: &str, e: &str) {
    let _ = writeln!(out, "{a:<10} {b:<8} {c:<12} {d:<12} {e:<12}");
}

fn percent(disk: u64, uncompressed: u64) -> String {
    if uncompressed == 0 {
        return "  0%".to_string();
    }
    format!("{:3.0}%", 100.0 * disk as f64 / uncompressed as f64)
}

/// compsize's `human_bytes()`, or the plain number for `-b`.
pub fn size(x: u64, bytes: bool) -> String {
    const UNITS: &[u8] = b"BKMGTPE";
    if bytes {
        return x.to_string();
    }
    let mut x = x;
    let mut u = 0;
    while x >= 10240 {
        u += 1;
        x >>= 10;
    }
    if x >= 1024 {
        format!(
            " {}.{}{}",
            x >> 10,
            x * 10 / 1024 % 10,
            UNITS[u + 1] as char
        )
    } else {
        format!("{:4}{}", x, UNITS[u] as char)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The hand-computed case: 8 files, 22 MiB stored raw and 64 MiB of zstd data in 14 MiB.
    fn sample() -> UsageReport {
        let mut r = UsageReport {
            files: 8,
            regular_extents: 525,
            refs: 525,
            inline: 0,
            inline_bytes: Figures::default(),
            dict_bytes: Figures::default(),
            per_codec: BTreeMap::new(),
            per_level: BTreeMap::new(),
        };
        let none = Figures {
            disk: 22 * MIB,
            uncompressed: 22 * MIB,
            referenced: 22 * MIB,
        };
        let zstd = Figures {
            disk: 14 * MIB,
            uncompressed: 64 * MIB,
            referenced: 64 * MIB,
        };
        r.per_codec.insert("zstd".into(), zstd);
        r.per_codec.insert("none".into(), none);
        r
    }

    #[test]
    fn renders_like_compsize() {
        // Totals by hand: disk 36 MiB, uncompressed 86 MiB, 36/86 = 41.9% -> " 42%";
        // zstd 14/64 = 21.9% -> " 22%". Columns as in compsize's output (kernel-reference.md).
        let expected = "Processed 8 files, 525 regular extents (525 refs), 0 inline.\n\
Type       Perc     Disk Usage   Uncompressed Referenced  \n\
TOTAL       42%       36M          86M          86M       \n\
none       100%       22M          22M          22M       \n\
zstd        22%       14M          64M          64M       \n";
        assert_eq!(sample().render(false), expected);
    }

    /// The codec:level breakdown follows the codec rows, in codec order then level order
    /// (numerically: zstd:-5 before zstd:3 before zstd:15), and survives the record.
    #[test]
    fn renders_levels_after_codecs() {
        let mut r = sample();
        let f = |d: u64, u: u64| Figures {
            disk: d * MIB,
            uncompressed: u * MIB,
            referenced: u * MIB,
        };
        r.per_level.insert("none".into(), f(22, 22));
        r.per_level.insert("zstd:15".into(), f(4, 24));
        r.per_level.insert("zstd:3".into(), f(8, 32));
        r.per_level.insert("zstd:-5".into(), f(2, 8));
        let out = r.render(false);
        let mut want = sample().render(false);
        want.push_str(
            "zstd:-5     25%      2.0M         8.0M         8.0M       \n\
zstd:3      25%      8.0M          32M          32M       \n\
zstd:15     17%      4.0M          24M          24M       \n",
        );
        assert_eq!(out, want);
        assert_eq!(UsageReport::from_record(&r.to_record()).unwrap(), r);
        let mut twice = r.to_record();
        twice.extend_from_slice(b"level zstd:3 1 1 1\n");
        assert!(UsageReport::from_record(&twice).is_err());
    }

    #[test]
    fn renders_bytes() {
        let out = sample().render(true);
        let total = out.lines().nth(2).unwrap();
        assert_eq!(
            total,
            format!(
                "TOTAL       42%     {:<12} {:<12} {:<12}",
                36 * MIB,
                86 * MIB,
                86 * MIB
            )
        );
    }

    #[test]
    fn human_units_match_compsize() {
        assert_eq!(size(0, false), "   0B");
        assert_eq!(size(1023, false), "1023B");
        assert_eq!(size(1024, false), " 1.0K");
        assert_eq!(size(10239, false), " 9.9K");
        assert_eq!(size(10240, false), "  10K");
        assert_eq!(size(36 * MIB, false), "  36M");
        assert_eq!(size(1288490188, false), " 1.1G");
        assert_eq!(size(5 << 40, false), " 5.0T");
    }

    #[test]
    fn empty_report_prints_only_the_count() {
        let r = UsageReport {
            files: 2,
            ..Default::default()
        };
        assert_eq!(
            r.render(false),
            "Processed 2 files, 0 regular extents (0 refs), 0 inline.\n"
        );
    }

    #[test]
    fn codec_rows_follow_btrfs_order_and_skip_empty() {
        let mut r = sample();
        r.per_codec.insert(
            "lzo".into(),
            Figures {
                disk: 1,
                uncompressed: 2,
                referenced: 2,
            },
        );
        r.per_codec.insert("zlib".into(), Figures::default());
        let names: Vec<String> = r
            .render(false)
            .lines()
            .skip(3)
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect();
        assert_eq!(names, ["none", "lzo", "zstd"]);
    }

    #[test]
    fn merge_adds_everything() {
        let mut a = sample();
        a.merge(&sample());
        assert_eq!(a.files, 16);
        assert_eq!(a.refs, 1050);
        assert_eq!(a.total().disk, 72 * MIB);
    }

    #[test]
    fn inline_bytes_have_their_own_row_and_record_line() {
        let mut r = sample();
        r.inline = 3;
        r.inline_bytes = Figures {
            disk: 1000,
            uncompressed: 3000,
            referenced: 3000,
        };
        let out = r.render(true);
        assert_eq!(
            out.lines().last().unwrap(),
            "inline      33%     1000         3000         3000        "
        );
        assert_eq!(UsageReport::from_record(&r.to_record()).unwrap(), r);
        let mut m = r.clone();
        m.merge(&r);
        assert_eq!(m.inline_bytes.disk, 2000);
        // No inline data: no row.
        assert!(!sample().render(true).contains("inline "));
        let bad = String::from_utf8(r.to_record())
            .unwrap()
            .replace("inline-bytes 1000", "inline-bytes x");
        assert!(UsageReport::from_record(bad.as_bytes()).is_err());
    }

    #[test]
    fn dict_bytes_have_their_own_row_and_record_line() {
        let mut r = sample();
        r.dict_bytes = Figures {
            disk: 500,
            uncompressed: 2000,
            referenced: 2000,
        };
        let out = r.render(true);
        assert_eq!(
            out.lines().last().unwrap(),
            "dict        25%     500          2000         2000        "
        );
        assert_eq!(UsageReport::from_record(&r.to_record()).unwrap(), r);
        let mut m = r.clone();
        m.merge(&r);
        assert_eq!(m.dict_bytes.disk, 1000);
        assert!(!sample().render(true).contains("dict "));
    }

    #[test]
    fn record_round_trip() {
        let r = sample();
        assert_eq!(UsageReport::from_record(&r.to_record()).unwrap(), r);
        let empty = UsageReport::default();
        assert_eq!(UsageReport::from_record(&empty.to_record()).unwrap(), empty);
    }

    #[test]
    fn malformed_records_are_rejected() {
        let good = String::from_utf8(sample().to_record()).unwrap();
        for bad in [
            String::new(),
            "compfs-usage 2\nfiles 1\nextents 1\nrefs 1\ninline 0\n".to_string(),
            good.replace("files 8", "files eight"),
            good.replace("refs 525\n", ""),
            good.replace("codec zstd", "codec"),
            good.replace("codec zstd 14680064", "codec zstd -1"),
            format!("{good}codec zstd 1 2 3\n"),
            format!("{good}garbage\n"),
            good.replace("files 8", "files 99999999999999999999999"),
        ] {
            assert!(
                UsageReport::from_record(bad.as_bytes()).is_err(),
                "accepted {bad:?}"
            );
        }
        assert!(UsageReport::from_record(&[0xff, 0xfe]).is_err());
    }
}
