//! File data: the per-inode write buffer, flushing (parallel compression, segment append, sync,
//! then one metadata transaction), reads with checksum verification, holes, truncation.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use compfs_codec::{
    Algorithm, CodecSpec, Decompressor, ExtentOutcome, ExtentPolicy, Mode, RawReason,
};
use redb::{ReadTransaction, ReadableDatabase};

use crate::error::{Error, Result};
use crate::format::{ExtentHeader, ExtentRec, Inline, InodeRec, MapRec, EXT_HEADER_LEN};
use crate::meta::{self, dec, W};
use crate::store::{lock, Inner, Store};
use crate::types::*;

/// Largest file size (like `MAX_LFS_FILESIZE` on 64-bit Linux).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// A compressed block and its uncompressed bytes.
type EncodedBlock = (Encoded, Arc<Vec<u8>>);

/// What a flush commits besides its extents.
pub(crate) struct FlushMeta {
    pub size: u64,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub punch: Vec<(u64, u64)>,
}

/// Encoded blocks appended to a segment, waiting for their metadata transaction.
struct Staged {
    encoded: Vec<Encoded>,
    /// (index in `encoded`, extent id, offset from the start of the append, header).
    placed: Vec<(usize, u64, u64, ExtentHeader)>,
    /// Segment and offset of the append (none when nothing was appended).
    seg: Option<(u64, u64)>,
}

/// A batch of blocks being compressed by the pool, to be committed by the next flush.
pub(crate) struct Pending {
    rx: std::sync::mpsc::Receiver<(usize, Vec<EncodedBlock>)>,
    n: usize,
    meta: FlushMeta,
    /// The blocks of this batch (to retire them from `flying` once committed).
    blocks: Vec<(u64, Arc<Vec<u8>>)>,
}

/// A block of which only some ranges were written.
pub(crate) struct Partial {
    /// `extent_size` bytes; only `ranges` are meaningful.
    pub data: Arc<Vec<u8>>,
    /// Written ranges within the block, sorted and disjoint (not adjacent).
    pub ranges: Vec<(usize, usize)>,
}

