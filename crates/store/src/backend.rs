//! The storage seams: every byte of file data goes through a [`Backend`], so tests can inject
//! failures (EIO, ENOSPC) and torn writes at chosen points with [`FaultBackend`]. The metadata
//! database `meta.redb` is redb's own file; a [`FaultBackend`] given as
//! [`Tuning::meta_faults`](crate::Tuning::meta_faults) injects the same faults into redb's
//! writes, syncs and resizes of it through [`MetaFile`], a [`redb::StorageBackend`] wrapped
//! around redb's [`FileBackend`].

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use crate::powercut::PowerCut;

/// One open segment file.
pub trait SegFile: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes `parts` back to back at `offset`, as one write of their concatenation (the
    /// default concatenates them; files override it with `pwritev`).
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        self.write_all_at(&parts.concat(), offset)
    }
    /// `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    fn size(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// A hint that bytes `offset..offset + len` will be read soon: a backend that fetches
    /// from far away starts fetching them in the background. Local files ignore it (the
    /// kernel's own readahead serves them).
    fn prefetch(&self, _offset: u64, _len: u64) {}
}

/// File operations on the segment directory.
pub trait Backend: Send + Sync {
    /// Creates a new file (fails if it exists), opened for reading and writing.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegFile>>;
    /// Opens an existing file, for writing too when `write`.
    fn open(&self, path: &Path, write: bool) -> io::Result<Arc<dyn SegFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// `fsync` of a directory, making creations and removals in it durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Whether [`SegFile::prefetch`] does anything: the store then tells it what a sequential
    /// reader of a file will read next.
    fn prefetches(&self) -> bool {
        false
    }
    /// Stops fetching ahead for good and waits for the fetches under way: the store is
    /// closing, and nothing may write into the backend's cache once it released its lock.
    fn stop_prefetch(&self) {}
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdBackend;

struct StdFile(File);

impl SegFile for StdFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.0, buf, offset)
    }
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        pwritev_all(&self.0, parts, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

/// `pwritev` of all of `parts` at `offset`, resuming after short writes and EINTR. std has no
/// positioned vectored write, so this calls libc; it saves copying a flush's extents into one
/// buffer before writing them.
fn pwritev_all(f: &File, parts: &[&[u8]], mut offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // At most IOV_MAX (1024 on Linux) vectors per call.
    const MAX_IOV: usize = 1024;
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    let mut at = 0;
    while at < iov.len() {
        let n = (iov.len() - at).min(MAX_IOV);
        let off =
            libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: `iov[at..at + n]` points into `parts`, which are borrowed for the whole call
        // and live, readable slices of the lengths given; the kernel only reads them.
        let r = unsafe { libc::pwritev(f.as_raw_fd(), iov[at..].as_ptr(), n as libc::c_int, off) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        let mut done = r as usize;
        offset += done as u64;
        // Skip the vectors written in full, then advance into a partly written one.
        while at < iov.len() && done >= iov[at].iov_len {
            done -= iov[at].iov_len;
            at += 1;
        }
        if done > 0 {
            let v = &mut iov[at];
            // SAFETY: `done < v.iov_len`, so the advanced pointer stays inside the same slice.
            v.iov_base = unsafe { (v.iov_base as *mut u8).add(done) } as *mut libc::c_void;
            v.iov_len -= done;
        }
    }
    Ok(())
}

impl Backend for StdBackend {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Arc::new(StdFile(f)))
    }
    fn open(&self, path: &Path, write: bool) -> io::Result<Arc<dyn SegFile>> {
        let f = OpenOptions::new().read(true).write(write).open(path)?;
        Ok(Arc::new(StdFile(f)))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
}

/// A segment file with unsynced bytes and the generation of its last append.
pub(crate) type Unsynced = (Arc<dyn SegFile>, u64);

/// The segment files with appended bytes not yet `fdatasync`ed, shared by a store and its
/// [`MetaFile`], and whether a segment sync ever failed.
///
/// Before any write that can carry redb's file header (the only pointer to a commit, whose
/// bytes start the file), [`MetaFile`] syncs every segment listed here: so whichever commit redb
/// comes back at after a power cut, the last durable one or a later non-durable one that redb
/// wrote a header for (its close does that), the segment bytes it references were synced first.
/// After a failed segment sync the bytes may be gone even from the page cache, so from then on
/// such writes fail: redb stays at the header it had. See docs/format.md, "What compfs assumes
/// of the disk and of redb".
#[derive(Default)]
pub struct SegSync {
    /// Segment id -> (file, generation of its last append).
    pub(crate) files: Mutex<HashMap<u64, Unsynced>>,
    failed: AtomicBool,
}

impl SegSync {
    /// Whether a segment sync failed since the store was opened.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// `fdatasync`s every listed segment and forgets them; fails (EIO) if any sync ever failed.
    pub(crate) fn sync_all(&self) -> io::Result<()> {
        if self.failed() {
            // EIO, as a failed fdatasync: an earlier one failed and its bytes may be lost.
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let files: Vec<Arc<dyn SegFile>> = self
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, (f, _))| f)
            .collect();
        for f in files {
            f.sync_data()?;
        }
        Ok(())
    }

    /// `backend`, with every failed `sync_data` of its files noted here.
    pub(crate) fn watch(self: &Arc<Self>, backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
        Arc::new(WatchedBackend {
            inner: backend,
            sync: self.clone(),
        })
    }
}

