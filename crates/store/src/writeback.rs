//! The writeback of closed files: small files are queued for the writeback thread, which
//! compresses and appends a batch of them and commits them in one transaction.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use compfs_codec::ExtentPolicy;

use crate::encode::whole_blocks;
use crate::error::{Error, Result};
use crate::file::{Dirty, FileState};
use crate::flush::{FlushMeta, Staged};
use crate::pack::{plan_packs, Member, PackInput};
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

    /// Flushes the closed files among `files` that would go into packs, 256 at a time, each
    /// batch in one transaction (files locked elsewhere are left to the caller).
    pub(crate) fn flush_packable(&self, files: &[(Ino, Arc<Mutex<FileState>>)]) -> Result<()> {
        let limit = self.pack_limit();
        if limit == 0 {
            return Ok(());
        }
        let mut done = Vec::new();
        let mut res = Ok(());
        for chunk in files.chunks(256) {
            let mut held = Vec::new();
            for (ino, a) in chunk {
                let g = match a.try_lock() {
                    Ok(g) => g,
                    Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) => continue,
                };
                let packable = g.open == 0
                    && !g.dead
                    && g.dirty
                        .as_ref()
                        .is_some_and(|d| pack_len(d, limit).is_some());
                if packable {
                    held.push((*ino, g));
                }
            }
            if held.len() < 2 {
                continue;
            }
            res = self
                .check_writable()
                .and_then(|()| self.writeback_held(&mut held));
            done.extend(held.iter().map(|(i, _)| *i));
            drop(held);
            if res.is_err() {
                break;
            }
        }
        for ino in done {
            self.maybe_forget(ino);
        }
        res
    }

    /// The work of [`Inner::writeback_batch`] on files whose locks it holds: files of one
    /// block with the same policy are compressed together into packs (see `pack`), the
    /// others one by one. On failure every file keeps its buffer (and the store is read-only).
    fn writeback_held(&self, held: &mut [(Ino, MutexGuard<'_, FileState>)]) -> Result<()> {
        struct Item {
            at: usize,
            d: Dirty,
            meta: FlushMeta,
            staged: Staged,
            keep: Vec<(u64, Arc<Vec<u8>>)>,
        }
        /// A file of a pack: its buffer, without block 0, which is `block`.
        struct PackItem {
            at: usize,
            d: Dirty,
            block: Arc<Vec<u8>>,
        }
        let restore_packs = |held: &mut [(Ino, MutexGuard<'_, FileState>)],
                             items: Vec<PackItem>| {
            for mut it in items {
                it.d.blocks.insert(
                    0,
                    Arc::try_unwrap(it.block).unwrap_or_else(|a| (*a).clone()),
                );
                held[it.at].1.dirty = Some(it.d);
            }
        };
        let (taken, packs) = self.take_packs(held);
        let pack_items: Vec<PackItem> = taken
            .into_iter()
            .map(|(at, d, block)| PackItem { at, d, block })
            .collect();
        let staged_packs = match self
            .encode_packs(packs)
            .and_then(|p| self.stage_packs(p).map_err(|e| self.fail(e)))
        {
            Ok(p) => p,
            Err(e) => {
                restore_packs(held, pack_items);
                return Err(e);
            }
        };
        let mut items: Vec<Item> = Vec::with_capacity(held.len());
        let restore = |held: &mut [(Ino, MutexGuard<'_, FileState>)],
                       items: Vec<Item>,
                       pack_items: Vec<PackItem>| {
            self.unpin_packs(&staged_packs);
            restore_packs(held, pack_items);
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
            if pack_items.iter().any(|p| p.at == at) {
                continue;
            }
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
                    restore(held, items, pack_items);
                    return Err(self.fail(err));
                }
                Err(err) => {
                    held[at].1.dirty = Some(d);
                    restore(held, items, pack_items);
                    return Err(err);
                }
            }
        }
        if items.is_empty() && staged_packs.is_empty() {
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
            for p in &staged_packs {
                self.apply_pack(w, p)?;
            }
            self.put_next_extent(w)?;
            Ok(std::mem::take(&mut w.freed))
        });
        match res {
            Ok(freed) => {
                self.unpin_packs(&staged_packs);
                for it in pack_items {
                    let n = 1 + it.d.blocks.len();
                    self.dirty_bytes
                        .fetch_sub(n * it.d.block as usize, Ordering::Relaxed);
                    if let Ok(v) = Arc::try_unwrap(it.block) {
                        self.give_buf(v);
                    }
                }
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
                restore(held, items, pack_items);
                Err(self.fail(err))
            }
        }
    }
}

/// The bytes a buffer would put in a pack of at most `limit` bytes: a file of one block, all
/// of it buffered as block 0 (nothing partial, punched or in flight), not all zeros.
fn pack_len(d: &Dirty, limit: usize) -> Option<usize> {
    let simple = d.blocks.len() == 1
        && d.partial.is_empty()
        && d.punch.is_empty()
        && d.pending.is_empty()
        && d.flying.is_empty();
    if !simple || d.size == 0 || d.size > d.block || d.size as usize > limit {
        return None;
    }
    let v = d.blocks.get(&0)?;
    let len = d.size as usize;
    if v.len() < len || v[..len].iter().all(|&b| b == 0) {
        return None;
    }
    Some(len)
}

/// Files of one policy: (inode, index among the held files, bytes).
type PolicyFiles = (ExtentPolicy, Vec<(Ino, usize, usize)>);

/// A file of a pack taken from the held files: its index, its buffer without block 0, and
/// block 0.
type Taken = (usize, Dirty, Arc<Vec<u8>>);

impl Inner {
    /// Takes the buffers of held files that go into packs (files of one block sharing a
    /// policy, at least two per pack), in inode order within each policy; returns them and the
    /// packs' inputs.
    fn take_packs(
        &self,
        held: &mut [(Ino, MutexGuard<'_, FileState>)],
    ) -> (Vec<Taken>, Vec<(ExtentPolicy, Vec<PackInput>)>) {
        let limit = self.pack_limit();
        let mut taken = Vec::new();
        let mut packs = Vec::new();
        if limit == 0 || held.len() < 2 {
            return (taken, packs);
        }
        // Per policy: (inode, index in `held`, length) of its files.
        let mut groups: Vec<PolicyFiles> = Vec::new();
        for (at, (ino, g)) in held.iter().enumerate() {
            let Some(len) = g.dirty.as_ref().and_then(|d| pack_len(d, limit)) else {
                continue;
            };
            // A file whose policy cannot be read is flushed alone (which reports the error).
            let Ok(policy) = self.file_policy(*ino) else {
                continue;
            };
            if policy.spec.is_none() {
                continue;
            }
            match groups.iter_mut().find(|g| g.0 == policy) {
                Some(g) => g.1.push((*ino, at, len)),
                None => groups.push((policy, vec![(*ino, at, len)])),
            }
        }
        for (policy, mut files) in groups {
            files.sort_unstable();
            let lens: Vec<usize> = files.iter().map(|f| f.2).collect();
            for r in plan_packs(&lens, limit) {
                let mut inputs = Vec::with_capacity(r.len());
                for &(ino, at, len) in &files[r] {
                    let Some(mut d) = held[at].1.dirty.take() else {
                        continue;
                    };
                    let Some(v) = d.blocks.remove(&0) else {
                        held[at].1.dirty = Some(d);
                        continue;
                    };
                    let block = Arc::new(v);
                    inputs.push(PackInput {
                        member: Member {
                            ino,
                            ext_offset: 0,
                            len: len as u32,
                            meta: FlushMeta {
                                block: d.block,
                                size: d.size,
                                mtime: d.mtime,
                                ctime: d.ctime,
                                punch: Vec::new(),
                            },
                            expect: None,
                        },
                        data: block.clone(),
                    });
                    taken.push((at, d, block));
                }
                packs.push((policy, inputs));
            }
        }
        (taken, packs)
    }
}
