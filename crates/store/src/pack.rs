//! Packed extents: small files compressed together. When the writeback of closed files (or a
//! flush of every file, `sync`) commits several files that each fit one block, their bytes are
//! concatenated into one extent of up to the pack size (`OpenOptions::pack`), compressed once,
//! and each file gets one map entry naming its range of that extent (`ext_offset`, `len`); the
//! extent's reference count is the number of files. Compressing many small files together
//! finds the redundancy between them that compressing each alone cannot (squashfs packs file
//! tails into fragment blocks the same way).
//!
//! A packed extent records owner inode [`PACK_OWNER`] (0, never an inode) instead of the inode
//! it was written for. Its stored bytes are charged to the files that reference it, each for
//! its share ([`pack_share`]), so a file's `st_blocks` stays its own and the shares add up to
//! the extent (rounded up per file). Only files with the same codec, level, mode and worth-it
//! rule share a pack. Once the store has a dictionary, a zstd pack is compressed with it
//! (whatever its length, unlike a file's own extents: see `dict`), and only with it: measured,
//! it shortened nearly every pack (the first copy in the pack of what the store's files have in
//! common, headers and boilerplate, and the entropy tables), and trying the codec without it
//! as well would double the CPU for a few bytes in all. `dict=nopack` keeps packs off the
//! dictionary.
//!
//! `defrag` keeps packs: a file whose one map entry covers it whole in a pack is at the target
//! extent size, and when its codec or level is not the target's, or its pack does not use the
//! current dictionary, it is repacked with other such files ([`Inner::repack_add`]), never
//! rewritten alone.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use compfs_codec::ExtentPolicy;

use crate::encode::{encode_block, EncodeJob, EncodedBlock, Out};
use crate::error::{Error, Result};
use crate::flush::{FlushMeta, Staged};
use crate::meta::W;
use crate::records::{ExtentRec, MapRec};
use crate::store::{lock, Inner};
use crate::types::*;

/// Owner inode recorded by packed extents (inode numbers start at 1).
pub(crate) const PACK_OWNER: Ino = 0;

/// Default pack size: the largest uncompressed extent a pack makes (see docs/benchmarks-fs.md).
pub const DEFAULT_PACK: u32 = 256 << 10;

/// The stored bytes charged to a file for `len` bytes of a packed extent of `raw_len` bytes
/// stored in `stored_len`: its share, rounded up (so a file with data is never charged 0).
pub(crate) fn pack_share(stored_len: u32, raw_len: u32, len: u32) -> u64 {
    if raw_len == 0 {
        return 0;
    }
    (stored_len as u64 * len as u64).div_ceil(raw_len as u64)
}

/// Cuts items of lengths `lens` (in this order) into consecutive packs of at most `limit`
/// bytes. Packs of one item are left out (such an item is written alone).
pub(crate) fn plan_packs(lens: &[usize], limit: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut sum = 0usize;
    for (i, &l) in lens.iter().enumerate() {
        if i > start && sum + l > limit {
            if i - start > 1 {
                out.push(start..i);
            }
            start = i;
            sum = 0;
        }
        sum += l;
    }
    if lens.len() - start > 1 {
        out.push(start..lens.len());
    }
    out
}

/// One file of a pack: its bytes go at `ext_offset` in the pack.
pub(crate) struct Member {
    pub ino: Ino,
    pub ext_offset: u32,
    pub len: u32,
    /// What the commit writes to the inode (size, times).
    pub meta: FlushMeta,
    /// When set, the member is committed only if its map is still exactly this one entry at
    /// offset 0 (and it has no inline data): a repack of unchanged data.
    pub expect: Option<MapRec>,
}

/// A pack compressed and appended, waiting for its transaction.
pub(crate) struct StagedPack {
    pub staged: Staged,
    pub members: Vec<Member>,
}

/// Data of one member, to be concatenated into a pack.
pub(crate) struct PackInput {
    pub member: Member,
    pub data: Arc<Vec<u8>>,
}

/// A file waiting to be repacked by `defrag` (see [`Inner::repack_add`]).
pub(crate) struct Repack {
    pub policy: ExtentPolicy,
    pub input: PackInput,
    /// Its pack is at target but not compressed with the current dictionary: it is packed
    /// only with other such files, and their pack is written only if it comes out compressed
    /// with the dictionary (see `defrag`, `BlockPlan::IfDict`).
    pub if_dict: bool,
}