/// A [`Backend`] whose files note failed syncs in a [`SegSync`].
struct WatchedBackend {
    inner: Arc<dyn Backend>,
    sync: Arc<SegSync>,
}

struct WatchedFile {
    inner: Arc<dyn SegFile>,
    sync: Arc<SegSync>,
}

impl SegFile for WatchedFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        self.inner.write_parts_at(parts, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        let r = self.inner.sync_data();
        if r.is_err() {
            self.sync.failed.store(true, Ordering::SeqCst);
        }
        r
    }
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn prefetch(&self, offset: u64, len: u64) {
        self.inner.prefetch(offset, len)
    }
}

impl WatchedBackend {
    fn wrap(&self, f: Arc<dyn SegFile>) -> Arc<dyn SegFile> {
        Arc::new(WatchedFile {
            inner: f,
            sync: self.sync.clone(),
        })
    }
}

impl Backend for WatchedBackend {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegFile>> {
        Ok(self.wrap(self.inner.create(path)?))
    }
    fn open(&self, path: &Path, write: bool) -> io::Result<Arc<dyn SegFile>> {
        Ok(self.wrap(self.inner.open(path, write)?))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn prefetches(&self) -> bool {
        self.inner.prefetches()
    }
    fn stop_prefetch(&self) {
        self.inner.stop_prefetch()
    }
}

/// Writes to `meta.redb` below this offset may carry redb's file header (320 bytes at offset 0
/// in redb 4: `DB_HEADER_SIZE` in `tree_store/page_store/header.rs`; its first page starts at
/// the page size, 4 KiB by default).
const META_HEADER_REGION: u64 = 4096;

/// Which operation a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Write,
    Sync,
    Create,
    /// Truncating or extending a file (`set_len`).
    SetLen,
    /// Reading (Torn reads fail with EIO like `Eio`).
    Read,
}

/// What happens at the chosen operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Fail with EIO, writing nothing.
    Eio,
    /// Fail with ENOSPC, writing nothing.
    NoSpace,
    /// Write only the first `n` bytes, then fail with EIO (a torn write).
    Torn(usize),
}

/// A planned fault: the `nth` (0-based) operation of kind `op` counted from when it was armed,
/// and every later one of that kind while `sticky`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub op: FaultOp,
    pub nth: u64,
    pub kind: FaultKind,
    pub sticky: bool,
}

#[derive(Default)]
struct FaultState {
    fault: Option<Fault>,
    counts: [u64; 5],
    /// Operations of each kind since creation (never reset).
    totals: [u64; 5],
    fired: u64,
}

