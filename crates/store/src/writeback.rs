//! The writeback of closed files: small files are queued for the writeback thread, which
//! compresses and appends a batch of them and commits them in one transaction.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::encode::whole_blocks;
use crate::error::{Error, Result};
use crate::file::{Dirty, FileState};
use crate::flush::{FlushMeta, Staged};
use crate::store::{lock, Inner};
use crate::types::*;

impl Inner {
    /// Flush on the last close: a file with several buffered blocks hands them to the pool and
    /// returns (the writeback thread commits the batches once compressed), so a writer moving
    /// on to its next file overlaps with this file's compression;
    /// small files, or when buffers are past half their limit, flush synchronously.
    pub(crate) fn release_flush(&self, ino: Ino, st: &mut FileState) -> Result<()> {
        let async_ok = st
            .dirty
            .as_ref()
            .is_some_and(|d| d.blocks.len() >= 2 && d.partial.is_empty() && d.punch.is_empty())
            && self.dirty_bytes.load(Ordering::Relaxed) < self.tuning.dirty_limit / 2;
        if !async_ok {
            return self.flush_locked(ino, st, false);
        }
        let Some(d) = st.dirty.as_mut() else {
            return Ok(());
        };
        self.start_async_flush(ino, d)?;
        // The writeback thread commits the batches as soon as they are compressed, which
        // frees their buffers for the writer's next file (left to the flusher, they would
        // pile up to the dirty limit and push every later close into a synchronous flush).
        if let Some(tx) = lock(&self.writeback).as_ref() {
            let _ = tx.send(ino);
        }
        Ok(())
    }

    /// Queues a closed file with a small buffer for the writeback thread; false when the
    /// caller must flush it itself (no writeback thread, a large buffer, which goes to the
    /// compression pool instead, or buffers past half their limit: back-pressure).
    pub(crate) fn queue_writeback(&self, ino: Ino, st: &FileState) -> bool {
        let small = st
            .dirty
            .as_ref()
            .is_some_and(|d| d.blocks.len() + d.partial.len() <= 1 && d.pending.is_empty());
        if !small || self.dirty_bytes.load(Ordering::Relaxed) >= self.tuning.dirty_limit / 2 {
            return false;
        }
        match lock(&self.writeback).as_ref() {
            Some(tx) => tx.send(ino).is_ok(),
            None => false,
        }
    }

    /// Flushes one file queued by [`Inner::queue_writeback`] (if it is still dirty).
    fn writeback_one(&self, ino: Ino) {
        let Some(a) = self.existing_file(ino) else {
            return;
        };
        {
            let mut g = lock(&a);
            if !g.dead && g.dirty.is_some() && self.check_writable().is_ok() {
                if let Err(e) = self.flush_locked(ino, &mut g, false) {
                    tracing::error!("compfs writeback of inode {ino} failed: {e}");
                }
            }
        }
        self.maybe_forget(ino);
    }

