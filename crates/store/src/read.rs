//! The read path: persisted bytes through the extent map, extents read from their segments,
//! verified (checksum, header) and decoded, with the decompressed-extent cache; buffered bytes
//! of dirty files.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use compfs_codec::{Algorithm, Decompressor, Dictionary};
use redb::ReadTransaction;

use crate::dict::StoreDict;
use crate::error::{Error, Result};
use crate::file::{kind_error, Dirty};
use crate::meta::{self, dec};
use crate::records::{ExtentHeader, ExtentRec, Inline, InodeRec, MapRec, EXT_HEADER_LEN};
use crate::span;
use crate::store::{lock, Inner, Store};
use crate::types::*;

thread_local! {
    static DECOMPRESSOR: RefCell<Decompressor> = RefCell::new(Decompressor::new());
    /// Reused buffer for an extent's stored bytes as read from its segment; only the first
    /// header + stored length bytes are meaningful, and they are overwritten on every read.
    static RAW_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The dictionary an extent or inline datum was compressed with, as its decoder takes it:
/// `Ok(None)` for none, `Err(why)` when it is missing or damaged.
pub(crate) type DictRef<'a> = std::result::Result<Option<&'a Dictionary>, String>;

/// A [`DictRef`] of a looked-up dictionary.
pub(crate) fn dict_ref(r: &std::result::Result<Option<Arc<StoreDict>>, String>) -> DictRef<'_> {
    match r {
        Ok(d) => Ok(d.as_ref().map(|d| &d.dict)),
        Err(e) => Err(e.clone()),
    }
}

/// Decompresses `stored` into `out` (exactly the uncompressed length) with codec `codec` and,
/// when `dict_id` is not 0, dictionary `dict`.
fn decompress(
    codec: u8,
    dict_id: u16,
    dict: DictRef<'_>,
    stored: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let alg = Algorithm::from_id(codec).ok_or_else(|| format!("unknown codec {codec}"))?;
    if dict_id == 0 {
        return DECOMPRESSOR
            .with(|d| d.borrow_mut().decompress(alg, stored, out))
            .map_err(|e| format!("undecodable: {e}"));
    }
    if alg != Algorithm::Zstd {
        return Err(format!("{} data names dictionary {dict_id}", alg.name()));
    }
    let d = dict?.ok_or_else(|| format!("dictionary {dict_id} is not loaded"))?;
    DECOMPRESSOR
        .with(|x| x.borrow_mut().decompress_dict(d, stored, out))
        .map_err(|e| format!("undecodable with dictionary {dict_id}: {e}"))
}

/// Checks inline data against its checksum and decodes it (with `dict`, the dictionary it
/// names): a mismatch, a missing or damaged dictionary, or stored bytes that do not decode to
/// exactly the uncompressed length, is `Error::Corrupt` (EIO) and one log line, as for an
/// extent.
pub(crate) fn decode_inline(ino: Ino, i: &Inline, dict: DictRef<'_>) -> Result<Vec<u8>> {
    let corrupt = |detail: String| {
        let err = Error::Corrupt {
            ino,
            offset: 0,
            segment: 0,
            seg_offset: 0,
            detail: format!("inline data: {detail}"),
        };
        tracing::error!("compfs: {err}");
        err
    };
    let crc = crc32c::crc32c(&i.bytes);
    if crc != i.crc {
        return Err(corrupt(format!(
            "checksum mismatch (stored {:08x}, computed {crc:08x})",
            i.crc
        )));
    }
    if i.codec == 0 {
        if i.bytes.len() != i.raw_len as usize || i.dict != 0 {
            return Err(corrupt("raw inline length mismatch".into()));
        }
        return Ok(i.bytes.clone());
    }
    let mut out = vec![0u8; i.raw_len as usize];
    decompress(i.codec, i.dict, dict, &i.bytes, &mut out).map_err(corrupt)?;
    Ok(out)
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
    dict: DictRef<'_>,
) -> std::result::Result<Vec<u8>, String> {
    let mut out = vec![0u8; xr.raw_len as usize];
    verify_extent_into(id, xr, raw, dict, &mut out)?;
    Ok(out)
}

