//! File operations on data: write, punch, allocate, truncate, seek, fsync.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::file::{kind_error, FileState, Partial};
use crate::meta::{self, dec};
use crate::prealloc;
use crate::read::inode_in;
use crate::records::MapRec;
use crate::span::{self, PunchSpan};
use crate::store::{lock, Inner, Store};
use crate::types::*;

/// Largest file size (like `MAX_LFS_FILESIZE` on 64-bit Linux).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

impl Store {
    /// Writes `data` at `offset` (buffered; durable after [`Store::fsync`] or [`Store::sync`]).
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        let inner = &self.inner;
        inner.check_writable()?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::InvalidArgument("write beyond the maximum file size".into()))?;
        inner.with_file(ino, |st| {
            let d = inner.ensure_dirty(ino, st)?;
            if data.is_empty() {
                return Ok(0);
            }
            let e = d.block;
            for sp in span::block_spans(offset, data.len() as u64, e) {
                let (b, s, n, from) = (sp.block, sp.start, sp.len, sp.from);
                let whole = sp.is_whole(e);
                let fresh = whole || b * e >= d.base_size;
                if !fresh && !d.blocks.contains_key(&b) && !d.flying.contains_key(&b) {
                    // A small write into persisted data: remember the range only (no read of
                    // the old extent); flushed as a small extent laid over the old one.
                    let p = d.partial.entry(b).or_insert_with(|| {
                        inner.dirty_bytes.fetch_add(e as usize, Ordering::Relaxed);
                        Partial {
                            data: Arc::new(vec![0u8; e as usize]),
                            ranges: Vec::new(),
                        }
                    });
                    Arc::make_mut(&mut p.data)[s..s + n].copy_from_slice(&data[from..from + n]);
                    p.add(s, s + n);
                    if p.covered() * 2 >= e as usize {
                        inner.load_block(ino, d, b, false, false)?;
                    }
                } else {
                    inner.load_block(ino, d, b, fresh, whole)?;
                    if let Some(v) = d.blocks.get_mut(&b) {
                        v[s..s + n].copy_from_slice(&data[from..from + n]);
                    }
                }
            }
            d.size = d.size.max(end);
            let now = Timestamp::now();
            d.mtime = now;
            lock(&inner.patches).clear_mtime(ino);
            d.ctime = now;
            let many = d.blocks.len() + d.partial.len()
                >= inner.tuning.flush_blocks.max(2 * inner.pool.threads);
            if inner.dirty_bytes.load(Ordering::Relaxed) > inner.tuning.dirty_limit {
                inner.flush_locked(ino, st, false)?;
            } else if many {
                inner.start_async_flush(ino, d)?;
            }
            inner
                .counters
                .user_written
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            Ok(data.len())
        })
    }

    /// Deallocates `[offset, offset + len)` (reads return zeros); the size is unchanged.
    pub fn punch_hole(&self, ino: Ino, offset: u64, len: u64) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        inner.with_file(ino, |st| {
            let d = inner.ensure_dirty(ino, st)?;
            let e = d.block;
            let spans = span::punch_spans(offset, len, d.size, e);
            if !spans.is_empty() {
                for sp in spans {
                    match sp {
                        PunchSpan::Drop(b) => {
                            if d.blocks.remove(&b).is_some() || d.partial.remove(&b).is_some() {
                                inner.dirty_bytes.fetch_sub(e as usize, Ordering::Relaxed);
                            }
                            d.punch.push((b * e, b * e + e));
                        }
                        PunchSpan::Zero { block, start, end } => {
                            inner.load_block(ino, d, block, false, false)?;
                            if let Some(v) = d.blocks.get_mut(&block) {
                                v[start..end].fill(0);
                            }
                        }
                    }
                }
                let now = Timestamp::now();
                d.mtime = now;
                lock(&inner.patches).clear_mtime(ino);
                d.ctime = now;
            }
            let size = d.size;
            inner.flush_locked(ino, st, false)?;
            // Reservations of whole pages inside the hole go, as ext4 frees the blocks; like
            // ext4, not past the page holding the end of file.
            if offset < size {
                let end = offset
                    .saturating_add(len)
                    .min(size.div_ceil(prealloc::PAGE) * prealloc::PAGE);
                let (a, b) = prealloc::narrow(offset, end);
                inner.unreserve(ino, a, b)?;
            }
            Ok(())
        })
    }

    /// `fallocate` default mode: reserves the holes of the range, widened to whole 4 KiB pages
    /// as ext4 does, with room on the host for them uncompressed (ENOSPC when it is not there;
    /// see `prealloc`), then extends the size unless `keep_size`. The first write into a
    /// reserved range cannot find the disk full; what compression saves then is free again.
    pub fn allocate(&self, ino: Ino, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::InvalidArgument("range beyond the maximum file size".into()))?;
        let (start, stop) = prealloc::widen(offset, end, MAX_FILE_SIZE);
        inner.with_file(ino, |st| {
            if st.dirty.is_some() {
                inner.flush_locked(ino, st, false)?;
            }
            let (data, size) = inner.committed_regions(ino)?;
            inner.reserve_range(ino, &data, start, stop)?;
            if keep_size || end <= size {
                // The size and the times stay as they are (as on ext4).
                return Ok(());
            }
            let d = inner.ensure_dirty(ino, st)?;
            if !keep_size && end > d.size {
                d.size = end;
                d.ctime = Timestamp::now();
                d.mtime = d.ctime;
                lock(&inner.patches).clear_mtime(ino);
            }
            inner.flush_locked(ino, st, false)
        })
    }

    /// Bytes of `ino` reserved by preallocation and not yet written.
    pub fn reserved_bytes(&self, ino: Ino) -> Result<u64> {
        self.inner.reserved_of(ino)
    }

    /// Data regions of a file after flushing it: (start, end) pairs in order, and the size.
    fn data_regions(&self, ino: Ino) -> Result<(Vec<(u64, u64)>, u64)> {
        let inner = &self.inner;
        inner.with_file(ino, |st| {
            if st.dirty.is_some() {
                inner.flush_locked(ino, st, false)?;
            }
            Ok(())
        })?;
        inner.maybe_forget(ino);
        inner.committed_regions(ino)
    }

    /// `SEEK_DATA`: the first data at or after `offset` ([`Error::NoData`] if none).
    pub fn seek_data(&self, ino: Ino, offset: u64) -> Result<u64> {
        let (regions, size) = self.data_regions(ino)?;
        span::seek_data(&regions, size, offset).ok_or(Error::NoData)
    }

    /// `SEEK_HOLE`: the first hole at or after `offset` (end of file counts as a hole).
    pub fn seek_hole(&self, ino: Ino, offset: u64) -> Result<u64> {
        let (regions, size) = self.data_regions(ino)?;
        span::seek_hole(&regions, size, offset).ok_or(Error::NoData)
    }

    /// Makes the file's data and metadata (and everything acknowledged before) durable.
    pub fn fsync(&self, ino: Ino, _datasync: bool) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        let _local = crate::object::LocalDurable::enter();
        inner.with_file(ino, |st| inner.flush_locked(ino, st, true))?;
        inner.maybe_forget(ino);
        Ok(())
    }
}

