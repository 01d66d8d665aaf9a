//! The flush pipeline: buffered blocks are compressed, appended to a segment and committed
//! with the inode in one metadata transaction (see the commit protocol in docs/format.md);
//! asynchronous batches keep the compression workers busy while a writer goes on.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use compfs_codec::{ExtentPolicy, RawReason};

use crate::encode::{
    encode_block, give_out_buf, whole_blocks, EncodeJob, Encoded, EncodedBlock, Out,
};
use crate::error::{Error, Result};
use crate::file::{Dirty, FileState};
use crate::meta::{self, W};
use crate::records::{ExtentHeader, ExtentRec, MapRec, EXT_HEADER_LEN};
use crate::span;
use crate::store::{lock, Inner};
use crate::types::*;

/// What a flush commits besides its extents.
pub(crate) struct FlushMeta {
    /// Block size the encoded blocks were cut with (their file offset is block * block size).
    pub block: u64,
    pub size: u64,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub punch: Vec<(u64, u64)>,
}

/// Encoded blocks appended to a segment, waiting for their metadata transaction.
pub(crate) struct Staged {
    pub(crate) encoded: Vec<Encoded>,
    /// (index in `encoded`, extent id, offset from the start of the append, header).
    pub(crate) placed: Vec<(usize, u64, u64, ExtentHeader)>,
    /// Segment and offset of the append (none when nothing was appended).
    pub(crate) seg: Option<(u64, u64)>,
}

/// A batch of blocks being compressed by the pool, to be committed by the next flush.
pub(crate) struct Pending {
    pub(crate) rx: std::sync::mpsc::Receiver<(usize, Vec<EncodedBlock>)>,
    pub(crate) n: usize,
    pub(crate) meta: FlushMeta,
    /// The blocks of this batch (to retire them from `flying` once committed).
    pub(crate) blocks: Vec<(u64, Arc<Vec<u8>>)>,
}

/// Compressed batches of a file a writer leaves queued (see `start_async_flush`).
const PIPELINE_BATCHES: usize = 2;

