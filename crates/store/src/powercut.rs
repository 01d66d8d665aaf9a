//! Simulated power cuts at the storage seam (tests).
//!
//! A [`PowerCut`] attached to a [`FaultBackend`](crate::backend::FaultBackend) (see
//! [`FaultBackend::with_power_cut`](crate::backend::FaultBackend::with_power_cut)) records every
//! write, resize, sync, creation and removal that the store makes of its segment files and of
//! `meta.redb` (through [`MetaFile`](crate::backend::MetaFile)), and keeps, per file, its last
//! synced content and the writes made since; per directory, the creations and removals not yet
//! made durable by a directory sync.
//!
//! At chosen operations (every operation through the seam is numbered; cuts fall at random
//! numbers, `gap` apart on average) it takes a **cut**: the image a power failure at that
//! moment could leave on the disk, written to a fresh directory. The image holds every file's
//! last synced state plus a subset of its unsynced writes chosen by a seeded RNG ([`CutMode`]):
//! none, all, a random subset applied in random order, or every write torn into 512-byte or
//! 4 KiB sectors of which a random subset survives. A file whose creation was not made durable
//! by a directory sync may vanish; one whose removal was not may come back. The store keeps
//! running after a cut; the images are checked afterwards by reopening each one as a store.
//!
//! The real files are written normally: the process keeps seeing what a page cache would show.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How the unsynced writes of a cut's image were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// No unsynced write survives.
    NoneSurvive,
    /// Every unsynced write survives (the page cache reached the disk; directory entries too).
    AllSurvive,
    /// A random subset of the unsynced writes survives, applied in random order.
    Subset,
    /// Every unsynced write is torn into sectors of this many bytes (aligned in the file), a
    /// random subset of which survives, applied in random order.
    Torn(u64),
}

/// One image taken at a cut.
#[derive(Debug, Clone)]
pub struct CutImage {
    /// The number of the operation before which the power failed: operations `0..op` were
    /// done (their calls may not have returned yet), `op` and later were not.
    pub op: u64,
    /// The directory holding the image (a complete store directory).
    pub dir: PathBuf,
    pub mode: CutMode,
}

#[derive(Debug, Clone)]
enum Pending {
    Write(u64, Arc<Vec<u8>>),
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct SimFile {
    /// Content at the last sync.
    durable: Vec<u8>,
    /// Writes and resizes since the last sync, in order.
    pending: Vec<Pending>,
}

#[derive(Debug, Clone)]
enum DirOp {
    /// A file created in the directory since its last sync.
    Create(PathBuf),
    /// A file removed since the directory's last sync, with its state at removal.
    Remove(PathBuf, SimFile),
}

struct State {
    root: PathBuf,
    out: PathBuf,
    meta: PathBuf,
    /// Files the process sees (relative to `root`).
    files: BTreeMap<PathBuf, SimFile>,
    /// Directories (relative), all made at the start.
    subdirs: Vec<PathBuf>,
    /// Per directory (relative), the entry changes not yet synced, in order.
    dirs: HashMap<PathBuf, Vec<DirOp>>,
    ops: u64,
    next_cut: u64,
    gap: u64,
    rng: u64,
    images: Vec<CutImage>,
    max_cuts: usize,
}

impl State {
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn rel(&self, p: &Path) -> PathBuf {
        p.strip_prefix(&self.root).unwrap_or(p).to_path_buf()
    }

    /// Numbers one operation, taking a cut first when one is due.
    fn tick(&mut self) {
        if self.ops == self.next_cut && self.images.len() < self.max_cuts {
            if let Err(e) = self.cut() {
                tracing::error!("power-cut image at operation {} failed: {e}", self.ops);
            }
            let g = self.gap;
            self.next_cut = self.ops + 1 + self.below(2 * g);
        }
        self.ops += 1;
    }

