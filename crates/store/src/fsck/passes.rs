//! The passes of a check, one function each, over the tables loaded once by [`load`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadTransaction, ReadableTable};

use super::dicts::dict_of;
use super::{Ctx, Fixes, ProblemKind};
use crate::backend::{Backend, SegFile};
use crate::error::Result;
use crate::meta;
use crate::pack::{pack_share, PACK_OWNER};
use crate::read::DictRef;
use crate::records::{
    parse_segment_file_name, segment_file_name, DirentRec, ExtentHeader, ExtentRec, InodeRec,
    MapRec, PreallocRec, SegmentHeader, SegmentRec, StatRec, EXT_HEADER_LEN, SEGMENT_DIR,
    SEG_HEADER_LEN, STAT_INLINE,
};
use crate::types::{FileKind, Ino, ROOT_INO};
use crate::FsckReport;

/// The tables of the metadata (records that decode) and the segment files on disk, loaded once
/// for all the passes of a check.
pub(super) struct Loaded {
    pub(super) seg_dir: PathBuf,
    /// How segment bytes are read (the files, or a bucket's objects).
    pub(super) backend: Arc<dyn Backend>,
    pub(super) inodes: BTreeMap<Ino, InodeRec>,
    pub(super) dirents: Vec<(Ino, Vec<u8>, DirentRec)>,
    pub(super) index: BTreeMap<(Ino, u64), Vec<u8>>,
    pub(super) orphans: BTreeSet<Ino>,
    pub(super) extents: BTreeMap<u64, ExtentRec>,
    pub(super) seg_index: BTreeMap<(u64, u64), u64>,
    pub(super) segments: BTreeMap<u64, SegmentRec>,
    pub(super) stats: BTreeMap<u8, StatRec>,
    /// Segment files on disk: id and length.
    pub(super) files: BTreeMap<u64, u64>,
    /// The dictionaries, checked and digested (or why they cannot be used).
    pub(super) dicts: super::dicts::Dicts,
}

/// Who references each extent, found by the extent-map pass.
pub(super) struct MapUse {
    pub(super) refs: HashMap<u64, u32>,
    pub(super) referenced: HashMap<u8, u64>,
    pub(super) users: HashMap<u64, Vec<(Ino, u64)>>,
    /// Per inode, its shares of packed extents (see `pack`).
    pub(super) pack_disk: HashMap<Ino, u64>,
}

/// What the verified extents add up to, found by the extent pass.
pub(super) struct ExtentUse {
    pub(super) live: HashMap<u64, u64>,
    pub(super) stat_calc: BTreeMap<u8, StatRec>,
    pub(super) disk: HashMap<Ino, u64>,
    pub(super) max_ext: u64,
}

/// Progress over the bytes a check reads (extents, then segment files).
pub(super) struct Progress<'p> {
    pub(super) done: u64,
    pub(super) total: u64,
    pub(super) report: &'p mut dyn FnMut(u64, u64),
}

impl Progress<'_> {
    fn advance(&mut self, n: u64) {
        self.done += n;
        (self.report)(self.done, self.total);
    }
}

