//! Opening, creating and closing stores; shared state; the segment appender; durability points
//! and the read-only latch; the background flusher.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use compfs_codec::{CodecSpec, Mode};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::attrs::{write_patches, Patches};
use crate::backend::{Backend, FaultBackend, MetaFile, SegFile, SegSync, StdBackend};
use crate::cache::Lru;

/// Number of [`Inner::loading`] stripes.
pub(crate) const LOAD_STRIPES: usize = 64;
use crate::data::FileState;
use crate::error::{Error, Result};
use crate::format::{
    parse_segment_file_name, segment_file_name, InodeRec, SbError, SegmentHeader, Superblock,
    FORMAT_VERSION, META_FILE, SEGMENT_DIR, SEG_HEADER_LEN, SUPERBLOCK_FILE,
};
use crate::meta::{self, W};
use crate::pool::Pool;
use crate::types::*;

/// Knobs beyond the API contract's options: mostly for tests and benchmarks.
#[derive(Clone)]
pub struct Tuning {
    /// Segment file size at which a new segment starts (stored in the superblock at creation).
    pub segment_size: u64,
    /// Largest regular file kept inline in its inode record (stored at creation; btrfs
    /// `max_inline` default 2048).
    pub inline_max: u32,
    /// Background flush interval; `None` disables the flusher thread.
    pub flush_interval: Option<Duration>,
    /// Storage backend for segment files.
    pub backend: Arc<dyn Backend>,
    /// Faults to inject into redb's writes, syncs and resizes of the metadata database (tests);
    /// `None` (the default) lets redb use its file as it does on its own.
    pub meta_faults: Option<FaultBackend>,
    /// Size of redb's page cache for the metadata database; `None` (the default) keeps redb's
    /// own (up to 1 GiB, filled on demand). Tests set it small so that transactions read pages
    /// from the file.
    pub meta_cache: Option<usize>,
    /// Automatic GC runs when garbage exceeds this fraction of all segment bytes...
    pub gc_garbage_ratio: f64,
    /// ...and at least this many bytes.
    pub gc_min_garbage: u64,
    /// Dirty (buffered) bytes of all files above which a writer flushes its own file.
    pub dirty_limit: usize,
    /// Dirty extent-sized blocks of one file that trigger its flush.
    pub flush_blocks: usize,
}

impl std::fmt::Debug for Tuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tuning")
            .field("segment_size", &self.segment_size)
            .field("inline_max", &self.inline_max)
            .field("flush_interval", &self.flush_interval)
            .field("gc_garbage_ratio", &self.gc_garbage_ratio)
            .field("meta_faults", &self.meta_faults.is_some())
            .field("meta_cache", &self.meta_cache)
            .finish_non_exhaustive()
    }
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            segment_size: 64 << 20,
            inline_max: 2048,
            flush_interval: Some(Duration::from_secs(2)),
            backend: Arc::new(StdBackend),
            meta_faults: None,
            meta_cache: None,
            gc_garbage_ratio: 0.3,
            gc_min_garbage: 64 << 20,
            dirty_limit: 64 << 20,
            flush_blocks: 24,
        }
    }
}

/// Counters for [`Stats`] kept in memory since open.
#[derive(Default)]
pub(crate) struct Counters {
    pub user_written: AtomicU64,
    pub user_read: AtomicU64,
    pub seg_written: AtomicU64,
    pub compressed: [AtomicU64; 5],
    pub raw: AtomicU64,
    pub heuristic_skips: AtomicU64,
    pub zero_blocks: AtomicU64,
    pub gc_runs: AtomicU64,
    pub gc_moved: AtomicU64,
    pub gc_freed: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
}

