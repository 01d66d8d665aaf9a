//! The control channel's `stat` reply as `compfs blk stat` prints it: zram's `mm_stat`,
//! `io_stat` and `bd_stat` lines, then a human summary (ratio, memory, dictionary, writeback
//! budget, memory policy, backing file).

use compfs_codec::human;

use crate::error::BlkError;
use crate::store::{DictStatus, PolicyStatus};
use crate::Stats;

/// The stat reply as printed: the three zram lines, then a human summary.
pub fn format_stat(lines: &[String]) -> Result<String, BlkError> {
    let field = |key: &str| -> Option<&str> {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
    };
    let (mm, io, bd) = match (field("mm_stat"), field("io_stat"), field("bd_stat")) {
        (Some(m), Some(i), Some(b)) => (m, i, b),
        _ => return Err(BlkError::StatReply("an incomplete stat reply")),
    };
    let s = Stats::parse(mm, io, bd).ok_or(BlkError::StatReply("a malformed stat"))?;
    let mut out = format!("mm_stat {mm}\nio_stat {io}\nbd_stat {bd}\n");
    let ratio = |a: u64, b: u64| {
        if b == 0 {
            "-".to_string()
        } else {
            format!("{:.2}", a as f64 / b as f64)
        }
    };
    out.push_str(&format!(
        "\nstored    {} ({} same-filled pages, {} huge pages)\ncompressed {}  ratio {}\nmemory    {} (max {}, limit {})  orig/mem {}\n",
        human(s.orig_data_size),
        s.same_pages,
        s.huge_pages,
        human(s.compr_data_size),
        ratio(s.orig_data_size, s.compr_data_size),
        human(s.mem_used_total),
        human(s.mem_used_max),
        if s.mem_limit == 0 {
            "none".to_string()
        } else {
            human(s.mem_limit)
        },
        ratio(s.orig_data_size, s.mem_used_total),
    ));
    if let Some(d) = field("disksize").and_then(|d| d.parse::<u64>().ok()) {
        let table = field("table_bytes").unwrap_or("0");
        out.push_str(&format!(
            "device    {} (page table {} bytes, not in mem_used_total, as in zram)\n",
            human(d),
            table
        ));
    }
    if let Some(a) = field("algorithms") {
        out.push_str(&format!("codecs    {a}\n"));
    }
    if let Some(d) = field("dict").and_then(DictStatus::parse) {
        out.push_str(&format!(
            "dict      version {} ({} held, {}), {} pages use it; trained {} times ({} ms last, {} ms total), {} pages moved to a newer one{}\n",
            d.version,
            d.dicts,
            human(d.bytes),
            d.pages,
            d.trainings,
            d.train_ms_last,
            d.train_ms_total,
            d.recompressed,
            if d.busy { ", busy" } else { "" }
        ));
        if d.samples_released > 0 || d.samples > 0 {
            out.push_str(&format!(
                "          {} sample pages held, {} released\n",
                d.samples, d.samples_released
            ));
        }
    }
    if let Some(w) = field("writeback_limit") {
        let v: Vec<u64> = w
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if let [bytes, period, left, batch] = v[..] {
            let budget = if bytes == 0 {
                "no limit".to_string()
            } else {
                format!("{} per {period} s, {} left", human(bytes), human(left))
            };
            out.push_str(&format!("writeback budget {budget}; batch {batch} pages\n"));
        }
    }
    if let Some(p) = field("policy") {
        let age = p.split_whitespace().nth(1).unwrap_or("?");
        if let Some(st) = PolicyStatus::parse(p) {
            out.push_str(&format!(
                "policy    idle after {age} s: {} steps, {} pages idle now; {} recompressed, {} written back, {} pool pages compacted, {} in use again and back on the primary codec\n",
                st.steps, st.idle, st.recompressed, st.written, st.compacted, st.promoted
            ));
        }
    }
    out.push_str(&format!(
        "backing   {} pages now, {} read, {} written\n",
        s.bd_count, s.bd_reads, s.bd_writes
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn reply(extra: &[&str]) -> Vec<String> {
        let s = Stats {
            orig_data_size: 8 << 20,
            compr_data_size: 2 << 20,
            mem_used_total: 4 << 20,
            mem_used_max: 5 << 20,
            same_pages: 3,
            huge_pages: 1,
            bd_count: 2,
            bd_reads: 7,
            bd_writes: 9,
            ..Stats::default()
        };
        let mut v = vec![
            format!("mm_stat {}", s.mm_stat()),
            format!("io_stat {}", s.io_stat()),
            format!("bd_stat {}", s.bd_stat()),
        ];
        v.extend(extra.iter().map(|l| l.to_string()));
        v
    }

    #[test]
    fn the_zram_lines_come_first_then_the_summary() {
        let lines = reply(&[
            "disksize 1073741824",
            "table_bytes 2097152",
            "algorithms lzo zstd:9",
        ]);
        let out = format_stat(&lines).unwrap();
        let mut it = out.lines();
        assert_eq!(it.next(), Some(lines[0].as_str()));
        assert_eq!(it.next(), Some(lines[1].as_str()));
        assert_eq!(it.next(), Some(lines[2].as_str()));
        assert_eq!(it.next(), Some(""));
        assert!(out.contains("(3 same-filled pages, 1 huge pages)"), "{out}");
        assert!(out.contains("ratio 4.00"), "{out}");
        assert!(out.contains("limit none)  orig/mem 2.00"), "{out}");
        assert!(out.contains("(page table 2097152 bytes,"), "{out}");
        assert!(out.contains("codecs    lzo zstd:9\n"), "{out}");
        assert!(
            out.ends_with("backing   2 pages now, 7 read, 9 written\n"),
            "{out}"
        );
        assert!(!out.contains("policy"), "{out}");
    }

    #[test]
    fn an_empty_store_has_no_ratio() {
        let mut lines = reply(&[]);
        lines[0] = format!("mm_stat {}", Stats::default().mm_stat());
        let out = format_stat(&lines).unwrap();
        assert!(out.contains("ratio -\n"), "{out}");
    }

    #[test]
    fn incomplete_or_malformed_replies_are_errors() {
        let lines = reply(&[]);
        let e = format_stat(&lines[..2]).unwrap_err();
        assert_eq!(e.to_string(), "the server sent an incomplete stat reply");
        let mut bad = lines;
        bad[1] = "io_stat 1 2 x 4".into();
        let e = format_stat(&bad).unwrap_err();
        assert_eq!(e.to_string(), "the server sent a malformed stat");
        assert!(format_stat(&[]).is_err());
        // Lines it does not know, or with fields it cannot read, are left out.
        let out = format_stat(&reply(&["writeback_limit 1 2", "policy x", "dict ?"])).unwrap();
        assert!(
            !out.contains("writeback budget") && !out.contains("policy"),
            "{out}"
        );
    }
}