/// Loads the tables (records that do not decode are problems) and lists the segment files.
pub(super) fn load(
    dir: &Path,
    backend: Arc<dyn Backend>,
    txn: &ReadTransaction,
    c: &mut Ctx,
    fx: &mut Fixes,
    rep: &mut FsckReport,
) -> Result<Loaded> {
    let mut inodes: BTreeMap<Ino, InodeRec> = BTreeMap::new();
    for r in txn.open_table(meta::INODES)?.iter()? {
        let (k, v) = r?;
        match InodeRec::decode(v.value()) {
            Ok(i) => {
                inodes.insert(k.value(), i);
            }
            Err(e) => {
                c.add(
                    ProblemKind::BadRecord,
                    Some(k.value()),
                    format!("inode {}: {e}", k.value()),
                );
                fx.free_inodes.push(k.value());
            }
        }
    }
    rep.inodes = inodes.len() as u64;
    let mut dirents: Vec<(Ino, Vec<u8>, DirentRec)> = Vec::new();
    for r in txn.open_table(meta::DIRENTS)?.iter()? {
        let (k, v) = r?;
        let (d, name) = k.value();
        match DirentRec::decode(v.value()) {
            Ok(de) => dirents.push((d, name.to_vec(), de)),
            Err(e) => {
                c.add(
                    ProblemKind::BadRecord,
                    Some(d),
                    format!(
                        "entry {:?} of directory {d}: {e}",
                        String::from_utf8_lossy(name)
                    ),
                );
                fx.remove_dirents.push((d, name.to_vec()));
            }
        }
    }
    let mut index: BTreeMap<(Ino, u64), Vec<u8>> = BTreeMap::new();
    for r in txn.open_table(meta::DIRINDEX)?.iter()? {
        let (k, v) = r?;
        index.insert(k.value(), v.value().to_vec());
    }
    let orphans: BTreeSet<Ino> = txn
        .open_table(meta::ORPHANS)?
        .iter()?
        .map(|r| r.map(|(k, _)| k.value()))
        .collect::<std::result::Result<_, _>>()?;
    let mut extents: BTreeMap<u64, ExtentRec> = BTreeMap::new();
    for r in txn.open_table(meta::EXTENTS)?.iter()? {
        let (k, v) = r?;
        match ExtentRec::decode(v.value()) {
            Ok(x) => {
                extents.insert(k.value(), x);
            }
            Err(e) => c.add(
                ProblemKind::BadRecord,
                None,
                format!("extent {}: {e}", k.value()),
            ),
        }
    }
    rep.extents = extents.len() as u64;
    let mut seg_index: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for r in txn.open_table(meta::SEG_EXTENTS)?.iter()? {
        let (k, v) = r?;
        seg_index.insert(k.value(), v.value());
    }
    let mut segments: BTreeMap<u64, SegmentRec> = BTreeMap::new();
    for r in txn.open_table(meta::SEGMENTS)?.iter()? {
        let (k, v) = r?;
        match SegmentRec::decode(v.value()) {
            Ok(s) => {
                segments.insert(k.value(), s);
            }
            Err(e) => c.add(
                ProblemKind::BadRecord,
                None,
                format!("segment {}: {e}", k.value()),
            ),
        }
    }
    let mut stats: BTreeMap<u8, StatRec> = BTreeMap::new();
    for r in txn.open_table(meta::STATS)?.iter()? {
        let (k, v) = r?;
        if let Ok(s) = StatRec::decode(v.value()) {
            stats.insert(k.value(), s);
        }
    }
    let dicts = super::dicts::load_dicts(txn, c)?;

    let seg_dir = dir.join(SEGMENT_DIR);
    let mut files: BTreeMap<u64, u64> = BTreeMap::new();
    for e in std::fs::read_dir(&seg_dir)? {
        let e = e?;
        if let Some(id) = e.file_name().to_str().and_then(parse_segment_file_name) {
            files.insert(id, e.metadata()?.len());
        }
    }
    Ok(Loaded {
        dicts,
        seg_dir,
        backend,
        inodes,
        dirents,
        index,
        orphans,
        extents,
        seg_index,
        segments,
        stats,
        files,
    })
}

