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
//!
//! Store dictionaries (format version 3): when the store has a current dictionary, a small
//! block (see `dict::dict_applies`) whose extents or inline data do not use it is not at
//! target either; it is rewritten when the rewrite comes out with the dictionary
//! ([`BlockPlan::IfDict`]). An extent compressed with the current dictionary counts as at the
//! target level whatever level it records (the dictionary's). Packs (see `pack`) follow the
//! same rule whatever their length, unless packs do not use the dictionary (`dict=nopack`):
//! a pack off the current dictionary is repacked, and the new pack is written only if it
//! comes out with the dictionary.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use compfs_codec::{CodecSpec, ExtentPolicy, Mode};

use crate::encode::{encode_block, EncodeJob, EncodedBlock, Out};
use crate::error::{Error, Result};
use crate::file::kind_error;
use crate::flush::FlushMeta;
use crate::meta::{self, dec};
use crate::pack::{Member, PackInput, PACK_OWNER};
use crate::pool::Pool;
use crate::read::inode_in;
use crate::records::{ExtentRec, InodeRec, MapRec};
use crate::span;
use crate::store::{Inner, Store};
use crate::types::*;

/// What `defrag` rewrites to. `spec: None` keeps each file's own policy (its
/// `compfs.compression` property, else the mount's or store's default); `level` overrides the
/// level of whichever codec that gives (`-L`); `force` tries the codec on every extent like
/// `compress-force` (otherwise the heuristic decides, as with `compress`). `extent_size`:
/// the uncompressed extent size to cut the file into (`None`: the file's own, its
/// `compfs.extent_size` property, else the store's); blocks not stored as one extent of that
/// size are rewritten even when their codec and level match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DefragTarget {
    pub spec: Option<CodecSpec>,
    pub level: Option<i32>,
    pub force: bool,
    pub extent_size: Option<u32>,
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

    /// The figures as JSON (`compfs defrag --json`): one flat object of integers, with
    /// `failed_files` the number of files that could not be defragmented.
    pub fn to_json(&self, failures: u64) -> String {
        let r = self;
        format!(
            "{{\"files\":{},\"extents_examined\":{},\"extents_rewritten\":{},\"extents_skipped\":{},\
             \"bytes_examined\":{},\"bytes_rewritten\":{},\"disk_bytes_before\":{},\
             \"disk_bytes_after\":{},\"failed_files\":{}}}\n",
            r.files,
            r.extents_examined,
            r.extents_rewritten,
            r.extents_skipped,
            r.bytes_examined,
            r.bytes_rewritten,
            r.disk_before,
            r.disk_after,
            failures
        )
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
    /// Codec and level are the target's but the block is small and not compressed with the
    /// current dictionary: rewrite it only if the result uses the dictionary.
    IfDict,
}

/// The plan of a block that `plan_block` found at target, given the dictionary ids its
/// extents record, the current dictionary and whether the block is small enough for one.
pub(crate) fn dict_plan(
    plan: BlockPlan,
    dicts: &[u16],
    cur: Option<u16>,
    small: bool,
) -> BlockPlan {
    match (plan, cur) {
        (BlockPlan::Skip, Some(c)) if small && dicts.iter().any(|&d| d != c) => BlockPlan::IfDict,
        _ => plan,
    }
}

/// The `(codec, level)` an extent counts as for planning: one compressed with the current
/// dictionary `cur` in the target codec counts as at the target level.
pub(crate) fn planned_as(x: (u8, i8, u16), target: (u8, i8), cur: Option<u16>) -> (u8, i8) {
    if x.2 != 0 && Some(x.2) == cur && x.0 == target.0 {
        (x.0, target.1)
    } else {
        (x.0, x.1)
    }
}

/// The plan for a block referencing extents stored as `(codec id, level)`, for a target codec
/// and level. Codecs without levels record level 0, so a plain comparison is right for them.
/// `whole`: the block is stored as one extent of the target extent size (see
/// [`span::is_whole_block`]); a block that is not is rewritten whatever its codec.
pub(crate) fn plan_block(extents: &[(u8, i8)], whole: bool, target: (u8, i8)) -> BlockPlan {
    if !whole {
        BlockPlan::Rewrite
    } else if extents.iter().all(|&x| x == target) {
        BlockPlan::Skip
    } else if target.0 != 0 && extents.iter().all(|&(c, _)| c == 0) {
        BlockPlan::IfShrinks
    } else {
        BlockPlan::Rewrite
    }
}

