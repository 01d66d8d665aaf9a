//! Recompression (`compfs defrag`, btrfs `filesystem defragment -c`): rewrites the blocks of a
//! file whose extents are not stored with the target codec **and level**, and skips the rest, so
//! a second identical run rewrites nothing. Every extent records its codec and level (extent
//! header bytes 4 and 5, extent record, inline data; see docs/format.md), which is what makes
//! the skip decision possible without reading the data.
//!
//! A rewritten block goes through the ordinary flush path (compress on the worker pool, append,
//! one metadata transaction replacing the block's map range), so crash safety is the flush's:
//! until a commit is durable the old extents stay referenced, and the extents a rewrite frees
//! are reclaimed by GC like any overwritten extent.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use compfs_codec::{CodecSpec, ExtentPolicy, Mode};
use redb::ReadableDatabase;

use crate::encode::{encode_block, EncodeJob, EncodedBlock, Out};
use crate::error::{Error, Result};
use crate::file::kind_error;
use crate::flush::FlushMeta;
use crate::meta::{self, dec};
use crate::read::inode_in;
use crate::records::{ExtentRec, MapRec};
use crate::span;
use crate::store::Store;
use crate::types::*;

/// What `defrag` rewrites to. `spec: None` keeps each file's own policy (its
/// `compfs.compression` property, else the mount's or store's default); `level` overrides the
/// level of whichever codec that gives (`-L`); `force` tries the codec on every extent like
/// `compress-force` (otherwise the heuristic decides, as with `compress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DefragTarget {
    pub spec: Option<CodecSpec>,
    pub level: Option<i32>,
    pub force: bool,
}

impl DefragTarget {
    /// The policy a file is rewritten with, given the file's own policy. Without `force` the
    /// mode is the heuristic when a codec is given, else the file's own mode.
    pub fn resolve(&self, own: ExtentPolicy) -> ExtentPolicy {
        let mut spec = self.spec.unwrap_or(own.spec);
        if let Some(l) = self.level {
            spec = CodecSpec::with_level(spec.algorithm(), l).spec;
        }
        let mode = if self.force {
            Mode::Force
        } else if self.spec.is_some() {
            Mode::Heuristic
        } else {
            own.mode
        };
        ExtentPolicy { spec, mode, ..own }
    }
}

/// Figures of a defrag run (one file, or summed over many with [`DefragReport::add`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DefragReport {
    /// Regular files processed.
    pub files: u64,
    /// Distinct extents (and inline data) looked at.
    pub extents_examined: u64,
    /// Of those, the ones whose block was rewritten.
    pub extents_rewritten: u64,
    /// Of those, the ones left alone (already at the target, or raw and not shrinkable).
    pub extents_skipped: u64,
    /// File bytes (uncompressed) of the blocks looked at.
    pub bytes_examined: u64,
    /// File bytes of the blocks rewritten.
    pub bytes_rewritten: u64,
    /// Stored bytes of the files' extents and inline data before and after.
    pub disk_before: u64,
    pub disk_after: u64,
}

impl DefragReport {
    pub fn add(&mut self, o: &DefragReport) {
        self.files += o.files;
        self.extents_examined += o.extents_examined;
        self.extents_rewritten += o.extents_rewritten;
        self.extents_skipped += o.extents_skipped;
        self.bytes_examined += o.bytes_examined;
        self.bytes_rewritten += o.bytes_rewritten;
        self.disk_before += o.disk_before;
        self.disk_after += o.disk_after;
    }
}

/// What to do with one block, from the codec and level of the extents it references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockPlan {
    /// Every extent is already stored with the target codec and level.
    Skip,
    /// Every extent is raw and the target compresses: compress it, and rewrite only if the
    /// result is compressed (a raw result would rewrite the same bytes).
    IfShrinks,
    /// Rewrite the block.
    Rewrite,
}

/// The plan for a block referencing extents stored as `(codec id, level)`, for a target codec
/// and level. Codecs without levels record level 0, so a plain comparison is right for them.
pub(crate) fn plan_block(extents: &[(u8, i8)], target: (u8, i8)) -> BlockPlan {
    if extents.iter().all(|&x| x == target) {
        BlockPlan::Skip
    } else if target.0 != 0 && extents.iter().all(|&(c, _)| c == 0) {
        BlockPlan::IfShrinks
    } else {
        BlockPlan::Rewrite
    }
}

/// True when an encoded block came out raw (as an extent or inline data).
fn came_out_raw(en: &EncodedBlock) -> bool {
    match &en.0.out {
        Out::Extent { codec, .. } => *codec == 0,
        Out::Inline(i) => i.codec == 0,
        Out::Hole => false,
    }
}

/// An extent a block references: (extent id, codec id, level).
type BlockExtent = (u64, u8, i8);

/// Batches of blocks compressing on the pool while this thread reads the next one.
const PIPELINE_BATCHES: usize = 1;

