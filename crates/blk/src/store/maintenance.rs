//! zram's maintenance operations: idle marking, recompression, writeback to the backing file,
//! compaction and reset.

use std::sync::atomic::Ordering;

use super::*;
use crate::error::BlkError;
use crate::pool::PAGE;

impl PageStore {
    /// Marks stored pages idle: all of them, or with `age` only those not read or written for
    /// at least `age` seconds (zram's `idle=all` and `idle=SECS` with
    /// CONFIG_ZRAM_TRACK_ENTRY_ACTIME). Reading or writing a page clears its mark. Returns the
    /// pages marked.
    pub fn mark_idle(&self, age: Option<u32>) -> u64 {
        let now = self.now();
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut t = lock(shard);
            for (_, e, at) in t.entries_mut() {
                if age.is_some_and(|a| now.saturating_sub(at) < a) {
                    continue;
                }
                if let Some(f) = e.flags_mut() {
                    *f |= FLAG_IDLE;
                    n += 1;
                }
            }
        }
        n
    }

    pub(super) fn selected(kind: PageKind, e: &Entry) -> bool {
        match (kind, e) {
            (PageKind::Idle, Entry::Obj { flags, .. }) => flags & FLAG_IDLE != 0,
            (PageKind::Huge, Entry::Obj { codec, .. }) => *codec == RAW,
            (PageKind::Incompressible, Entry::Obj { flags, .. }) => flags & FLAG_NO_RECOMP != 0,
            _ => false,
        }
    }

    /// Decodes up to `limit` pages (0: all) that `kind` selects and `keep` accepts and hands
    /// each to `f` with its shard's table locked: the walk `recompress` uses. The lock is
    /// taken for one page at a time, so requests for other pages of the shard are not held up
    /// behind a whole pass (the memory policy runs this while the device is in use).
    fn walk_selected(
        &self,
        kind: PageKind,
        limit: u64,
        keep: impl Fn(&Entry) -> bool,
        mut f: impl FnMut(&mut Ctx, &mut Table, usize, Entry, &[u8]) -> Result<(), BlkError>,
    ) -> Result<(), BlkError> {
        let mut seen = 0u64;
        with_ctx(|ctx| {
            let mut page_buf = vec![0u8; PAGE];
            for (s, shard) in self.shards.iter().enumerate() {
                let len = lock(shard).len();
                for idx in 0..len {
                    let mut t = lock(shard);
                    if limit != 0 && seen == limit {
                        return Ok(());
                    }
                    let e = t[idx];
                    if !Self::selected(kind, &e) || !keep(&e) {
                        continue;
                    }
                    seen += 1;
                    let page = idx as u64 * SHARDS as u64 + s as u64;
                    self.decode(ctx, page, e, &mut page_buf)?;
                    f(ctx, &mut t, idx, e, &page_buf)?;
                }
            }
            Ok(())
        })
    }

    /// Re-compresses idle, huge or incompressible pages with the secondary codecs in priority
    /// order, keeping a result only when it is smaller (zram's `recompress type=...
    /// threshold=... max_pages=...`). Pages whose compressed size is below `threshold` (if
    /// nonzero) are skipped, pages already on the last codec too; at most `max_pages` pages
    /// (0: no limit) are tried. Pages no codec shrinks are flagged incompressible and not
    /// tried again until rewritten. Returns pages changed.
    pub fn recompress(
        &self,
        kind: PageKind,
        threshold: u64,
        max_pages: u64,
    ) -> Result<u64, BlkError> {
        if self.codecs.len() < 2 {
            return Err(BlkError::NoRecomp);
        }
        let last = self.codecs.len() - 1;
        let keep = |e: &Entry| match e {
            Entry::Obj {
                len, flags, codec, ..
            } => {
                flags & FLAG_NO_RECOMP == 0
                    && (*codec == RAW || codec_index(*codec) < last)
                    && (threshold == 0 || u64::from(*len) >= threshold)
            }
            _ => false,
        };
        let mut changed = 0;
        self.walk_selected(kind, max_pages, keep, |ctx, t, idx, e, data| {
            let Entry::Obj {
                len, codec, flags, ..
            } = e
            else {
                return Ok(());
            };
            let first = if codec == RAW {
                1
            } else {
                codec_index(codec) + 1
            };
            for ci in first..self.codecs.len() {
                let n = ctx.comp.compress(self.codecs[ci], data, &mut ctx.buf)?;
                if n < len as usize && n <= HUGE_THRESHOLD {
                    let obj = match self.pool.alloc(&ctx.buf[..n]) {
                        Ok(o) => o,
                        // Out of memory for the new copy: leave the page as it is.
                        Err(PoolError::Limit { .. }) => return Ok(()),
                        Err(e) => return Err(BlkError::Pool(e)),
                    };
                    add(&self.c.pages_stored, 1);
                    add(&self.c.compr_data_size, n as u64);
                    self.free_entry(e);
                    t[idx] = Entry::Obj {
                        obj,
                        len: n as u16,
                        codec: ci as u8,
                        flags,
                    };
                    changed += 1;
                    return Ok(());
                }
            }
            if let Some(f) = t.get_mut(idx).and_then(Entry::flags_mut) {
                *f |= FLAG_NO_RECOMP;
            }
            Ok(())
        })?;
        Ok(changed)
    }

    /// Moves idle, huge or incompressible pages to the backing file (zram's
    /// `writeback=idle|huge|incompressible`), at most `max_pages` (0: no limit) and within the
    /// writeback budget; reads fetch them from there. Pages go out `writeback_batch_size` at a
    /// time: a batch is decoded, written (consecutive slots in one write) and only then
    /// switched over in the table. Returns pages written.
    pub fn writeback(&self, kind: PageKind, max_pages: u64) -> Result<u64, BlkError> {
        let mut written = 0u64;
        for s in 0..SHARDS {
            let len = lock(&self.shards[s]).len();
            let left = if max_pages == 0 {
                u64::MAX
            } else {
                max_pages - written
            };
            if left == 0 {
                break;
            }
            let (n, stop) = self.writeback_pages(kind, s, 0..len, left)?;
            written += n;
            if stop {
                break;
            }
        }
        Ok(written)
    }

    /// Writes back those of the entries `idxs` of shard `s` that `kind` selects, at most
    /// `max` of them, batch by batch. Returns pages written and whether the budget ran out.
    pub(super) fn writeback_pages(
        &self,
        kind: PageKind,
        s: usize,
        idxs: impl Iterator<Item = usize>,
        max: u64,
    ) -> Result<(u64, bool), BlkError> {
        let b = self.backing.as_ref().ok_or(BlkError::NoBacking)?;
        let batch = self.writeback_batch_size().max(1);
        let mut written = 0u64;
        let mut idxs = idxs.peekable();
        let mut buf = vec![0u8; batch * PAGE];
        while idxs.peek().is_some() && written < max {
            // Take the budget first, then gather a batch under the shard lock.
            let want = (batch as u64).min(max - written);
            let granted = self.take_budget(want);
            if granted == 0 {
                return Ok((written, true));
            }
            let mut chosen: Vec<(u64, usize, Entry)> = Vec::with_capacity(granted as usize);
            let mut t = lock(&self.shards[s]);
            while chosen.len() < granted as usize {
                let Some(idx) = idxs.next() else { break };
                let e = t[idx];
                if Self::selected(kind, &e) {
                    chosen.push((idx as u64 * SHARDS as u64 + s as u64, idx, e));
                }
            }
            self.return_budget(granted - chosen.len() as u64);
            if chosen.is_empty() {
                continue;
            }
            let r = with_ctx(|ctx| -> Result<(), BlkError> {
                for (i, (page, _, e)) in chosen.iter().enumerate() {
                    self.decode(ctx, *page, *e, &mut buf[i * PAGE..(i + 1) * PAGE])?;
                }
                Ok(())
            });
            if let Err(e) = r {
                self.return_budget(chosen.len() as u64);
                return Err(e);
            }
            let slots = b.alloc_slots(chosen.len());
            if let Err(err) = b.write_slots(&slots, &buf[..chosen.len() * PAGE]) {
                self.return_budget(chosen.len() as u64);
                b.free_slots(&slots);
                return Err(BlkError::BackingIo(err));
            }
            for ((_, idx, e), slot) in chosen.iter().zip(&slots) {
                let idx = *idx;
                let flags = e.flags().unwrap_or(0);
                self.free_entry(*e);
                t[idx] = Entry::Backed {
                    slot: slot.to_ne_bytes(),
                    flags: flags & !FLAG_IDLE,
                };
                add(&self.c.bd_count, 1);
                add(&self.c.bd_writes, 1);
            }
            written += chosen.len() as u64;
        }
        Ok((written, false))
    }

    /// Compacts the pool; returns pages freed.
    pub fn compact(&self) -> u64 {
        self.pool.compact()
    }

    /// Drops every page and resets the statistics (zram's `reset`).
    pub fn reset(&self) {
        for shard in self.shards.iter() {
            let mut t = lock(shard);
            for (_, e, _) in t.entries_mut() {
                self.free_entry(*e);
                *e = Entry::Empty;
            }
        }
        if let Some(b) = &self.backing {
            *lock(&b.slots) = SlotAlloc::default();
        }
        let c = &self.c;
        for a in [
            &c.huge_pages_since,
            &c.failed_reads,
            &c.failed_writes,
            &c.invalid_io,
            &c.notify_free,
            &c.bd_reads,
            &c.bd_writes,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        self.pool.compact();
        self.pool.reset_compacted();
        self.pool.reset_max();
    }
}