/// Directory tree and link counts; returns the largest inode number.
pub(super) fn check_tree(l: &Loaded, c: &mut Ctx, fx: &mut Fixes) -> Ino {
    let Loaded {
        inodes,
        dirents,
        index,
        orphans,
        ..
    } = l;
    let mut links: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    let mut dir_of: HashMap<Ino, Ino> = HashMap::new();
    let mut seen_index = BTreeSet::new();
    for (d, name, de) in dirents {
        let name_s = String::from_utf8_lossy(name);
        let parent_ok = inodes.get(d).is_some_and(|p| p.kind == FileKind::Dir);
        let target = inodes.get(&de.ino);
        if !parent_ok || target.is_none() {
            c.add(
                ProblemKind::BadDirent,
                Some(*d),
                format!("entry '{name_s}' in directory {d} points to missing inode {} (or its directory is missing)", de.ino),
            );
            fx.remove_dirents.push((*d, name.clone()));
            fx.remove_index.push((*d, de.seq));
            seen_index.insert((*d, de.seq));
            continue;
        }
        if index.get(&(*d, de.seq)) != Some(name) {
            c.add(
                ProblemKind::BadDirent,
                Some(*d),
                format!("entry '{name_s}' in directory {d} is missing from the directory index"),
            );
        }
        seen_index.insert((*d, de.seq));
        *links.entry(de.ino).or_default() += 1;
        if de.kind == FileKind::Dir {
            *subdirs.entry(*d).or_default() += 1;
            dir_of.insert(de.ino, *d);
        }
    }
    for (k, name) in index {
        if !seen_index.contains(k) {
            c.add(
                ProblemKind::BadDirent,
                Some(k.0),
                format!(
                    "directory index of {} names '{}' which has no entry",
                    k.0,
                    String::from_utf8_lossy(name)
                ),
            );
            fx.remove_index.push(*k);
        }
    }
    let mut max_ino = ROOT_INO;
    for (&ino, r) in inodes {
        max_ino = max_ino.max(ino);
        let l = links.get(&ino).copied().unwrap_or(0);
        if ino != ROOT_INO && l == 0 {
            if orphans.contains(&ino) {
                c.add(
                    ProblemKind::Orphan,
                    Some(ino),
                    format!(
                        "inode {ino} was unlinked while open; its space is freed at the next open"
                    ),
                );
            } else {
                c.add(
                    ProblemKind::UnreachableInode,
                    Some(ino),
                    format!("inode {ino} is in no directory"),
                );
            }
            fx.free_inodes.push(ino);
            continue;
        }
        let want = if r.kind == FileKind::Dir {
            2 + subdirs.get(&ino).copied().unwrap_or(0)
        } else {
            l
        };
        if r.nlink != want {
            c.add(
                ProblemKind::WrongCount,
                Some(ino),
                format!("inode {ino} has link count {} but {want} links", r.nlink),
            );
            fx.set_nlink.push((ino, want));
        }
        if r.kind == FileKind::Dir && ino != ROOT_INO {
            if let Some(&p) = dir_of.get(&ino) {
                if r.parent != p {
                    c.add(
                        ProblemKind::WrongCount,
                        Some(ino),
                        format!("directory {ino} records parent {} but is in {p}", r.parent),
                    );
                }
            }
        }
    }
    max_ino
}

/// Extent maps: every entry inside its file and its extent.
pub(super) fn check_maps(
    txn: &ReadTransaction,
    l: &Loaded,
    c: &mut Ctx,
    fx: &mut Fixes,
) -> Result<MapUse> {
    let Loaded {
        inodes, extents, ..
    } = l;
    let mut refs: HashMap<u64, u32> = HashMap::new();
    let mut referenced: HashMap<u8, u64> = HashMap::new();
    let mut users: HashMap<u64, Vec<(Ino, u64)>> = HashMap::new();
    let mut pack_disk: HashMap<Ino, u64> = HashMap::new();
    let mut prev: Option<(Ino, u64)> = None;
    let mut map_entries = Vec::new();
    for r in txn.open_table(meta::EXTMAP)?.iter()? {
        let (k, v) = r?;
        let (ino, off) = k.value();
        match MapRec::decode(v.value()) {
            Ok(m) => map_entries.push((ino, off, m)),
            Err(e) => {
                c.add(
                    ProblemKind::BadRecord,
                    Some(ino),
                    format!("map entry of inode {ino} at {off}: {e}"),
                );
                fx.remove_map.push((ino, off));
            }
        }
    }
    for &(ino, off, m) in &map_entries {
        let Some(r) = inodes.get(&ino) else {
            c.add(
                ProblemKind::BadMapEntry,
                Some(ino),
                format!("map entry at {off} of missing inode {ino}"),
            );
            fx.remove_map.push((ino, off));
            continue;
        };
        let end = off.saturating_add(m.len as u64);
        let overlap = matches!(prev, Some((pi, pe)) if pi == ino && pe > off);
        let bad = if r.kind != FileKind::File {
            Some("belongs to a non-file".to_string())
        } else if overlap {
            Some("overlaps the previous entry".to_string())
        } else if end > r.size {
            Some(format!("reaches past the file size {}", r.size))
        } else {
            None
        };
        if let Some(why) = bad {
            c.add(
                ProblemKind::BadMapEntry,
                Some(ino),
                format!("inode {ino} map entry at offset {off} {why}"),
            );
            fx.remove_map.push((ino, off));
            continue;
        }
        prev = Some((ino, end));
        let Some(x) = extents.get(&m.extent) else {
            c.add(
                ProblemKind::MissingExtent,
                Some(ino),
                format!("inode {ino} offset {off}: extent {} is missing", m.extent),
            );
            fx.remove_map.push((ino, off));
            continue;
        };
        if m.check_within(x.raw_len as u64).is_err() {
            c.add(
                ProblemKind::BadMapEntry,
                Some(ino),
                format!(
                    "inode {ino} map entry at offset {off} reaches past extent {}",
                    m.extent
                ),
            );
            fx.remove_map.push((ino, off));
            continue;
        }
        *refs.entry(m.extent).or_default() += 1;
        *referenced.entry(x.codec).or_default() += m.len as u64;
        users.entry(m.extent).or_default().push((ino, off));
        if x.ino == PACK_OWNER {
            *pack_disk.entry(ino).or_default() += pack_share(x.stored_len, x.raw_len, m.len);
        }
    }
    Ok(MapUse {
        refs,
        referenced,
        users,
        pack_disk,
    })
}