/// Like [`verify_extent`], decoding into `out`, which must be exactly `xr.raw_len` bytes long
/// and is fully overwritten on success (left in an unspecified state on failure).
fn verify_extent_into(
    id: u64,
    xr: &ExtentRec,
    raw: &[u8],
    dict: DictRef<'_>,
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let h =
        ExtentHeader::decode(&raw[..EXT_HEADER_LEN.min(raw.len())]).map_err(|e| e.to_string())?;
    if h.id != id
        || h.raw_len != xr.raw_len
        || h.stored_len != xr.stored_len
        || h.codec != xr.codec
        || h.dict != xr.dict
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
    decompress(h.codec, h.dict, dict, stored, out)
}

/// The error for a damaged extent met while reading `ino` at `file_off`, logged once here.
/// Why an extent could not be read: the device failed (an I/O error) or the extent is damaged
/// or missing (corrupt data). Both are EIO to a reader, but they are logged and reported apart:
/// a failing disk is not a checksum mismatch.
#[derive(Debug)]
enum ExtentFault {
    Io(std::io::Error),
    Damaged(String),
}

impl ExtentFault {
    /// The error for reading extent `id` (record `xr`) for `ino` at `file_off`, logged once here.
    fn into_error(self, id: u64, ino: Ino, file_off: u64, xr: &ExtentRec) -> Error {
        match self {
            ExtentFault::Io(e) => {
                tracing::error!(
                    "compfs: I/O error reading extent {id} of inode {ino} at file offset \
                     {file_off} (segment {} offset {}): {e}",
                    xr.segment,
                    xr.seg_offset
                );
                Error::Io(e)
            }
            ExtentFault::Damaged(detail) => damaged(ino, file_off, xr, detail),
        }
    }
}

pub(crate) fn damaged(ino: Ino, file_off: u64, xr: &ExtentRec, detail: String) -> Error {
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

fn read_dirty(inner: &Inner, ino: Ino, d: &Dirty, offset: u64, buf: &mut [u8]) -> Result<usize> {
    if offset >= d.size {
        return Ok(0);
    }
    let n = ((d.size - offset).min(buf.len() as u64)) as usize;
    let e = d.block;
    let mut persisted: Option<(std::sync::RwLockReadGuard<'_, ()>, ReadTransaction)> = None;
    for sp in span::block_spans(offset, n as u64, e) {
        let (b, s, k) = (sp.block, sp.start, sp.len);
        let pos = offset + sp.from as u64;
        let out = &mut buf[sp.from..sp.from + k];
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
                let txn = inner.read_txn()?;
                persisted = Some((g, txn));
            }
            if let Some((_, txn)) = &persisted {
                inner.read_persisted(txn, ino, pos, out)?;
            }
            if let Some(p) = d.partial.get(&b) {
                p.overlay(s, out);
            }
        }
    }
    Ok(n)
}

