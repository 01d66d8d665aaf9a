//! Dirty state of open files: the per-inode table of file states, the write buffer of
//! extent-sized blocks and partially written blocks, and the pool of block buffers.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use compfs_codec::{CodecSpec, ExtentPolicy};

use crate::encode::trim_out_bufs;
use crate::error::{Error, Result};
use crate::flush::Pending;
use crate::records::InodeRec;
use crate::span;
use crate::store::{lock, Inner};
use crate::txn::MetaTxn;
use crate::types::*;

/// A block of which only some ranges were written.
pub(crate) struct Partial {
    /// `Dirty::block` bytes; only `ranges` are meaningful.
    pub data: Arc<Vec<u8>>,
    /// Written ranges within the block, sorted and disjoint (not adjacent).
    pub ranges: Vec<(usize, usize)>,
}

impl Partial {
    pub(crate) fn add(&mut self, s: usize, e: usize) {
        span::range_insert(&mut self.ranges, s, e);
    }
    pub(crate) fn covered(&self) -> usize {
        span::range_covered(&self.ranges)
    }
    /// Copies the written ranges of `[off, off + out.len())` (block-relative) into `out`.
    pub(crate) fn overlay(&self, off: usize, out: &mut [u8]) {
        for (s, e) in span::range_clip(&self.ranges, off, off + out.len()) {
            out[s - off..e - off].copy_from_slice(&self.data[s..e]);
        }
    }
}

/// Buffered, not yet flushed changes of one regular file.
pub(crate) struct Dirty {
    /// Block size of this buffer: the file's extent size (its `compfs.extent_size` property,
    /// else the store's) when buffering started. Fixed while anything is buffered; a changed
    /// property applies from the next time the file has nothing buffered.
    pub block: u64,
    /// Blocks by index, each `block` bytes (zeros past the end of file).
    pub blocks: BTreeMap<u64, Vec<u8>>,
    /// Blocks of the batch being compressed (`pending`), readable until it is committed.
    pub flying: BTreeMap<u64, Arc<Vec<u8>>>,
    /// Batches being compressed, oldest first (at most two: one compressing while the one
    /// before it commits).
    pub pending: std::collections::VecDeque<Pending>,
    /// Blocks written only in part and not loaded: the written ranges, flushed as small
    /// extents that the extent map lays over the old extent (see docs/format.md).
    pub partial: BTreeMap<u64, Partial>,
    /// Current file size.
    pub size: u64,
    /// File size in the metadata when buffering started: no persisted data lies beyond it.
    pub base_size: u64,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Ranges to drop from the extent map at the next flush (punched holes).
    pub punch: Vec<(u64, u64)>,
}

impl Dirty {
    /// Buffered blocks that start inside the file (blocks past the end are dropped, not
    /// written).
    pub(crate) fn live_blocks(&self, extent_size: u64) -> Vec<u64> {
        self.blocks
            .keys()
            .copied()
            .filter(|&b| b * extent_size < self.size)
            .collect()
    }
}

/// In-memory state of an inode that is open or has buffered writes.
#[derive(Default)]
pub(crate) struct FileState {
    pub open: u32,
    pub dirty: Option<Dirty>,
    /// Removed from the table of file states: whoever holds this must look it up again.
    pub dead: bool,
}

pub(crate) fn kind_error(kind: FileKind) -> Error {
    match kind {
        FileKind::Dir => Error::IsDir,
        _ => Error::InvalidArgument("not a regular file".into()),
    }
}

/// Pooled buffers of each kind kept while idle.
const IDLE_BUFS: usize = 8;

impl Inner {
    fn file_arc(&self, ino: Ino) -> Arc<Mutex<FileState>> {
        lock(&self.files).entry(ino).or_default().clone()
    }

    pub(crate) fn existing_file(&self, ino: Ino) -> Option<Arc<Mutex<FileState>>> {
        lock(&self.files).get(&ino).cloned()
    }

    /// Runs `f` with the inode's state locked.
    pub(crate) fn with_file<T>(
        &self,
        ino: Ino,
        f: impl FnOnce(&mut FileState) -> Result<T>,
    ) -> Result<T> {
        loop {
            let a = self.file_arc(ino);
            let mut g = lock(&a);
            if g.dead {
                continue;
            }
            return f(&mut g);
        }
    }

    /// Drops the in-memory state of an inode that is neither open nor dirty.
    pub(crate) fn maybe_forget(&self, ino: Ino) {
        let mut m = lock(&self.files);
        if let Some(a) = m.get(&ino).cloned() {
            if let Ok(mut g) = a.try_lock() {
                if g.open == 0 && g.dirty.is_none() {
                    g.dead = true;
                    m.remove(&ino);
                }
            }
        }
    }

    pub(crate) fn inode(&self, ino: Ino) -> Result<InodeRec> {
        self.with_meta(|m| m.inode(ino))
    }

    /// The codec policy for `ino`: its `compfs.compression` property, else the default.
    pub(crate) fn file_policy(&self, ino: Ino) -> Result<ExtentPolicy> {
        let (spec, mode) = self
            .policy
            .read()
            .map(|p| *p)
            .unwrap_or((self.sb.codec, self.sb.mode));
        let spec = match self.with_meta(|m| m.xattr(ino, COMPRESSION_XATTR))? {
            Some(v) => std::str::from_utf8(&v)
                .ok()
                .and_then(|s| CodecSpec::parse(s).ok())
                .map(|p| p.spec)
                .unwrap_or(spec),
            None => spec,
        };
        Ok(ExtentPolicy {
            spec,
            mode,
            min_saving: self.min_saving,
        })
    }