/// Preallocated ranges: each of a regular file, disjoint from the file's other ranges and
/// from its data (extent map and inline prefix). A bad one is dropped by a repair (the range
/// stays a hole, only its reservation goes).
pub(super) fn check_prealloc(
    txn: &ReadTransaction,
    l: &Loaded,
    c: &mut Ctx,
    fx: &mut Fixes,
) -> Result<()> {
    let t = match txn.open_table(meta::PREALLOC) {
        Ok(t) => t,
        // A store written before the table existed.
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let map = txn.open_table(meta::EXTMAP)?;
    let mut prev: Option<(Ino, u64)> = None;
    for r in t.iter()? {
        let (k, v) = r?;
        let (ino, start) = k.value();
        let p = match PreallocRec::decode(start, v.value()) {
            Ok(p) => p,
            Err(e) => {
                c.add(
                    ProblemKind::BadRecord,
                    Some(ino),
                    format!("preallocated range of inode {ino} at {start}: {e}"),
                );
                fx.remove_prealloc.push((ino, start));
                continue;
            }
        };
        let end = start + p.len;
        let data_in = |a: u64, b: u64| -> Result<bool> {
            if let Some(r) = map.range((ino, 0)..(ino, a))?.next_back() {
                let (k, v) = r?;
                if let Ok(m) = MapRec::decode(v.value()) {
                    if k.value().1.saturating_add(m.len as u64) > a {
                        return Ok(true);
                    }
                }
            }
            Ok(map.range((ino, a)..(ino, b))?.next().is_some())
        };
        let bad = match l.inodes.get(&ino) {
            None => Some("belongs to a missing inode".to_string()),
            Some(r) if r.kind != FileKind::File => Some("belongs to a non-file".to_string()),
            Some(_) if matches!(prev, Some((pi, pe)) if pi == ino && pe > start) => {
                Some("overlaps the previous range".to_string())
            }
            Some(r)
                if r.inline
                    .as_ref()
                    .is_some_and(|i| u64::from(i.raw_len) > start) =>
            {
                Some("overlaps the inline data".to_string())
            }
            Some(_) if data_in(start, end)? => Some("overlaps written data".to_string()),
            Some(_) => None,
        };
        if let Some(why) = bad {
            c.add(
                ProblemKind::BadMapEntry,
                Some(ino),
                format!("inode {ino} preallocated range {start}..{end} {why}"),
            );
            fx.remove_prealloc.push((ino, start));
            continue;
        }
        prev = Some((ino, end));
    }
    Ok(())
}

/// Extents: records, segment index, and their bytes read and verified.
pub(super) fn check_extents(
    l: &Loaded,
    mu: &MapUse,
    c: &mut Ctx,
    fx: &mut Fixes,
    rep: &mut FsckReport,
    pr: &mut Progress<'_>,
) -> Result<ExtentUse> {
    let Loaded {
        seg_dir,
        backend,
        extents,
        seg_index,
        files,
        ..
    } = l;
    let MapUse {
        refs,
        users,
        pack_disk,
        ..
    } = mu;
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut stat_calc: BTreeMap<u8, StatRec> = BTreeMap::new();
    // Packed extents are charged to their files by share, other extents to their owner.
    let mut disk: HashMap<Ino, u64> = pack_disk.clone();
    let mut open_files: HashMap<u64, Arc<dyn SegFile>> = HashMap::new();
    let mut max_ext = 0u64;
    for (&id, x) in extents {
        max_ext = max_ext.max(id);
        let who = users.get(&id).cloned().unwrap_or_default();
        let names = who
            .iter()
            .map(|(i, o)| format!("inode {i} offset {o}"))
            .collect::<Vec<_>>()
            .join(", ");
        let n = refs.get(&id).copied().unwrap_or(0);
        if n == 0 {
            c.add(
                ProblemKind::UnreferencedExtent,
                None,
                format!(
                    "extent {id} (segment {} offset {}) is referenced by no file",
                    x.segment, x.seg_offset
                ),
            );
            fx.remove_extents.push(id);
            continue;
        }
        if seg_index.get(&(x.segment, x.seg_offset)) != Some(&id) {
            c.add(
                ProblemKind::WrongCount,
                None,
                format!("extent {id} is missing from the segment index"),
            );
        }
        *live.entry(x.segment).or_default() += x.footprint();
        let s = stat_calc.entry(x.codec).or_default();
        s.extents += 1;
        s.disk += x.stored_len as u64;
        s.uncompressed += x.raw_len as u64;
        if x.ino != PACK_OWNER {
            *disk.entry(x.ino).or_default() += x.stored_len as u64;
        }
        // Read and verify the bytes.
        // A device error stops the check (EIO): reporting it as a damaged extent would have
        // a repair drop data that is only unreadable for now.
        let check = (|| -> std::io::Result<std::result::Result<(), String>> {
            if !files.contains_key(&x.segment) {
                return Ok(Err(format!("segment {} is missing", x.segment)));
            }
            let f = match open_files.get(&x.segment) {
                Some(f) => f,
                None => match backend.open(&seg_dir.join(segment_file_name(x.segment)), false) {
                    Ok(f) => open_files.entry(x.segment).or_insert(f),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Ok(Err(format!("segment {} unreadable: {e}", x.segment)))
                    }
                    Err(e) => return Err(e),
                },
            };
            verify_stored(&|b, o| f.read_exact_at(b, o), id, x, dict_of(l, x.dict))
        })()?;
        pr.advance(x.footprint());
        if let Err(why) = check {
            let kind = if why.contains("missing") {
                ProblemKind::MissingExtent
            } else {
                ProblemKind::CorruptExtent
            };
            c.add(
                kind,
                who.first().map(|w| w.0),
                format!(
                    "extent {id} at segment {} offset {} ({names}): {why}",
                    x.segment, x.seg_offset
                ),
            );
            for w in &who {
                fx.remove_map.push(*w);
            }
            fx.remove_extents.push(id);
            continue;
        }
        rep.bytes_verified += x.stored_len as u64;
        if n != x.refs {
            c.add(
                ProblemKind::WrongCount,
                None,
                format!("extent {id} records {} references but has {n}", x.refs),
            );
            fx.set_refs.push((id, n));
        }
    }
    Ok(ExtentUse {
        live,
        stat_calc,
        disk,
        max_ext,
    })
}

