//! Offline consistency checker: every metadata invariant, every extent checksum, and a walk of
//! every segment by its extent headers. With `repair`, the safe repairs: drop references to
//! corrupt or missing extents (the rest of the file stays readable, the damaged range reads as
//! zeros), recompute counts, free orphaned inodes and unreferenced extents, drop dangling
//! directory entries, delete leftover segment files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase};

use crate::backend::{Backend, StdBackend};
use crate::error::Result;
use crate::open::{check_identity, open_db, read_superblock};
use crate::records::{SegmentRec, StatRec};
use crate::types::Ino;

/// Kind of a problem found by [`fsck`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemKind {
    /// An extent fails its header check, checksum or decompression.
    CorruptExtent,
    /// A map entry references an extent that has no record, or whose segment is gone.
    MissingExtent,
    /// A map entry is malformed (overlaps, past the extent or the file size, not a file), or a
    /// preallocated range overlaps another, the file's data, or is not of a regular file.
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
    fsck_with(dir, repair, Arc::new(StdBackend), progress)
}

/// [`fsck`] reading segment bytes through `backend` (a store in a bucket: its objects,
/// behind the placeholders of `dir/segs`).
pub(crate) fn fsck_with(
    dir: &Path,
    repair: bool,
    backend: Arc<dyn Backend>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<FsckReport> {
    let mut sb = read_superblock(dir)?;
    let db = open_db(dir)?;
    check_identity(dir, &db, &sb)?;
    if repair {
        // Repairs write records in the current format.
        crate::open::upgrade_format(dir, &db, &mut sb)?;
    }
    let first = check(dir, &backend, &db, &sb.uuid, repair, progress)?;
    if !repair || first.problems.is_empty() {
        return Ok(first);
    }
    // Structural repairs change counts; further passes settle them. The first pass's findings
    // are the report; each counts as repaired if a final check no longer sees its kind+inode.
    for _ in 0..3 {
        if check(dir, &backend, &db, &sb.uuid, true, &mut |_, _| {})?.errors() == 0 {
            break;
        }
    }
    let verify = check(dir, &backend, &db, &sb.uuid, false, &mut |_, _| {})?;
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

mod dicts;
mod passes;
mod repair;

use passes::{
    check_accounting, check_counters, check_extents, check_maps, check_prealloc,
    check_segment_files, check_segment_records, check_tree, load, Progress,
};
use repair::apply;

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
    remove_prealloc: Vec<(Ino, u64)>,
    remove_extents: Vec<u64>,
    /// Regular files whose inline data is damaged: dropped (the range reads as zeros).
    drop_inline: Vec<Ino>,
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
    backend: &Arc<dyn Backend>,
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
    let l = load(dir, backend.clone(), &txn, &mut c, &mut fx, &mut rep)?;
    let max_ino = check_tree(&l, &mut c, &mut fx);
    let mu = check_maps(&txn, &l, &mut c, &mut fx)?;
    check_prealloc(&txn, &l, &mut c, &mut fx)?;
    let total: u64 =
        l.extents.values().map(|x| x.footprint()).sum::<u64>() + l.files.values().sum::<u64>();
    let mut pr = Progress {
        done: 0,
        total,
        report: progress,
    };
    (pr.report)(0, total);
    let mut eu = check_extents(&l, &mu, &mut c, &mut fx, &mut rep, &mut pr)?;
    check_accounting(&l, mu.referenced, &mut eu, &mut c, &mut fx);
    check_segment_records(&l, &eu, &mut c, &mut fx);
    check_segment_files(&l, uuid, &mut c, &mut fx, &mut rep, &mut pr)?;
    check_counters(&txn, max_ino, eu.max_ext, &mut c, &mut fx)?;
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