/// True when an encoded block came out compressed with a dictionary.
fn came_out_dict(en: &EncodedBlock) -> bool {
    match &en.0.out {
        Out::Extent { dict, .. } => *dict != 0,
        Out::Inline(i) => i.dict != 0,
        Out::Hole => false,
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

/// An extent a block references: (extent id, codec id, level, dictionary id).
type BlockExtent = (u64, u8, i8, u16);

/// Batches of blocks compressing on the pool while this thread reads the next one.
const PIPELINE_BATCHES: usize = 1;

/// Blocks handed to the compression pool, waiting for their commit.
#[derive(Default)]
struct Batch {
    rx: Option<Receiver<(usize, Vec<EncodedBlock>)>>,
    n: usize,
    /// Block -> its plan and what it referenced when read.
    blocks: BTreeMap<u64, (BlockPlan, BlockNow)>,
    /// Block size the blocks were cut with.
    block: u64,
    /// File size when the blocks were read.
    size: u64,
}

/// Marks inline data among a block's extent ids (extent ids start at 1).
const INLINE_ID: u64 = 0;

impl Inner {
    /// What each block in `blocks` of a file references now, read in `txn`: the block's
    /// extents (for the plan) and its map entries (to see later whether it changed), for
    /// blocks of `e` bytes. An extent written with another block size may cross block
    /// boundaries: it counts for every block it overlaps.
    fn blocks_now(
        &self,
        txn: &redb::ReadTransaction,
        ino: Ino,
        rec: &InodeRec,
        blocks: std::ops::RangeInclusive<u64>,
        e: u64,
    ) -> Result<BTreeMap<u64, BlockNow>> {
        let mut out: BTreeMap<u64, BlockNow> = BTreeMap::new();
        if let Some(i) = &rec.inline {
            if blocks.contains(&0) {
                let b = out.entry(0).or_default();
                b.extents.push((INLINE_ID, i.codec, i.level, i.dict));
                b.key.push((0, INLINE_ID, 0, i.raw_len));
                b.raw_lens.push(i.raw_len);
            }
        }
        let map = txn.open_table(meta::EXTMAP)?;
        let extents = txn.open_table(meta::EXTENTS)?;
        let from = blocks.start().saturating_mul(e);
        let to = blocks.end().saturating_add(1).saturating_mul(e);
        // An entry is at most one extent (at most MAX_EXTENT bytes) long: one that overlaps
        // `from` starts less than that before it.
        let scan_from = from.saturating_sub(compfs_codec::MAX_EXTENT as u64 - 1);
        for row in map.range((ino, scan_from)..(ino, to))? {
            let (k, m) = row?;
            let off = k.value().1;
            let m = dec(MapRec::decode(m.value()))?;
            let x = match extents.get(m.extent)? {
                Some(v) => dec(ExtentRec::decode(v.value()))?,
                None => return Err(meta::corrupt("map entry names a missing extent")),
            };
            for b in span::blocks_of(off, m.len as u64, e).into_iter().flatten() {
                if !blocks.contains(&b) {
                    continue;
                }
                let bn = out.entry(b).or_default();
                bn.packed |= x.ino == PACK_OWNER;
                bn.extents.push((m.extent, x.codec, x.level, x.dict));
                bn.key.push((off, m.extent, m.ext_offset, m.len));
                bn.raw_lens.push(x.raw_len);
            }
        }
        Ok(out)
    }
}

/// A block as the metadata has it at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct BlockNow {
    extents: Vec<BlockExtent>,
    /// (file offset, extent id, offset in the extent, length) of its map entries (inline data:
    /// extent id 0): equal keys mean equal contents, since extent contents never change and
    /// ids are not reused within a session.
    key: Vec<(u64, u64, u32, u32)>,
    /// Uncompressed length of each entry's extent (inline data: its length), as `key`.
    raw_lens: Vec<u32>,
    /// Whether an entry names a packed extent (see `pack`).
    packed: bool,
}

impl BlockNow {
    /// Whether block `b` (of `e` bytes, in a file of `size` bytes) is one whole extent, or the
    /// whole file in a pack (a file of one block mapped by one entry naming a packed extent).
    fn whole(&self, b: u64, e: u64, size: u64) -> bool {
        if self.packed {
            return self.whole_in_pack(b, e, size);
        }
        match (self.key.as_slice(), self.raw_lens.as_slice()) {
            ([(off, _, xo, len)], [raw]) => span::is_whole_block(
                span::Piece {
                    file_off: *off,
                    ext_offset: *xo,
                    len: *len,
                },
                *raw,
                b,
                e,
                size,
            ),
            _ => false,
        }
    }
}

impl BlockNow {
    /// Whether this block is a whole file of one block in a pack (see [`BlockNow::whole`]).
    fn whole_in_pack(&self, b: u64, e: u64, size: u64) -> bool {
        self.packed
            && b == 0
            && size <= e
            && matches!(self.key.as_slice(), [(0, _, _, len)] if *len as u64 == size)
    }
}

impl Store {
    /// Rewrites the blocks of regular file `ino` that are not stored as `target` asks (see the
    /// module documentation). `progress` is called with the file's running figures after each
    /// batch of blocks. Commits are non-durable, like writes: [`Store::sync`] makes them durable.
    ///
    /// The file is locked only while a batch is read and while one is committed, so readers,
    /// writers and the background flusher are not held up for the whole file. A block changed
    /// by anyone between its read and its commit is left as the other writer made it.
    pub fn defrag(
        &self,
        ino: Ino,
        target: &DefragTarget,
        progress: &mut dyn FnMut(&DefragReport),
    ) -> Result<DefragReport> {
        let run = DefragRun {
            pool: &self.inner.pool,
            control: &mut |r| {
                progress(r);
                true
            },
        };
        let res = self.inner.defrag_file(ino, target, run);
        self.inner.maybe_forget(ino);
        res
    }
}

/// How a defrag runs: on which compression pool, and a callback after each batch that may
/// hold the run (it is called with no lock held) or stop it (returns false; the figures so far
/// are returned, everything committed so far stays).
pub(crate) struct DefragRun<'a> {
    pub pool: &'a Pool,
    pub control: &'a mut dyn FnMut(&DefragReport) -> bool,
}