/// Reads extent `id` (record `x`) from its segment with `read_at` and verifies it:
/// `Ok(Err(why))` when it is damaged or missing (the segment ends before it), `Err` when the
/// device fails.
pub(super) fn verify_stored(
    read_at: &dyn Fn(&mut [u8], u64) -> std::io::Result<()>,
    id: u64,
    x: &ExtentRec,
    dict: DictRef<'_>,
) -> std::io::Result<std::result::Result<(), String>> {
    let mut raw = vec![0u8; EXT_HEADER_LEN + x.stored_len as usize];
    match read_at(&mut raw, x.seg_offset) {
        Ok(()) => Ok(crate::read::verify_extent(id, x, &raw, dict).map(|_| ())),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Ok(Err(format!("read failed: {e}")))
        }
        Err(e) => Err(e),
    }
}

/// Inline data, per-inode disk bytes and per-codec statistics.
pub(super) fn check_accounting(
    l: &Loaded,
    referenced: HashMap<u8, u64>,
    eu: &mut ExtentUse,
    c: &mut Ctx,
    fx: &mut Fixes,
) {
    let Loaded { inodes, stats, .. } = l;
    let ExtentUse {
        stat_calc, disk, ..
    } = eu;
    for (codec, r) in referenced {
        stat_calc.entry(codec).or_default().referenced += r;
    }
    for (&ino, r) in inodes {
        if r.kind == FileKind::File {
            if let Some(i) = &r.inline {
                let s = stat_calc.entry(STAT_INLINE).or_default();
                s.extents += 1;
                s.disk += i.bytes.len() as u64;
                s.uncompressed += i.raw_len as u64;
                s.referenced += i.raw_len as u64;
                if let Err(e) = crate::read::decode_inline(ino, i, dict_of(l, i.dict)) {
                    c.add(
                        ProblemKind::CorruptExtent,
                        Some(ino),
                        format!("inode {ino}: {e}"),
                    );
                    fx.drop_inline.push(ino);
                }
            }
        }
        let want = disk.get(&ino).copied().unwrap_or(0);
        if r.disk_bytes != want && !fx.free_inodes.contains(&ino) {
            c.add(
                ProblemKind::WrongCount,
                Some(ino),
                format!(
                    "inode {ino} records {} disk bytes but has {want}",
                    r.disk_bytes
                ),
            );
            fx.set_disk.push((ino, want));
        }
    }
    let keys: BTreeSet<u8> = stats.keys().chain(stat_calc.keys()).copied().collect();
    for k in keys {
        let have = stats.get(&k).copied().unwrap_or_default();
        let want = stat_calc.get(&k).copied().unwrap_or_default();
        if have != want {
            c.add(
                ProblemKind::WrongCount,
                None,
                format!("statistics of codec {k}: recorded {have:?}, actual {want:?}"),
            );
            fx.set_stats.insert(k, Some(want));
        }
    }
}