/// The segment being appended to, and segments with appended but uncommitted extents.
pub(crate) struct SegWriter {
    pub id: u64,
    pub file: Option<Arc<dyn SegFile>>,
    pub end: u64,
    pub next_id: u64,
    pub pins: HashMap<u64, u32>,
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub seg_dir: PathBuf,
    pub sb: Superblock,
    pub db: Database,
    pub tuning: Tuning,
    pub read_only_open: bool,
    pub policy: RwLock<(CodecSpec, Mode)>,
    pub ro: Mutex<Option<String>>,
    pub ro_flag: AtomicBool,
    pub files: Mutex<HashMap<Ino, Arc<Mutex<FileState>>>>,
    /// Open handles per inode (mirrors `FileState::open`, changed under the file's lock). A
    /// leaf lock: namespace transactions read it while holding redb's write lock, which a
    /// flush acquires while holding a file lock, so they must not take file locks.
    pub opens: Mutex<HashMap<Ino, u32>>,
    pub seg: Mutex<SegWriter>,
    /// Read handles of segment files. Readers hold the read lock from the start of their
    /// metadata snapshot to the end of their segment reads; GC deletes files under the write
    /// lock, so a reader never finds its segment gone.
    pub seg_barrier: RwLock<()>,
    /// Segments with appended bytes not yet `fdatasync`ed, each with a generation that every
    /// append bumps (the segment syncer retires an entry only if no append came after the
    /// generation it synced). Shared with `meta.redb`'s [`MetaFile`], which syncs them before
    /// writing redb's header (see [`SegSync`]).
    pub unsynced: Arc<SegSync>,
    /// Bytes appended since the segment syncer was last woken.
    pub unsynced_bytes: AtomicU64,
    /// Wakes the segment syncer (see `segsync_loop`).
    pub segsync: Mutex<Option<std::sync::mpsc::SyncSender<()>>>,
    pub seg_handles: Mutex<HashMap<u64, Arc<dyn SegFile>>>,
    pub cache: Mutex<Lru>,
    /// Striped locks held while an extent is loaded into the cache, so that two threads
    /// missing on the same extent at once (FUSE reads of its two halves) decode it once.
    pub loading: Vec<Mutex<()>>,
    pub pool: Pool,
    pub counters: Counters,
    pub dirty_bytes: AtomicUsize,
    /// Free block buffers for reuse.
    pub bufs: Mutex<Vec<Vec<u8>>>,
    pub next_extent: AtomicU64,
    pub gc_lock: Mutex<()>,
    pub last_durable: Mutex<Instant>,
    /// Attribute changes not yet in the metadata, written by the next commit (see `attrs`).
    pub patches: Mutex<Patches>,
    /// Queue of the writeback thread: small files flushed after their last close.
    pub writeback: Mutex<Option<std::sync::mpsc::Sender<Ino>>>,
}

/// A compfs store. See the crate docs.
///
/// ```
/// fn shared<T: Send + Sync>() {}
/// shared::<compfs_store::Store>();
/// ```
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    flusher: Option<(std::sync::mpsc::Sender<()>, JoinHandle<()>)>,
    writeback: Option<JoinHandle<()>>,
    segsync: Option<JoinHandle<()>>,
    closed: bool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a thread panicked while holding it; the protected data are plain
    // caches or counters that stay structurally valid, so continue with them.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn random_uuid() -> Result<[u8; 16]> {
    use std::io::Read;
    let mut u = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut u)?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

/// Formats a UUID the usual way.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn sync_dir(p: &Path) -> Result<()> {
    std::fs::File::open(p)?.sync_all()?;
    Ok(())
}

/// Reads and checks the superblock of `dir`.
pub(crate) fn read_superblock(dir: &Path) -> Result<Superblock> {
    let not_store = |reason: String| Error::NotAStore {
        path: dir.to_path_buf(),
        reason,
    };
    if !dir.is_dir() {
        return Err(not_store("not a directory".into()));
    }
    let p = dir.join(SUPERBLOCK_FILE);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_store(format!("it has no {SUPERBLOCK_FILE}")))
        }
        Err(e) => return Err(Error::Io(e)),
    };
    Superblock::decode(&bytes).map_err(|e| match e {
        SbError::BadMagic => not_store(format!(
            "{SUPERBLOCK_FILE} has no compfs magic (written by another program?)"
        )),
        SbError::FutureVersion(v) => Error::UnsupportedVersion {
            path: dir.to_path_buf(),
            found: v,
            supported: FORMAT_VERSION,
        },
        SbError::Truncated(n) => Error::BadSuperblock {
            path: p.clone(),
            reason: format!("truncated to {n} bytes"),
        },
        SbError::BadChecksum { stored, computed } => Error::BadSuperblock {
            path: p.clone(),
            reason: format!("checksum mismatch (stored {stored:08x}, computed {computed:08x})"),
        },
        SbError::BadField(f) => Error::BadSuperblock {
            path: p.clone(),
            reason: format!("invalid {f}"),
        },
    })
}

/// Opens the metadata database after checking that it is one (redb may write to a file it
/// opens, so a foreign file is rejected before redb sees it).
pub(crate) fn open_db(dir: &Path) -> Result<Database> {
    open_db_with(dir, None, None, None)
}

