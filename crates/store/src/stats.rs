//! Statistics: in-memory counters since open, the persisted per-codec and per-segment figures
//! ([`Store::stats`]), and compsize-like usage of files and directories ([`Store::usage`]).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use compfs_codec::Algorithm;
use redb::ReadableTable;

use crate::error::Result;
use crate::meta::{self, dec};
use crate::read::inode_in;
use crate::records::{ExtentRec, MapRec};
use crate::store::{Inner, Store};
use crate::types::*;

/// Counters for [`Stats`] kept in memory since open.
#[derive(Default)]
pub(crate) struct Counters {
    pub user_written: AtomicU64,
    pub user_read: AtomicU64,
    pub seg_written: AtomicU64,
    pub compressed: [AtomicU64; 5],
    pub raw: AtomicU64,
    pub heuristic_skips: AtomicU64,
    pub zero_blocks: AtomicU64,
    pub gc_runs: AtomicU64,
    pub gc_moved: AtomicU64,
    pub gc_freed: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
}

impl Inner {
    pub(crate) fn stats(&self) -> Stats {
        let c = &self.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = Stats {
            user_bytes_written: ld(&c.user_written),
            user_bytes_read: ld(&c.user_read),
            segment_bytes_written: ld(&c.seg_written),
            extents_raw: ld(&c.raw),
            heuristic_skips: ld(&c.heuristic_skips),
            zero_blocks: ld(&c.zero_blocks),
            gc_runs: ld(&c.gc_runs),
            gc_bytes_moved: ld(&c.gc_moved),
            gc_segments_freed: ld(&c.gc_freed),
            cache_hits: ld(&c.cache_hits),
            cache_misses: ld(&c.cache_misses),
            read_only: self.ro_flag.load(Ordering::SeqCst) || self.read_only_open,
            dirty_bytes: self.dirty_bytes.load(Ordering::Relaxed) as u64,
            background: *crate::store::lock(&self.bg.stats),
            ..Stats::default()
        };
        for a in compfs_codec::Algorithm::ALL {
            let n = ld(&c.compressed[a.id() as usize]);
            if n > 0 {
                s.extents_compressed.insert(a.name().to_string(), n);
            }
        }
        if let Ok(txn) = self.read_txn() {
            if let Ok(t) = txn.open_table(meta::STATS) {
                if let Ok(it) = t.iter() {
                    for (k, v) in it.flatten() {
                        let Ok(r) = crate::records::StatRec::decode(v.value()) else {
                            continue;
                        };
                        let name = if k.value() == crate::records::STAT_INLINE {
                            "inline".to_string()
                        } else {
                            match compfs_codec::Algorithm::from_id(k.value()) {
                                Some(a) => a.name().to_string(),
                                None => continue,
                            }
                        };
                        s.per_codec.insert(
                            name,
                            CodecCounters {
                                extents: r.extents,
                                disk: r.disk,
                                uncompressed: r.uncompressed,
                                referenced: r.referenced,
                            },
                        );
                    }
                }
            }
            if let Ok(t) = txn.open_table(meta::SEGMENTS) {
                if let Ok(it) = t.iter() {
                    for (_, v) in it.flatten() {
                        if let Ok(r) = crate::records::SegmentRec::decode(v.value()) {
                            s.segment_bytes = s.segment_bytes.saturating_add(r.len);
                            s.live_bytes = s.live_bytes.saturating_add(r.live);
                        }
                    }
                }
            }
        }
        s
    }
}

/// "zstd:9" for a codec with levels, the bare name for one without ("none", "lzo", "lz4"), as
/// recorded per extent; an unknown codec id is shown as `codec<ID>`.
pub fn codec_level_label(codec: u8, level: i8) -> String {
    match Algorithm::from_id(codec) {
        Some(a) if a.has_levels() => format!("{}:{level}", a.name()),
        Some(a) => a.name().to_string(),
        None => format!("codec{codec}"),
    }
}

impl Store {
    /// Live statistics.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Whether written data is buffered or being compressed (the writeback and compression
    /// threads have work): one atomic load, for per-request decisions.
    pub fn writes_pending(&self) -> bool {
        self.inner
            .dirty_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    /// compsize figures for files and (recursively) directories; each file and each extent is
    /// counted once, a packed extent by each file's share (see `pack`).
    pub fn usage(&self, inos: &[Ino]) -> Result<Usage> {
        self.inner.flush_all(false)?;
        let txn = self.inner.read_txn()?;
        let dirents = txn.open_table(meta::DIRENTS)?;
        let map = txn.open_table(meta::EXTMAP)?;
        let extents = txn.open_table(meta::EXTENTS)?;
        let mut seen = BTreeSet::new();
        let mut todo: Vec<Ino> = inos.to_vec();
        let mut files = Vec::new();
        while let Some(ino) = todo.pop() {
            if !seen.insert(ino) {
                continue;
            }
            let rec = inode_in(&txn, ino)?;
            match rec.kind {
                FileKind::Dir => {
                    for r in dirents.range((ino, &[][..])..(ino + 1, &[][..]))? {
                        let (_, v) = r?;
                        let de = dec(crate::records::DirentRec::decode(v.value()))?;
                        todo.push(de.ino);
                    }
                }
                FileKind::File => files.push((ino, rec)),
                _ => {}
            }
        }
        let mut u = Usage::default();
        let mut ext_seen = BTreeSet::new();
        for (ino, rec) in files {
            u.files += 1;
            if let Some(i) = &rec.inline {
                u.inline += 1;
                let name = Algorithm::from_id(i.codec).map_or("none", |a| a.name());
                let f = CodecUsage {
                    disk: i.bytes.len() as u64,
                    uncompressed: i.raw_len as u64,
                    referenced: i.raw_len as u64,
                };
                u.per_codec.entry(name.to_string()).or_default().add(&f);
                u.per_level
                    .entry(codec_level_label(i.codec, i.level))
                    .or_default()
                    .add(&f);
                u.inline_bytes.add(&f);
                if i.dict != 0 {
                    u.dict_bytes.add(&f);
                }
            }
            for r in map.range((ino, 0)..=(ino, u64::MAX))? {
                let (_, v) = r?;
                let m = dec(MapRec::decode(v.value()))?;
                u.refs += 1;
                let xr = match extents.get(m.extent)? {
                    Some(v) => dec(ExtentRec::decode(v.value()))?,
                    None => continue,
                };
                let name = Algorithm::from_id(xr.codec).map_or("none", |a| a.name());
                let mut f = CodecUsage {
                    referenced: m.len as u64,
                    ..CodecUsage::default()
                };
                let first = ext_seen.insert(m.extent);
                if first {
                    u.regular_extents += 1;
                }
                if xr.ino == crate::pack::PACK_OWNER {
                    // A packed extent counts by share for each file (as it is charged to its
                    // disk bytes), so that figures added up over files (`compfs usage` on a
                    // mount adds each file's record) come to the extent's bytes.
                    f.disk = crate::pack::pack_share(xr.stored_len, xr.raw_len, m.len);
                    f.uncompressed = m.len as u64;
                } else if first {
                    f.disk = xr.stored_len as u64;
                    f.uncompressed = xr.raw_len as u64;
                }
                u.per_codec.entry(name.to_string()).or_default().add(&f);
                u.per_level
                    .entry(codec_level_label(xr.codec, xr.level))
                    .or_default()
                    .add(&f);
                if xr.dict != 0 {
                    u.dict_bytes.add(&f);
                }
            }
        }
        let mut t = CodecUsage::default();
        for c in u.per_codec.values() {
            t.add(c);
        }
        u.total = t;
        Ok(u)
    }
}