impl Inner {
    /// Data regions of a file in the committed metadata: (start, end) pairs in order, and
    /// the size.
    pub(crate) fn committed_regions(&self, ino: Ino) -> Result<(Vec<(u64, u64)>, u64)> {
        let txn = self.read_txn()?;
        let rec = inode_in(&txn, ino)?;
        if rec.kind != FileKind::File {
            return Err(kind_error(rec.kind));
        }
        let mut v: Vec<(u64, u64)> = Vec::new();
        if let Some(i) = &rec.inline {
            v.push((0, i.raw_len as u64));
        }
        let map = txn.open_table(meta::EXTMAP)?;
        for r in map.range((ino, 0)..=(ino, u64::MAX))? {
            let (k, m) = r?;
            let m = dec(MapRec::decode(m.value()))?;
            let s = k.value().1;
            span::region_push(&mut v, s, s.saturating_add(m.len as u64));
        }
        Ok((v, rec.size))
    }

    /// Applies a truncation to the buffer and flushes.
    pub(crate) fn truncate_locked(&self, ino: Ino, st: &mut FileState, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::InvalidArgument("file size too large".into()));
        }
        let d = self.ensure_dirty(ino, st)?;
        let e = d.block;
        let old_size = d.size;
        if size < d.size {
            let t = span::truncate_span(size, e);
            let keep = t.first_gone;
            let gone_p: Vec<u64> = d.partial.range(keep..).map(|(k, _)| *k).collect();
            for b in gone_p {
                d.partial.remove(&b);
                self.dirty_bytes.fetch_sub(e as usize, Ordering::Relaxed);
            }
            let gone: Vec<u64> = d.blocks.range(keep..).map(|(k, _)| *k).collect();
            for b in gone {
                d.blocks.remove(&b);
                self.dirty_bytes.fetch_sub(e as usize, Ordering::Relaxed);
            }
            if let Some((b, from)) = t.tail {
                self.load_block(ino, d, b, false, false)?;
                if let Some(v) = d.blocks.get_mut(&b) {
                    v[from..].fill(0);
                }
            }
        }
        d.size = size;
        let now = Timestamp::now();
        d.mtime = now;
        lock(&self.patches).clear_mtime(ino);
        d.ctime = now;
        self.flush_locked(ino, st, false)?;
        // As ext4_setattr, also at the same size: reservations past the end of file go (from
        // the page holding it on), KEEP_SIZE ones included.
        if size <= old_size {
            self.unreserve(
                ino,
                size.div_ceil(prealloc::PAGE) * prealloc::PAGE,
                u64::MAX,
            )?;
        }
        Ok(())
    }
}