/// [`open_db`] with `faults` injected into redb's I/O of the file and the segments of `gate`
/// synced before redb writes its header (see [`meta_db`]).
pub(crate) fn open_db_with(
    dir: &Path,
    faults: Option<&FaultBackend>,
    cache: Option<usize>,
    gate: Option<Arc<SegSync>>,
) -> Result<Database> {
    let p = dir.join(META_FILE);
    let mut head = [0u8; 9];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotAStore {
                path: dir.to_path_buf(),
                reason: format!("it has no {META_FILE}"),
            },
            _ => Error::Io(e),
        })?;
        let n = f.read(&mut head)?;
        if n < 4 || &head[0..4] != b"redb" {
            return Err(Error::NotAStore {
                path: dir.to_path_buf(),
                reason: format!(
                    "{META_FILE} is not a compfs metadata database (another program's file?)"
                ),
            });
        }
    }
    meta_db(&p, false, faults, cache, gate).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::InUse(dir.to_path_buf()),
        // A failing device (EIO, ENOSPC while redb repairs) does not make the file foreign.
        redb::DatabaseError::Storage(redb::StorageError::Io(e)) if e.raw_os_error().is_some() => {
            Error::from_io(e)
        }
        other => Error::NotAStore {
            path: dir.to_path_buf(),
            reason: format!("{META_FILE} cannot be opened: {other}"),
        },
    })
}

