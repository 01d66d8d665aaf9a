//! Read-only virtual xattrs through which unprivileged users get usage figures and statistics.
//!
//! * `compfs.usage` on a regular file: that file's compsize figures ([`UsageReport::to_record`]).
//! * `compfs.stats` on the root directory: the store's live counters ([`StatsRecord`]).
//! * `compfs.remote` on the root directory of a store in a bucket: its metadata snapshot.
//!
//! The kernel checks read permission on the inode before passing a getxattr of a namespace it
//! does not know (fs/xattr.c `xattr_permission()` → `inode_permission(MAY_READ)`), so a user
//! only ever sees the figures of files they could read. `compfs usage` walks directories itself
//! and counts each inode once (hard links), which counts every extent once because compfs only
//! shares extents within one inode.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use compfs_store::{Error, FileKind, Ino, Stats, Store, Usage, ROOT_INO};

use crate::error::RecordError;
use crate::usage::{Figures, UsageReport};

/// Per-file usage record.
pub const USAGE_XATTR: &str = "compfs.usage";
/// Whole-store statistics record (root directory only).
pub const STATS_XATTR: &str = "compfs.stats";

/// The metadata snapshot of a store in a bucket (root directory only): one line.
pub const REMOTE_XATTR: &str = "compfs.remote";

/// True for the names this layer answers itself.
pub fn is_virtual(name: &[u8]) -> bool {
    name == USAGE_XATTR.as_bytes()
        || name == STATS_XATTR.as_bytes()
        || name == REMOTE_XATTR.as_bytes()
}

/// The value of a virtual xattr.
pub fn virtual_xattr(store: &Store, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Error> {
    if name == USAGE_XATTR.as_bytes() {
        let attr = store.getattr(ino)?;
        if attr.kind != FileKind::File {
            return Err(Error::NoXattr);
        }
        Ok(report_from_usage(&store.usage(&[ino])?).to_record())
    } else if name == STATS_XATTR.as_bytes() && ino == ROOT_INO {
        let mut r = StatsRecord::from_stats(&store.stats());
        r.add_transport(fuser::uring_stats());
        Ok(r.encode())
    } else if name == REMOTE_XATTR.as_bytes() && ino == ROOT_INO {
        store
            .remote_status()
            .map(String::into_bytes)
            .ok_or(Error::NoXattr)
    } else {
        Err(Error::NoXattr)
    }
}

/// Converts the store's figures.
pub fn report_from_usage(u: &Usage) -> UsageReport {
    UsageReport {
        files: u.files,
        regular_extents: u.regular_extents,
        refs: u.refs,
        inline: u.inline,
        inline_bytes: Figures {
            disk: u.inline_bytes.disk,
            uncompressed: u.inline_bytes.uncompressed,
            referenced: u.inline_bytes.referenced,
        },
        dict_bytes: Figures {
            disk: u.dict_bytes.disk,
            uncompressed: u.dict_bytes.uncompressed,
            referenced: u.dict_bytes.referenced,
        },
        per_codec: u
            .per_codec
            .iter()
            .map(|(k, c)| {
                (
                    k.clone(),
                    Figures {
                        disk: c.disk,
                        uncompressed: c.uncompressed,
                        referenced: c.referenced,
                    },
                )
            })
            .collect(),
        per_level: u
            .per_level
            .iter()
            .map(|(k, c)| {
                (
                    k.clone(),
                    Figures {
                        disk: c.disk,
                        uncompressed: c.uncompressed,
                        referenced: c.referenced,
                    },
                )
            })
            .collect(),
    }
}

/// `compfs stats` figures: ordered `key value` pairs, so new counters need no format change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsRecord {
    pub values: BTreeMap<String, u64>,
}

const STATS_MAGIC: &str = "compfs-stats 1";