/// A [`Backend`] that forwards to [`StdBackend`] and injects one armed [`Fault`]; with a
/// [`PowerCut`], it also records every operation for simulated power cuts.
#[derive(Clone, Default)]
pub struct FaultBackend {
    state: Arc<Mutex<FaultState>>,
    writes: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
    cut: Option<PowerCut>,
}

impl FaultBackend {
    pub fn new() -> FaultBackend {
        FaultBackend::default()
    }

    /// A backend that records every operation of segment files and (given as
    /// [`Tuning::meta_faults`](crate::Tuning::meta_faults)) of `meta.redb` in `cut`, which
    /// takes power-cut images of the store (see [`crate::powercut`]). Faults can be armed too.
    pub fn with_power_cut(cut: PowerCut) -> FaultBackend {
        FaultBackend {
            cut: Some(cut),
            ..FaultBackend::default()
        }
    }

    /// Numbers an operation for the power-cut recorder (a cut may fall before it).
    fn begin(&self) {
        if let Some(c) = &self.cut {
            c.begin();
        }
    }

    /// Arms `fault`; operation counts start from zero now.
    pub fn arm(&self, fault: Fault) {
        if let Ok(mut s) = self.state.lock() {
            s.fault = Some(fault);
            s.counts = [0; 5];
        }
    }

    /// Disarms any fault.
    pub fn disarm(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.fault = None;
        }
    }

    /// How many times a fault fired.
    pub fn fired(&self) -> u64 {
        self.state.lock().map(|s| s.fired).unwrap_or(0)
    }

    /// Writes and syncs done so far (of segment files, or of the metadata file for a
    /// [`FaultBackend`] used as [`Tuning::meta_faults`](crate::Tuning::meta_faults)).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.writes.load(Ordering::Relaxed),
            self.syncs.load(Ordering::Relaxed),
        )
    }

    /// Operations of kind `op` done so far (armed or not).
    pub fn count(&self, op: FaultOp) -> u64 {
        self.state
            .lock()
            .map(|s| s.totals[op as usize])
            .unwrap_or(0)
    }

    fn check(&self, op: FaultOp) -> Option<FaultKind> {
        let mut s = self.state.lock().ok()?;
        let idx = op as usize;
        let n = s.counts[idx];
        s.counts[idx] += 1;
        s.totals[idx] += 1;
        let f = s.fault?;
        if f.op == op && (n == f.nth || (f.sticky && n > f.nth)) {
            s.fired += 1;
            Some(f.kind)
        } else {
            None
        }
    }
}

fn fault_error(k: FaultKind) -> io::Error {
    match k {
        FaultKind::NoSpace => io::Error::from_raw_os_error(libc::ENOSPC),
        FaultKind::Eio | FaultKind::Torn(_) => io::Error::from_raw_os_error(libc::EIO),
    }
}