impl Inner {
    pub(crate) fn defrag_file(
        &self,
        ino: Ino,
        target: &DefragTarget,
        run: DefragRun<'_>,
    ) -> Result<DefragReport> {
        let inner = self;
        let DefragRun { pool, control } = run;
        inner.check_writable()?;
        // A repack of this file still queued by an earlier run is written first, so that the
        // plan below sees it.
        if inner.repack_queued(ino) {
            inner.repack_flush(None)?;
        }
        let own = match target.extent_size {
            Some(n) => n as u64,
            None => inner.file_extent_size(ino)?,
        };
        let policy = target.resolve(inner.file_policy(ino)?);
        let want = (policy.spec.algorithm().id(), policy.spec.level() as i8);
        let dx = inner.dict_ctx(&policy).no_sample();
        let cur = dx.cur.as_ref().map(|d| d.id);
        // The dictionary packs use (none with `dict=nopack`), whatever their length.
        let pack_cur = inner.pack_dict(policy.spec).map(|d| d.id);
        let mut r = DefragReport {
            files: 1,
            ..DefragReport::default()
        };
        // The blocks with data when the run starts (blocks written later are written with the
        // file's policy anyway).
        let (blocks, e): (Vec<u64>, u64) = inner.with_file(ino, |st| {
            inner.flush_locked(ino, st, false)?;
            let txn = inner.read_txn()?;
            let rec = inode_in(&txn, ino)?;
            if rec.kind != FileKind::File {
                return Err(kind_error(rec.kind));
            }
            let e = inner.block_for(&rec, own);
            r.disk_before = disk_of(&rec);
            let now = inner.blocks_now(&txn, ino, &rec, 0..=u64::MAX / e, e)?;
            let examined: BTreeSet<u64> =
                now.values().flat_map(|b| &b.extents).map(|x| x.0).collect();
            r.extents_examined = examined.len() as u64;
            Ok((now.into_keys().collect(), e))
        })?;
        let mut rewritten: BTreeSet<u64> = BTreeSet::new();
        // Batches being compressed on the pool: the next batch is read (decompressed) while
        // the previous one compresses, and committed by this thread meanwhile.
        let mut flying: VecDeque<Batch> = VecDeque::new();
        let mut stopped = false;
        for chunk in blocks.chunks(inner.tuning.flush_blocks.max(2)) {
            let (Some(&first), Some(&last)) = (chunk.first(), chunk.last()) else {
                continue;
            };
            let mut batch = Batch {
                block: e,
                ..Batch::default()
            };
            let mut jobs: Vec<EncodeJob> = Vec::new();
            // (file, its extents, repacked only if the pack comes out with the dictionary)
            let mut repacks: Vec<(PackInput, Vec<u64>, bool)> = Vec::new();
            inner.with_file(ino, |st| {
                if st.dirty.is_some() {
                    inner.flush_locked(ino, st, false)?;
                }
                let _g = inner.seg_barrier.read();
                let txn = inner.read_txn()?;
                let rec = inode_in(&txn, ino)?;
                let now = inner.blocks_now(&txn, ino, &rec, first..=last, e)?;
                let inline_ok = rec.size <= inner.inline_limit(e);
                batch.size = rec.size;
                for &b in chunk {
                    let len = span::block_len_in_file(rec.size, b, e);
                    r.bytes_examined += len as u64;
                    let Some(bn) = now.get(&b) else { continue };
                    let packed = bn.whole_in_pack(b, e, rec.size);
                    let cur_here = if packed { pack_cur } else { cur };
                    let codecs: Vec<(u8, i8)> = bn
                        .extents
                        .iter()
                        .map(|x| planned_as((x.1, x.2, x.3), want, cur_here))
                        .collect();
                    let dicts: Vec<u16> = bn.extents.iter().map(|x| x.3).collect();
                    // Packs try the dictionary whatever their length (see `pack`).
                    let small =
                        packed || crate::dict::dict_applies(policy.spec, len, inline_ok && b == 0);
                    let base = plan_block(&codecs, bn.whole(b, e, rec.size), want);
                    // A raw pack was incompressible when written: left alone.
                    let plan = match (packed, base) {
                        (true, BlockPlan::IfShrinks) => BlockPlan::Skip,
                        (_, p) => dict_plan(p, &dicts, cur_here, small),
                    };
                    if plan == BlockPlan::Skip || len == 0 {
                        continue;
                    }
                    if packed && inner.pack_limit() > 0 {
                        // Repacked with other files, never rewritten alone (see `pack`).
                        let mut v = vec![0u8; len];
                        inner.read_persisted(&txn, ino, 0, &mut v)?;
                        let (_, extent, ext_offset, mlen) = bn.key[0];
                        let member = Member {
                            ino,
                            ext_offset: 0,
                            len: len as u32,
                            meta: FlushMeta {
                                block: e,
                                size: rec.size,
                                mtime: rec.mtime,
                                ctime: Timestamp::now(),
                                punch: Vec::new(),
                            },
                            expect: Some(MapRec {
                                extent,
                                ext_offset,
                                len: mlen,
                            }),
                        };
                        let ids = bn.extents.iter().map(|x| x.0).collect();
                        repacks.push((
                            PackInput {
                                member,
                                data: Arc::new(v),
                            },
                            ids,
                            plan == BlockPlan::IfDict,
                        ));
                        continue;
                    }
                    let mut v = vec![0u8; e as usize];
                    inner.read_persisted(&txn, ino, b * e, &mut v)?;
                    batch.blocks.insert(b, (plan, bn.clone()));
                    let src = Arc::new(v);
                    let inline = inline_ok && b == 0;
                    let dx = dx.clone();
                    jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                        (encode_block(enc, &policy, b, &src[..len], inline, &dx), src)
                    }));
                }
                Ok(())
            })?;
            for (input, ids, if_dict) in repacks {
                // Counted when queued (the repack is written later, with other files' data;
                // an `if_dict` one is then dropped if the dictionary does not shorten it).
                r.bytes_rewritten += input.member.len as u64;
                inner.repack_add(policy, input, if_dict)?;
                rewritten.extend(ids);
            }
            if !jobs.is_empty() {
                let (rx, n) = inner.submit_grouped_on(pool, jobs);
                batch.rx = Some(rx);
                batch.n = n;
                flying.push_back(batch);
            }
            while flying.len() > PIPELINE_BATCHES {
                if let Some(b) = flying.pop_front() {
                    inner.commit_batch(ino, b, &mut r, &mut rewritten)?;
                }
            }
            if !control(&r) {
                stopped = true;
                break;
            }
        }
        while let Some(b) = flying.pop_front() {
            inner.commit_batch(ino, b, &mut r, &mut rewritten)?;
            if !stopped {
                control(&r);
            }
        }
        r.extents_rewritten = rewritten.len() as u64;
        r.extents_skipped = r.extents_examined.saturating_sub(r.extents_rewritten);
        r.disk_after = disk_of(&inner.inode(ino)?);
        Ok(r)
    }

    /// Waits for a batch's compression and commits the blocks that are still as they were read
    /// (and, for blocks that were raw, only those that came out compressed).
    fn commit_batch(
        &self,
        ino: Ino,
        b: Batch,
        r: &mut DefragReport,
        rewritten: &mut BTreeSet<u64>,
    ) -> Result<()> {
        let inner = self;
        let e = b.block;
        let Some(rx) = b.rx else { return Ok(()) };
        let mut results: Vec<EncodedBlock> = Vec::new();
        for _ in 0..b.n {
            match rx.recv() {
                Ok((_, v)) => results.extend(v),
                Err(_) => return Err(Error::Io(std::io::Error::other("compression worker lost"))),
            }
        }
        results.retain(|en| {
            b.blocks
                .get(&en.0.block)
                .is_some_and(|(plan, _)| match plan {
                    BlockPlan::IfShrinks => !came_out_raw(en),
                    BlockPlan::IfDict => came_out_dict(en),
                    _ => true,
                })
        });
        if results.is_empty() {
            return Ok(());
        }
        let (Some(first), Some(last)) = (
            results.iter().map(|en| en.0.block).min(),
            results.iter().map(|en| en.0.block).max(),
        ) else {
            return Ok(());
        };
        inner.with_file(ino, |st| {
            if st.dirty.is_some() {
                inner.flush_locked(ino, st, false)?;
            }
            let rec = inner.inode(ino)?;
            if rec.size != b.size {
                // Truncated or extended meanwhile: the encoded lengths may be stale.
                return Ok(());
            }
            let now = {
                let txn = inner.read_txn()?;
                inner.blocks_now(&txn, ino, &rec, first..=last, e)?
            };
            results.retain(|en| {
                let blk = en.0.block;
                b.blocks.get(&blk).map(|x| &x.1) == now.get(&blk)
            });
            if results.is_empty() {
                return Ok(());
            }
            let done: Vec<u64> = results.iter().map(|en| en.0.block).collect();
            let meta = FlushMeta {
                block: e,
                size: rec.size,
                mtime: rec.mtime,
                ctime: Timestamp::now(),
                punch: Vec::new(),
            };
            inner
                .commit_encoded(ino, &meta, false, std::mem::take(&mut results))
                .map_err(|er| inner.fail(er))?;
            for blk in done {
                r.bytes_rewritten += span::block_len_in_file(rec.size, blk, e) as u64;
                if let Some((_, bn)) = b.blocks.get(&blk) {
                    rewritten.extend(bn.extents.iter().map(|x| x.0));
                }
            }
            r.extents_rewritten = rewritten.len() as u64;
            Ok(())
        })
    }
}

