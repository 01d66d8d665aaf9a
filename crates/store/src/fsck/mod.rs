//! Offline consistency checker: every metadata invariant, every extent checksum, and a walk of
//! every segment by its extent headers. With `repair`, the safe repairs: drop references to
//! corrupt or missing extents (the rest of the file stays readable, the damaged range reads as
//! zeros), recompute counts, free orphaned inodes and unreferenced extents, drop dangling
//! directory entries, delete leftover segment files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable};

use crate::error::{Error, Result};
use crate::format::{
    parse_segment_file_name, segment_file_name, DirentRec, ExtentHeader, ExtentRec, InodeRec,
    MapRec, SegmentHeader, SegmentRec, StatRec, EXT_HEADER_LEN, SEGMENT_DIR, SEG_HEADER_LEN,
    STAT_INLINE,
};
use crate::meta::{self, W};
use crate::store::{check_identity, open_db, read_superblock};
use crate::types::{FileKind, Ino, ROOT_INO};

/// Kind of a problem found by [`fsck`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemKind {
    /// An extent fails its header check, checksum or decompression.
    CorruptExtent,
    /// A map entry references an extent that has no record, or whose segment is gone.
    MissingExtent,
    /// A map entry is malformed (overlaps, past the extent or the file size, not a file).
    BadMapEntry,
    /// An extent record nobody references.
    UnreferencedExtent,
    /// A directory entry naming a missing inode, or an inconsistent directory index.
    BadDirent,
    /// An inode no directory entry reaches (and not an open-unlinked orphan).
    UnreachableInode,
    /// A counter disagrees with what the metadata implies (nlink, refs, live bytes, statistics,
    /// disk bytes, id counters).
    WrongCount,
    /// A record that does not decode.
    BadRecord,
    /// A segment file whose header is damaged.
    BadSegment,
    /// Informational: an inode unlinked while open when the store was last used (freed at the
    /// next open).
    Orphan,
    /// Informational: a segment file no committed metadata references (left by a crash).
    LeftoverSegment,
    /// Informational: bytes past a segment's committed end (appended before a crash).
    UncommittedTail,
    /// Informational: a damaged region in dead (unreferenced) segment space.
    DamagedDeadSpace,
}

impl ProblemKind {
    /// Whether the problem is informational (not damage).
    pub fn is_info(self) -> bool {
        matches!(
            self,
            ProblemKind::Orphan
                | ProblemKind::LeftoverSegment
                | ProblemKind::UncommittedTail
                | ProblemKind::DamagedDeadSpace
        )
    }
}

/// One problem found by [`fsck`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsckProblem {
    pub kind: ProblemKind,
    /// The file concerned, when there is one.
    pub ino: Option<Ino>,
    pub message: String,
    /// Fixed by `--repair`.
    pub repaired: bool,
}

/// What [`fsck`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsckReport {
    pub problems: Vec<FsckProblem>,
    pub inodes: u64,
    pub extents: u64,
    pub segments: u64,
    /// Stored bytes of live extents verified.
    pub bytes_verified: u64,
    /// Dead (garbage) bytes in segments, reclaimable by GC.
    pub dead_bytes: u64,
}

impl FsckReport {
    /// Damage found (informational notes excluded).
    pub fn errors(&self) -> usize {
        self.problems.iter().filter(|p| !p.kind.is_info()).count()
    }
    /// Damage found and not repaired.
    pub fn unrepaired(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| !p.kind.is_info() && !p.repaired)
            .count()
    }
    /// Damage repaired.
    pub fn repaired(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| !p.kind.is_info() && p.repaired)
            .count()
    }
    /// No damage at all.
    pub fn is_clean(&self) -> bool {
        self.errors() == 0
    }
}

/// Checks the (closed) store in `dir`; with `repair`, fixes what can be fixed safely.
/// `progress(done, total)` is called as extents and segments are verified (bytes).
pub fn fsck(dir: &Path, repair: bool, progress: &mut dyn FnMut(u64, u64)) -> Result<FsckReport> {
    let sb = read_superblock(dir)?;
    let db = open_db(dir)?;
    check_identity(dir, &db, &sb)?;
    let first = check(dir, &db, &sb.uuid, repair, progress)?;
    if !repair || first.problems.is_empty() {
        return Ok(first);
    }
    // Structural repairs change counts; further passes settle them. The first pass's findings
    // are the report; each counts as repaired if a final check no longer sees its kind+inode.
    for _ in 0..3 {
        if check(dir, &db, &sb.uuid, true, &mut |_, _| {})?.errors() == 0 {
            break;
        }
    }
    let verify = check(dir, &db, &sb.uuid, false, &mut |_, _| {})?;
    let remaining: BTreeSet<(ProblemKind, Option<Ino>, String)> = verify
        .problems
        .iter()
        .filter(|p| !p.kind.is_info())
        .map(|p| (p.kind, p.ino, p.message.clone()))
        .collect();
    let mut rep = first;
    for p in rep.problems.iter_mut() {
        p.repaired = !p.kind.is_info() && !remaining.contains(&(p.kind, p.ino, p.message.clone()));
    }
    for p in verify.problems {
        if !p.kind.is_info() && !rep.problems.iter().any(|q| q.message == p.message) {
            rep.problems.push(p);
        }
    }
    Ok(rep)
}