/// Writes `data` with `write`, unless `fault`: then fails, after writing a prefix if torn.
fn faulty_write(
    fault: Option<FaultKind>,
    data: &[u8],
    write: impl FnOnce(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    match fault {
        None => write(data),
        Some(FaultKind::Torn(n)) => {
            write(&data[..n.min(data.len())])?;
            Err(fault_error(FaultKind::Torn(n)))
        }
        Some(k) => Err(fault_error(k)),
    }
}

/// Runs `op`, unless `fault`: then fails without running it.
fn faulty(fault: Option<FaultKind>, op: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    match fault {
        None => op(),
        Some(k) => Err(fault_error(k)),
    }
}

struct FaultFile {
    inner: Arc<dyn SegFile>,
    backend: FaultBackend,
    path: PathBuf,
}

impl FaultFile {
    fn cut(&self) -> Option<&PowerCut> {
        self.backend.cut.as_ref()
    }
}

impl SegFile for FaultFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        faulty(self.backend.check(FaultOp::Read), || {
            self.inner.read_exact_at(buf, offset)
        })
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.backend.writes.fetch_add(1, Ordering::Relaxed);
        self.backend.begin();
        faulty_write(self.backend.check(FaultOp::Write), buf, |b| {
            self.inner.write_all_at(b, offset)?;
            if let Some(c) = self.cut() {
                c.wrote(Some(&self.path), offset, b);
            }
            Ok(())
        })
    }
    fn sync_data(&self) -> io::Result<()> {
        self.backend.syncs.fetch_add(1, Ordering::Relaxed);
        self.backend.begin();
        let n = self.cut().map(|c| c.sync_start(Some(&self.path)));
        faulty(self.backend.check(FaultOp::Sync), || self.inner.sync_data())?;
        if let (Some(c), Some(n)) = (self.cut(), n) {
            c.synced(Some(&self.path), n);
        }
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.backend.begin();
        faulty(self.backend.check(FaultOp::SetLen), || {
            self.inner.set_len(len)
        })?;
        if let Some(c) = self.cut() {
            c.resized(Some(&self.path), len);
        }
        Ok(())
    }
}

impl Backend for FaultBackend {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegFile>> {
        self.begin();
        if let Some(k) = self.check(FaultOp::Create) {
            return Err(fault_error(k));
        }
        let inner = StdBackend.create(path)?;
        if let Some(c) = &self.cut {
            c.created(path);
        }
        Ok(Arc::new(FaultFile {
            inner,
            backend: self.clone(),
            path: path.to_path_buf(),
        }))
    }
    fn open(&self, path: &Path, write: bool) -> io::Result<Arc<dyn SegFile>> {
        Ok(Arc::new(FaultFile {
            inner: StdBackend.open(path, write)?,
            backend: self.clone(),
            path: path.to_path_buf(),
        }))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.begin();
        StdBackend.remove(path)?;
        if let Some(c) = &self.cut {
            c.removed(path);
        }
        Ok(())
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.begin();
        let n = self.cut.as_ref().map(|c| c.dir_sync_start(path));
        StdBackend.sync_dir(path)?;
        if let (Some(c), Some(n)) = (&self.cut, n) {
            c.dir_synced(path, n);
        }
        Ok(())
    }
}

/// redb's file backend for `meta.redb`, which every open store uses:
/// * with a [`SegSync`], a write that may carry redb's header first syncs every segment with
///   unsynced bytes, and fails after a failed segment sync (see [`SegSync`]);
/// * with a [`FaultBackend`] (tests), its faults: `read`s, `write`s, `sync_data`s and
///   `set_len`s count as [`FaultOp::Read`], [`FaultOp::Write`], [`FaultOp::Sync`] and
///   [`FaultOp::SetLen`], and a [`PowerCut`] attached to it records them.
///
/// redb's file locks go straight to the file, so a second open of a store in use still fails.
pub struct MetaFile {
    inner: FileBackend,
    faults: FaultBackend,
    armed: bool,
    gate: Option<Arc<SegSync>>,
}

impl MetaFile {
    /// Wraps `file`, opened for reading and writing.
    pub fn new(
        file: File,
        faults: Option<FaultBackend>,
        gate: Option<Arc<SegSync>>,
    ) -> Result<MetaFile, redb::DatabaseError> {
        Ok(MetaFile {
            inner: FileBackend::new(file)?,
            armed: faults.is_some(),
            faults: faults.unwrap_or_default(),
            gate,
        })
    }

    /// The fault planned for the next `op`, if any (nothing counted without faults).
    fn check(&self, op: FaultOp) -> Option<FaultKind> {
        if self.armed {
            self.faults.check(op)
        } else {
            None
        }
    }
}

impl std::fmt::Debug for MetaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaFile")
            .field("inner", &self.inner)
            .field("fired", &self.faults.fired())
            .finish()
    }
}