impl StatsRecord {
    pub fn from_stats(s: &Stats) -> StatsRecord {
        let mut v = BTreeMap::new();
        let mut put = |k: &str, n: u64| {
            v.insert(k.to_string(), n);
        };
        put("user_bytes_written", s.user_bytes_written);
        put("user_bytes_read", s.user_bytes_read);
        put("segment_bytes_written", s.segment_bytes_written);
        put("extents_raw", s.extents_raw);
        put("heuristic_skips", s.heuristic_skips);
        put("zero_blocks", s.zero_blocks);
        put("gc_runs", s.gc_runs);
        put("gc_bytes_moved", s.gc_bytes_moved);
        put("gc_segments_freed", s.gc_segments_freed);
        put("cache_hits", s.cache_hits);
        put("cache_misses", s.cache_misses);
        put("segment_bytes", s.segment_bytes);
        put("live_bytes", s.live_bytes);
        put("read_only", u64::from(s.read_only));
        put("dirty_bytes", s.dirty_bytes);
        let b = &s.background;
        put("background.files_pending", b.files_pending);
        put("background.extents_pending", b.extents_pending);
        put("background.bytes_pending", b.bytes_pending);
        put("background.extents_done", b.extents_done);
        put("background.bytes_done", b.bytes_done);
        put("background.bytes_saved", b.bytes_saved);
        put("background.passes", b.passes);
        for (codec, n) in &s.extents_compressed {
            put(&format!("extents_compressed.{codec}"), *n);
        }
        for (codec, c) in &s.per_codec {
            put(&format!("store.{codec}.extents"), c.extents);
            put(&format!("store.{codec}.disk"), c.disk);
            put(&format!("store.{codec}.uncompressed"), c.uncompressed);
            put(&format!("store.{codec}.referenced"), c.referenced);
        }
        StatsRecord { values: v }
    }

