//! zram's maintenance operations: idle marking, recompression, writeback to the backing file,
//! compaction and reset.

use std::sync::atomic::Ordering;

use super::*;
use crate::error::BlkError;
use crate::pool::PAGE;

impl PageStore {
    /// Marks every stored page idle; reading or writing a page clears its mark (zram's
    /// `idle=all`).
    pub fn mark_idle(&self) -> u64 {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut t = lock(shard);
            for (_, e) in t.entries_mut() {
                if let Some(f) = e.flags_mut() {
                    *f |= FLAG_IDLE;
                    n += 1;
                }
            }
        }
        n
    }

    fn selected(kind: PageKind, e: &Entry) -> bool {
        match (kind, e) {
            (PageKind::Idle, Entry::Obj { flags, .. }) => flags & FLAG_IDLE != 0,
            (PageKind::Huge, Entry::Obj { codec, .. }) => *codec == RAW,
            _ => false,
        }
    }

    /// Decodes every page that `kind` selects and `keep` accepts and hands it to `f` with its
    /// shard's table locked: the walk `recompress` and `writeback` share.
    fn walk_selected(
        &self,
        kind: PageKind,
        keep: impl Fn(&Entry) -> bool,
        mut f: impl FnMut(&mut Ctx, &mut Table, usize, Entry, &[u8]) -> Result<(), BlkError>,
    ) -> Result<(), BlkError> {
        with_ctx(|ctx| {
            let mut page_buf = vec![0u8; PAGE];
            for (s, shard) in self.shards.iter().enumerate() {
                let mut t = lock(shard);
                for idx in 0..t.len() {
                    let e = t[idx];
                    if !Self::selected(kind, &e) || !keep(&e) {
                        continue;
                    }
                    let page = idx as u64 * SHARDS as u64 + s as u64;
                    self.decode(ctx, page, e, &mut page_buf)?;
                    f(ctx, &mut t, idx, e, &page_buf)?;
                }
            }
            Ok(())
        })
    }

    /// Re-compresses idle or huge pages with the secondary codecs in priority order, keeping a
    /// result only when it is smaller (zram's `recompress type=... threshold=...`). Pages whose
    /// compressed size is below `threshold` (if nonzero) are skipped. Returns pages changed.
    pub fn recompress(&self, kind: PageKind, threshold: u64) -> Result<u64, BlkError> {
        if self.codecs.len() < 2 {
            return Err(BlkError::NoRecomp);
        }
        let keep = |e: &Entry| match e {
            Entry::Obj { len, flags, .. } => {
                flags & FLAG_NO_RECOMP == 0 && (threshold == 0 || u64::from(*len) >= threshold)
            }
            _ => false,
        };
        let mut changed = 0;
        self.walk_selected(kind, keep, |ctx, t, idx, e, data| {
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

    /// Moves idle or huge pages to the backing file (zram's `writeback=idle|huge`); reads
    /// fetch them from there. Returns pages written.
    pub fn writeback(&self, kind: PageKind) -> Result<u64, BlkError> {
        let b = self.backing.as_ref().ok_or(BlkError::NoBacking)?;
        let mut written = 0;
        self.walk_selected(
            kind,
            |_| true,
            |_, t, idx, e, data| {
                let Entry::Obj { flags, .. } = e else {
                    return Ok(());
                };
                let slot = {
                    let mut sl = lock(&b.slots);
                    match sl.free.pop() {
                        Some(x) => x,
                        None => {
                            let x = sl.next;
                            sl.next += 1;
                            x
                        }
                    }
                };
                if let Err(err) = b.file.write_all_at(data, u64::from(slot) * PAGE as u64) {
                    lock(&b.slots).free.push(slot);
                    return Err(BlkError::BackingIo(err));
                }
                self.free_entry(e);
                t[idx] = Entry::Backed {
                    slot: slot.to_ne_bytes(),
                    flags: flags & !FLAG_IDLE,
                };
                add(&self.c.bd_count, 1);
                add(&self.c.bd_writes, 1);
                written += 1;
                Ok(())
            },
        )?;
        Ok(written)
    }

    /// Compacts the pool; returns pages freed.
    pub fn compact(&self) -> u64 {
        self.pool.compact()
    }

    /// Drops every page and resets the statistics (zram's `reset`).
    pub fn reset(&self) {
        for shard in self.shards.iter() {
            let mut t = lock(shard);
            for (_, e) in t.entries_mut() {
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