/// Blocks handed to the compression pool, waiting for their commit.
struct Batch {
    rx: Option<Receiver<(usize, Vec<EncodedBlock>)>>,
    n: usize,
    plans: BTreeMap<u64, BlockPlan>,
    /// Block -> the extents it referenced (counted as rewritten once it is committed).
    extents: BTreeMap<u64, Vec<u64>>,
}

/// Marks inline data among a block's extent ids (extent ids start at 1).
const INLINE_ID: u64 = 0;

impl Store {
    /// Rewrites the blocks of regular file `ino` that are not stored as `target` asks (see the
    /// module documentation). `progress` is called with the file's running figures after each
    /// batch of blocks. Commits are non-durable, like writes: [`Store::sync`] makes them durable.
    pub fn defrag(
        &self,
        ino: Ino,
        target: &DefragTarget,
        progress: &mut dyn FnMut(&DefragReport),
    ) -> Result<DefragReport> {
        let inner = &self.inner;
        inner.check_writable()?;
        let e = inner.sb.extent_size as u64;
        let policy = target.resolve(inner.file_policy(ino)?);
        let want = (policy.spec.algorithm().id(), policy.spec.level() as i8);
        inner.with_file(ino, |st| {
            inner.flush_locked(ino, st, false)?;
            let mut r = DefragReport {
                files: 1,
                ..DefragReport::default()
            };
            // Block -> (extent id, codec, level) of everything the block references.
            let mut blocks: BTreeMap<u64, Vec<BlockExtent>> = BTreeMap::new();
            let (size, mtime) = {
                let txn = inner.db.begin_read()?;
                let rec = inode_in(&txn, ino)?;
                if rec.kind != FileKind::File {
                    return Err(kind_error(rec.kind));
                }
                r.disk_before = disk_of(&rec);
                if let Some(i) = &rec.inline {
                    blocks
                        .entry(0)
                        .or_default()
                        .push((INLINE_ID, i.codec, i.level));
                }
                let map = txn.open_table(meta::EXTMAP)?;
                let extents = txn.open_table(meta::EXTENTS)?;
                for row in map.range((ino, 0)..=(ino, u64::MAX))? {
                    let (k, m) = row?;
                    let m = dec(MapRec::decode(m.value()))?;
                    let x = match extents.get(m.extent)? {
                        Some(v) => dec(ExtentRec::decode(v.value()))?,
                        None => return Err(meta::corrupt("map entry names a missing extent")),
                    };
                    for b in span::blocks_of(k.value().1, m.len as u64, e)
                        .into_iter()
                        .flatten()
                    {
                        blocks
                            .entry(b)
                            .or_default()
                            .push((m.extent, x.codec, x.level));
                    }
                }
                (rec.size, rec.mtime)
            };
            let examined: BTreeSet<u64> = blocks.values().flatten().map(|x| x.0).collect();
            r.extents_examined = examined.len() as u64;
            let list: Vec<(u64, Vec<BlockExtent>)> = blocks.into_iter().collect();
            let mut rewritten: BTreeSet<u64> = BTreeSet::new();
            let inline_ok = size <= inner.sb.inline_max as u64;
            // Batches being compressed on the pool: the next batch is read (decompressed) while
            // the previous one compresses, and committed by this thread meanwhile.
            let mut flying: VecDeque<Batch> = VecDeque::new();
            let finish = |b: Batch, r: &mut DefragReport, rewritten: &mut BTreeSet<u64>| {
                let mut results: Vec<EncodedBlock> = Vec::new();
                let Some(rx) = b.rx else { return Ok(()) };
                for _ in 0..b.n {
                    match rx.recv() {
                        Ok((_, v)) => results.extend(v),
                        Err(_) => {
                            return Err(Error::Io(std::io::Error::other("compression worker lost")))
                        }
                    }
                }
                let keep: Vec<EncodedBlock> = results
                    .into_iter()
                    .filter(|en| {
                        b.plans.get(&en.0.block) != Some(&BlockPlan::IfShrinks) || !came_out_raw(en)
                    })
                    .collect();
                if keep.is_empty() {
                    return Ok(());
                }
                let done: Vec<u64> = keep.iter().map(|en| en.0.block).collect();
                let meta = FlushMeta {
                    size,
                    mtime,
                    ctime: Timestamp::now(),
                    punch: Vec::new(),
                };
                inner
                    .commit_encoded(ino, &meta, false, keep)
                    .map_err(|er| inner.fail(er))?;
                for blk in done {
                    r.bytes_rewritten += span::block_len_in_file(size, blk, e) as u64;
                    if let Some(xs) = b.extents.get(&blk) {
                        rewritten.extend(xs.iter().copied());
                    }
                }
                r.extents_rewritten = rewritten.len() as u64;
                Ok(())
            };
            for chunk in list.chunks(inner.tuning.flush_blocks.max(2)) {
                let mut batch = Batch {
                    rx: None,
                    n: 0,
                    plans: BTreeMap::new(),
                    extents: BTreeMap::new(),
                };
                let mut jobs: Vec<EncodeJob> = Vec::new();
                for (b, xs) in chunk {
                    let b = *b;
                    r.bytes_examined += span::block_len_in_file(size, b, e) as u64;
                    let codecs: Vec<(u8, i8)> = xs.iter().map(|x| (x.1, x.2)).collect();
                    let plan = plan_block(&codecs, want);
                    if plan == BlockPlan::Skip {
                        continue;
                    }
                    batch.plans.insert(b, plan);
                    batch.extents.insert(b, xs.iter().map(|x| x.0).collect());
                    let mut v = vec![0u8; e as usize];
                    {
                        let _g = inner.seg_barrier.read();
                        let txn = inner.db.begin_read()?;
                        inner.read_persisted(&txn, ino, b * e, &mut v)?;
                    }
                    let src = Arc::new(v);
                    let len = span::block_len_in_file(size, b, e);
                    let inline = inline_ok && b == 0;
                    jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                        (encode_block(enc, &policy, b, &src[..len], inline), src)
                    }));
                }
                if !jobs.is_empty() {
                    let (rx, n) = inner.submit_grouped(jobs);
                    batch.rx = Some(rx);
                    batch.n = n;
                    flying.push_back(batch);
                }
                while flying.len() > PIPELINE_BATCHES {
                    if let Some(b) = flying.pop_front() {
                        finish(b, &mut r, &mut rewritten)?;
                    }
                }
                progress(&r);
            }
            while let Some(b) = flying.pop_front() {
                finish(b, &mut r, &mut rewritten)?;
                progress(&r);
            }
            r.extents_rewritten = rewritten.len() as u64;
            r.extents_skipped = r.extents_examined - r.extents_rewritten;
            r.disk_after = disk_of(&inner.inode(ino)?);
            Ok(r)
        })
    }

    /// Rewrites a file's data with `policy` (default: the file's own policy), like
    /// `btrfs filesystem defragment -c`; extents already stored that way are kept
    /// ([`Store::defrag`]).
    pub fn recompress(&self, ino: Ino, policy: Option<(CodecSpec, Mode)>) -> Result<()> {
        let target = match policy {
            Some((s, m)) => DefragTarget {
                spec: Some(s),
                level: None,
                force: m == Mode::Force,
            },
            None => DefragTarget::default(),
        };
        self.defrag(ino, &target, &mut |_| {}).map(|_| ())
    }
}