    fn cut(&mut self) -> io::Result<()> {
        let mode = match self.below(6) {
            0 => CutMode::NoneSurvive,
            1 => CutMode::AllSurvive,
            2 | 3 => CutMode::Subset,
            4 => CutMode::Torn(512),
            _ => CutMode::Torn(4096),
        };
        let dir = self.out.join(format!("cut-{}", self.images.len()));
        // Which files exist after the cut: every file the process sees, except creations not
        // made durable that are lost; plus removals not made durable that are undone.
        let mut image: BTreeMap<PathBuf, SimFile> = self.files.clone();
        let dirops: Vec<DirOp> = self.dirs.values().flatten().cloned().collect();
        for op in dirops {
            let keep = match mode {
                CutMode::NoneSurvive => false,
                CutMode::AllSurvive => true,
                _ => self.below(2) == 0,
            };
            if keep {
                continue;
            }
            match op {
                DirOp::Create(p) => {
                    image.remove(&p);
                }
                DirOp::Remove(p, f) => {
                    image.insert(p, f);
                }
            }
        }
        std::fs::create_dir_all(&dir)?;
        for d in &self.subdirs {
            std::fs::create_dir_all(dir.join(d))?;
        }
        for (rel, f) in image {
            let bytes = self.surviving(&f, mode);
            let p = dir.join(&rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&p, bytes)?;
        }
        self.images.push(CutImage {
            op: self.ops,
            dir,
            mode,
        });
        Ok(())
    }

    /// The content of `f` after a cut in `mode`.
    fn surviving(&mut self, f: &SimFile, mode: CutMode) -> Vec<u8> {
        let mut d = f.durable.clone();
        let mut ops: Vec<Pending> = match mode {
            CutMode::NoneSurvive => Vec::new(),
            CutMode::AllSurvive => f.pending.clone(),
            CutMode::Subset => f
                .pending
                .iter()
                .filter(|_| self.below(2) == 0)
                .cloned()
                .collect(),
            CutMode::Torn(sector) => {
                let mut v = Vec::new();
                for p in &f.pending {
                    match p {
                        Pending::SetLen(_) => {
                            if self.below(2) == 0 {
                                v.push(p.clone());
                            }
                        }
                        Pending::Write(off, data) => {
                            let end = off + data.len() as u64;
                            let mut s = *off;
                            while s < end {
                                let e = ((s / sector + 1) * sector).min(end);
                                if self.below(2) == 0 {
                                    let part =
                                        data[(s - off) as usize..(e - off) as usize].to_vec();
                                    v.push(Pending::Write(s, Arc::new(part)));
                                }
                                s = e;
                            }
                        }
                    }
                }
                v
            }
        };
        if matches!(mode, CutMode::Subset | CutMode::Torn(_)) {
            // Any order: shuffle.
            for i in (1..ops.len()).rev() {
                let j = self.below(i as u64 + 1) as usize;
                ops.swap(i, j);
            }
        }
        for p in ops {
            apply(&mut d, &p);
        }
        d
    }
}

fn apply(d: &mut Vec<u8>, p: &Pending) {
    match p {
        Pending::Write(off, data) => {
            let off = *off as usize;
            if d.len() < off + data.len() {
                d.resize(off + data.len(), 0);
            }
            d[off..off + data.len()].copy_from_slice(data);
        }
        Pending::SetLen(n) => d.resize(*n as usize, 0),
    }
}

/// Records a store's file operations and takes power-cut images. See the module docs.
#[derive(Clone)]
pub struct PowerCut {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for PowerCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerCut").finish_non_exhaustive()
    }
}

/// Reads every file under `dir` (relative paths).
fn read_tree(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<PathBuf, SimFile>,
    dirs: &mut Vec<PathBuf>,
) -> io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            dirs.push(p.strip_prefix(root).unwrap_or(&p).to_path_buf());
            read_tree(root, &p, out, dirs)?;
        } else {
            let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
            out.insert(
                rel,
                SimFile {
                    durable: std::fs::read(&p)?,
                    pending: Vec::new(),
                },
            );
        }
    }
    Ok(())
}