struct Ctx {
    problems: Vec<FsckProblem>,
}

impl Ctx {
    fn add(&mut self, kind: ProblemKind, ino: Option<Ino>, message: String) {
        self.problems.push(FsckProblem {
            kind,
            ino,
            message,
            repaired: false,
        });
    }
}

#[derive(Default)]
struct Fixes {
    remove_dirents: Vec<(Ino, Vec<u8>)>,
    remove_index: Vec<(Ino, u64)>,
    free_inodes: Vec<Ino>,
    remove_map: Vec<(Ino, u64)>,
    remove_extents: Vec<u64>,
    set_nlink: Vec<(Ino, u32)>,
    set_refs: Vec<(u64, u32)>,
    set_disk: Vec<(Ino, u64)>,
    set_segments: Vec<(u64, Option<SegmentRec>)>,
    set_stats: BTreeMap<u8, Option<StatRec>>,
    counters: Vec<(&'static str, u64)>,
    delete_files: Vec<u64>,
}

fn check(
    dir: &Path,
    db: &Database,
    uuid: &[u8; 16],
    repair: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<FsckReport> {
    let mut c = Ctx {
        problems: Vec::new(),
    };
    let mut fx = Fixes::default();
    let mut rep = FsckReport::default();
    let txn = db.begin_read()?;

    // Load the tables.
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

    // Directory tree and link counts.
    let mut links: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    let mut dir_of: HashMap<Ino, Ino> = HashMap::new();
    let mut seen_index = BTreeSet::new();
    for (d, name, de) in &dirents {
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
    for (k, name) in &index {
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
    for (&ino, r) in &inodes {
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

    // Extent maps.
    let mut refs: HashMap<u64, u32> = HashMap::new();
    let mut referenced: HashMap<u8, u64> = HashMap::new();
    let mut users: HashMap<u64, Vec<(Ino, u64)>> = HashMap::new();
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
        let end = off + m.len as u64;
        let overlap = matches!(prev, Some((pi, pe)) if pi == ino && pe > off);
        let bad = if r.kind != FileKind::File {
            Some("belongs to a non-file".to_string())
        } else if m.len == 0 {
            Some("is empty".to_string())
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
        if m.ext_offset as u64 + m.len as u64 > x.raw_len as u64 {
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
    }

    // Extents: records, index, bytes.
    let seg_dir = dir.join(SEGMENT_DIR);
    let mut files: BTreeMap<u64, u64> = BTreeMap::new();
    for e in std::fs::read_dir(&seg_dir)? {
        let e = e?;
        if let Some(id) = e.file_name().to_str().and_then(parse_segment_file_name) {
            files.insert(id, e.metadata()?.len());
        }
    }
    let total: u64 =
        extents.values().map(|x| x.footprint()).sum::<u64>() + files.values().sum::<u64>();
    let mut done = 0u64;
    progress(0, total);
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut stat_calc: BTreeMap<u8, StatRec> = BTreeMap::new();
    let mut disk: HashMap<Ino, u64> = HashMap::new();
    let mut open_files: HashMap<u64, std::fs::File> = HashMap::new();
    let mut max_ext = 0u64;
    for (&id, x) in &extents {
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
        *disk.entry(x.ino).or_default() += x.stored_len as u64;
        // Read and verify the bytes.
        let check = (|| -> std::result::Result<(), String> {
            if !files.contains_key(&x.segment) {
                return Err(format!("segment {} is missing", x.segment));
            }
            let f = match open_files.get(&x.segment) {
                Some(f) => f,
                None => {
                    let f = std::fs::File::open(seg_dir.join(segment_file_name(x.segment)))
                        .map_err(|e| format!("segment {} unreadable: {e}", x.segment))?;
                    open_files.entry(x.segment).or_insert(f)
                }
            };
            let mut raw = vec![0u8; EXT_HEADER_LEN + x.stored_len as usize];
            std::os::unix::fs::FileExt::read_exact_at(f, &mut raw, x.seg_offset)
                .map_err(|e| format!("read failed: {e}"))?;
            crate::data::verify_extent(id, x, &raw).map(|_| ())
        })();
        done += x.footprint();
        progress(done, total);
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
    for (codec, r) in referenced {
        stat_calc.entry(codec).or_default().referenced += r;
    }
    for (&ino, r) in &inodes {
        if r.kind == FileKind::File {
            if let Some(i) = &r.inline {
                let s = stat_calc.entry(STAT_INLINE).or_default();
                s.extents += 1;
                s.disk += i.bytes.len() as u64;
                s.uncompressed += i.raw_len as u64;
                s.referenced += i.raw_len as u64;
                if let Err(e) = crate::data::decode_inline(ino, i) {
                    c.add(
                        ProblemKind::CorruptExtent,
                        Some(ino),
                        format!("inode {ino}: {e}"),
                    );
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

    // Segments: records, headers, and a walk by extent headers.
    for (&id, s) in &segments {
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
    rep.segments = files.len() as u64;
    for (&id, &flen) in &files {
        let path = seg_dir.join(segment_file_name(id));
        let data = std::fs::read(&path)?;
        done += flen;
        progress(done, total);
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

    // Id counters.
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
    drop(m);
    drop(txn);

    if repair {
        apply(dir, db, &fx)?;
        for p in c.problems.iter_mut() {
            p.repaired = !p.kind.is_info();
        }
    }
    rep.problems = c.problems;
    Ok(rep)
}

fn apply(dir: &Path, db: &Database, fx: &Fixes) -> Result<()> {
    let txn = db.begin_write()?;
    {
        let mut w = W::open(&txn)?;
        for (d, name) in &fx.remove_dirents {
            w.dirents_mut()?.remove((*d, name.as_slice()))?;
        }
        for k in &fx.remove_index {
            w.dirindex_mut()?.remove(*k)?;
        }
        for (ino, off) in &fx.remove_map {
            w.extmap_mut()?.remove((*ino, *off))?;
        }
        for id in &fx.remove_extents {
            let removed = w
                .extents_mut()?
                .remove(*id)?
                .map(|v| ExtentRec::decode(v.value()));
            if let Some(Ok(x)) = removed {
                w.seg_extents_mut()?.remove((x.segment, x.seg_offset))?;
            }
        }
        for ino in &fx.free_inodes {
            // Remove what the inode owns directly; counts are recomputed by the next pass.
            let owned: Vec<u64> = w
                .extmap()?
                .range((*ino, 0)..=(*ino, u64::MAX))?
                .map(|r| r.map(|(k, _)| k.value().1))
                .collect::<std::result::Result<_, _>>()?;
            for off in owned {
                w.extmap_mut()?.remove((*ino, off))?;
            }
            let names: Vec<Vec<u8>> = w
                .xattrs()?
                .range((*ino, &[][..])..(*ino + 1, &[][..]))?
                .map(|r| r.map(|(k, _)| k.value().1.to_vec()))
                .collect::<std::result::Result<_, _>>()?;
            for n in names {
                w.xattrs_mut()?.remove((*ino, n.as_slice()))?;
            }
            w.orphans_mut()?.remove(*ino)?;
            w.inodes_mut()?.remove(*ino)?;
        }
        for (ino, n) in &fx.set_nlink {
            if let Ok(mut r) = w.inode(*ino) {
                r.nlink = *n;
                w.put_inode(*ino, &r)?;
            }
        }
        for (ino, d) in &fx.set_disk {
            if let Ok(mut r) = w.inode(*ino) {
                r.disk_bytes = *d;
                w.put_inode(*ino, &r)?;
            }
        }
        for (id, n) in &fx.set_refs {
            if let Ok(mut x) = w.extent(*id) {
                x.refs = *n;
                w.extents_mut()?.insert(*id, x.encode().as_slice())?;
            }
        }
        for (id, s) in &fx.set_segments {
            match s {
                Some(s) => w.put_segment(*id, s)?,
                None => {
                    w.segments_mut()?.remove(*id)?;
                }
            }
        }
        for (k, s) in &fx.set_stats {
            match s {
                Some(s) => {
                    w.stats_mut()?.insert(*k, s.encode().as_slice())?;
                }
                None => {
                    w.stats_mut()?.remove(*k)?;
                }
            }
        }
        for (name, v) in &fx.counters {
            w.meta_mut()?.insert(*name, v.to_le_bytes().as_slice())?;
        }
    }
    txn.commit()?;
    for id in &fx.delete_files {
        let p = dir.join(SEGMENT_DIR).join(segment_file_name(*id));
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::Io(e)),
            _ => {}
        }
    }
    Ok(())
}