impl Partial {
    fn add(&mut self, s: usize, e: usize) {
        let mut v = Vec::with_capacity(self.ranges.len() + 1);
        let (mut s, mut e) = (s, e);
        for &(a, b) in &self.ranges {
            if b < s || a > e {
                v.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        v.push((s, e));
        v.sort_unstable();
        self.ranges = v;
    }
    fn covered(&self) -> usize {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }
    /// Copies the written ranges of `[off, off + out.len())` (block-relative) into `out`.
    fn overlay(&self, off: usize, out: &mut [u8]) {
        let end = off + out.len();
        for &(a, b) in &self.ranges {
            let (s, e) = (a.max(off), b.min(end));
            if s < e {
                out[s - off..e - off].copy_from_slice(&self.data[s..e]);
            }
        }
    }
}

/// Buffered, not yet flushed changes of one regular file.
pub(crate) struct Dirty {
    /// Extent-sized blocks by index, each `extent_size` bytes (zeros past the end of file).
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
    fn live_blocks(&self, extent_size: u64) -> Vec<u64> {
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

thread_local! {
    static DECOMPRESSOR: RefCell<Decompressor> = RefCell::new(Decompressor::new());
    static ENCODER: RefCell<compfs_codec::ExtentEncoder> = RefCell::new(compfs_codec::ExtentEncoder::new());
    /// Compression output buffer of this thread; a compressed extent leaves in it, and a
    /// pooled one (see `OUT_BUFS`) takes its place.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Reused buffer for an extent's stored bytes as read from its segment; only the first
    /// header + stored length bytes are meaningful, and they are overwritten on every read.
    static RAW_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

enum Out {
    Hole,
    Inline(Inline),
    /// `stored: None` = stored raw (the block itself). `crc`: crc32c of the stored bytes,
    /// computed by the compression worker.
    Extent {
        codec: u8,
        level: i8,
        stored: Option<Vec<u8>>,
        reason: Option<RawReason>,
        crc: u32,
    },
}

struct Encoded {
    block: u64,
    /// Offset of the data within the block (0 for whole blocks).
    off: usize,
    len: usize,
    /// A whole block (replaces the block's range) or a written range of a partial block.
    full: bool,
    out: Out,
}

type EncodeJob = Box<dyn FnOnce(&mut compfs_codec::ExtentEncoder) -> EncodedBlock + Send>;

/// Map entries within one block beyond which a partially written block is rewritten whole.
const MAX_BLOCK_PIECES: usize = 16;

fn kind_error(kind: FileKind) -> Error {
    match kind {
        FileKind::Dir => Error::IsDir,
        _ => Error::InvalidArgument("not a regular file".into()),
    }
}

pub(crate) fn decode_inline(ino: Ino, i: &Inline) -> Result<Vec<u8>> {
    let corrupt = |detail: String| Error::Corrupt {
        ino,
        offset: 0,
        segment: 0,
        seg_offset: 0,
        detail: format!("inline data: {detail}"),
    };
    if i.codec == 0 {
        if i.bytes.len() != i.raw_len as usize {
            return Err(corrupt("raw inline length mismatch".into()));
        }
        return Ok(i.bytes.clone());
    }
    let alg = Algorithm::from_id(i.codec).ok_or_else(|| corrupt(format!("codec {}", i.codec)))?;
    let mut out = vec![0u8; i.raw_len as usize];
    DECOMPRESSOR
        .with(|d| d.borrow_mut().decompress(alg, &i.bytes, &mut out))
        .map_err(|e| corrupt(e.to_string()))?;
    Ok(out)
}

impl Inner {
    pub(crate) fn file_arc(&self, ino: Ino) -> Arc<Mutex<FileState>> {
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
        let txn = self.db.begin_read()?;
        inode_in(&txn, ino)
    }

    /// The codec policy for `ino`: its `compfs.compression` property, else the default.
    pub(crate) fn file_policy(&self, ino: Ino) -> Result<ExtentPolicy> {
        let (spec, mode) = self
            .policy
            .read()
            .map(|p| *p)
            .unwrap_or((self.sb.codec, self.sb.mode));
        let txn = self.db.begin_read()?;
        let t = txn.open_table(meta::XATTRS)?;
        let spec = match t.get((ino, COMPRESSION_XATTR))? {
            Some(v) => std::str::from_utf8(v.value())
                .ok()
                .and_then(|s| CodecSpec::parse(s).ok())
                .map(|p| p.spec)
                .unwrap_or(spec),
            None => spec,
        };
        Ok(ExtentPolicy::new(spec, mode))
    }

    fn ensure_dirty<'a>(&self, ino: Ino, st: &'a mut FileState) -> Result<&'a mut Dirty> {
        if st.dirty.is_none() {
            let rec = self.inode(ino)?;
            if rec.kind != FileKind::File {
                return Err(kind_error(rec.kind));
            }
            st.dirty = Some(Dirty {
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
    fn load_block(
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
        let e = self.sb.extent_size as u64;
        if let Some(a) = d.flying.get(&b) {
            // Being compressed: start from its content (the batch commits it as it was).
            d.blocks.insert(b, a.to_vec());
            self.dirty_bytes.fetch_add(e as usize, Ordering::Relaxed);
            return Ok(());
        }
        let mut v = self.take_buf(!overwritten);
        if !whole && b * e < d.base_size {
            let _g = self.seg_barrier.read();
            let txn = self.db.begin_read()?;
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

    /// Reads the persisted bytes of `[off, off + buf.len())` (holes as zeros; no size clipping).
    pub(crate) fn read_persisted(
        &self,
        txn: &ReadTransaction,
        ino: Ino,
        off: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        // Byte ranges of `buf` written below; the rest is zeroed at the end instead of zeroing
        // the whole buffer first (every byte of a cold sequential read is overwritten anyway).
        let mut written: Vec<(usize, usize)> = Vec::new();
        let end = off + buf.len() as u64;
        let rec = inode_in(txn, ino)?;
        if let Some(i) = &rec.inline {
            let data = decode_inline(ino, i)?;
            let (s, e) = (off.min(data.len() as u64), end.min(data.len() as u64));
            if s < e {
                buf[..(e - s) as usize].copy_from_slice(&data[s as usize..e as usize]);
                written.push((0, (e - s) as usize));
            }
        }
        let map = txn.open_table(meta::EXTMAP)?;
        let extents = txn.open_table(meta::EXTENTS)?;
        let mut entries = Vec::new();
        if let Some(r) = map.range((ino, 0)..(ino, off))?.next_back() {
            let (k, v) = r?;
            entries.push((k.value().1, dec(MapRec::decode(v.value()))?));
        }
        for r in map.range((ino, off)..(ino, end))? {
            let (k, v) = r?;
            entries.push((k.value().1, dec(MapRec::decode(v.value()))?));
        }
        for (foff, m) in entries {
            let (s, e) = (foff.max(off), (foff + m.len as u64).min(end));
            if s >= e {
                continue;
            }
            let xr = match extents.get(m.extent)? {
                Some(v) => dec(ExtentRec::decode(v.value()))?,
                None => {
                    return Err(Error::Corrupt {
                        ino,
                        offset: s,
                        segment: 0,
                        seg_offset: 0,
                        detail: format!("extent {} is missing from the metadata", m.extent),
                    })
                }
            };
            let dst = (s - off) as usize..(e - off) as usize;
            // The read wants the whole extent: decode it straight into the caller's buffer
            // (checksum verified as always) and leave the cache alone, since a sequential
            // reader will not ask for these bytes again (the kernel's page cache holds them).
            let whole = m.ext_offset == 0 && dst.len() as u64 == xr.raw_len as u64;
            if whole && !self.extent_cached(m.extent) {
                self.extent_into(m.extent, &xr, ino, s, &mut buf[dst.clone()])?;
                written.push((dst.start, dst.end));
                continue;
            }
            let data = self.extent_data(m.extent, &xr, ino, s)?;
            let src = (m.ext_offset as u64 + (s - foff)) as usize;
            let n = (e - s) as usize;
            if src + n > data.len() {
                return Err(Error::Corrupt {
                    ino,
                    offset: s,
                    segment: xr.segment,
                    seg_offset: xr.seg_offset,
                    detail: "map entry reaches past the end of its extent".into(),
                });
            }
            buf[dst.clone()].copy_from_slice(&data[src..src + n]);
            written.push((dst.start, dst.end));
        }
        zero_unwritten(buf, &mut written);
        Ok(())
    }

    /// Whether extent `id` is in the decompressed-extent cache (counts as a use of it).
    fn extent_cached(&self, id: u64) -> bool {
        lock(&self.cache).contains(id)
    }

    /// Reads, verifies and decodes extent `id` into `out` (exactly its raw length), without
    /// going through the cache. Call with `seg_barrier` held.
    fn extent_into(
        &self,
        id: u64,
        xr: &ExtentRec,
        ino: Ino,
        file_off: u64,
        out: &mut [u8],
    ) -> Result<()> {
        self.counters.cache_misses.fetch_add(1, Ordering::Relaxed);
        self.with_stored(xr, |raw| verify_extent_into(id, xr, raw, out))
            .map_err(|detail| damaged(ino, file_off, xr, detail))
    }

    /// The uncompressed bytes of an extent, verified (cached). Call with `seg_barrier` held.
    pub(crate) fn extent_data(
        &self,
        id: u64,
        xr: &ExtentRec,
        ino: Ino,
        file_off: u64,
    ) -> Result<Arc<Vec<u8>>> {
        if let Some(v) = lock(&self.cache).get(id) {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(v);
        }
        // `loading` has LOAD_STRIPES entries, so the index is in bounds.
        let _loading = lock(&self.loading[(id % crate::store::LOAD_STRIPES as u64) as usize]);
        if let Some(v) = lock(&self.cache).get(id) {
            // Another thread loaded it while we waited.
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(v);
        }
        self.counters.cache_misses.fetch_add(1, Ordering::Relaxed);
        let data = self
            .load_extent(id, xr)
            .map_err(|detail| damaged(ino, file_off, xr, detail))?;
        let data = Arc::new(data);
        lock(&self.cache).insert(id, data.clone());
        Ok(data)
    }

    /// Reads, checks and decodes an extent; the error is a description of the damage.
    pub(crate) fn load_extent(
        &self,
        id: u64,
        xr: &ExtentRec,
    ) -> std::result::Result<Vec<u8>, String> {
        self.with_stored(xr, |raw| verify_extent(id, xr, raw))
    }

    /// Reads an extent's header and stored bytes into this thread's reused buffer and hands
    /// them to `f`; the error is a description of the damage.
    fn with_stored<R>(
        &self,
        xr: &ExtentRec,
        f: impl FnOnce(&[u8]) -> std::result::Result<R, String>,
    ) -> std::result::Result<R, String> {
        let file = self
            .seg_file(xr.segment)
            .map_err(|e| format!("segment unreadable: {e}"))?;
        RAW_BUF.with(|cell| {
            let mut raw = cell.borrow_mut();
            let len = EXT_HEADER_LEN + xr.stored_len as usize;
            // Only ever grown (shrinking and regrowing would zero bytes again);
            // read_exact_at overwrites all `len` bytes used.
            if raw.len() < len {
                raw.resize(len, 0);
            }
            file.read_exact_at(&mut raw[..len], xr.seg_offset)
                .map_err(|e| format!("read failed: {e}"))?;
            f(&raw[..len])
        })
    }

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
                let e = self.sb.extent_size as usize;
                self.dirty_bytes.fetch_sub(blocks * e, Ordering::Relaxed);
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
        let e = self.sb.extent_size as u64;
        let policy = self.file_policy(ino)?;
        let inline_ok = d.size <= self.sb.inline_max as u64;
        let ids = d.live_blocks(e);
        let mut jobs: Vec<EncodeJob> = Vec::with_capacity(ids.len());
        let mut mine = Vec::with_capacity(ids.len());
        for b in ids {
            let Some(v) = d.blocks.remove(&b) else {
                continue;
            };
            let a = Arc::new(v);
            d.flying.insert(b, a.clone());
            mine.push((b, a.clone()));
            let len = (d.size - b * e).min(e) as usize;
            let inline = inline_ok && b == 0;
            jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                (encode_block(enc, &policy, b, &a[..len], inline), a)
            }));
        }
        let (rx, n) = self.submit_grouped(jobs);
        d.pending.push_back(Pending {
            rx,
            n,
            meta: FlushMeta {
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

    /// Queues jobs on the pool in a few groups (about two per worker), so that a batch costs a
    /// few thread wake-ups instead of one per extent. Returns the channel and group count.
    fn submit_grouped(
        &self,
        jobs: Vec<EncodeJob>,
    ) -> (std::sync::mpsc::Receiver<(usize, Vec<EncodedBlock>)>, usize) {
        let groups = (self.pool.threads * 2).clamp(1, jobs.len().max(1));
        let per = jobs.len().div_ceil(groups).max(1);
        let mut grouped: Vec<Vec<EncodeJob>> = Vec::new();
        let mut it = jobs.into_iter().peekable();
        while it.peek().is_some() {
            grouped.push(it.by_ref().take(per).collect());
        }
        let n = grouped.len();
        let rx = self.pool.submit(
            grouped
                .into_iter()
                .map(|g| {
                    move |enc: &mut compfs_codec::ExtentEncoder| {
                        g.into_iter().map(|j| j(enc)).collect::<Vec<EncodedBlock>>()
                    }
                })
                .collect(),
        );
        (rx, n)
    }

    /// A block buffer of `extent_size` bytes, reused when one is free (zeroed when asked).
    pub(crate) fn take_buf(&self, zero: bool) -> Vec<u8> {
        let e = self.sb.extent_size as usize;
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
    pub(crate) fn writeback_one(&self, ino: Ino) {
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
        let e = self.sb.extent_size as u64;
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
                    (self.stage_encoded(ino, results), keep)
                });
            let meta = FlushMeta {
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
        let res = self.write(false, |w| {
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
                        .fetch_sub(n * e as usize, Ordering::Relaxed);
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

    /// Flushes everything buffered in `d` synchronously, keeping `d` as an empty buffer.
    fn flush_sync_inner(&self, ino: Ino, d: &mut Dirty) -> Result<()> {
        let blocks = d.blocks.len() + d.partial.len();
        match self.flush_dirty(ino, d, false, None) {
            Ok(()) | Err(Error::NotFound) => {
                self.dirty_bytes
                    .fetch_sub(blocks * self.sb.extent_size as usize, Ordering::Relaxed);
                d.base_size = d.size;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Waits for and commits every batch started by [`Inner::start_async_flush`], in order.
    pub(crate) fn finish_pending(&self, ino: Ino, d: &mut Dirty) -> Result<()> {
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
                    .fetch_sub(flown * self.sb.extent_size as usize, Ordering::Relaxed);
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

    /// Compresses the buffered blocks and written ranges of partial blocks of `d` under
    /// `policy`, taking the blocks out of the buffer (callers put them back from the results
    /// if the commit fails): one job on this thread, more on the worker pool.
    fn encode_dirty(
        &self,
        ino: Ino,
        d: &mut Dirty,
        policy: ExtentPolicy,
    ) -> Result<Vec<EncodedBlock>> {
        let e = self.sb.extent_size as u64;
        let inline_ok = d.size <= self.sb.inline_max as u64;
        // Partial blocks whose map is already fragmented, or that hold inline data, are
        // rewritten whole; this bounds the extents one block can pin.
        let parts: Vec<u64> = d.partial.keys().copied().collect();
        if !parts.is_empty() {
            let mut promote = Vec::new();
            {
                let txn = self.db.begin_read()?;
                let rec = inode_in(&txn, ino)?;
                let map = txn.open_table(meta::EXTMAP)?;
                for &b in &parts {
                    let n = map.range((ino, b * e)..(ino, b * e + e))?.count();
                    if n >= MAX_BLOCK_PIECES || (b == 0 && rec.inline.is_some()) {
                        promote.push(b);
                    }
                }
            }
            for b in promote {
                self.load_block(ino, d, b, false, false)?;
            }
        }
        let live = d.live_blocks(e);
        let mut jobs: Vec<EncodeJob> = Vec::with_capacity(live.len());
        for b in live {
            let Some(src) = d.blocks.remove(&b) else {
                continue;
            };
            let src = Arc::new(src);
            let len = (d.size - b * e).min(e) as usize;
            let inline = inline_ok && b == 0;
            jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                (encode_block(enc, &policy, b, &src[..len], inline), src)
            }));
        }
        for (&b, p) in &d.partial {
            let blen = (d.size.saturating_sub(b * e)).min(e) as usize;
            for &(rs, re) in &p.ranges {
                let re = re.min(blen);
                if rs >= re {
                    continue;
                }
                let src = p.data.clone();
                jobs.push(Box::new(move |enc: &mut compfs_codec::ExtentEncoder| {
                    let mut en = encode_block(enc, &policy, b, &src[rs..re], false);
                    en.off = rs;
                    en.full = false;
                    (en, src)
                }));
            }
        }
        let results: Vec<EncodedBlock> = if jobs.len() == 1 {
            // One block: compress on this thread, no hand-off.
            jobs.into_iter()
                .map(|j| ENCODER.with(|enc| j(&mut enc.borrow_mut())))
                .collect()
        } else {
            let (rx, n) = self.submit_grouped(jobs);
            let mut v = Vec::new();
            for _ in 0..n {
                match rx.recv() {
                    Ok((_, r)) => v.extend(r),
                    Err(_) => {
                        return Err(Error::Io(std::io::Error::other("compression worker lost")))
                    }
                }
            }
            v
        };
        Ok(results)
    }

    /// Appends encoded blocks to a segment and commits them (see the commit protocol in
    /// docs/format.md).
    fn commit_encoded(
        &self,
        ino: Ino,
        meta: &FlushMeta,
        durable: bool,
        results: Vec<EncodedBlock>,
    ) -> Result<()> {
        let staged = self.stage_encoded(ino, results)?;
        let res = self.write(durable, |w| {
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

    fn put_next_extent(&self, w: &mut W<'_>) -> Result<()> {
        let next = self.next_extent.load(Ordering::SeqCst);
        w.meta_mut()?
            .insert(meta::NEXT_EXTENT, next.to_le_bytes().as_slice())?;
        Ok(())
    }

    /// Lays out encoded blocks as extents, appends them to the active segment (pinned until
    /// [`Inner::finish_staged`]) and notes the segment as unsynced.
    fn stage_encoded(&self, ino: Ino, results: Vec<EncodedBlock>) -> Result<Staged> {
        let e = self.sb.extent_size as u64;
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
            let (id, f, off) = self.append_parts(&parts)?;
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
    fn apply_flush(&self, w: &mut W<'_>, ino: Ino, d: &FlushMeta, st: &Staged) -> Result<()> {
        let (encoded, placed, seg) = (&st.encoded, &st.placed, st.seg);
        let e = self.sb.extent_size as u64;
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
                            segment: seg_id,
                            seg_offset: seg_off,
                            stored_len: h.stored_len,
                            raw_len: h.raw_len,
                            codec: h.codec,
                            level: h.level,
                            crc: h.crc,
                            refs: 0,
                            ino,
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
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Applies a truncation to the buffer and flushes.
    pub(crate) fn truncate_locked(&self, ino: Ino, st: &mut FileState, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::InvalidArgument("file size too large".into()));
        }
        let e = self.sb.extent_size as u64;
        let d = self.ensure_dirty(ino, st)?;
        if size < d.size {
            let keep = size.div_ceil(e);
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
            if size % e != 0 {
                let b = size / e;
                self.load_block(ino, d, b, false, false)?;
                if let Some(v) = d.blocks.get_mut(&b) {
                    v[(size % e) as usize..].fill(0);
                }
            }
        }
        d.size = size;
        let now = Timestamp::now();
        d.mtime = now;
        lock(&self.patches).clear_mtime(ino);
        d.ctime = now;
        self.flush_locked(ino, st, false)
    }
}

pub(crate) fn inode_in(txn: &ReadTransaction, ino: Ino) -> Result<InodeRec> {
    let t = txn.open_table(meta::INODES)?;
    match t.get(ino)? {
        Some(v) => dec(InodeRec::decode(v.value())),
        None => Err(Error::NotFound),
    }
}

/// Checks an extent read from its segment (header + stored bytes) against its record and
/// decodes it.
pub(crate) fn verify_extent(
    id: u64,
    xr: &ExtentRec,
    raw: &[u8],
) -> std::result::Result<Vec<u8>, String> {
    let mut out = vec![0u8; xr.raw_len as usize];
    verify_extent_into(id, xr, raw, &mut out)?;
    Ok(out)
}

/// Like [`verify_extent`], decoding into `out`, which must be exactly `xr.raw_len` bytes long
/// and is fully overwritten on success (left in an unspecified state on failure).
pub(crate) fn verify_extent_into(
    id: u64,
    xr: &ExtentRec,
    raw: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let h = ExtentHeader::decode(&raw[..EXT_HEADER_LEN.min(raw.len())])?;
    if h.id != id || h.raw_len != xr.raw_len || h.stored_len != xr.stored_len || h.codec != xr.codec
    {
        return Err(format!(
            "extent header does not match the metadata (header id {} len {}/{}, expected id {id} len {}/{})",
            h.id, h.stored_len, h.raw_len, xr.stored_len, xr.raw_len
        ));
    }
    if out.len() != h.raw_len as usize {
        return Err(format!(
            "output buffer of {} bytes for an extent of {} bytes",
            out.len(),
            h.raw_len
        ));
    }
    let stored = &raw[EXT_HEADER_LEN..];
    let crc = crc32c::crc32c(stored);
    if crc != xr.crc || crc != h.crc {
        return Err(format!(
            "checksum mismatch: stored bytes have crc32c {crc:08x}, expected {:08x}",
            xr.crc
        ));
    }
    let alg = Algorithm::from_id(h.codec).ok_or_else(|| format!("unknown codec {}", h.codec))?;
    DECOMPRESSOR
        .with(|d| d.borrow_mut().decompress(alg, stored, out))
        .map_err(|e| format!("undecodable: {e}"))
}

/// The error for a damaged extent met while reading `ino` at `file_off`, logged once here.
fn damaged(ino: Ino, file_off: u64, xr: &ExtentRec, detail: String) -> Error {
    let err = Error::Corrupt {
        ino,
        offset: file_off,
        segment: xr.segment,
        seg_offset: xr.seg_offset,
        detail,
    };
    tracing::error!("compfs: {err}");
    err
}

/// Zeroes every byte of `buf` outside the (possibly overlapping, unsorted) `written` ranges.
fn zero_unwritten(buf: &mut [u8], written: &mut [(usize, usize)]) {
    written.sort_unstable();
    let mut pos = 0;
    for &(s, e) in written.iter() {
        if s > pos {
            buf[pos..s].fill(0);
        }
        pos = pos.max(e);
    }
    if pos < buf.len() {
        buf[pos..].fill(0);
    }
}

/// Compressed batches of a file a writer leaves queued (see `start_async_flush`).
const PIPELINE_BATCHES: usize = 2;

/// Pooled buffers of each kind kept while idle.
const IDLE_BUFS: usize = 8;

/// Compressed-extent buffers, passed from the compression workers to the committing thread and
/// back: a steady write reuses the same memory instead of allocating (and page-faulting) one
/// per extent in a worker and freeing it in another thread. Holds at most [`OUT_BUFS_BYTES`]
/// of capacity (shared by every store of the process); trimmed when idle.
static OUT_BUFS: Mutex<OutBufs> = Mutex::new(OutBufs {
    bufs: Vec::new(),
    bytes: 0,
});
/// Most capacity [`OUT_BUFS`] keeps: what the default dirty limit can have in flight.
const OUT_BUFS_BYTES: usize = 64 << 20;

struct OutBufs {
    bufs: Vec<Vec<u8>>,
    /// Sum of the capacities of `bufs`.
    bytes: usize,
}

fn take_out_buf() -> Vec<u8> {
    let mut p = lock(&OUT_BUFS);
    match p.bufs.pop() {
        Some(v) => {
            p.bytes -= v.capacity();
            v
        }
        None => Vec::new(),
    }
}

fn give_out_buf(mut v: Vec<u8>) {
    v.clear();
    let mut p = lock(&OUT_BUFS);
    if p.bytes + v.capacity() <= OUT_BUFS_BYTES {
        p.bytes += v.capacity();
        p.bufs.push(v);
    }
}

/// Frees pooled output buffers beyond `keep` (the background flusher calls it when idle).
pub(crate) fn trim_out_bufs(keep: usize) {
    let mut p = lock(&OUT_BUFS);
    while p.bufs.len() > keep {
        if let Some(v) = p.bufs.pop() {
            p.bytes -= v.capacity();
        }
    }
}

/// The whole blocks among `results`, kept until their commit succeeded.
fn whole_blocks(results: &[EncodedBlock]) -> Vec<(u64, Arc<Vec<u8>>)> {
    results
        .iter()
        .filter(|(en, _)| en.full)
        .map(|(en, a)| (en.block, a.clone()))
        .collect()
}

fn encode_block(
    enc: &mut compfs_codec::ExtentEncoder,
    policy: &ExtentPolicy,
    block: u64,
    src: &[u8],
    inline: bool,
) -> Encoded {
    let len = src.len();
    if src.iter().all(|&b| b == 0) {
        return Encoded {
            block,
            off: 0,
            full: true,
            len,
            out: Out::Hole,
        };
    }
    if inline {
        if !policy.spec.is_none() {
            let mut dst = Vec::new();
            if let Ok(n) = enc.compressor.compress(policy.spec, src, &mut dst) {
                if n < len {
                    dst.truncate(n);
                    return Encoded {
                        block,
                        off: 0,
                        full: true,
                        len,
                        out: Out::Inline(Inline {
                            codec: policy.spec.algorithm().id(),
                            level: policy.spec.level() as i8,
                            raw_len: len as u32,
                            bytes: dst,
                        }),
                    };
                }
            }
        }
        return Encoded {
            block,
            off: 0,
            full: true,
            len,
            out: Out::Inline(Inline {
                codec: 0,
                level: 0,
                raw_len: len as u32,
                bytes: src.to_vec(),
            }),
        };
    }
    let (outcome, dst) = SCRATCH.with(|scratch| {
        let mut dst = scratch.borrow_mut();
        let outcome = match enc.encode(policy, src, &mut dst) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("compfs: compressor failed ({e}); storing extent raw");
                ExtentOutcome::Raw(RawReason::NotWorthIt)
            }
        };
        let out = match outcome {
            // Hand the scratch buffer itself over (the committing thread returns it to the
            // pool once written) and continue with a pooled one: no copy, no allocation.
            ExtentOutcome::Compressed { len: n } => {
                let mut v = std::mem::replace(&mut *dst, take_out_buf());
                v.truncate(n);
                v
            }
            ExtentOutcome::Raw(_) => Vec::new(),
        };
        (outcome, out)
    });
    let out = match outcome {
        ExtentOutcome::Compressed { .. } => Out::Extent {
            codec: policy.spec.algorithm().id(),
            level: policy.spec.level() as i8,
            crc: crc32c::crc32c(&dst),
            stored: Some(dst),
            reason: None,
        },
        ExtentOutcome::Raw(r) => Out::Extent {
            codec: 0,
            level: 0,
            stored: None,
            reason: Some(r),
            crc: crc32c::crc32c(src),
        },
    };
    Encoded {
        block,
        off: 0,
        full: true,
        len,
        out,
    }
}

impl Store {
    /// Reads up to `buf.len()` bytes at `offset`; short only at end of file. Holes read as zeros.
    pub fn read(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let inner = &self.inner;
        if let Some(a) = inner.existing_file(ino) {
            let g = lock(&a);
            if let Some(d) = &g.dirty {
                let n = read_dirty(inner, ino, d, offset, buf)?;
                inner
                    .counters
                    .user_read
                    .fetch_add(n as u64, Ordering::Relaxed);
                return Ok(n);
            }
        }
        let _g = inner.seg_barrier.read();
        let txn = inner.db.begin_read()?;
        let rec = inode_in(&txn, ino)?;
        if rec.kind != FileKind::File {
            return Err(kind_error(rec.kind));
        }
        if offset >= rec.size {
            return Ok(0);
        }
        let n = ((rec.size - offset).min(buf.len() as u64)) as usize;
        inner.read_persisted(&txn, ino, offset, &mut buf[..n])?;
        inner
            .counters
            .user_read
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Writes `data` at `offset` (buffered; durable after [`Store::fsync`] or [`Store::sync`]).
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        let inner = &self.inner;
        inner.check_writable()?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::InvalidArgument("write beyond the maximum file size".into()))?;
        let e = inner.sb.extent_size as u64;
        inner.with_file(ino, |st| {
            let d = inner.ensure_dirty(ino, st)?;
            if data.is_empty() {
                return Ok(0);
            }
            let mut pos = offset;
            while pos < end {
                let b = pos / e;
                let bstart = b * e;
                let s = (pos - bstart) as usize;
                let n = ((end - pos) as usize).min(e as usize - s);
                let whole = s == 0 && n == e as usize;
                let from = (pos - offset) as usize;
                let fresh = whole || bstart >= d.base_size;
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
                pos += n as u64;
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
        let e = inner.sb.extent_size as u64;
        inner.with_file(ino, |st| {
            let d = inner.ensure_dirty(ino, st)?;
            let end = offset.saturating_add(len).min(d.size);
            if offset < end {
                let mut b = offset / e;
                while b * e < end {
                    let (bs, be) = (b * e, (b * e + e).min(d.size));
                    if offset <= bs && be <= end {
                        if d.blocks.remove(&b).is_some() || d.partial.remove(&b).is_some() {
                            inner.dirty_bytes.fetch_sub(e as usize, Ordering::Relaxed);
                        }
                        d.punch.push((bs, bs + e));
                    } else {
                        inner.load_block(ino, d, b, false, false)?;
                        if let Some(v) = d.blocks.get_mut(&b) {
                            let s = offset.max(bs) - bs;
                            let t = end.min(be) - bs;
                            v[s as usize..t as usize].fill(0);
                        }
                    }
                    b += 1;
                }
                let now = Timestamp::now();
                d.mtime = now;
                lock(&inner.patches).clear_mtime(ino);
                d.ctime = now;
            }
            inner.flush_locked(ino, st, false)
        })
    }

    /// `fallocate` default mode: extends the size unless `keep_size`. compfs allocates space
    /// when data is written (compressed size is unknown in advance), so no space is reserved.
    pub fn allocate(&self, ino: Ino, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::InvalidArgument("range beyond the maximum file size".into()))?;
        inner.with_file(ino, |st| {
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
        let txn = inner.db.begin_read()?;
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
            match v.last_mut() {
                Some(last) if last.1 == s => last.1 = s + m.len as u64,
                _ => v.push((s, s + m.len as u64)),
            }
        }
        Ok((v, rec.size))
    }

    /// `SEEK_DATA`: the first data at or after `offset` ([`Error::NoData`] if none).
    pub fn seek_data(&self, ino: Ino, offset: u64) -> Result<u64> {
        let (regions, size) = self.data_regions(ino)?;
        if offset >= size {
            return Err(Error::NoData);
        }
        for (s, e) in regions {
            if e > offset {
                return Ok(s.max(offset));
            }
        }
        Err(Error::NoData)
    }

    /// `SEEK_HOLE`: the first hole at or after `offset` (end of file counts as a hole).
    pub fn seek_hole(&self, ino: Ino, offset: u64) -> Result<u64> {
        let (regions, size) = self.data_regions(ino)?;
        if offset >= size {
            return Err(Error::NoData);
        }
        let mut pos = offset;
        for (s, e) in regions {
            if s > pos {
                break;
            }
            if e > pos {
                pos = e;
            }
        }
        Ok(pos.min(size))
    }

    /// Makes the file's data and metadata (and everything acknowledged before) durable.
    pub fn fsync(&self, ino: Ino, _datasync: bool) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        inner.with_file(ino, |st| inner.flush_locked(ino, st, true))?;
        inner.maybe_forget(ino);
        Ok(())
    }

    /// Rewrites a file's data with `policy` (default: the file's own policy), like
    /// `btrfs filesystem defragment -c`.
    pub fn recompress(&self, ino: Ino, policy: Option<(CodecSpec, Mode)>) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        let e = inner.sb.extent_size as u64;
        let pol = match policy {
            Some((s, m)) => ExtentPolicy::new(s, m),
            None => inner.file_policy(ino)?,
        };
        inner.with_file(ino, |st| {
            inner.flush_locked(ino, st, false)?;
            let (regions, size) = {
                let txn = inner.db.begin_read()?;
                let rec = inode_in(&txn, ino)?;
                if rec.kind != FileKind::File {
                    return Err(kind_error(rec.kind));
                }
                let map = txn.open_table(meta::EXTMAP)?;
                let mut blocks = BTreeSet::new();
                if rec.inline.is_some() {
                    blocks.insert(0u64);
                }
                for r in map.range((ino, 0)..=(ino, u64::MAX))? {
                    let (k, m) = r?;
                    let m = dec(MapRec::decode(m.value()))?;
                    let s = k.value().1;
                    let last = (s + m.len as u64 - 1) / e;
                    for b in s / e..=last {
                        blocks.insert(b);
                    }
                }
                (blocks, rec.size)
            };
            let list: Vec<u64> = regions.into_iter().collect();
            let rec = inner.inode(ino)?;
            for chunk in list.chunks(inner.tuning.flush_blocks.max(2)) {
                let mut d = Dirty {
                    blocks: BTreeMap::new(),
                    flying: BTreeMap::new(),
                    pending: Default::default(),
                    partial: BTreeMap::new(),
                    size,
                    base_size: size,
                    mtime: rec.mtime,
                    ctime: Timestamp::now(),
                    punch: Vec::new(),
                };
                for &b in chunk {
                    let mut v = vec![0u8; e as usize];
                    let _g = inner.seg_barrier.read();
                    let txn = inner.db.begin_read()?;
                    inner.read_persisted(&txn, ino, b * e, &mut v)?;
                    d.blocks.insert(b, v);
                }
                inner
                    .flush_dirty(ino, &mut d, false, Some(pol))
                    .map_err(|er| inner.fail(er))?;
            }
            Ok(())
        })
    }

    /// compsize figures for files and (recursively) directories; each file and each extent is
    /// counted once.
    pub fn usage(&self, inos: &[Ino]) -> Result<Usage> {
        self.inner.flush_all(false)?;
        let txn = self.inner.db.begin_read()?;
        let dirents = txn.open_table(meta::DIRENTS)?;
        let map = txn.open_table(meta::EXTMAP)?;
        let extents = txn.open_table(meta::EXTENTS)?;
        let mut seen = BTreeSet::new();
        let mut todo: Vec<Ino> = inos.to_vec();
        let mut files = Vec::new();
        while let Some(ino) = todo.pop() {
            if !seen.insert(ino) {
                continue;
            }
            let rec = inode_in(&txn, ino)?;
            match rec.kind {
                FileKind::Dir => {
                    for r in dirents.range((ino, &[][..])..(ino + 1, &[][..]))? {
                        let (_, v) = r?;
                        let de = dec(crate::format::DirentRec::decode(v.value()))?;
                        todo.push(de.ino);
                    }
                }
                FileKind::File => files.push((ino, rec)),
                _ => {}
            }
        }
        let mut u = Usage::default();
        let mut ext_seen = BTreeSet::new();
        for (ino, rec) in files {
            u.files += 1;
            if let Some(i) = &rec.inline {
                u.inline += 1;
                let name = Algorithm::from_id(i.codec).map_or("none", |a| a.name());
                let c = u.per_codec.entry(name.to_string()).or_default();
                c.disk += i.bytes.len() as u64;
                c.uncompressed += i.raw_len as u64;
                c.referenced += i.raw_len as u64;
            }
            for r in map.range((ino, 0)..=(ino, u64::MAX))? {
                let (_, v) = r?;
                let m = dec(MapRec::decode(v.value()))?;
                u.refs += 1;
                let xr = match extents.get(m.extent)? {
                    Some(v) => dec(ExtentRec::decode(v.value()))?,
                    None => continue,
                };
                let name = Algorithm::from_id(xr.codec).map_or("none", |a| a.name());
                let c = u.per_codec.entry(name.to_string()).or_default();
                c.referenced += m.len as u64;
                if ext_seen.insert(m.extent) {
                    u.regular_extents += 1;
                    c.disk += xr.stored_len as u64;
                    c.uncompressed += xr.raw_len as u64;
                }
            }
        }
        let mut t = CodecUsage::default();
        for c in u.per_codec.values() {
            t.add(c);
        }
        u.total = t;
        Ok(u)
    }
}

fn read_dirty(inner: &Inner, ino: Ino, d: &Dirty, offset: u64, buf: &mut [u8]) -> Result<usize> {
    if offset >= d.size {
        return Ok(0);
    }
    let n = ((d.size - offset).min(buf.len() as u64)) as usize;
    let e = inner.sb.extent_size as u64;
    let end = offset + n as u64;
    let mut pos = offset;
    let mut persisted: Option<(std::sync::RwLockReadGuard<'_, ()>, ReadTransaction)> = None;
    while pos < end {
        let b = pos / e;
        let s = (pos - b * e) as usize;
        let k = ((end - pos) as usize).min(e as usize - s);
        let out = &mut buf[(pos - offset) as usize..(pos - offset) as usize + k];
        if let Some(v) = d.blocks.get(&b) {
            out.copy_from_slice(&v[s..s + k]);
        } else if let Some(v) = d.flying.get(&b) {
            out.copy_from_slice(&v[s..s + k]);
        } else if pos >= d.base_size && !d.partial.contains_key(&b) {
            out.fill(0);
        } else {
            // Persisted bytes (one snapshot for the whole read), then any partial writes.
            if persisted.is_none() {
                let g = inner.seg_barrier.read().unwrap_or_else(|p| p.into_inner());
                let txn = inner.db.begin_read()?;
                persisted = Some((g, txn));
            }
            if let Some((_, txn)) = &persisted {
                inner.read_persisted(txn, ino, pos, out)?;
            }
            if let Some(p) = d.partial.get(&b) {
                p.overlay(s, out);
            }
        }
        pos += k as u64;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The output-buffer pool keeps at most its byte budget, whatever the buffers' sizes, and
    /// a trim frees down to the count asked.
    #[test]
    fn output_buffer_pool_is_bounded_in_bytes() {
        for _ in 0..100 {
            give_out_buf(Vec::with_capacity(1 << 20));
        }
        {
            let p = lock(&OUT_BUFS);
            assert!(p.bytes <= OUT_BUFS_BYTES, "{} bytes pooled", p.bytes);
            let sum: usize = p.bufs.iter().map(|v| v.capacity()).sum();
            assert_eq!(sum, p.bytes);
        }
        let v = take_out_buf();
        assert!(v.capacity() >= 1 << 20 && v.is_empty());
        give_out_buf(v);
        trim_out_bufs(3);
        let p = lock(&OUT_BUFS);
        assert!(p.bufs.len() <= 3);
        assert_eq!(p.bufs.iter().map(|v| v.capacity()).sum::<usize>(), p.bytes);
    }
}