/// Opens (with `create`: creates) the redb database `p`. The file goes through [`MetaFile`]:
/// redb's own `FileBackend`, with the segments of `gate` synced before any write of redb's
/// header (so no commit redb can come back at references unsynced segment bytes) and, in
/// tests, `faults`. It forwards redb's lock calls to the `FileBackend`, so a second open of a
/// store in use fails with `DatabaseAlreadyOpen` ([`Error::InUse`]; tested in
/// `tests/meta_faults.rs`).
fn meta_db(
    p: &Path,
    create: bool,
    faults: Option<&FaultBackend>,
    cache: Option<usize>,
    gate: Option<Arc<SegSync>>,
) -> std::result::Result<Database, redb::DatabaseError> {
    let mut b = Database::builder();
    if let Some(c) = cache {
        b.set_cache_size(c);
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(p)?;
    b.create_with_backend(MetaFile::new(f, faults.cloned(), gate)?)
}

/// Checks that the metadata belongs to the superblock's store.
pub(crate) fn check_identity(dir: &Path, db: &Database, sb: &Superblock) -> Result<()> {
    let bad = |reason: &str| Error::NotAStore {
        path: dir.to_path_buf(),
        reason: reason.to_string(),
    };
    let txn = db.begin_read()?;
    let t = txn
        .open_table(meta::META)
        .map_err(|_| bad("metadata has no compfs tables"))?;
    let uuid = t
        .get("uuid")?
        .ok_or_else(|| bad("metadata has no store UUID"))?;
    if uuid.value() != sb.uuid {
        return Err(bad("metadata belongs to another store (UUID mismatch)"));
    }
    Ok(())
}

impl Store {
    /// Whether `dir` holds a store (a valid superblock).
    pub fn is_store(dir: &Path) -> bool {
        read_superblock(dir).is_ok()
    }

    /// Creates a new store in `dir` (created if missing). Refuses a non-empty directory unless
    /// `opts.force`, which removes an existing store's files first.
    pub fn create(dir: &Path, opts: &CreateOptions) -> Result<Store> {
        Store::create_tuned(dir, opts, Tuning::default())
    }

    /// [`Store::create`] with [`Tuning`].
    pub fn create_tuned(dir: &Path, opts: &CreateOptions, tuning: Tuning) -> Result<Store> {
        compfs_codec::check_extent_size(opts.extent_size as usize)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if tuning.segment_size < 1 << 16 {
            return Err(Error::InvalidArgument("segment size below 64 KiB".into()));
        }
        if dir.exists() {
            if !dir.is_dir() {
                return Err(Error::NotAStore {
                    path: dir.to_path_buf(),
                    reason: "exists and is not a directory".into(),
                });
            }
            let non_empty = std::fs::read_dir(dir)?.next().is_some();
            if non_empty {
                if !opts.force {
                    return Err(Error::AlreadyExists(dir.to_path_buf()));
                }
                for f in [SUPERBLOCK_FILE, META_FILE] {
                    match std::fs::remove_file(dir.join(f)) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                        _ => {}
                    }
                }
                match std::fs::remove_dir_all(dir.join(SEGMENT_DIR)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
        } else {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::create_dir(dir.join(SEGMENT_DIR))?;
        let now = Timestamp::now();
        let sb = Superblock {
            version: FORMAT_VERSION,
            uuid: random_uuid()?,
            extent_size: opts.extent_size,
            codec: opts.compression,
            mode: opts.mode,
            inline_max: tuning.inline_max.min(opts.extent_size / 2),
            segment_size: tuning.segment_size,
            created: now.secs,
        };
        {
            let db = meta_db(
                &dir.join(META_FILE),
                true,
                tuning.meta_faults.as_ref(),
                tuning.meta_cache,
                None,
            )?;
            let txn = db.begin_write()?;
            {
                let mut w = W::open(&txn)?;
                w.create_all()?;
                w.meta_mut()?.insert("uuid", sb.uuid.as_slice())?;
                w.meta_mut()?
                    .insert("format", FORMAT_VERSION.to_le_bytes().as_slice())?;
                w.meta_mut()?
                    .insert(meta::NEXT_INO, 2u64.to_le_bytes().as_slice())?;
                w.meta_mut()?
                    .insert(meta::NEXT_EXTENT, 1u64.to_le_bytes().as_slice())?;
                let root = InodeRec {
                    kind: FileKind::Dir,
                    perm: 0o755,
                    nlink: 2,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    size: 0,
                    atime: now,
                    mtime: now,
                    ctime: now,
                    crtime: now,
                    parent: ROOT_INO,
                    next_seq: 0,
                    disk_bytes: 0,
                    inline: None,
                };
                w.put_inode(ROOT_INO, &root)?;
            }
            txn.commit()?;
        }
        // The superblock is written last, atomically: a directory with a superblock holds a
        // complete store.
        let tmp = dir.join(format!("{SUPERBLOCK_FILE}.tmp"));
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&sb.encode())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, dir.join(SUPERBLOCK_FILE))?;
        sync_dir(dir)?;
        Store::open_tuned(dir, &OpenOptions::default(), tuning)
    }

    /// Opens an existing store.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Store> {
        Store::open_tuned(dir, opts, Tuning::default())
    }

    /// [`Store::open`] with [`Tuning`] (its `segment_size` and `inline_max` are ignored: the
    /// superblock's values apply).
    pub fn open_tuned(dir: &Path, opts: &OpenOptions, mut tuning: Tuning) -> Result<Store> {
        let sb = read_superblock(dir)?;
        // Every segment sync is watched (a failure fences redb's header, see `SegSync`).
        let seg_sync = Arc::new(SegSync::default());
        tuning.backend = seg_sync.watch(tuning.backend.clone());
        let db = open_db_with(
            dir,
            tuning.meta_faults.as_ref(),
            tuning.meta_cache,
            Some(seg_sync.clone()),
        )?;
        check_identity(dir, &db, &sb)?;
        let seg_dir = dir.join(SEGMENT_DIR);
        // Segment ids continue after every id in the metadata or on disk.
        let mut next_id = 1u64;
        for e in std::fs::read_dir(&seg_dir)? {
            if let Some(id) = e?.file_name().to_str().and_then(parse_segment_file_name) {
                next_id = next_id.max(id + 1);
            }
        }
        let next_extent;
        {
            let txn = db.begin_read()?;
            let segs = txn.open_table(meta::SEGMENTS)?;
            if let Some(r) = segs.last()? {
                next_id = next_id.max(r.0.value() + 1);
            }
            let m = txn.open_table(meta::META)?;
            next_extent = match m.get(meta::NEXT_EXTENT)? {
                Some(v) => meta::u64_value(v.value())?,
                None => return Err(meta::corrupt("missing extent counter")),
            };
        }
        let policy = opts.policy.unwrap_or((sb.codec, sb.mode));
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            seg_dir,
            sb,
            db,
            read_only_open: opts.read_only,
            policy: RwLock::new(policy),
            ro: Mutex::new(None),
            ro_flag: AtomicBool::new(false),
            files: Mutex::new(HashMap::new()),
            opens: Mutex::new(HashMap::new()),
            seg: Mutex::new(SegWriter {
                id: 0,
                file: None,
                end: 0,
                next_id,
                pins: HashMap::new(),
            }),
            seg_barrier: RwLock::new(()),
            unsynced: seg_sync,
            unsynced_bytes: AtomicU64::new(0),
            segsync: Mutex::new(None),
            seg_handles: Mutex::new(HashMap::new()),
            cache: Mutex::new(Lru::new(opts.cache_bytes)),
            loading: (0..LOAD_STRIPES).map(|_| Mutex::new(())).collect(),
            pool: Pool::new(opts.threads)?,
            counters: Counters::default(),
            dirty_bytes: AtomicUsize::new(0),
            bufs: Mutex::new(Vec::new()),
            next_extent: AtomicU64::new(next_extent),
            gc_lock: Mutex::new(()),
            last_durable: Mutex::new(Instant::now()),
            patches: Mutex::new(Patches::default()),
            writeback: Mutex::new(None),
            tuning: tuning.clone(),
        });
        if !opts.read_only {
            inner.free_orphans()?;
        }
        let flusher = match (tuning.flush_interval, opts.read_only) {
            (Some(iv), false) => {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let weak: Weak<Inner> = Arc::downgrade(&inner);
                let h = std::thread::Builder::new()
                    .name("compfs-flush".into())
                    .spawn(move || flusher_loop(weak, rx, iv))?;
                Some((tx, h))
            }
            _ => None,
        };
        let writeback = if opts.read_only {
            None
        } else {
            let (tx, rx) = std::sync::mpsc::channel::<Ino>();
            let weak: Weak<Inner> = Arc::downgrade(&inner);
            let h = std::thread::Builder::new()
                .name("compfs-writeback".into())
                .spawn(move || writeback_loop(weak, rx))?;
            *lock(&inner.writeback) = Some(tx);
            Some(h)
        };
        let segsync = if opts.read_only {
            None
        } else {
            let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
            let weak: Weak<Inner> = Arc::downgrade(&inner);
            let h = std::thread::Builder::new()
                .name("compfs-segsync".into())
                .spawn(move || segsync_loop(weak, rx))?;
            *lock(&inner.segsync) = Some(tx);
            Some(h)
        };
        Ok(Store {
            inner,
            flusher,
            writeback,
            segsync,
            closed: false,
        })
    }

    /// Changes the default codec and mode (like a remount with other options).
    pub fn set_policy(&self, spec: CodecSpec, mode: Mode) {
        if let Ok(mut p) = self.inner.policy.write() {
            *p = (spec, mode);
        }
    }

    /// The default codec and mode in force.
    pub fn policy(&self) -> (CodecSpec, Mode) {
        self.inner
            .policy
            .read()
            .map(|p| *p)
            .unwrap_or((self.inner.sb.codec, self.inner.sb.mode))
    }

    /// The store's extent size.
    pub fn extent_size(&self) -> u32 {
        self.inner.sb.extent_size
    }

    /// The store's superblock.
    pub fn superblock(&self) -> Superblock {
        self.inner.sb
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }

    /// Flushes every buffered write and makes everything acknowledged so far durable.
    pub fn sync(&self) -> Result<()> {
        self.inner.check_writable()?;
        self.inner.flush_all(false)?;
        self.inner.commit_durable()
    }

    /// Flushes, syncs and stops the worker threads.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        if let Some((tx, h)) = self.flusher.take() {
            drop(tx);
            let _ = h.join();
        }
        lock(&self.inner.writeback).take();
        if let Some(h) = self.writeback.take() {
            let _ = h.join();
        }
        lock(&self.inner.segsync).take();
        if let Some(h) = self.segsync.take() {
            let _ = h.join();
        }
        let r = if self.inner.read_only_open || self.inner.ro_flag.load(Ordering::SeqCst) {
            Ok(())
        } else {
            self.inner
                .flush_all(false)
                .and_then(|_| self.inner.commit_durable())
        };
        self.inner.pool.shutdown();
        r
    }

    /// Live statistics.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Space of the filesystem holding the store.
    pub fn statfs(&self) -> Result<StatFs> {
        let c = std::ffi::CString::new(self.inner.dir.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::InvalidArgument("store path contains NUL".into()))?;
        // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
        if r != 0 {
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        let used_inodes = {
            let txn = self.inner.db.begin_read()?;
            txn.open_table(meta::INODES)?.len()?
        };
        Ok(StatFs {
            bsize: s.f_frsize as u32,
            blocks: s.f_blocks as u64,
            bfree: s.f_bfree as u64,
            bavail: s.f_bavail as u64,
            files: used_inodes + s.f_ffree as u64,
            ffree: s.f_ffree as u64,
            namelen: NAME_MAX as u32,
        })
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(
                "compfs store {}: final flush failed: {e}",
                self.inner.dir.display()
            );
        }
    }
}