    /// Flushes files queued by [`Inner::queue_writeback`]: each is compressed on this thread and
    /// appended, then all are committed in one transaction. An untar closes thousands of small
    /// files; a transaction each was most of the writeback's cost and kept redb's write lock
    /// busy while FUSE requests (creates) waited for it. A file that is locked elsewhere, or
    /// holds more than one block, partial blocks, punched holes or batches in flight, is
    /// flushed on its own.
    pub(crate) fn writeback_batch(&self, inos: &[Ino]) {
        if self.check_writable().is_err() {
            return;
        }
        let mut seen = BTreeSet::new();
        let arcs: Vec<(Ino, Arc<Mutex<FileState>>)> = inos
            .iter()
            .filter(|i| seen.insert(**i))
            .filter_map(|&i| self.existing_file(i).map(|a| (i, a)))
            .collect();
        let mut alone = Vec::new();
        let mut held = Vec::new();
        for (ino, a) in &arcs {
            let g = match a.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    alone.push(*ino);
                    continue;
                }
            };
            let Some(d) = g.dirty.as_ref() else {
                continue;
            };
            let simple = d.blocks.len() <= 1
                && d.partial.is_empty()
                && d.punch.is_empty()
                && d.pending.is_empty();
            if g.dead {
                continue;
            }
            if simple {
                held.push((*ino, g));
            } else {
                drop(g);
                alone.push(*ino);
            }
        }
        if let Err(e) = self.writeback_held(&mut held) {
            tracing::error!("compfs writeback of {} files failed: {e}", held.len());
        }
        let done: Vec<Ino> = held.iter().map(|(i, _)| *i).collect();
        drop(held);
        for ino in done {
            self.maybe_forget(ino);
        }
        for ino in alone {
            self.writeback_one(ino);
        }
    }

    /// The work of [`Inner::writeback_batch`] on files whose locks it holds. On failure every
    /// file keeps its buffer (and the store is read-only).
    fn writeback_held(&self, held: &mut [(Ino, MutexGuard<'_, FileState>)]) -> Result<()> {
        struct Item {
            at: usize,
            d: Dirty,
            meta: FlushMeta,
            staged: Staged,
            keep: Vec<(u64, Arc<Vec<u8>>)>,
        }
        let mut items: Vec<Item> = Vec::with_capacity(held.len());
        let restore = |held: &mut [(Ino, MutexGuard<'_, FileState>)], items: Vec<Item>| {
            for mut it in items {
                if let Some((id, _)) = it.staged.seg {
                    self.unpin(id);
                }
                for (b, a) in it.keep {
                    it.d.blocks
                        .insert(b, Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()));
                }
                held[it.at].1.dirty = Some(it.d);
            }
        };
        for at in 0..held.len() {
            let ino = held[at].0;
            let Some(mut d) = held[at].1.dirty.take() else {
                continue;
            };
            let prepared = self
                .file_policy(ino)
                .and_then(|policy| self.encode_dirty(ino, &mut d, policy))
                .map(|results| {
                    let keep = whole_blocks(&results);
                    (self.stage_encoded(ino, d.block, results), keep)
                });
            let meta = FlushMeta {
                block: d.block,
                size: d.size,
                mtime: d.mtime,
                ctime: d.ctime,
                punch: Vec::new(),
            };
            match prepared {
                Ok((Ok(staged), keep)) => items.push(Item {
                    at,
                    d,
                    meta,
                    staged,
                    keep,
                }),
                Ok((Err(err), keep)) => {
                    for (b, a) in keep {
                        d.blocks
                            .insert(b, Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()));
                    }
                    held[at].1.dirty = Some(d);
                    restore(held, items);
                    return Err(self.fail(err));
                }
                Err(err) => {
                    held[at].1.dirty = Some(d);
                    restore(held, items);
                    return Err(err);
                }
            }
        }
        if items.is_empty() {
            return Ok(());
        }
        // One commit for the held batch of namespace changes and these flushes.
        let res = self.write_joined(false, |w| {
            for it in &items {
                // A file unlinked meanwhile: its data goes with it.
                match w.inode(held[it.at].0) {
                    Ok(_) => {}
                    Err(Error::NotFound) => continue,
                    Err(e) => return Err(e),
                }
                self.apply_flush(w, held[it.at].0, &it.meta, &it.staged)?;
            }
            self.put_next_extent(w)?;
            Ok(std::mem::take(&mut w.freed))
        });
        match res {
            Ok(freed) => {
                for it in items {
                    if let Some((id, _)) = it.staged.seg {
                        self.unpin(id);
                    }
                    let n = it.keep.len() + it.d.blocks.len();
                    self.dirty_bytes
                        .fetch_sub(n * it.d.block as usize, Ordering::Relaxed);
                    for (_, a) in it.keep {
                        if let Ok(v) = Arc::try_unwrap(a) {
                            self.give_buf(v);
                        }
                    }
                }
                let mut cache = lock(&self.cache);
                for id in freed {
                    cache.remove(id);
                }
                Ok(())
            }
            Err(err) => {
                restore(held, items);
                Err(self.fail(err))
            }
        }
    }
}