impl StorageBackend for MetaFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        faulty(self.check(FaultOp::Read), || self.inner.read(offset, out))
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.faults.begin();
        faulty(self.check(FaultOp::SetLen), || self.inner.set_len(len))?;
        if let Some(c) = &self.faults.cut {
            c.resized(None, len);
        }
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.faults.syncs.fetch_add(1, Ordering::Relaxed);
        self.faults.begin();
        let n = self.faults.cut.as_ref().map(|c| c.sync_start(None));
        faulty(self.check(FaultOp::Sync), || self.inner.sync_data())?;
        if let (Some(c), Some(n)) = (&self.faults.cut, n) {
            c.synced(None, n);
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if offset < META_HEADER_REGION {
            if let Some(g) = &self.gate {
                g.sync_all()?;
            }
        }
        self.faults.writes.fetch_add(1, Ordering::Relaxed);
        self.faults.begin();
        faulty_write(self.check(FaultOp::Write), data, |d| {
            self.inner.write(offset, d)?;
            if let Some(c) = &self.faults.cut {
                c.wrote(None, offset, d);
            }
            Ok(())
        })
    }
    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A write that may carry redb's header syncs every listed segment first (a page write
    /// does not); after a failed segment sync, header writes fail and page writes go on.
    #[test]
    fn meta_header_writes_sync_segments_first() {
        let t = tempfile::tempdir().unwrap();
        let fb = FaultBackend::new();
        let gate = Arc::new(SegSync::default());
        let be = gate.watch(Arc::new(fb.clone()));
        let seg = be.create(&t.path().join("s")).unwrap();
        seg.write_all_at(b"extent", 0).unwrap();
        gate.files.lock().unwrap().insert(1, (seg.clone(), 1));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(t.path().join("m"))
            .unwrap();
        let meta = MetaFile::new(f, None, Some(gate.clone())).unwrap();
        meta.write(8192, &[1; 16]).unwrap();
        assert_eq!(fb.counts().1, 0, "a page write synced a segment");
        meta.write(0, &[1; 320]).unwrap();
        assert_eq!(
            fb.counts().1,
            1,
            "the header write did not sync the segment"
        );
        assert!(gate.files.lock().unwrap().is_empty());
        meta.write(0, &[1; 320]).unwrap();
        assert_eq!(fb.counts().1, 1, "nothing left to sync");
        fb.arm(Fault {
            op: FaultOp::Sync,
            nth: 0,
            kind: FaultKind::Eio,
            sticky: false,
        });
        assert!(seg.sync_data().is_err());
        assert!(gate.failed());
        assert!(meta.write(0, &[2; 320]).is_err());
        meta.write(8192, &[2; 16]).unwrap();
    }

    /// More vectors than one `pwritev` takes, of sizes 0..3000, at an unaligned offset: the
    /// file holds exactly their concatenation, and the bytes around it are untouched.
    #[test]
    fn write_parts_at_writes_the_concatenation() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        let f = StdBackend.create(&p).unwrap();
        f.write_all_at(&[0xEE; 10], 0).unwrap();
        let owned: Vec<Vec<u8>> = (0..2500u32)
            .map(|i| vec![(i % 251) as u8; (i as usize * 7919) % 3000])
            .collect();
        let parts: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        f.write_parts_at(&parts, 7).unwrap();
        let all = parts.concat();
        let got = std::fs::read(&p).unwrap();
        assert_eq!(got.len(), 7 + all.len());
        assert_eq!(&got[..7], &[0xEE; 7]);
        assert_eq!(&got[7..], &all[..]);
        // Through the fault backend (the default: one write of the concatenation), torn.
        let fb = FaultBackend::new();
        let g = fb.create(&t.path().join("g")).unwrap();
        fb.arm(Fault {
            op: FaultOp::Write,
            nth: 0,
            kind: FaultKind::Torn(100),
            sticky: false,
        });
        assert!(g.write_parts_at(&parts, 0).is_err());
        assert_eq!(std::fs::read(t.path().join("g")).unwrap(), &all[..100]);
    }
}