impl Store {
    /// Rewrites a file's data with `policy` (default: the file's own policy), like
    /// `btrfs filesystem defragment -c`; extents already stored that way are kept
    /// ([`Store::defrag`]).
    pub fn recompress(&self, ino: Ino, policy: Option<(CodecSpec, Mode)>) -> Result<()> {
        let target = match policy {
            Some((s, m)) => DefragTarget {
                spec: Some(s),
                force: m == Mode::Force,
                ..DefragTarget::default()
            },
            None => DefragTarget::default(),
        };
        self.defrag(ino, &target, &mut |_| {}).map(|_| ())
    }
}

/// Stored bytes of a file: its extents plus its inline data.
fn disk_of(rec: &InodeRec) -> u64 {
    rec.disk_bytes
        .saturating_add(rec.inline.as_ref().map_or(0, |i| i.bytes.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_report_is_one_flat_object() {
        let r = DefragReport {
            files: 1,
            extents_examined: 2,
            extents_rewritten: 3,
            extents_skipped: 4,
            bytes_examined: 5,
            bytes_rewritten: 6,
            disk_before: 7,
            disk_after: 8,
        };
        assert_eq!(
            r.to_json(9),
            "{\"files\":1,\"extents_examined\":2,\"extents_rewritten\":3,\"extents_skipped\":4,\
             \"bytes_examined\":5,\"bytes_rewritten\":6,\"disk_bytes_before\":7,\
             \"disk_bytes_after\":8,\"failed_files\":9}\n"
        );
    }
    use compfs_codec::Algorithm;

    #[test]
    fn plans_follow_codec_and_level() {
        let z9 = (3u8, 9i8);
        assert_eq!(plan_block(&[(3, 9)], true, z9), BlockPlan::Skip);
        // Not one extent of the target size: rewritten whatever its codec.
        assert_eq!(plan_block(&[(3, 9)], false, z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(0, 0)], false, z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(0, 0)], false, (0, 0)), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(3, 9), (3, 9)], true, z9), BlockPlan::Skip);
        assert_eq!(plan_block(&[(3, 1)], true, z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(3, 9), (3, 1)], true, z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(1, 9)], true, z9), BlockPlan::Rewrite);
        assert_eq!(plan_block(&[(0, 0)], true, z9), BlockPlan::IfShrinks);
        assert_eq!(plan_block(&[(0, 0), (3, 9)], true, z9), BlockPlan::Rewrite);
        // --nocomp: raw is the target, compressed blocks are rewritten raw.
        assert_eq!(plan_block(&[(0, 0)], true, (0, 0)), BlockPlan::Skip);
        assert_eq!(plan_block(&[(4, 0)], true, (0, 0)), BlockPlan::Rewrite);
        // Codecs without levels record level 0.
        assert_eq!(plan_block(&[(4, 0)], true, (4, 0)), BlockPlan::Skip);
    }

    #[test]
    fn small_blocks_move_to_the_current_dictionary() {
        use BlockPlan::*;
        assert_eq!(dict_plan(Skip, &[0], Some(1), true), IfDict);
        assert_eq!(dict_plan(Skip, &[1], Some(1), true), Skip);
        assert_eq!(dict_plan(Skip, &[1, 0], Some(1), true), IfDict);
        assert_eq!(dict_plan(Skip, &[0], Some(1), false), Skip);
        assert_eq!(dict_plan(Skip, &[0], None, true), Skip);
        assert_eq!(dict_plan(Rewrite, &[0], Some(1), true), Rewrite);
        // An extent with the current dictionary counts at the target level.
        assert_eq!(planned_as((3, 3, 1), (3, 9), Some(1)), (3, 9));
        assert_eq!(planned_as((3, 3, 2), (3, 9), Some(1)), (3, 3));
        assert_eq!(planned_as((3, 3, 0), (3, 9), Some(1)), (3, 3));
        assert_eq!(planned_as((3, 3, 1), (1, 9), Some(1)), (3, 3));
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
            extent_size: None,
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
            extent_size: None,
        };
        assert_eq!(t.resolve(own).spec.level(), 0);
    }
}