impl Inner {
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
            let data = self.inline_data(ino, i)?;
            if let Some((s, e, src)) = span::entry_window(0, data.len() as u32, 0, off, end) {
                let (dst, n) = ((s - off) as usize, (e - s) as usize);
                buf[dst..dst + n].copy_from_slice(&data[src as usize..src as usize + n]);
                written.push((dst, dst + n));
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
            let Some((s, e, src)) = span::entry_window(foff, m.len, m.ext_offset, off, end) else {
                continue;
            };
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
            if let Err(err) = m.check_within(xr.raw_len as u64) {
                return Err(Error::Corrupt {
                    ino,
                    offset: s,
                    segment: xr.segment,
                    seg_offset: xr.seg_offset,
                    detail: err.to_string(),
                });
            }
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
            let n = (e - s) as usize;
            if src + n as u64 > data.len() as u64 {
                return Err(Error::Corrupt {
                    ino,
                    offset: s,
                    segment: xr.segment,
                    seg_offset: xr.seg_offset,
                    detail: "map entry reaches past the end of its extent".into(),
                });
            }
            let src = src as usize;
            buf[dst.clone()].copy_from_slice(&data[src..src + n]);
            written.push((dst.start, dst.end));
        }
        for (a, b) in span::range_gaps(&mut written, buf.len()) {
            buf[a..b].fill(0);
        }
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
        let d = self.dict_for(xr.dict);
        self.with_stored(xr, |raw| verify_extent_into(id, xr, raw, dict_ref(&d), out))
            .map_err(|f| f.into_error(id, ino, file_off, xr))
    }

    /// The dictionary id `id` names (none for 0), loaded once per open; the error says why it
    /// cannot be used.
    pub(crate) fn dict_for(&self, id: u16) -> std::result::Result<Option<Arc<StoreDict>>, String> {
        if id == 0 {
            return Ok(None);
        }
        self.dicts.get(&self.db, id).map(Some)
    }

    /// The checked, decoded bytes of inline data `i` of `ino`.
    pub(crate) fn inline_data(&self, ino: Ino, i: &Inline) -> Result<Vec<u8>> {
        let d = self.dict_for(i.dict);
        decode_inline(ino, i, dict_ref(&d))
    }

    /// The uncompressed bytes of an extent, verified (cached). Call with `seg_barrier` held.
    fn extent_data(
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
            .map_err(|f| f.into_error(id, ino, file_off, xr))?;
        let data = Arc::new(data);
        lock(&self.cache).insert(id, data.clone());
        Ok(data)
    }

    /// Reads, checks and decodes an extent.
    fn load_extent(&self, id: u64, xr: &ExtentRec) -> std::result::Result<Vec<u8>, ExtentFault> {
        let d = self.dict_for(xr.dict);
        self.with_stored(xr, |raw| verify_extent(id, xr, raw, dict_ref(&d)))
    }

    /// Reads an extent's header and stored bytes into this thread's reused buffer and hands
    /// them to `f` (whose error is a description of the damage).
    fn with_stored<R>(
        &self,
        xr: &ExtentRec,
        f: impl FnOnce(&[u8]) -> std::result::Result<R, String>,
    ) -> std::result::Result<R, ExtentFault> {
        let file = self.seg_file(xr.segment).map_err(|e| match e {
            // The device failed to open an existing file.
            Error::Io(io) if io.kind() != std::io::ErrorKind::NotFound => ExtentFault::Io(io),
            // The segment is gone: the data it held is missing.
            e => ExtentFault::Damaged(format!("segment unreadable: {e}")),
        })?;
        RAW_BUF.with(|cell| {
            let mut raw = cell.borrow_mut();
            let len = EXT_HEADER_LEN + xr.stored_len as usize;
            // Only ever grown (shrinking and regrowing would zero bytes again);
            // read_exact_at overwrites all `len` bytes used.
            if raw.len() < len {
                raw.resize(len, 0);
            }
            file.read_exact_at(&mut raw[..len], xr.seg_offset)
                .map_err(|e| match e.kind() {
                    // The segment ends before the extent: its bytes are missing.
                    std::io::ErrorKind::UnexpectedEof => {
                        ExtentFault::Damaged(format!("read failed: {e}"))
                    }
                    _ => ExtentFault::Io(e),
                })?;
            f(&raw[..len]).map_err(ExtentFault::Damaged)
        })
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
        let txn = inner.read_txn()?;
        let rec = inode_in(&txn, ino)?;
        if rec.kind != FileKind::File {
            return Err(kind_error(rec.kind));
        }
        if offset >= rec.size {
            return Ok(0);
        }
        let n = ((rec.size - offset).min(buf.len() as u64)) as usize;
        // Readahead first: its GETs are then on their way while this read waits for its own.
        if inner.tuning.backend.prefetches() {
            if let Some((from, to)) = inner.prefetch.read(ino, offset, n as u64) {
                inner.prefetch_file(&txn, ino, from, to, rec.size);
            }
        }
        inner.read_persisted(&txn, ino, offset, &mut buf[..n])?;
        inner
            .counters
            .user_read
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}