/// Stored bytes of a file: its extents plus its inline data.
fn disk_of(rec: &crate::records::InodeRec) -> u64 {
    rec.disk_bytes
        .saturating_add(rec.inline.as_ref().map_or(0, |i| i.bytes.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use compfs_codec::Algorithm;

    #[test]
    fn plans_follow_codec_and_level() {
        let z9 = (3u8, 9i8);
        assert_eq!(plan_block(&[(3, 9)], z9), BlockPlan::Skip);
        assert_eq!(plan_block(&[(3, 9), (3, 9)], z9), BlockPlan::Skip);
        assert_eq!(plan_block(&[(3, 1)], z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(3, 9), (3, 1)], z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(1, 9)], z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(0, 0)], z9), BlockPlan::IfShrinks);
        assert_eq!(plan_block(&[(0, 0), (3, 9)], z9), BlockPlan::Rewrite);
        // --nocomp: raw is the target, compressed blocks are rewritten raw.
        assert_eq!(plan_block(&[(0, 0)], (0, 0)), BlockPlan::Skip);
        assert_eq!(plan_block(&[(4, 0)], (0, 0)), BlockPlan::Rewrite);
        // Codecs without levels record level 0.
        assert_eq!(plan_block(&[(4, 0)], (4, 0)), BlockPlan::Skip);
    }

    #[test]
    fn target_resolution() {
        let own = ExtentPolicy::new(CodecSpec::with_level(Algorithm::Lz4, 0).spec, Mode::Force);
        let p = DefragTarget::default().resolve(own);
        assert_eq!((p.spec, p.mode), (own.spec, Mode::Force));
        let z9 = CodecSpec::with_level(Algorithm::Zstd, 9).spec;
        let t = DefragTarget {
            spec: Some(CodecSpec::with_level(Algorithm::Zstd, 3).spec),
            level: Some(9),
            force: false,
        };
        let p = t.resolve(own);
        assert_eq!((p.spec, p.mode), (z9, Mode::Heuristic));
        let t = DefragTarget { force: true, ..t };
        assert_eq!(t.resolve(own).mode, Mode::Force);
        // -L alone applies to the file's own codec; a codec without levels ignores it.
        let t = DefragTarget {
            spec: None,
            level: Some(7),
            force: false,
        };
        assert_eq!(t.resolve(own).spec.level(), 0);
    }
}