impl Inner {
    /// Flushes a file's buffered changes. On failure the store turns read-only and the buffer is
    /// kept, so reads keep returning what was written.
    pub(crate) fn flush_locked(&self, ino: Ino, st: &mut FileState, durable: bool) -> Result<()> {
        let Some(mut d) = st.dirty.take() else {
            if durable {
                self.check_writable()?;
                return self.commit_durable();
            }
            return Ok(());
        };
        if let Err(e) = self.check_writable() {
            st.dirty = Some(d);
            return Err(e);
        }
        if let Err(e) = self.finish_pending(ino, &mut d) {
            st.dirty = Some(d);
            return Err(e);
        }
        let blocks = d.blocks.len() + d.partial.len();
        match self.flush_dirty(ino, &mut d, durable, None) {
            Ok(()) | Err(Error::NotFound) => {
                self.dirty_bytes
                    .fetch_sub(blocks * d.block as usize, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                st.dirty = Some(d);
                Err(self.fail(e))
            }
        }
    }

    /// Hands the buffered blocks to the compression pool without waiting (the writer goes on
    /// filling new blocks meanwhile); the previous batch of this file is committed first.
    pub(crate) fn start_async_flush(&self, ino: Ino, d: &mut Dirty) -> Result<()> {
        if !d.punch.is_empty() || !d.partial.is_empty() {
            self.finish_pending(ino, d)?;
            // A batch must hold every buffered change (so that what a crash leaves is the file
            // as it was at some moment): partial blocks go through a synchronous flush.
            return self.flush_sync_inner(ino, d);
        }
        let e = d.block;
        let policy = self.file_policy(ino)?;
        let inline_ok = d.size <= self.inline_limit(e);
        let ids = d.live_blocks(e);
        let dx = self.dict_ctx(&policy);
        let mut jobs: Vec<EncodeJob> = Vec::with_capacity(ids.len());
        let mut mine = Vec::with_capacity(ids.len());
        for b in ids {
            let Some(v) = d.blocks.remove(&b) else {
                continue;
            };
            let a = Arc::new(v);
            d.flying.insert(b, a.clone());
            mine.push((b, a.clone()));
            let len = span::block_len_in_file(d.size, b, e);
            let inline = inline_ok && b == 0;
            let dx = dx.clone();
            jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                (encode_block(enc, &policy, b, &a[..len], inline, &dx), a)
            }));
        }
        let (rx, n) = self.submit_grouped(jobs);
        d.pending.push_back(Pending {
            rx,
            n,
            meta: FlushMeta {
                block: e,
                size: d.size,
                mtime: d.mtime,
                ctime: d.ctime,
                punch: Vec::new(),
            },
            blocks: mine,
        });
        // The new batch is queued before the older ones commit, so the workers stay busy
        // while this thread appends and commits. Two batches stay queued: with one, a worker
        // ran dry whenever this thread was busy copying or committing (1.85 cores busy on 2;
        // with two, 1.94, and 3% more throughput; three gave no more).
        while d.pending.len() > PIPELINE_BATCHES {
            self.finish_oldest(ino, d)?;
        }
        Ok(())
    }

    /// Flushes everything buffered in `d` synchronously, keeping `d` as an empty buffer.
    fn flush_sync_inner(&self, ino: Ino, d: &mut Dirty) -> Result<()> {
        let blocks = d.blocks.len() + d.partial.len();
        match self.flush_dirty(ino, d, false, None) {
            Ok(()) | Err(Error::NotFound) => {
                self.dirty_bytes
                    .fetch_sub(blocks * d.block as usize, Ordering::Relaxed);
                d.base_size = d.size;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Waits for and commits every batch started by [`Inner::start_async_flush`], in order.
    fn finish_pending(&self, ino: Ino, d: &mut Dirty) -> Result<()> {
        while !d.pending.is_empty() {
            self.finish_oldest(ino, d)?;
        }
        Ok(())
    }

    fn finish_oldest(&self, ino: Ino, d: &mut Dirty) -> Result<()> {
        let Some(p) = d.pending.pop_front() else {
            return Ok(());
        };
        let mut results = Vec::new();
        let mut groups = 0;
        while groups < p.n {
            match p.rx.recv() {
                Ok((_, r)) => {
                    results.extend(r);
                    groups += 1;
                }
                Err(_) => break,
            }
        }
        let res = if groups < p.n {
            Err(Error::Io(std::io::Error::other("compression worker lost")))
        } else {
            self.commit_encoded(ino, &p.meta, false, results)
        };
        match res {
            Ok(()) | Err(Error::NotFound) => {
                for (b, a) in p.blocks.iter() {
                    if d.flying.get(b).is_some_and(|f| Arc::ptr_eq(f, a)) {
                        d.flying.remove(b);
                    }
                }
                let flown = p.blocks.len();
                for (_, a) in p.blocks {
                    if let Ok(v) = Arc::try_unwrap(a) {
                        self.give_buf(v);
                    }
                }
                d.base_size = d.base_size.max(p.meta.size);
                self.dirty_bytes
                    .fetch_sub(flown * d.block as usize, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // Later batches are dropped too (their blocks are in `flying`).
                d.pending.clear();
                // Keep the data readable: flying blocks go back to the buffer unless rewritten.
                for (b, a) in std::mem::take(&mut d.flying) {
                    d.blocks
                        .entry(b)
                        .or_insert_with(|| Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()));
                }
                Err(self.fail(e))
            }
        }
    }

    /// Writes buffered blocks as extents, then commits them with the inode in one transaction.
    pub(crate) fn flush_dirty(
        &self,
        ino: Ino,
        d: &mut Dirty,
        durable: bool,
        policy_override: Option<ExtentPolicy>,
    ) -> Result<()> {
        let policy = match policy_override {
            Some(p) => p,
            None => self.file_policy(ino)?,
        };
        let results = self.encode_dirty(ino, d, policy)?;
        let meta = FlushMeta {
            block: d.block,
            size: d.size,
            mtime: d.mtime,
            ctime: d.ctime,
            punch: std::mem::take(&mut d.punch),
        };
        let keep = whole_blocks(&results);
        let res = self.commit_encoded(ino, &meta, durable, results);
        if res.is_err() {
            // The buffer keeps every block until a commit succeeded.
            d.punch = meta.punch;
            for (b, a) in keep {
                d.blocks
                    .insert(b, Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()));
            }
        } else {
            d.partial.clear();
            for (_, a) in keep {
                if let Ok(v) = Arc::try_unwrap(a) {
                    self.give_buf(v);
                }
            }
        }
        res
    }

    /// Appends encoded blocks to a segment and commits them (see the commit protocol in
    /// docs/format.md).
    pub(crate) fn commit_encoded(
        &self,
        ino: Ino,
        meta: &FlushMeta,
        durable: bool,
        results: Vec<EncodedBlock>,
    ) -> Result<()> {
        let staged = self.stage_encoded(ino, meta.block, results)?;
        // Committed with the held batch, at once: the file's buffer is dropped once this
        // returns, so its commit must have happened.
        let res = self.write_joined(durable, |w| {
            self.apply_flush(w, ino, meta, &staged)?;
            self.put_next_extent(w)?;
            Ok(std::mem::take(&mut w.freed))
        });
        self.finish_staged(&staged, res)
    }

    /// Unpins the segment of a staged flush and, when its commit succeeded, drops the extents it
    /// freed from the cache.
    fn finish_staged(&self, staged: &Staged, res: Result<Vec<u64>>) -> Result<()> {
        if let Some((id, _)) = staged.seg {
            self.unpin(id);
        }
        let freed = res?;
        let mut cache = lock(&self.cache);
        for id in freed {
            cache.remove(id);
        }
        Ok(())
    }

    pub(crate) fn put_next_extent(&self, w: &mut W<'_>) -> Result<()> {
        let next = self.next_extent.load(Ordering::SeqCst);
        w.meta_mut()?
            .insert(meta::NEXT_EXTENT, next.to_le_bytes().as_slice())?;
        Ok(())
    }

    /// Lays out encoded blocks as extents, appends them to the active segment (pinned until
    /// [`Inner::finish_staged`]) and notes the segment as unsynced.
    /// `e`: the block size the blocks were cut with.
    pub(crate) fn stage_encoded(
        &self,
        ino: Ino,
        e: u64,
        mut results: Vec<EncodedBlock>,
    ) -> Result<Staged> {
        // In file order, whatever order the compression workers finished in: a file written
        // sequentially is then laid out sequentially (its last extent is the last one appended,
        // so what a reader finds after it is the next file written: see `prefetch`), and
        // readahead along a segment follows the file.
        results.sort_by_key(|(en, _)| (en.block, en.off));
        let mut encoded = Vec::with_capacity(results.len());
        let mut blocks: BTreeMap<u64, Arc<Vec<u8>>> = BTreeMap::new();
        for (en, a) in results {
            blocks.insert(en.block, a);
            encoded.push(en);
        }
        // The extents of this flush go back to back into the segment: each header followed by
        // its stored bytes, written with one vectored write straight from the workers' buffers.
        let mut heads: Vec<[u8; EXT_HEADER_LEN]> = Vec::with_capacity(encoded.len());
        let mut at = 0u64;
        let mut placed = Vec::new(); // (encoded index, extent id, offset in the write, header)
        for (i, en) in encoded.iter().enumerate() {
            let c = &self.counters;
            match &en.out {
                Out::Hole => {
                    c.zero_blocks.fetch_add(1, Ordering::Relaxed);
                }
                Out::Inline(_) => {}
                Out::Extent {
                    codec,
                    level,
                    stored,
                    reason,
                    crc,
                    dict,
                } => {
                    let stored: &[u8] = match stored {
                        Some(v) => v,
                        None => match blocks.get(&en.block) {
                            Some(b) => &b[en.off..en.off + en.len],
                            None => return Err(meta::corrupt("flushed block vanished")),
                        },
                    };
                    match reason {
                        None => {
                            c.compressed[*codec as usize % 5].fetch_add(1, Ordering::Relaxed);
                        }
                        Some(r) => {
                            c.raw.fetch_add(1, Ordering::Relaxed);
                            if matches!(r, RawReason::Heuristic(_)) {
                                c.heuristic_skips.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    let id = self.next_extent.fetch_add(1, Ordering::SeqCst);
                    let h = ExtentHeader {
                        codec: *codec,
                        level: *level,
                        raw_len: en.len as u32,
                        stored_len: stored.len() as u32,
                        id,
                        ino,
                        file_offset: en.block * e + en.off as u64,
                        crc: *crc,
                        dict: *dict,
                    };
                    placed.push((i, id, at, h));
                    heads.push(h.encode());
                    at += (EXT_HEADER_LEN + stored.len()) as u64;
                }
            }
        }
        let mut seg = None;
        if at > 0 {
            let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * heads.len());
            for ((i, ..), h) in placed.iter().zip(&heads) {
                let en: &Encoded = &encoded[*i];
                let stored: &[u8] = match &en.out {
                    Out::Extent {
                        stored: Some(v), ..
                    } => v,
                    Out::Extent { stored: None, .. } => match blocks.get(&en.block) {
                        Some(b) => &b[en.off..en.off + en.len],
                        None => return Err(meta::corrupt("flushed block vanished")),
                    },
                    Out::Hole | Out::Inline(_) => &[],
                };
                parts.push(h);
                parts.push(stored);
            }
            // Extents over preallocated ranges: the reserve file gives their room back first,
            // and its lock is held until they are appended (see `prealloc`).
            let written: Vec<(u64, u64)> = placed
                .iter()
                .map(|(i, ..)| {
                    let en = &encoded[*i];
                    let s = en.block * e + en.off as u64;
                    (s, s + en.len as u64)
                })
                .collect();
            let room = self.release_for_append(ino, &written)?;
            let (id, f, off) = self.append_parts(&parts)?;
            drop(room);
            // Durability order: these bytes are synced before any durable commit (which
            // would make metadata referencing them durable): see `Inner::commit`.
            self.mark_unsynced(id, f, at);
            seg = Some((id, off));
        }
        // Written blocks are not cached (the kernel's page cache holds them on a mount); their
        // buffers, and the workers' output buffers, are reused for the next writes.
        drop(blocks);
        for en in encoded.iter_mut() {
            if let Out::Extent { stored, .. } = &mut en.out {
                if let Some(v) = stored.take() {
                    give_out_buf(v);
                }
            }
        }
        Ok(Staged {
            encoded,
            placed,
            seg,
        })
    }

    /// The metadata changes of one staged flush, inside the caller's transaction (extents freed
    /// are added to `w.freed`).
    pub(crate) fn apply_flush(
        &self,
        w: &mut W<'_>,
        ino: Ino,
        d: &FlushMeta,
        st: &Staged,
    ) -> Result<()> {
        let (encoded, placed, seg) = (&st.encoded, &st.placed, st.seg);
        let e = d.block;
        let reserved = self.any_reserved();
        {
            let mut rec = w.inode(ino)?;
            let old_inline = rec.inline.clone();
            let mut disk: i64 = 0;
            for &(s, t) in &d.punch {
                disk += w.map_remove_range(ino, s, t)?;
                if s == 0 && rec.inline.as_ref().is_some_and(|i| i.raw_len as u64 <= t) {
                    rec.inline = None;
                }
            }
            let mut by_block: BTreeMap<(u64, usize), (u64, u64, ExtentHeader)> = BTreeMap::new();
            if let Some((_, base)) = seg {
                for (i, id, off, h) in placed {
                    let en = &encoded[*i];
                    by_block.insert((en.block, en.off), (*id, base + off, *h));
                }
            }
            for en in encoded {
                let start = en.block * e + en.off as u64;
                let end = if en.full {
                    start + e
                } else {
                    start + en.len as u64
                };
                disk += w.map_remove_range(ino, start, end)?;
                // Data written over a preallocated range ends its reservation (a hole does not).
                if reserved && !matches!(en.out, Out::Hole) {
                    w.prealloc_remove(ino, start, start + en.len as u64)?;
                }
                if en.block == 0 && en.full {
                    rec.inline = None;
                }
                match &en.out {
                    Out::Hole => {}
                    Out::Inline(i) => rec.inline = Some(i.clone()),
                    Out::Extent { .. } => {
                        let (Some((seg_id, _)), Some(&(id, seg_off, h))) =
                            (seg, by_block.get(&(en.block, en.off)))
                        else {
                            return Err(meta::corrupt("flushed extent without a segment"));
                        };
                        let xr = ExtentRec {
                            ino,
                            ..ExtentRec::from_header(seg_id, seg_off, &h)
                        };
                        disk += w.add_mapped_extent(
                            id,
                            &xr,
                            ino,
                            start,
                            MapRec {
                                extent: id,
                                ext_offset: 0,
                                len: en.len as u32,
                            },
                        )?;
                    }
                }
            }
            disk += w.map_remove_range(ino, d.size, u64::MAX)?;
            if rec
                .inline
                .as_ref()
                .is_some_and(|i| i.raw_len as u64 > d.size)
            {
                rec.inline = None;
            }
            w.inline_changed(old_inline.as_ref(), rec.inline.as_ref())?;
            rec.size = d.size;
            rec.mtime = d.mtime;
            rec.ctime = rec.ctime.max(d.ctime);
            rec.disk_bytes = rec.disk_bytes.saturating_add_signed(disk);
            w.put_inode(ino, &rec)?;
        }
        Ok(())
    }

    /// Flushes every file with buffered changes (non-durably).
    pub(crate) fn flush_all(&self, background: bool) -> Result<()> {
        let files: Vec<(Ino, Arc<Mutex<FileState>>)> = lock(&self.files)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mut first_err = None;
        // Closed files of one block first, together: they go into packs (see `pack`).
        if let Err(e) = self.flush_packable(&files) {
            first_err.get_or_insert(e);
        }
        for (ino, a) in files {
            {
                let mut g = lock(&a);
                if g.dead || g.dirty.is_none() {
                    drop(g);
                    if background {
                        self.maybe_forget(ino);
                    }
                    continue;
                }
                if let Err(e) = self.flush_locked(ino, &mut g, false) {
                    first_err.get_or_insert(e);
                }
            }
            self.maybe_forget(ino);
        }
        // Files a defrag queued for a repack.
        if first_err.is_none() {
            if let Err(e) = self.repack_flush(None) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