/// Repacks waiting per policy.
#[derive(Default)]
pub(crate) struct RepackQueue {
    pub items: Vec<Repack>,
}

impl Inner {
    /// The pack size of this open, or 0 when packing is off (also while preallocated ranges
    /// exist: their room is given back per file by the ordinary flush).
    pub(crate) fn pack_limit(&self) -> usize {
        let pack = self.pack.load(Ordering::Relaxed);
        if pack == 0 || self.any_reserved() {
            0
        } else {
            pack as usize
        }
    }

    /// Compresses packs on the pool: each entry is (policy, its inputs). Returns the encoded
    /// packs in the same order with their concatenated bytes.
    pub(crate) fn encode_packs(
        &self,
        packs: Vec<(ExtentPolicy, Vec<PackInput>)>,
    ) -> Result<Vec<(EncodedBlock, Vec<Member>)>> {
        let mut jobs: Vec<EncodeJob> = Vec::with_capacity(packs.len());
        let mut members_of = Vec::with_capacity(packs.len());
        for (i, (policy, inputs)) in packs.into_iter().enumerate() {
            // Members are training samples of the store's dictionary as files written alone
            // are (for the files that are not packed: inline data, files written alone).
            let dx = self.dict_ctx(&policy);
            for p in &inputs {
                dx.offer(policy.spec, &p.data[..p.member.len as usize]);
            }
            let px = self.pack_dict_ctx(&policy);
            let total: usize = inputs.iter().map(|p| p.member.len as usize).sum();
            let mut buf = Vec::with_capacity(total);
            let mut members = Vec::with_capacity(inputs.len());
            for mut p in inputs {
                p.member.ext_offset = buf.len() as u32;
                buf.extend_from_slice(&p.data[..p.member.len as usize]);
                members.push(p.member);
            }
            members_of.push(members);
            let buf = Arc::new(buf);
            jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                // `block` carries the pack's index back (the header records file offset 0).
                let mut en = encode_block(enc, &policy, 1, &buf, false, &px);
                en.block = i as u64;
                (en, buf)
            }));
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let (rx, n) = self.submit_grouped(jobs);
        let mut out: Vec<Option<EncodedBlock>> = (0..members_of.len()).map(|_| None).collect();
        for _ in 0..n {
            match rx.recv() {
                Ok((_, r)) => {
                    for en in r {
                        let i = en.0.block as usize;
                        if let Some(slot) = out.get_mut(i) {
                            *slot = Some(en);
                        }
                    }
                }
                Err(_) => return Err(Error::Io(std::io::Error::other("compression worker lost"))),
            }
        }
        out.into_iter()
            .zip(members_of)
            .map(|(en, m)| match en {
                Some(mut en) => {
                    en.0.block = 0;
                    Ok((en, m))
                }
                None => Err(Error::Io(std::io::Error::other("compression worker lost"))),
            })
            .collect()
    }

    /// Appends encoded packs to the active segment (pinned until the caller unpins).
    pub(crate) fn stage_packs(
        &self,
        packs: Vec<(EncodedBlock, Vec<Member>)>,
    ) -> Result<Vec<StagedPack>> {
        let mut out = Vec::with_capacity(packs.len());
        for (en, members) in packs {
            match self.stage_encoded(PACK_OWNER, 0, vec![en]) {
                Ok(staged) => out.push(StagedPack { staged, members }),
                Err(e) => {
                    self.unpin_packs(&out);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    pub(crate) fn unpin_packs(&self, packs: &[StagedPack]) {
        for p in packs {
            if let Some((id, _)) = p.staged.seg {
                self.unpin(id);
            }
        }
    }

    /// The metadata changes of a staged pack inside the caller's transaction: the extent with
    /// one reference per member still there (members unlinked meanwhile, or whose map changed
    /// since a repack read it, are left out), and each member's map and inode.
    pub(crate) fn apply_pack(&self, w: &mut W<'_>, p: &StagedPack) -> Result<()> {
        let placed = match (p.staged.seg, p.staged.placed.first()) {
            (Some((seg_id, base)), Some((_, id, off, h))) => Some((seg_id, base + off, *id, *h)),
            // All zeros: a hole, nothing appended (writers never pack such files).
            _ => None,
        };
        let mut live = Vec::with_capacity(p.members.len());
        for m in &p.members {
            let rec = match w.inode(m.ino) {
                Ok(r) => r,
                Err(Error::NotFound) => continue,
                Err(e) => return Err(e),
            };
            if let Some(want) = m.expect {
                let now = w.map_overlapping(m.ino, 0, u64::MAX)?;
                let same = rec.inline.is_none()
                    && rec.size == m.meta.size
                    && now.len() == 1
                    && now[0].0 == 0
                    && now[0].1 == want;
                if !same {
                    continue;
                }
            }
            live.push(m);
        }
        if live.is_empty() {
            return Ok(());
        }
        let xr = match placed {
            Some((seg_id, seg_off, id, h)) => {
                let xr = ExtentRec {
                    ino: PACK_OWNER,
                    ..ExtentRec::from_header(seg_id, seg_off, &h)
                };
                let referenced: u64 = live.iter().map(|m| m.len as u64).sum();
                w.add_extent(id, &xr, live.len() as u32, referenced)?;
                Some((id, xr))
            }
            None => None,
        };
        for m in live {
            let mut rec = w.inode(m.ino)?;
            let old_inline = rec.inline.take();
            let mut disk = w.map_remove_range(m.ino, 0, u64::MAX)?;
            if let Some((id, xr)) = &xr {
                let entry = MapRec {
                    extent: *id,
                    ext_offset: m.ext_offset,
                    len: m.len,
                };
                w.extmap_mut()?
                    .insert((m.ino, 0), entry.encode().as_slice())?;
                disk += pack_share(xr.stored_len, xr.raw_len, m.len) as i64;
            }
            w.inline_changed(old_inline.as_ref(), None)?;
            rec.size = m.meta.size;
            rec.mtime = m.meta.mtime;
            rec.ctime = rec.ctime.max(m.meta.ctime);
            rec.disk_bytes = rec.disk_bytes.saturating_add_signed(disk);
            w.put_inode(m.ino, &rec)?;
        }
        Ok(())
    }

    /// Queues a file of one block stored whole in a pack for a repack with `policy` (a defrag
    /// found it off target; `if_dict`: at target but not on the current dictionary, see
    /// [`Repack::if_dict`]), and writes the queued repacks of that policy once they fill a
    /// pack (the caller checked that packing is on).
    pub(crate) fn repack_add(
        &self,
        policy: ExtentPolicy,
        input: PackInput,
        if_dict: bool,
    ) -> Result<()> {
        let limit = self.pack.load(Ordering::Relaxed).max(1) as usize;
        let due = {
            let mut q = lock(&self.repack);
            q.items.retain(|r| r.input.member.ino != input.member.ino);
            q.items.push(Repack {
                policy,
                input,
                if_dict,
            });
            let bytes: usize = q
                .items
                .iter()
                .filter(|r| r.policy == policy && r.if_dict == if_dict)
                .map(|r| r.input.member.len as usize)
                .sum();
            bytes >= limit
        };
        if due {
            self.repack_flush(Some((policy, if_dict)))?;
        }
        Ok(())
    }

    /// Whether `ino` waits in the repack queue.
    pub(crate) fn repack_queued(&self, ino: Ino) -> bool {
        lock(&self.repack)
            .items
            .iter()
            .any(|r| r.input.member.ino == ino)
    }

    /// Writes the queued repacks in packs of the pack size: all of them (`only` None; a file
    /// left alone in its group is written as a pack of one, so it stays a pack), or those of
    /// one (policy, `if_dict`) group that fill packs (the last, partly filled pack's files stay
    /// queued for more to join them). A pack of [`Repack::if_dict`] files that comes out
    /// without the dictionary is not written (its files keep their packs).
    pub(crate) fn repack_flush(&self, only: Option<(ExtentPolicy, bool)>) -> Result<()> {
        let items: Vec<Repack> = {
            let mut q = lock(&self.repack);
            let (take, keep): (Vec<Repack>, Vec<Repack>) = std::mem::take(&mut q.items)
                .into_iter()
                .partition(|r| only.is_none_or(|g| g == (r.policy, r.if_dict)));
            q.items = keep;
            take
        };
        if items.is_empty() {
            return Ok(());
        }
        self.check_writable()?;
        let limit = self.pack.load(Ordering::Relaxed).max(1) as usize;
        let mut groups: Vec<(ExtentPolicy, bool, Vec<PackInput>)> = Vec::new();
        for r in items {
            match groups
                .iter_mut()
                .find(|g| g.0 == r.policy && g.1 == r.if_dict)
            {
                Some(g) => g.2.push(r.input),
                None => groups.push((r.policy, r.if_dict, vec![r.input])),
            }
        }
        let mut packs: Vec<(ExtentPolicy, Vec<PackInput>)> = Vec::new();
        let mut if_dict: Vec<bool> = Vec::new();
        for (policy, only_dict, inputs) in groups {
            let lens: Vec<usize> = inputs.iter().map(|p| p.member.len as usize).collect();
            let mut ranges = plan_packs(&lens, limit);
            // Every file goes: singles too (a pack of one file stays a packed extent).
            let covered: Vec<bool> = (0..inputs.len())
                .map(|i| ranges.iter().any(|r| r.contains(&i)))
                .collect();
            for (i, c) in covered.iter().enumerate() {
                if !c {
                    ranges.push(i..i + 1);
                }
            }
            ranges.sort_by_key(|r| r.start);
            let mut it = inputs.into_iter();
            let n = ranges.len();
            for (k, r) in ranges.into_iter().enumerate() {
                let take: Vec<PackInput> = it.by_ref().take(r.len()).collect();
                if only.is_some() && k + 1 == n && n > 1 {
                    lock(&self.repack)
                        .items
                        .extend(take.into_iter().map(|input| Repack {
                            policy,
                            input,
                            if_dict: only_dict,
                        }));
                    continue;
                }
                packs.push((policy, take));
                if_dict.push(only_dict);
            }
        }
        let encoded: Vec<(EncodedBlock, Vec<Member>)> = self
            .encode_packs(packs)?
            .into_iter()
            .zip(if_dict)
            .filter(|((en, _), only_dict)| !only_dict || uses_dict(en))
            .map(|(p, _)| p)
            .collect();
        if encoded.is_empty() {
            return Ok(());
        }
        let staged = self.stage_packs(encoded).map_err(|e| self.fail(e))?;
        let res = self.write_joined(false, |w| {
            for p in &staged {
                self.apply_pack(w, p)?;
            }
            self.put_next_extent(w)?;
            Ok(std::mem::take(&mut w.freed))
        });
        self.unpin_packs(&staged);
        let freed = res.map_err(|e| self.fail(e))?;
        let mut cache = lock(&self.cache);
        for id in freed {
            cache.remove(id);
        }
        Ok(())
    }
}

/// Whether an encoded pack came out compressed with a dictionary.
fn uses_dict(en: &EncodedBlock) -> bool {
    matches!(en.0.out, Out::Extent { dict, .. } if dict != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_are_cut_at_the_limit_and_singles_left_out() {
        assert_eq!(plan_packs(&[], 10), Vec::<Range<usize>>::new());
        assert_eq!(plan_packs(&[5], 10), Vec::<Range<usize>>::new());
        assert_eq!(plan_packs(&[5, 5], 10), vec![0..2]);
        assert_eq!(plan_packs(&[5, 5, 1], 10), vec![0..2]);
        assert_eq!(plan_packs(&[5, 5, 1, 1], 10), vec![0..2, 2..4]);
        // An item larger than the limit stands alone.
        assert_eq!(plan_packs(&[20, 3, 3], 10), vec![1..3]);
        assert_eq!(plan_packs(&[3, 20, 3], 10), Vec::<Range<usize>>::new());
        assert_eq!(plan_packs(&[1; 25], 10), vec![0..10, 10..20, 20..25]);
        // Every item is in at most one pack, packs in order, each within the limit.
        let lens: Vec<usize> = (0..200).map(|i| (i * 7919) % 3000 + 1).collect();
        let p = plan_packs(&lens, 16384);
        let mut last = 0;
        for r in &p {
            assert!(r.start >= last && r.len() >= 2);
            assert!(lens[r.clone()].iter().sum::<usize>() <= 16384);
            last = r.end;
        }
    }

    #[test]
    fn shares_round_up_and_add_up_to_the_extent() {
        assert_eq!(pack_share(100, 1000, 0), 0);
        assert_eq!(pack_share(100, 1000, 1), 1);
        assert_eq!(pack_share(100, 1000, 1000), 100);
        assert_eq!(pack_share(100, 0, 5), 0);
        let lens = [300u32, 300, 400];
        let sum: u64 = lens.iter().map(|&l| pack_share(333, 1000, l)).sum();
        assert!((333..=333 + lens.len() as u64).contains(&sum));
        // No overflow at the largest lengths.
        assert_eq!(pack_share(u32::MAX, u32::MAX, u32::MAX), u32::MAX as u64);
    }
}