    /// The extent size of `ino`: its `compfs.extent_size` property, else the store's. A
    /// damaged property value counts as absent.
    pub(crate) fn file_extent_size(&self, ino: Ino) -> Result<u64> {
        self.with_meta(|m| self.file_extent_size_in(m, ino))
    }

    /// [`Inner::file_extent_size`] read through `m` (the held batch or a snapshot).
    fn file_extent_size_in(&self, m: &MetaTxn<'_, '_>, ino: Ino) -> Result<u64> {
        let own = m
            .xattr(ino, EXTENT_SIZE_XATTR)?
            .and_then(|v| std::str::from_utf8(&v).ok().and_then(parse_extent_size));
        Ok(own.unwrap_or(self.sb.extent_size) as u64)
    }

    /// The block size to cut `rec`'s data with, given its extent size `e`: the store's when the
    /// file's inline data is longer than `e` (a block 0 written whole replaces the inline data,
    /// so it must cover it; only a store made with a large `inline_max` can have such files).
    pub(crate) fn block_for(&self, rec: &InodeRec, e: u64) -> u64 {
        match &rec.inline {
            Some(i) if i.raw_len as u64 > e => self.sb.extent_size as u64,
            _ => e,
        }
    }

    /// Largest file kept inline for a block size of `block` bytes.
    pub(crate) fn inline_limit(&self, block: u64) -> u64 {
        (self.sb.inline_max as u64).min(block / 2)
    }

    pub(crate) fn ensure_dirty<'a>(
        &self,
        ino: Ino,
        st: &'a mut FileState,
    ) -> Result<&'a mut Dirty> {
        if st.dirty.is_none() {
            // Read through the held batch: a read snapshot would commit it first, one redb
            // commit per file written after its CREATE (10% of the ring threads' time in an
            // untar).
            let (rec, e) =
                self.with_meta(|m| Ok((m.inode(ino)?, self.file_extent_size_in(m, ino)?)))?;
            if rec.kind != FileKind::File {
                return Err(kind_error(rec.kind));
            }
            let block = self.block_for(&rec, e);
            st.dirty = Some(Dirty {
                block,
                blocks: BTreeMap::new(),
                flying: BTreeMap::new(),
                pending: Default::default(),
                partial: BTreeMap::new(),
                size: rec.size,
                base_size: rec.size,
                mtime: rec.mtime,
                ctime: rec.ctime,
                punch: Vec::new(),
            });
        }
        match st.dirty.as_mut() {
            Some(d) => Ok(d),
            None => Err(Error::NotFound),
        }
    }

    /// Makes sure block `b` is buffered, loading its persisted bytes when there are any.
    /// `whole`: no persisted bytes are needed (the block is new or fully overwritten);
    /// `overwritten`: the caller overwrites all of it, so the buffer need not be zeroed.
    pub(crate) fn load_block(
        &self,
        ino: Ino,
        d: &mut Dirty,
        b: u64,
        whole: bool,
        overwritten: bool,
    ) -> Result<()> {
        if d.blocks.contains_key(&b) {
            return Ok(());
        }
        let e = d.block;
        if let Some(a) = d.flying.get(&b) {
            // Being compressed: start from its content (the batch commits it as it was).
            d.blocks.insert(b, a.to_vec());
            self.dirty_bytes.fetch_add(e as usize, Ordering::Relaxed);
            return Ok(());
        }
        let mut v = self.take_buf(e as usize, !overwritten);
        if !whole && b * e < d.base_size {
            let _g = self.seg_barrier.read();
            let txn = self.read_txn()?;
            self.read_persisted(&txn, ino, b * e, &mut v)?;
        }
        match d.partial.remove(&b) {
            Some(p) => p.overlay(0, &mut v),
            None => {
                self.dirty_bytes.fetch_add(e as usize, Ordering::Relaxed);
            }
        }
        d.blocks.insert(b, v);
        Ok(())
    }

    /// A block buffer of `e` bytes, reused when one is free (zeroed when asked). The pool holds
    /// buffers of the store's extent size only; files with their own size allocate theirs.
    fn take_buf(&self, e: usize, zero: bool) -> Vec<u8> {
        if e != self.sb.extent_size as usize {
            return vec![0u8; e];
        }
        match lock(&self.bufs).pop() {
            Some(mut v) => {
                if zero {
                    v.fill(0);
                }
                v
            }
            None => vec![0u8; e],
        }
    }

    /// Returns a block buffer for reuse. The pool keeps as many as the dirty limit can have in
    /// flight (a steady sequential write then allocates none; freeing and re-faulting 128 KiB
    /// buffers cost about 9% of its throughput); the background flusher trims it when idle.
    pub(crate) fn give_buf(&self, v: Vec<u8>) {
        let e = self.sb.extent_size as usize;
        if v.len() == e {
            let mut b = lock(&self.bufs);
            if b.len() < (self.tuning.dirty_limit / e).max(64) {
                b.push(v);
            }
        }
    }

    /// Frees pooled buffers beyond a few, once nothing is buffered.
    pub(crate) fn trim_bufs(&self) {
        if self.dirty_bytes.load(Ordering::Relaxed) == 0 {
            lock(&self.bufs).truncate(IDLE_BUFS);
            trim_out_bufs(IDLE_BUFS);
        }
    }
}