    /// The FUSE transport's figures: `fuse.uring_queues` (queues registered with the kernel;
    /// 0 when requests go through `/dev/fuse`) and `fuse.uring_requests` (requests served
    /// through the rings), `fuse.uring_handed_off` (of those, the ones the ring threads handed
    /// to helper threads, see [`crate::ring`]), `fuse.uring_woken_here` (rounds of a ring thread
    /// whose pending replies were committed so as to wake their requesters on its CPU,
    /// [`crate::ring`]),
    /// and `fuse.uring_requests.cpuN` per queue
    /// that served any.
    pub fn add_transport(&mut self, u: fuser::UringStats) {
        self.values.insert("fuse.uring_queues".into(), u.queues);
        self.values.insert("fuse.uring_requests".into(), u.requests);
        self.values
            .insert("fuse.uring_handed_off".into(), u.handed_off);
        self.values
            .insert("fuse.uring_woken_here".into(), u.woken_here);
        for (cpu, n) in u.per_queue.iter().enumerate() {
            if *n > 0 {
                self.values
                    .insert(format!("fuse.uring_requests.cpu{cpu}"), *n);
            }
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("{STATS_MAGIC}\n");
        for (k, n) in &self.values {
            let _ = writeln!(s, "{k} {n}");
        }
        s.into_bytes()
    }

    pub fn decode(v: &[u8]) -> Result<StatsRecord, RecordError> {
        let text = std::str::from_utf8(v).map_err(|_| RecordError::new("stats: not UTF-8"))?;
        let mut lines = text.lines();
        if lines.next() != Some(STATS_MAGIC) {
            return Err(RecordError::new("stats: missing 'compfs-stats 1' header"));
        }
        let mut values = BTreeMap::new();
        for l in lines {
            let (k, n) = l
                .split_once(' ')
                .ok_or_else(|| RecordError::new(format!("stats: bad line '{l}'")))?;
            let n: u64 = n
                .parse()
                .map_err(|_| RecordError::new(format!("stats: bad number in '{l}'")))?;
            if k.is_empty() || values.insert(k.to_string(), n).is_some() {
                return Err(RecordError::new(format!(
                    "stats: bad or repeated key in '{l}'"
                )));
            }
        }
        Ok(StatsRecord { values })
    }

    fn get(&self, k: &str) -> u64 {
        self.values.get(k).copied().unwrap_or(0)
    }

    /// The human-readable `compfs stats` output.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mb = |n: u64| format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64);
        let _ = writeln!(
            out,
            "user bytes written       {}",
            mb(self.get("user_bytes_written"))
        );
        let _ = writeln!(
            out,
            "user bytes read          {}",
            mb(self.get("user_bytes_read"))
        );
        let _ = writeln!(
            out,
            "segment bytes written    {}",
            mb(self.get("segment_bytes_written"))
        );
        let _ = writeln!(
            out,
            "dirty (not committed)    {}",
            mb(self.get("dirty_bytes"))
        );
        let compressed: Vec<(&str, u64)> = self
            .values
            .iter()
            .filter_map(|(k, n)| k.strip_prefix("extents_compressed.").map(|c| (c, *n)))
            .collect();
        let total_c: u64 = compressed.iter().map(|(_, n)| n).sum();
        let _ = write!(out, "extents compressed       {total_c}");
        for (c, n) in &compressed {
            let _ = write!(out, "  {c}={n}");
        }
        out.push('\n');
        let _ = writeln!(out, "extents raw              {}", self.get("extents_raw"));
        let _ = writeln!(
            out,
            "  heuristic skips        {}",
            self.get("heuristic_skips")
        );
        let _ = writeln!(out, "zero blocks (holes)      {}", self.get("zero_blocks"));
        let _ = writeln!(
            out,
            "gc runs                  {} ({} moved, {} segments freed)",
            self.get("gc_runs"),
            mb(self.get("gc_bytes_moved")),
            self.get("gc_segments_freed")
        );
        let (h, m) = (self.get("cache_hits"), self.get("cache_misses"));
        let rate = if h + m == 0 {
            "n/a".to_string()
        } else {
            format!("{:.1}%", 100.0 * h as f64 / (h + m) as f64)
        };
        let _ = writeln!(
            out,
            "cache hit rate           {rate} ({h} hits, {m} misses)"
        );
        let _ = writeln!(
            out,
            "segments                 {} total, {} live",
            mb(self.get("segment_bytes")),
            mb(self.get("live_bytes"))
        );
        let _ = writeln!(
            out,
            "background pending       {} extents, {} in {} files",
            self.get("background.extents_pending"),
            mb(self.get("background.bytes_pending")),
            self.get("background.files_pending")
        );
        let _ = writeln!(
            out,
            "background done          {} extents, {}, {} saved ({} passes)",
            self.get("background.extents_done"),
            mb(self.get("background.bytes_done")),
            mb(self.get("background.bytes_saved")),
            self.get("background.passes")
        );
        let queues = self.get("fuse.uring_queues");
        if queues > 0 {
            let _ = writeln!(
                out,
                "FUSE transport           io_uring, {queues} queues, {} requests",
                self.get("fuse.uring_requests")
            );
        } else if self.values.contains_key("fuse.uring_queues") {
            let _ = writeln!(out, "FUSE transport           /dev/fuse");
        }
        if self.get("read_only") != 0 {
            let _ = writeln!(
                out,
                "state                    READ-ONLY after an I/O failure"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_round_trip_and_render() {
        let mut s = Stats {
            user_bytes_written: 3 << 20,
            cache_hits: 3,
            cache_misses: 1,
            ..Default::default()
        };
        s.extents_compressed.insert("zstd".into(), 7);
        s.background = compfs_store::BackgroundStats {
            files_pending: 2,
            extents_pending: 5,
            bytes_pending: 1 << 20,
            extents_done: 9,
            bytes_done: 2 << 20,
            bytes_saved: 512 << 10,
            passes: 4,
        };
        let r = StatsRecord::from_stats(&s);
        let back = StatsRecord::decode(&r.encode()).unwrap();
        assert_eq!(back, r);
        let text = back.render();
        assert!(text.contains("user bytes written       3.0 MiB"), "{text}");
        assert!(
            text.contains("extents compressed       7  zstd=7"),
            "{text}"
        );
        assert!(text.contains("cache hit rate           75.0%"), "{text}");
        assert!(
            text.contains("background pending       5 extents, 1.0 MiB in 2 files"),
            "{text}"
        );
        assert!(
            text.contains("background done          9 extents, 2.0 MiB, 0.5 MiB saved (4 passes)"),
            "{text}"
        );
    }

    #[test]
    fn malformed_stats_are_rejected() {
        for bad in [
            &b""[..],
            b"compfs-stats 2\n",
            b"compfs-stats 1\nkey\n",
            b"compfs-stats 1\nkey x\n",
            b"compfs-stats 1\nkey 1\nkey 2\n",
            b"compfs-stats 1\n 1\n",
            b"\xff",
        ] {
            assert!(StatsRecord::decode(bad).is_err(), "{bad:?}");
        }
    }
}