impl PowerCut {
    /// Starts recording the store in `root`, whose files on disk now are taken as durable (call
    /// it after the store was created and closed, or synced). Images go to `out/cut-N`; a cut
    /// falls on average every `gap` operations (at most `max_cuts` of them); `seed` seeds the
    /// choice of cut points and surviving writes.
    pub fn new(root: &Path, out: &Path, seed: u64, gap: u64, max_cuts: usize) -> io::Result<Self> {
        let mut files = BTreeMap::new();
        let mut subdirs = Vec::new();
        read_tree(root, root, &mut files, &mut subdirs)?;
        let mut st = State {
            root: root.to_path_buf(),
            out: out.to_path_buf(),
            meta: PathBuf::from(crate::format::META_FILE),
            files,
            subdirs,
            dirs: HashMap::new(),
            ops: 0,
            next_cut: 0,
            gap: gap.max(1),
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            images: Vec::new(),
            max_cuts,
        };
        st.next_cut = st.below(2 * st.gap);
        Ok(PowerCut {
            state: Arc::new(Mutex::new(st)),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Operations numbered so far.
    pub fn ops(&self) -> u64 {
        self.with(|s| s.ops)
    }

    /// The images taken so far.
    pub fn images(&self) -> Vec<CutImage> {
        self.with(|s| s.images.clone())
    }

    /// Stops taking cuts (operations are still recorded).
    pub fn stop(&self) {
        self.with(|s| s.max_cuts = 0);
    }

    /// Takes a cut now (before the next operation), whatever the schedule.
    pub fn cut_now(&self) -> io::Result<CutImage> {
        self.with(|s| {
            s.cut()?;
            s.images
                .last()
                .cloned()
                .ok_or_else(|| io::Error::other("no image"))
        })
    }

    /// Numbers an operation about to start (a cut may fall before it).
    pub(crate) fn begin(&self) {
        self.with(|s| s.tick());
    }

    /// A write of `data` at `off` to `path` (or `meta.redb` when `None`) completed.
    pub(crate) fn wrote(&self, path: Option<&Path>, off: u64, data: &[u8]) {
        self.push(path, Pending::Write(off, Arc::new(data.to_vec())));
    }

    /// A resize of `path` (or `meta.redb`) to `len` completed.
    pub(crate) fn resized(&self, path: Option<&Path>, len: u64) {
        self.push(path, Pending::SetLen(len));
    }

    fn push(&self, path: Option<&Path>, p: Pending) {
        self.with(|s| {
            let rel = path.map_or_else(|| s.meta.clone(), |p| s.rel(p));
            s.files.entry(rel).or_default().pending.push(p);
        })
    }

    /// A sync of `path` (or `meta.redb`) starts: returns how many recorded writes it covers.
    pub(crate) fn sync_start(&self, path: Option<&Path>) -> usize {
        self.with(|s| {
            let rel = path.map_or_else(|| s.meta.clone(), |p| s.rel(p));
            s.files.get(&rel).map_or(0, |f| f.pending.len())
        })
    }

    /// The sync begun with [`PowerCut::sync_start`] (which returned `n`) completed.
    pub(crate) fn synced(&self, path: Option<&Path>, n: usize) {
        self.with(|s| {
            let rel = path.map_or_else(|| s.meta.clone(), |p| s.rel(p));
            if let Some(f) = s.files.get_mut(&rel) {
                let n = n.min(f.pending.len());
                let done: Vec<Pending> = f.pending.drain(..n).collect();
                for p in &done {
                    apply(&mut f.durable, p);
                }
            }
        })
    }

    /// `path` was created (empty).
    pub(crate) fn created(&self, path: &Path) {
        self.with(|s| {
            let rel = s.rel(path);
            let dir = rel.parent().map(Path::to_path_buf).unwrap_or_default();
            s.files.insert(rel.clone(), SimFile::default());
            s.dirs.entry(dir).or_default().push(DirOp::Create(rel));
        })
    }

    /// `path` was removed.
    pub(crate) fn removed(&self, path: &Path) {
        self.with(|s| {
            let rel = s.rel(path);
            let dir = rel.parent().map(Path::to_path_buf).unwrap_or_default();
            if let Some(f) = s.files.remove(&rel) {
                s.dirs.entry(dir).or_default().push(DirOp::Remove(rel, f));
            }
        })
    }

    /// A sync of directory `path` starts: returns how many entry changes it covers.
    pub(crate) fn dir_sync_start(&self, path: &Path) -> usize {
        self.with(|s| {
            let rel = s.rel(path);
            s.dirs.get(&rel).map_or(0, Vec::len)
        })
    }

    /// The directory sync begun with [`PowerCut::dir_sync_start`] (which returned `n`) completed.
    pub(crate) fn dir_synced(&self, path: &Path, n: usize) {
        self.with(|s| {
            let rel = s.rel(path);
            if let Some(v) = s.dirs.get_mut(&rel) {
                let n = n.min(v.len());
                v.drain(..n);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn file(durable: &[u8], pending: Vec<Pending>) -> SimFile {
        SimFile {
            durable: durable.to_vec(),
            pending,
        }
    }

    fn state(seed: u64) -> State {
        State {
            root: PathBuf::new(),
            out: PathBuf::new(),
            meta: PathBuf::new(),
            files: BTreeMap::new(),
            subdirs: Vec::new(),
            dirs: HashMap::new(),
            ops: 0,
            next_cut: u64::MAX,
            gap: 1,
            rng: seed | 1,
            images: Vec::new(),
            max_cuts: 0,
        }
    }

    /// Every surviving byte is the synced byte or one some unsynced write put there; torn
    /// writes survive in whole aligned sectors; none/all give exactly the synced / final state.
    #[test]
    fn surviving_bytes_come_from_writes() {
        let w1 = Pending::Write(100, Arc::new(vec![1u8; 5000]));
        let w2 = Pending::Write(3000, Arc::new(vec![2u8; 3000]));
        let f = file(&[9u8; 1000], vec![w1, w2, Pending::SetLen(7000)]);
        let mut st = state(7);
        assert_eq!(st.surviving(&f, CutMode::NoneSurvive), vec![9u8; 1000]);
        let all = st.surviving(&f, CutMode::AllSurvive);
        assert_eq!(all.len(), 7000);
        assert_eq!(&all[..100], &[9u8; 100][..]);
        assert_eq!(&all[100..3000], &[1u8; 2900][..]);
        assert_eq!(&all[3000..6000], &[2u8; 3000][..]);
        let mut seen_partial = false;
        for seed in 1..200 {
            let mut st = state(seed);
            for mode in [CutMode::Subset, CutMode::Torn(512), CutMode::Torn(4096)] {
                let got = st.surviving(&f, mode);
                for (i, &b) in got.iter().enumerate() {
                    let ok = match b {
                        9 => i < 1000,
                        1 => (100..5100).contains(&i),
                        2 => (3000..6000).contains(&i),
                        0 => i >= 1000,
                        _ => false,
                    };
                    assert!(ok, "byte {i} = {b} in {mode:?}");
                }
                if let CutMode::Torn(s) = mode {
                    // A sector is written whole or not at all: within a sector of w2's range,
                    // the bytes are all 2 or none (w1 may overlap the first sectors).
                    let start = 5120usize.next_multiple_of(s as usize);
                    for c in got
                        .get(start..6000.min(got.len()))
                        .unwrap_or(&[])
                        .chunks(s as usize)
                    {
                        let twos = c.iter().filter(|&&b| b == 2).count();
                        if c.len() == s as usize {
                            assert!(twos == 0 || twos == c.len());
                        }
                    }
                }
                if got != all && got != vec![9u8; 1000] {
                    seen_partial = true;
                }
            }
        }
        assert!(seen_partial);
    }
}
