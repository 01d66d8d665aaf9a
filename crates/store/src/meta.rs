//! The metadata tables and the transactional helpers that keep their invariants: extent
//! reference counts, per-segment live bytes and per-codec statistics change together with the
//! extent map in one transaction.

use std::cell::{Cell, OnceCell};

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use crate::error::{Error, Result};
use crate::pack::{pack_share, PACK_OWNER};
use crate::records::{
    DecodeError, DirentRec, ExtentRec, Inline, InodeRec, MapRec, SegmentRec, StatRec, STAT_INLINE,
};
use crate::span;
use crate::types::{FileKind, Ino};

pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
pub(crate) const DIRENTS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("dirents");
pub(crate) const DIRINDEX: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("dir_index");
pub(crate) const XATTRS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("xattrs");
pub(crate) const EXTMAP: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("extent_map");
pub(crate) const EXTENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("extents");
pub(crate) const SEG_EXTENTS: TableDefinition<(u64, u64), u64> =
    TableDefinition::new("segment_extents");
pub(crate) const SEGMENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("segments");
pub(crate) const STATS: TableDefinition<u8, &[u8]> = TableDefinition::new("stats");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const ORPHANS: TableDefinition<u64, ()> = TableDefinition::new("orphans");
/// Preallocated ranges: (inode, start) -> [`crate::records::PreallocRec`] (see `prealloc`).
pub(crate) const PREALLOC: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("prealloc");
/// Trained zstd dictionaries: id -> [`crate::records::DictRec`] (format version 3, see `dict`).
pub(crate) const DICTS: TableDefinition<u16, &[u8]> = TableDefinition::new("dicts");

pub(crate) const NEXT_INO: &str = "next_ino";
pub(crate) const NEXT_EXTENT: &str = "next_extent";

pub(crate) fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::CorruptMetadata(what.to_string())
}

/// A record that does not decode is damaged metadata.
pub(crate) fn dec<T>(r: std::result::Result<T, DecodeError>) -> Result<T> {
    r.map_err(|e| Error::CorruptMetadata(e.to_string()))
}

pub(crate) fn u64_value(b: &[u8]) -> Result<u64> {
    let a: [u8; 8] = b
        .try_into()
        .map_err(|_| corrupt("counter is not 8 bytes"))?;
    Ok(u64::from_le_bytes(a))
}

/// A table keyed by (inode, name).
type NamedTable<'t> = Table<'t, (u64, &'static [u8]), &'static [u8]>;

/// The tables of one write transaction, each opened on first use: opening all eleven (now twelve) cost
/// about 8 µs per transaction, a quarter of a small one (a create touches five).
pub(crate) struct W<'t> {
    txn: &'t WriteTransaction,
    inodes: OnceCell<Table<'t, u64, &'static [u8]>>,
    dirents: OnceCell<NamedTable<'t>>,
    dirindex: OnceCell<Table<'t, (u64, u64), &'static [u8]>>,
    xattrs: OnceCell<NamedTable<'t>>,
    extmap: OnceCell<Table<'t, (u64, u64), &'static [u8]>>,
    extents: OnceCell<Table<'t, u64, &'static [u8]>>,
    seg_extents: OnceCell<Table<'t, (u64, u64), u64>>,
    segments: OnceCell<Table<'t, u64, &'static [u8]>>,
    stats: OnceCell<Table<'t, u8, &'static [u8]>>,
    meta: OnceCell<Table<'t, &'static str, &'static [u8]>>,
    orphans: OnceCell<Table<'t, u64, ()>>,
    prealloc: OnceCell<Table<'t, (u64, u64), &'static [u8]>>,
    dicts: OnceCell<Table<'t, u16, &'static [u8]>>,
    /// Change of the reserved total in this transaction (applied after commit, see
    /// `Inner::settle`).
    pub reserve_delta: i64,
    /// Extents freed in this transaction (the caller drops them from the cache after commit).
    pub freed: Vec<u64>,
    /// Whether a table was opened for changes: a body that fails after that may have changed
    /// the transaction (see `Inner::write_batched`).
    touched: Cell<bool>,
}