/// Appended bytes after which the segment syncer is woken.
const SEGSYNC_BYTES: u64 = 8 << 20;

/// The segment syncer: `fdatasync`s segments in the background while they are written (see
/// `Inner::mark_unsynced`).
fn segsync_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<()>) {
    while rx.recv().is_ok() {
        let Some(inner) = weak.upgrade() else { return };
        inner.sync_segments_background();
    }
}

/// Flushes files queued by their last close (see `Inner::queue_writeback`), so that the
/// closing thread (a FUSE request) does not compress and commit.
fn writeback_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<Ino>) {
    while let Ok(first) = rx.recv() {
        let Some(inner) = weak.upgrade() else { return };
        // Everything queued so far goes in one batch (one transaction).
        let mut batch = vec![first];
        while batch.len() < 256 {
            match rx.try_recv() {
                Ok(ino) => batch.push(ino),
                Err(_) => break,
            }
        }
        inner.writeback_batch(&batch);
    }
}

fn flusher_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<()>, iv: Duration) {
    loop {
        match rx.recv_timeout(iv) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(inner) = weak.upgrade() else { return };
        if inner.ro_flag.load(Ordering::SeqCst) {
            continue;
        }
        if let Err(e) = inner.flush_all(true) {
            tracing::error!("compfs background flush failed: {e}");
            continue;
        }
        inner.trim_bufs();
        let due = lock(&inner.last_durable).elapsed() >= Duration::from_secs(5);
        if due {
            if let Err(e) = inner.commit_durable() {
                tracing::error!("compfs background commit failed: {e}");
                continue;
            }
        }
        if inner.gc_due() {
            if let Err(e) = inner.gc(inner.tuning.gc_garbage_ratio.max(0.5)) {
                tracing::warn!("compfs automatic GC failed: {e}");
            }
        }
    }
}

