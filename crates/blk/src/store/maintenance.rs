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

    /// Takes page `idx` of shard `s` for slow work done without the shard lock: if `kind`
    /// selects its entry and `keep` accepts it, decodes it into `buf`, flags the entry
    /// [`FLAG_PENDING`] and returns it. Any write, trim or move of the page replaces the entry
    /// and so drops the flag; [`PageStore::still_pending`] checks it afterwards.
    fn take_pending(
        &self,
        ctx: &mut Ctx,
        s: usize,
        idx: usize,
        kind: PageKind,
        keep: impl Fn(&Entry) -> bool,
        buf: &mut [u8],
    ) -> Result<Option<Entry>, BlkError> {
        let mut t = lock(&self.shards[s]);
        let e = t[idx];
        if !Self::selected(kind, &e) || !keep(&e) {
            return Ok(None);
        }
        let page = idx as u64 * SHARDS as u64 + s as u64;
        self.decode(ctx, page, e, buf)?;
        if let Some(f) = t.get_mut(idx).and_then(Entry::flags_mut) {
            *f |= FLAG_PENDING;
        }
        Ok(Some(e))
    }

    /// Whether the entry now in the table is still the one `take_pending` returned as `was`
    /// (same object, pending flag still set); clears the flag either way.
    pub(super) fn still_pending(t: &mut Table, idx: usize, was: &Entry) -> bool {
        let same_obj = match (t[idx], was) {
            (Entry::Obj { obj: a, .. }, Entry::Obj { obj: b, .. }) => a == *b,
            _ => false,
        };
        match t.get_mut(idx).and_then(Entry::flags_mut) {
            Some(f) if *f & FLAG_PENDING != 0 => {
                *f &= !FLAG_PENDING;
                same_obj
            }
            _ => false,
        }
    }

    /// Re-compresses idle, huge or incompressible pages with the secondary codecs in priority
    /// order, keeping a result only when it is smaller (zram's `recompress type=...
    /// threshold=... max_pages=...`). Pages whose compressed size is below `threshold` (if
    /// nonzero) are skipped, pages already on the last codec too; at most `max_pages` pages
    /// (0: no limit) are tried. Pages no codec shrinks are flagged incompressible and not
    /// tried again until rewritten. Returns pages changed.
    ///
    /// The shard lock is held only to decode a page and to swap in its new copy, never while
    /// the (slow) secondary codec runs: the memory policy does this at idle priority while the
    /// device is in use, and a request must not wait behind a preempted low-priority thread.
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
                flags & (FLAG_NO_RECOMP | FLAG_PENDING) == 0
                    && (*codec == RAW || codec_index(*codec) < last)
                    && (threshold == 0 || u64::from(*len) >= threshold)
            }
            _ => false,
        };
        let mut changed = 0;
        let mut tried = 0u64;
        with_ctx(|ctx| -> Result<(), BlkError> {
            let mut data = vec![0u8; PAGE];
            let mut out = Vec::with_capacity(2 * PAGE);
            for s in 0..SHARDS {
                let len = lock(&self.shards[s]).len();
                for idx in 0..len {
                    if max_pages != 0 && tried == max_pages {
                        return Ok(());
                    }
                    let Some(e) = self.take_pending(ctx, s, idx, kind, keep, &mut data)? else {
                        continue;
                    };
                    tried += 1;
                    let Entry::Obj { len, codec, .. } = e else {
                        continue;
                    };
                    let first = if codec == RAW {
                        1
                    } else {
                        codec_index(codec) + 1
                    };
                    let mut found = Ok(None);
                    for ci in first..self.codecs.len() {
                        match ctx.comp.compress(self.codecs[ci], &data, &mut out) {
                            Ok(n) if n < len as usize && n <= HUGE_THRESHOLD => {
                                found = Ok(Some((ci, n)));
                                break;
                            }
                            Ok(_) => {}
                            Err(err) => {
                                found = Err(err);
                                break;
                            }
                        }
                    }
                    let mut t = lock(&self.shards[s]);
                    // Cleared even when the codec failed, so the page is not stuck pending.
                    if !Self::still_pending(&mut t, idx, &e) {
                        continue;
                    }
                    let Some((ci, n)) = found? else {
                        if let Some(f) = t.get_mut(idx).and_then(Entry::flags_mut) {
                            *f |= FLAG_NO_RECOMP;
                        }
                        continue;
                    };
                    if kind == PageKind::Idle && t[idx].flags().is_some_and(|f| f & FLAG_IDLE == 0)
                    {
                        // Read while the secondary codec ran (a read clears the idle mark but
                        // keeps the entry): the page is in use again, so it stays on its
                        // codec. Without this, a policy step at idle priority on a busy
                        // machine, which can take longer than a working-set move, demoted the
                        // new working set's pages after their first read, and every next read
                        // paid a zstd:9 decode and a promotion.
                        continue;
                    }
                    let obj = match self.pool.alloc(&out[..n]) {
                        Ok(o) => o,
                        // Out of memory for the new copy: leave the page as it is.
                        Err(PoolError::Limit { .. }) => continue,
                        Err(e) => return Err(BlkError::Pool(e)),
                    };
                    let flags = t[idx].flags().unwrap_or(0);
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
                }
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
            // Decoded and flagged under the lock, written without it (the file write may
            // sleep), switched over under it again if nobody changed the page meanwhile.
            let mut chosen: Vec<(usize, Entry)> = Vec::with_capacity(granted as usize);
            let r = with_ctx(|ctx| -> Result<(), BlkError> {
                while chosen.len() < granted as usize {
                    let Some(idx) = idxs.next() else { break };
                    let i = chosen.len();
                    let dst = &mut buf[i * PAGE..(i + 1) * PAGE];
                    let keep = |e: &Entry| e.flags().is_some_and(|f| f & FLAG_PENDING == 0);
                    if let Some(e) = self.take_pending(ctx, s, idx, kind, keep, dst)? {
                        chosen.push((idx, e));
                    }
                }
                Ok(())
            });
            self.return_budget(granted - chosen.len() as u64);
            let slots = b.alloc_slots(chosen.len());
            let r = r.and_then(|()| {
                b.write_slots(&slots, &buf[..chosen.len() * PAGE])
                    .map_err(BlkError::BackingIo)
            });
            let mut t = lock(&self.shards[s]);
            let mut unused = Vec::new();
            for ((idx, e), slot) in chosen.iter().zip(&slots) {
                let idx = *idx;
                if !Self::still_pending(&mut t, idx, e) || r.is_err() {
                    unused.push(*slot);
                    continue;
                }
                let flags = t[idx].flags().unwrap_or(0);
                self.free_entry(*e);
                t[idx] = Entry::Backed {
                    slot: slot.to_ne_bytes(),
                    flags: flags & !FLAG_IDLE,
                };
                add(&self.c.bd_count, 1);
                add(&self.c.bd_writes, 1);
                written += 1;
            }
            drop(t);
            self.return_budget(unused.len() as u64);
            b.free_slots(&unused);
            r?;
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
        self.drop_spares();
        self.pool.compact();
        self.pool.reset_compacted();
        self.pool.reset_max();
    }
}