/// `name()` opens (once) and reads table `name`; `name_mut()` opens it for changes.
macro_rules! tables {
    ($($name:ident, $name_mut:ident, $def:ident: $k:ty => $v:ty;)*) => {
        $(
            // Some tables are only ever changed, never read, through `W`.
            #[allow(dead_code)]
            pub(crate) fn $name(&self) -> Result<&Table<'t, $k, $v>> {
                if let Some(t) = self.$name.get() {
                    return Ok(t);
                }
                let t = self.txn.open_table($def)?;
                Ok(self.$name.get_or_init(|| t))
            }

            pub(crate) fn $name_mut(&mut self) -> Result<&mut Table<'t, $k, $v>> {
                self.touched.set(true);
                if self.$name.get().is_none() {
                    let t = self.txn.open_table($def)?;
                    let _ = self.$name.set(t);
                }
                // Set just above when it was empty.
                self.$name
                    .get_mut()
                    .ok_or_else(|| corrupt(concat!("table ", stringify!($name), " not open")))
            }
        )*
    };
}

impl<'t> W<'t> {
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<W<'t>> {
        Ok(W {
            txn,
            inodes: OnceCell::new(),
            dirents: OnceCell::new(),
            dirindex: OnceCell::new(),
            xattrs: OnceCell::new(),
            extmap: OnceCell::new(),
            extents: OnceCell::new(),
            seg_extents: OnceCell::new(),
            segments: OnceCell::new(),
            stats: OnceCell::new(),
            meta: OnceCell::new(),
            orphans: OnceCell::new(),
            prealloc: OnceCell::new(),
            dicts: OnceCell::new(),
            reserve_delta: 0,
            freed: Vec::new(),
            touched: Cell::new(false),
        })
    }

    /// Whether a table was opened for changes in this `W`.
    /// Starts the next body in this transaction: the per-body figures start over (the tables
    /// stay open, see `txn::OpenTxn`).
    pub(crate) fn start_body(&mut self) {
        self.reserve_delta = 0;
        self.freed.clear();
        self.touched.set(false);
    }

    pub(crate) fn touched(&self) -> bool {
        self.touched.get()
    }

    /// Opens (and so creates) every table: a new store must have them all for readers.
    pub(crate) fn create_all(&mut self) -> Result<()> {
        self.inodes_mut()?;
        self.dirents_mut()?;
        self.dirindex_mut()?;
        self.xattrs_mut()?;
        self.extmap_mut()?;
        self.extents_mut()?;
        self.seg_extents_mut()?;
        self.segments_mut()?;
        self.stats_mut()?;
        self.meta_mut()?;
        self.orphans_mut()?;
        self.prealloc_mut()?;
        self.dicts_mut()?;
        Ok(())
    }

    tables! {
        inodes, inodes_mut, INODES: u64 => &'static [u8];
        dirents, dirents_mut, DIRENTS: (u64, &'static [u8]) => &'static [u8];
        dirindex, dirindex_mut, DIRINDEX: (u64, u64) => &'static [u8];
        xattrs, xattrs_mut, XATTRS: (u64, &'static [u8]) => &'static [u8];
        extmap, extmap_mut, EXTMAP: (u64, u64) => &'static [u8];
        extents, extents_mut, EXTENTS: u64 => &'static [u8];
        seg_extents, seg_extents_mut, SEG_EXTENTS: (u64, u64) => u64;
        segments, segments_mut, SEGMENTS: u64 => &'static [u8];
        stats, stats_mut, STATS: u8 => &'static [u8];
        meta, meta_mut, META: &'static str => &'static [u8];
        orphans, orphans_mut, ORPHANS: u64 => ();
        prealloc, prealloc_mut, PREALLOC: (u64, u64) => &'static [u8];
        dicts, dicts_mut, DICTS: u16 => &'static [u8];
    }

    pub(crate) fn inode(&self, ino: Ino) -> Result<InodeRec> {
        match self.inodes()?.get(ino)? {
            Some(v) => dec(InodeRec::decode(v.value())),
            None => Err(Error::NotFound),
        }
    }

    pub(crate) fn put_inode(&mut self, ino: Ino, r: &InodeRec) -> Result<()> {
        self.inodes_mut()?.insert(ino, r.encode().as_slice())?;
        Ok(())
    }

    pub(crate) fn next(&mut self, name: &'static str) -> Result<u64> {
        let cur = match self.meta()?.get(name)? {
            Some(v) => u64_value(v.value())?,
            None => return Err(corrupt(format!("missing counter {name}"))),
        };
        self.meta_mut()?
            .insert(name, (cur + 1).to_le_bytes().as_slice())?;
        Ok(cur)
    }

    pub(crate) fn dirent(&self, dir: Ino, name: &[u8]) -> Result<Option<DirentRec>> {
        match self.dirents()?.get((dir, name))? {
            Some(v) => Ok(Some(dec(DirentRec::decode(v.value()))?)),
            None => Ok(None),
        }
    }

    /// Adds `name → ino` to directory `dir` (whose record `d` gets the next sequence number).
    pub(crate) fn add_dirent(
        &mut self,
        dir: Ino,
        d: &mut InodeRec,
        name: &[u8],
        ino: Ino,
        kind: FileKind,
    ) -> Result<()> {
        let seq = d.next_seq;
        d.next_seq += 1;
        let rec = DirentRec { ino, kind, seq };
        self.dirents_mut()?
            .insert((dir, name), rec.encode().as_slice())?;
        self.dirindex_mut()?.insert((dir, seq), name)?;
        Ok(())
    }

    pub(crate) fn remove_dirent(&mut self, dir: Ino, name: &[u8]) -> Result<DirentRec> {
        let rec = match self.dirents_mut()?.remove((dir, name))? {
            Some(v) => dec(DirentRec::decode(v.value()))?,
            None => return Err(Error::NotFound),
        };
        self.dirindex_mut()?.remove((dir, rec.seq))?;
        Ok(rec)
    }

    /// Replaces the target of an existing entry, keeping its cookie.
    pub(crate) fn retarget_dirent(
        &mut self,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        kind: FileKind,
    ) -> Result<()> {
        let mut rec = self.dirent(dir, name)?.ok_or(Error::NotFound)?;
        rec.ino = ino;
        rec.kind = kind;
        self.dirents_mut()?
            .insert((dir, name), rec.encode().as_slice())?;
        Ok(())
    }

    pub(crate) fn dir_is_empty(&self, dir: Ino) -> Result<bool> {
        Ok(self
            .dirindex()?
            .range((dir, 0)..=(dir, u64::MAX))?
            .next()
            .is_none())
    }

    fn stat_adjust(&mut self, key: u8, d: [i64; 4]) -> Result<()> {
        let mut s = match self.stats()?.get(key)? {
            Some(v) => dec(StatRec::decode(v.value()))?,
            None => StatRec::default(),
        };
        let add = |x: u64, dx: i64| x.saturating_add_signed(dx);
        s.extents = add(s.extents, d[0]);
        s.disk = add(s.disk, d[1]);
        s.uncompressed = add(s.uncompressed, d[2]);
        s.referenced = add(s.referenced, d[3]);
        self.stats_mut()?.insert(key, s.encode().as_slice())?;
        Ok(())
    }

    /// Keeps the inline row of the statistics in step when a regular file's inline data changes.
    pub(crate) fn inline_changed(
        &mut self,
        old: Option<&Inline>,
        new: Option<&Inline>,
    ) -> Result<()> {
        let f = |i: Option<&Inline>| match i {
            Some(i) => [
                1i64,
                i.bytes.len() as i64,
                i.raw_len as i64,
                i.raw_len as i64,
            ],
            None => [0; 4],
        };
        let (a, b) = (f(old), f(new));
        if a != b {
            self.stat_adjust(
                STAT_INLINE,
                [b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3]],
            )?;
        }
        Ok(())
    }

    pub(crate) fn extent(&self, id: u64) -> Result<ExtentRec> {
        match self.extents()?.get(id)? {
            Some(v) => dec(ExtentRec::decode(v.value())),
            None => Err(corrupt(format!("extent {id} referenced but missing"))),
        }
    }

    pub(crate) fn segment(&self, id: u64) -> Result<SegmentRec> {
        match self.segments()?.get(id)? {
            Some(v) => dec(SegmentRec::decode(v.value())),
            None => Ok(SegmentRec::default()),
        }
    }

    pub(crate) fn put_segment(&mut self, id: u64, s: &SegmentRec) -> Result<()> {
        self.segments_mut()?.insert(id, s.encode().as_slice())?;
        Ok(())
    }

    /// A new extent that `ino` references whole at file offset `off` through `m` (what a flush
    /// adds for each block it wrote): the extent record with one reference, its segment index
    /// entry, the segment's live bytes, the codec's statistics row and the map entry. The range
    /// must be free. Returns the change of the inode's disk bytes.
    pub(crate) fn add_mapped_extent(
        &mut self,
        id: u64,
        rec: &ExtentRec,
        ino: Ino,
        off: u64,
        m: MapRec,
    ) -> Result<i64> {
        self.add_extent(id, rec, 1, m.len as u64)?;
        self.extmap_mut()?
            .insert((ino, off), m.encode().as_slice())?;
        Ok(rec.stored_len as i64)
    }

    /// A new extent with `refs` references of `referenced` bytes, whose map entries the caller
    /// inserts (one for a file's own extent, one per file for a packed extent, see `pack`): its
    /// record, its segment index entry, the segment's live bytes and the codec's statistics row.
    pub(crate) fn add_extent(
        &mut self,
        id: u64,
        rec: &ExtentRec,
        refs: u32,
        referenced: u64,
    ) -> Result<()> {
        let rec = ExtentRec { refs, ..*rec };
        self.extents_mut()?.insert(id, rec.encode().as_slice())?;
        self.seg_extents_mut()?
            .insert((rec.segment, rec.seg_offset), id)?;
        let mut s = self.segment(rec.segment)?;
        s.live = s.live.saturating_add(rec.footprint());
        s.len = s.len.max(rec.seg_offset.saturating_add(rec.footprint()));
        self.put_segment(rec.segment, &s)?;
        self.stat_adjust(
            rec.codec,
            [
                1,
                rec.stored_len as i64,
                rec.raw_len as i64,
                referenced as i64,
            ],
        )
    }

    /// Replaces one map entry of `old_len` bytes naming extent `id` by entries of `kept`
    /// lengths naming it: changes its reference count and referenced bytes, and frees it at
    /// zero references. Returns the change of the disk bytes of the inode whose entry it was:
    /// an extent of its own is charged whole until freed, a packed extent by share.
    fn extent_adjust(&mut self, id: u64, old_len: u32, kept: &[u32]) -> Result<i64> {
        let mut rec = self.extent(id)?;
        let refs = rec.refs as i64 - 1 + kept.len() as i64;
        if refs < 0 {
            return Err(corrupt(format!("extent {id} reference count below zero")));
        }
        let kept_bytes: i64 = kept.iter().map(|&l| l as i64).sum();
        self.stat_adjust(rec.codec, [0, 0, 0, kept_bytes - old_len as i64])?;
        let share = |l: u32| pack_share(rec.stored_len, rec.raw_len, l) as i64;
        let packed = rec.ino == PACK_OWNER;
        let disk = if packed {
            kept.iter().map(|&l| share(l)).sum::<i64>() - share(old_len)
        } else {
            0
        };
        if refs == 0 {
            self.extents_mut()?.remove(id)?;
            self.seg_extents_mut()?
                .remove((rec.segment, rec.seg_offset))?;
            let mut s = self.segment(rec.segment)?;
            s.live = s.live.saturating_sub(rec.footprint());
            self.put_segment(rec.segment, &s)?;
            self.stat_adjust(
                rec.codec,
                [-1, -(rec.stored_len as i64), -(rec.raw_len as i64), 0],
            )?;
            self.freed.push(id);
            return Ok(if packed {
                disk
            } else {
                -(rec.stored_len as i64)
            });
        }
        rec.refs = u32::try_from(refs)
            .map_err(|_| corrupt(format!("extent {id} reference count above {}", u32::MAX)))?;
        self.extents_mut()?.insert(id, rec.encode().as_slice())?;
        Ok(disk)
    }

    /// The map entries overlapping `[start, end)`.
    pub(crate) fn map_overlapping(
        &self,
        ino: Ino,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, MapRec)>> {
        let mut out = Vec::new();
        if start >= end {
            return Ok(out);
        }
        if let Some(r) = self.extmap()?.range((ino, 0)..(ino, start))?.next_back() {
            let (k, v) = r?;
            let m = dec(MapRec::decode(v.value()))?;
            let off = k.value().1;
            if off.saturating_add(m.len as u64) > start {
                out.push((off, m));
            }
        }
        for r in self.extmap()?.range((ino, start)..(ino, end))? {
            let (k, v) = r?;
            out.push((k.value().1, dec(MapRec::decode(v.value()))?));
        }
        Ok(out)
    }

    /// Removes the file range `[start, end)` from `ino`'s map, trimming or splitting entries
    /// that cross the bounds (the kept pieces keep referencing the same extent). Returns the
    /// disk-bytes change of the inode.
    pub(crate) fn map_remove_range(&mut self, ino: Ino, start: u64, end: u64) -> Result<i64> {
        let mut disk = 0i64;
        for (off, m) in self.map_overlapping(ino, start, end)? {
            self.extmap_mut()?.remove((ino, off))?;
            let mut kept = Vec::new();
            // The pieces left are computed by `span::cut`; this only writes them.
            let whole = span::Piece {
                file_off: off,
                ext_offset: m.ext_offset,
                len: m.len,
            };
            for p in span::cut(whole, start, end).into_iter().flatten() {
                let rec = MapRec {
                    extent: m.extent,
                    ext_offset: p.ext_offset,
                    len: p.len,
                };
                self.extmap_mut()?
                    .insert((ino, p.file_off), rec.encode().as_slice())?;
                kept.push(p.len);
            }
            disk += self.extent_adjust(m.extent, m.len, &kept)?;
        }
        Ok(disk)
    }

    /// Deletes an inode and everything it owns (map, extents, preallocated ranges, xattrs,
    /// orphan mark).
    pub(crate) fn free_inode(&mut self, ino: Ino) -> Result<()> {
        let rec = self.inode(ino)?;
        self.map_remove_range(ino, 0, u64::MAX)?;
        self.prealloc_remove(ino, 0, u64::MAX)?;
        if rec.kind == FileKind::File {
            self.inline_changed(rec.inline.as_ref(), None)?;
        }
        let names: Vec<Vec<u8>> = self
            .xattrs()?
            .range((ino, &[][..])..(ino + 1, &[][..]))?
            .map(|r| r.map(|(k, _)| k.value().1.to_vec()))
            .collect::<std::result::Result<_, _>>()?;
        for n in names {
            self.xattrs_mut()?.remove((ino, n.as_slice()))?;
        }
        self.orphans_mut()?.remove(ino)?;
        self.inodes_mut()?.remove(ino)?;
        Ok(())
    }
}