impl Inner {
    /// Fails with [`Error::ReadOnly`] if the store takes no more changes.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.read_only_open {
            return Err(Error::ReadOnly("opened read-only".into()));
        }
        if self.ro_flag.load(Ordering::SeqCst) {
            let why = lock(&self.ro).clone().unwrap_or_default();
            return Err(Error::ReadOnly(why));
        }
        Ok(())
    }

    /// Latches the store read-only after a failed write, sync or commit, and passes the error on.
    pub(crate) fn fail(&self, e: Error) -> Error {
        if !self.ro_flag.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "compfs store {}: {e}; refusing further writes until reopened",
                self.dir.display()
            );
            *lock(&self.ro) = Some(format!("an earlier write or sync failed: {e}"));
        }
        e
    }

    /// Starts a write transaction with non-durable commit semantics.
    pub(crate) fn begin(&self, durable: bool) -> Result<redb::WriteTransaction> {
        let mut txn = self.db.begin_write().map_err(|e| self.fail(e.into()))?;
        txn.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(|e| self.fail(e.into()))?;
        Ok(txn)
    }

    /// Runs `body` in a write transaction and commits it (durably when `durable`).
    ///
    /// A storage error inside the body (redb I/O, a full disk, damaged metadata) latches the
    /// store read-only exactly like a failed begin or commit, as btrfs aborts a transaction:
    /// redb may already have written some of the transaction's pages, and the device is failing.
    /// Errors that only refuse the operation (`NotFound`, `Exists`, ...) leave it writable.
    pub(crate) fn write<T>(
        &self,
        durable: bool,
        body: impl FnOnce(&mut W<'_>) -> Result<T>,
    ) -> Result<T> {
        let txn = self.begin(durable)?;
        let out = {
            let mut w = W::open(&txn).map_err(|e| self.fail_storage(e))?;
            body(&mut w).map_err(|e| self.fail_storage(e))?
        };
        self.commit(txn, durable)?;
        Ok(out)
    }

    /// Latches read-only when `e` is a storage error (see [`Error::is_storage`]).
    pub(crate) fn fail_storage(&self, e: Error) -> Error {
        if e.is_storage() {
            self.fail(e)
        } else {
            e
        }
    }

    /// Notes that segment `id` has appended bytes not yet synced.
    pub(crate) fn mark_unsynced(&self, id: u64, f: Arc<dyn SegFile>, bytes: u64) {
        {
            let mut u = lock(&self.unsynced.files);
            let e = u.entry(id).or_insert((f, 0));
            e.1 += 1;
        }
        // Every few MiB, have the segment syncer write them out in the background, so that
        // the next durable commit (fsync, sync, unmount) finds little left to sync.
        let n = self.unsynced_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if n >= SEGSYNC_BYTES {
            self.unsynced_bytes.store(0, Ordering::Relaxed);
            if let Some(tx) = lock(&self.segsync).as_ref() {
                let _ = tx.try_send(());
            }
        }
    }

    /// One pass of the segment syncer: `fdatasync`s every segment with unsynced bytes without
    /// holding any lock, then forgets those that took no append meanwhile.
    fn sync_segments_background(&self) {
        let files: Vec<(u64, Arc<dyn SegFile>, u64)> = lock(&self.unsynced.files)
            .iter()
            .map(|(&id, (f, g))| (id, f.clone(), *g))
            .collect();
        for (id, f, gen) in files {
            if let Err(e) = f.sync_data() {
                // Noted in `unsynced` (a watched file): the next durable commit fails and
                // latches read-only (a second fdatasync could succeed with the bytes lost).
                tracing::warn!("compfs background sync of segment {id} failed: {e}");
                continue;
            }
            let mut u = lock(&self.unsynced.files);
            if u.get(&id).is_some_and(|(_, g)| *g == gen) {
                u.remove(&id);
            }
        }
    }

    /// `fdatasync`s every segment with unsynced appended bytes.
    /// Fails if any segment sync failed before (its bytes may be lost).
    pub(crate) fn sync_segments(&self) -> Result<()> {
        self.unsynced
            .sync_all()
            .map_err(|e| self.fail(Error::from_io(e)))
    }

    /// Commits; a failure latches read-only. A durable commit first syncs every segment with
    /// unsynced bytes: the transaction holds redb's write lock, so every earlier (non-durable)
    /// commit that this one makes durable appended its bytes before now, and they are synced
    /// before the metadata referencing them becomes durable.
    ///
    /// Every commit also writes the pending attribute patches (see `attrs`); they are retired
    /// once the commit succeeded.
    pub(crate) fn commit(&self, txn: redb::WriteTransaction, durable: bool) -> Result<()> {
        let pending = {
            let p = lock(&self.patches);
            if p.is_empty() {
                Vec::new()
            } else {
                p.snapshot()
            }
        };
        if !pending.is_empty() {
            write_patches(&txn, &pending).map_err(|e| self.fail(e))?;
        }
        if durable {
            self.sync_segments()?;
        }
        txn.commit().map_err(|e| self.fail(e.into()))?;
        if durable {
            *lock(&self.last_durable) = Instant::now();
        }
        if !pending.is_empty() {
            lock(&self.patches).retire(&pending);
        }
        Ok(())
    }

    /// A durable (fsync'ing) commit: makes every earlier non-durable commit durable. Every
    /// segment byte those commits reference was synced before they committed.
    pub(crate) fn commit_durable(&self) -> Result<()> {
        self.write(true, |_| Ok(()))
    }

    fn free_orphans(&self) -> Result<()> {
        let orphans: Vec<u64> = {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(meta::ORPHANS)?;
            t.iter()?
                .map(|r| r.map(|(k, _)| k.value()))
                .collect::<std::result::Result<_, _>>()?
        };
        if orphans.is_empty() {
            return Ok(());
        }
        self.write(true, |w| {
            for ino in orphans {
                match w.free_inode(ino) {
                    Ok(()) | Err(Error::NotFound) => {}
                    Err(e) => return Err(e),
                }
                w.orphans_mut()?.remove(ino)?;
            }
            Ok(())
        })
    }

    /// A read handle of segment `id`. Call with `seg_barrier` read-locked.
    pub(crate) fn seg_file(&self, id: u64) -> Result<Arc<dyn SegFile>> {
        if let Some(f) = lock(&self.seg_handles).get(&id) {
            return Ok(f.clone());
        }
        {
            let w = lock(&self.seg);
            if w.id == id {
                if let Some(f) = &w.file {
                    return Ok(f.clone());
                }
            }
        }
        let f = self
            .tuning
            .backend
            .open(&self.seg_dir.join(segment_file_name(id)), false)?;
        let mut h = lock(&self.seg_handles);
        if h.len() > 256 {
            h.clear();
        }
        h.insert(id, f.clone());
        Ok(f)
    }

    /// Appends encoded extents (each a header followed by its bytes, concatenated in `buf`) to
    /// the active segment, starting a new one when it is full. Returns the segment, its file and
    /// the offset of `buf`; the segment stays pinned (GC leaves it alone) until `unpin`.
    pub(crate) fn append(&self, buf: &[u8]) -> Result<(u64, Arc<dyn SegFile>, u64)> {
        self.append_parts(&[buf])
    }

    /// [`Inner::append`] of the concatenation of `parts`, written with one vectored write.
    pub(crate) fn append_parts(&self, parts: &[&[u8]]) -> Result<(u64, Arc<dyn SegFile>, u64)> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut w = lock(&self.seg);
        let need_new = match &w.file {
            None => true,
            Some(_) => w.end > SEG_HEADER_LEN && w.end + len > self.sb.segment_size,
        };
        if need_new {
            let id = w.next_id;
            w.next_id += 1;
            let path = self.seg_dir.join(segment_file_name(id));
            let f = self.tuning.backend.create(&path).map_err(Error::from_io)?;
            let h = SegmentHeader {
                version: FORMAT_VERSION,
                uuid: self.sb.uuid,
                id,
            };
            f.write_all_at(&h.encode(), 0).map_err(Error::from_io)?;
            f.sync_data().map_err(Error::from_io)?;
            self.tuning
                .backend
                .sync_dir(&self.seg_dir)
                .map_err(Error::from_io)?;
            w.id = id;
            w.file = Some(f);
            w.end = SEG_HEADER_LEN;
        }
        let (id, off) = (w.id, w.end);
        let Some(f) = w.file.clone() else {
            return Err(Error::Io(std::io::Error::other("no active segment")));
        };
        *w.pins.entry(id).or_insert(0) += 1;
        // Reserve the range before writing so concurrent appenders never overlap.
        w.end += len;
        drop(w);
        let res = match parts {
            [one] => f.write_all_at(one, off),
            _ => f.write_parts_at(parts, off),
        };
        if let Err(e) = res {
            self.unpin(id);
            return Err(Error::from_io(e));
        }
        self.counters.seg_written.fetch_add(len, Ordering::Relaxed);
        Ok((id, f, off))
    }

    pub(crate) fn unpin(&self, id: u64) {
        let mut w = lock(&self.seg);
        if let Some(n) = w.pins.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                w.pins.remove(&id);
            }
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let c = &self.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = Stats {
            user_bytes_written: ld(&c.user_written),
            user_bytes_read: ld(&c.user_read),
            segment_bytes_written: ld(&c.seg_written),
            extents_raw: ld(&c.raw),
            heuristic_skips: ld(&c.heuristic_skips),
            zero_blocks: ld(&c.zero_blocks),
            gc_runs: ld(&c.gc_runs),
            gc_bytes_moved: ld(&c.gc_moved),
            gc_segments_freed: ld(&c.gc_freed),
            cache_hits: ld(&c.cache_hits),
            cache_misses: ld(&c.cache_misses),
            read_only: self.ro_flag.load(Ordering::SeqCst) || self.read_only_open,
            dirty_bytes: self.dirty_bytes.load(Ordering::Relaxed) as u64,
            ..Stats::default()
        };
        for a in compfs_codec::Algorithm::ALL {
            let n = ld(&c.compressed[a.id() as usize]);
            if n > 0 {
                s.extents_compressed.insert(a.name().to_string(), n);
            }
        }
        if let Ok(txn) = self.db.begin_read() {
            if let Ok(t) = txn.open_table(meta::STATS) {
                if let Ok(it) = t.iter() {
                    for (k, v) in it.flatten() {
                        let Ok(r) = crate::format::StatRec::decode(v.value()) else {
                            continue;
                        };
                        let name = if k.value() == crate::format::STAT_INLINE {
                            "inline".to_string()
                        } else {
                            match compfs_codec::Algorithm::from_id(k.value()) {
                                Some(a) => a.name().to_string(),
                                None => continue,
                            }
                        };
                        s.per_codec.insert(
                            name,
                            CodecCounters {
                                extents: r.extents,
                                disk: r.disk,
                                uncompressed: r.uncompressed,
                                referenced: r.referenced,
                            },
                        );
                    }
                }
            }
            if let Ok(t) = txn.open_table(meta::SEGMENTS) {
                if let Ok(it) = t.iter() {
                    for (_, v) in it.flatten() {
                        if let Ok(r) = crate::format::SegmentRec::decode(v.value()) {
                            s.segment_bytes += r.len;
                            s.live_bytes += r.live;
                        }
                    }
                }
            }
        }
        s
    }
}