/// Segment records against the files and the live bytes of their extents.
pub(super) fn check_segment_records(l: &Loaded, eu: &ExtentUse, c: &mut Ctx, fx: &mut Fixes) {
    let Loaded {
        segments,
        files,
        extents,
        ..
    } = l;
    let live = &eu.live;
    for (&id, s) in segments {
        let l = live.get(&id).copied().unwrap_or(0);
        if !files.contains_key(&id) {
            if l > 0 || extents.values().any(|x| x.segment == id) {
                c.add(
                    ProblemKind::MissingExtent,
                    None,
                    format!("segment {id} is missing but holds live extents"),
                );
            } else {
                c.add(
                    ProblemKind::WrongCount,
                    None,
                    format!("segment {id} has a record but no file"),
                );
                fx.set_segments.push((id, None));
            }
            continue;
        }
        if s.live != l {
            c.add(
                ProblemKind::WrongCount,
                None,
                format!("segment {id} records {} live bytes but holds {l}", s.live),
            );
            fx.set_segments.push((
                id,
                Some(SegmentRec {
                    len: s.len,
                    live: l,
                }),
            ));
        }
    }
}

/// Segment files: headers, committed length, and a walk by extent headers.
pub(super) fn check_segment_files(
    l: &Loaded,
    uuid: &[u8; 16],
    c: &mut Ctx,
    fx: &mut Fixes,
    rep: &mut FsckReport,
    pr: &mut Progress<'_>,
) -> Result<()> {
    let Loaded {
        seg_dir,
        backend,
        segments,
        files,
        seg_index,
        ..
    } = l;
    rep.segments = files.len() as u64;
    for (&id, &flen) in files {
        let path = seg_dir.join(segment_file_name(id));
        let data = match read_segment(backend.as_ref(), &path) {
            Ok(d) => d,
            // A segment in a bucket with a range no object holds.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                pr.advance(flen);
                c.add(
                    ProblemKind::MissingExtent,
                    None,
                    format!("segment {id}: {e}"),
                );
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        pr.advance(flen);
        let Some(srec) = segments.get(&id) else {
            c.add(
                ProblemKind::LeftoverSegment,
                None,
                format!(
                    "segment file {} is not referenced by committed metadata",
                    segment_file_name(id)
                ),
            );
            fx.delete_files.push(id);
            continue;
        };
        match SegmentHeader::decode(&data) {
            Ok(h) if h.id == id && &h.uuid == uuid => {}
            Ok(_) => c.add(
                ProblemKind::BadSegment,
                None,
                format!("segment {id} header names another segment or store"),
            ),
            Err(e) => c.add(ProblemKind::BadSegment, None, format!("segment {id}: {e}")),
        }
        let committed = srec.len.min(data.len() as u64);
        if srec.len > data.len() as u64 {
            c.add(
                ProblemKind::MissingExtent,
                None,
                format!(
                    "segment {id} is {} bytes, shorter than its committed length {}",
                    data.len(),
                    srec.len
                ),
            );
        }
        if (data.len() as u64) > srec.len.max(SEG_HEADER_LEN) {
            c.add(
                ProblemKind::UncommittedTail,
                None,
                format!(
                    "segment {id} has {} bytes past its committed end",
                    data.len() as u64 - srec.len.max(SEG_HEADER_LEN)
                ),
            );
        }
        let mut pos = SEG_HEADER_LEN;
        let mut dead = 0u64;
        while pos + EXT_HEADER_LEN as u64 <= committed {
            let known = seg_index.get(&(id, pos)).copied();
            match ExtentHeader::decode(&data[pos as usize..pos as usize + EXT_HEADER_LEN]) {
                Ok(h) => {
                    let next = pos + EXT_HEADER_LEN as u64 + h.stored_len as u64;
                    if known.is_none() {
                        dead += next.min(committed) - pos;
                    }
                    pos = next;
                }
                Err(e) => {
                    // Resynchronise at the next extent the index knows.
                    let next = seg_index
                        .range((id, pos + 1)..(id, u64::MAX))
                        .next()
                        .map(|(k, _)| k.1)
                        .unwrap_or(committed);
                    if known.is_none() {
                        c.add(
                            ProblemKind::DamagedDeadSpace,
                            None,
                            format!(
                                "segment {id} offset {pos}: {e} (in dead space, {} bytes skipped)",
                                next - pos
                            ),
                        );
                        dead += next - pos;
                    }
                    pos = next;
                }
            }
        }
        rep.dead_bytes += dead;
    }
    Ok(())
}

/// The whole of a segment, through the backend.
fn read_segment(backend: &dyn Backend, path: &Path) -> std::io::Result<Vec<u8>> {
    let f = backend.open(path, false)?;
    let len = usize::try_from(f.size()?).map_err(|_| std::io::Error::other("segment too large"))?;
    let mut data = vec![0u8; len];
    f.read_exact_at(&mut data, 0)?;
    Ok(data)
}

/// Id counters above every id in use.
pub(super) fn check_counters(
    txn: &ReadTransaction,
    max_ino: Ino,
    max_ext: u64,
    c: &mut Ctx,
    fx: &mut Fixes,
) -> Result<()> {
    let m = txn.open_table(meta::META)?;
    let counter = |name: &str| -> Result<u64> {
        match m.get(name)? {
            Some(v) => meta::u64_value(v.value()),
            None => Ok(0),
        }
    };
    if counter(meta::NEXT_INO)? <= max_ino {
        c.add(
            ProblemKind::WrongCount,
            None,
            format!("inode counter is not above the largest inode {max_ino}"),
        );
        fx.counters.push((meta::NEXT_INO, max_ino + 1));
    }
    if counter(meta::NEXT_EXTENT)? <= max_ext {
        c.add(
            ProblemKind::WrongCount,
            None,
            format!("extent counter is not above the largest extent {max_ext}"),
        );
        fx.counters.push((meta::NEXT_EXTENT, max_ext + 1));
    }
    Ok(())
}

#[cfg(test)]
#[path = "passes_tests.rs"]
mod tests;
