//! Opening, creating and closing stores; the shared state ([`Inner`]) and its tuning knobs.
//! The rest of the store lives in modules by concern: `txn` (transactions and the read-only
//! latch), `segment` (the appender), `file`/`fileops`/`flush`/`encode`/`writeback`/`read` (file
//! data), `background` (threads), `stats`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use compfs_codec::{CodecSpec, Mode};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::attrs::Patches;
use crate::backend::{Backend, FaultBackend, SegFile, SegSync, StdBackend};
use crate::cache::Lru;

/// Number of [`Inner::loading`] stripes.
pub(crate) const LOAD_STRIPES: usize = 64;
use crate::background::Threads;
use crate::error::{Error, Result};
use crate::file::FileState;
use crate::meta::{self, W};
use crate::open::{
    check_identity, meta_db, open_db_with, random_uuid, read_superblock, upgrade_format,
    write_superblock,
};
use crate::pool::Pool;
use crate::prealloc::{Reserve, RESERVE_FILE};
use crate::records::{
    parse_segment_file_name, InodeRec, Superblock, FORMAT_VERSION, META_FILE, SEGMENT_DIR,
    SUPERBLOCK_FILE,
};
use crate::segment::SegWriter;
use crate::stats::Counters;
use crate::types::*;

/// Knobs beyond the API contract's options: mostly for tests and benchmarks.
#[derive(Clone)]
pub struct Tuning {
    /// Segment file size at which a new segment starts (stored in the superblock at creation).
    pub segment_size: u64,
    /// Largest regular file kept inline in its inode record (stored at creation). 2048, as
    /// btrfs's `max_inline`, but chosen by measurement: with inline data compressed, larger
    /// limits made `meta.redb` grow by more than the segments shrank (docs/benchmarks.md).
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
    /// Namespace changes the held batch takes before it is committed (see `txn`); 1 commits
    /// every change at once (as before batching: benchmarks compare the two).
    pub batch_ops: u32,
    /// Called after every durable commit with redb's write lock held (stores in a bucket
    /// upload their metadata snapshot there; see [`crate::object`]).
    pub after_durable: Option<Arc<dyn crate::object::DurableHook>>,
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
            batch_ops: crate::txn::BATCH_OPS,
            after_durable: None,
        }
    }
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub seg_dir: PathBuf,
    pub sb: Superblock,
    pub db: Database,
    pub tuning: Tuning,
    pub read_only_open: bool,
    pub policy: RwLock<(CodecSpec, Mode)>,
    /// The worth-it rule of this open ([`OpenOptions::min_saving`]).
    pub min_saving: compfs_codec::MinSaving,
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
    /// generation it synced). Shared with `meta.redb`'s [`MetaFile`](crate::backend::MetaFile),
    /// which syncs them before writing redb's header (see [`SegSync`]).
    pub unsynced: Arc<SegSync>,
    /// Bytes appended since the segment syncer was last woken.
    pub unsynced_bytes: AtomicU64,
    /// Wakes the segment syncer (see `segsync_loop`).
    pub segsync: Mutex<Option<std::sync::mpsc::SyncSender<()>>>,
    pub seg_handles: Mutex<HashMap<u64, Arc<dyn SegFile>>>,
    pub cache: Mutex<Lru>,
    /// Files' sequential read streams, for backends that fetch ahead.
    pub prefetch: crate::prefetch::Tracker,
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
    /// Since when commits changed the metadata without a durable commit having passed that
    /// on to the [`crate::object::DurableHook`] (which uploads snapshots only of changes).
    pub changed: Mutex<Option<Instant>>,
    /// Attribute changes not yet in the metadata, written by the next commit (see `attrs`).
    pub patches: Mutex<Patches>,
    /// The open batch of namespace changes (see `txn`): a redb write transaction holding
    /// changes not yet committed. Every metadata write transaction runs under this lock.
    pub held: Mutex<Option<crate::txn::Held>>,
    /// Queue of the writeback thread: small files flushed after their last close.
    pub writeback: Mutex<Option<std::sync::mpsc::Sender<Ino>>>,
    /// Preallocated ranges' total and the host space held for them (see `prealloc`).
    pub reserve: Reserve,
    /// Background recompression (see `bgcomp`).
    pub bg: crate::bgcomp::Shared,
    /// Store-trained dictionaries (see `dict`).
    pub dicts: Arc<crate::dict::Dicts>,
    /// Pack size of this open (0: packing off; see `pack` and [`Store::set_pack`]).
    pub pack: AtomicU32,
    /// Files `defrag` queued for a repack (see `pack`).
    pub repack: Mutex<crate::pack::RepackQueue>,
}

/// A compfs store. See the crate docs.
///
/// ```
/// fn shared<T: Send + Sync>() {}
/// shared::<compfs_store::Store>();
/// ```
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    threads: Threads,
    closed: bool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a thread panicked while holding it; the protected data are plain
    // caches or counters that stay structurally valid, so continue with them.
    m.lock().unwrap_or_else(|p| p.into_inner())
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
                for f in [SUPERBLOCK_FILE, META_FILE, RESERVE_FILE] {
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
        write_superblock(dir, &sb)?;
        Store::open_tuned(dir, &OpenOptions::default(), tuning)
    }

    /// Opens an existing store.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Store> {
        Store::open_tuned(dir, opts, Tuning::default())
    }

    /// [`Store::open`] with [`Tuning`] (its `segment_size` and `inline_max` are ignored: the
    /// superblock's values apply).
    pub fn open_tuned(dir: &Path, opts: &OpenOptions, mut tuning: Tuning) -> Result<Store> {
        let mut sb = read_superblock(dir)?;
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
        if !opts.read_only {
            upgrade_format(dir, &db, &mut sb)?;
        }
        let seg_dir = dir.join(SEGMENT_DIR);
        // Segment ids continue after every id in the metadata or on disk.
        let mut next_id = 1u64;
        for e in std::fs::read_dir(&seg_dir)? {
            if let Some(id) = e?.file_name().to_str().and_then(parse_segment_file_name) {
                next_id = next_id.max(id + 1);
            }
        }
        let next_extent;
        let reserved;
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
            reserved = crate::prealloc::total_in(&txn)?;
        }
        let reserve = Reserve::open(dir, reserved, opts.read_only)?;
        let policy = opts.policy.unwrap_or((sb.codec, sb.mode));
        let dicts = Arc::new(crate::dict::Dicts::open(
            &db,
            opts.dict && !opts.read_only,
            opts.pack_dict,
            crate::dict::dict_level(sb.codec),
        )?);
        let inner = Arc::new(Inner {
            dicts,
            dir: dir.to_path_buf(),
            seg_dir,
            sb,
            db,
            read_only_open: opts.read_only,
            policy: RwLock::new(policy),
            min_saving: opts.min_saving,
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
            prefetch: crate::prefetch::Tracker::default(),
            loading: (0..LOAD_STRIPES).map(|_| Mutex::new(())).collect(),
            pool: Pool::new(opts.threads)?,
            counters: Counters::default(),
            dirty_bytes: AtomicUsize::new(0),
            bufs: Mutex::new(Vec::new()),
            next_extent: AtomicU64::new(next_extent),
            gc_lock: Mutex::new(()),
            last_durable: Mutex::new(Instant::now()),
            changed: Mutex::new(None),
            held: Mutex::new(None),
            patches: Mutex::new(Patches::default()),
            writeback: Mutex::new(None),
            reserve,
            bg: crate::bgcomp::Shared::new(opts.background, opts.threads),
            tuning: tuning.clone(),
            pack: AtomicU32::new(opts.pack.min(compfs_codec::MAX_EXTENT as u32)),
            repack: Mutex::new(crate::pack::RepackQueue::default()),
        });
        if !opts.read_only {
            inner.free_orphans()?;
        }
        let threads = Threads::start(&inner, tuning.flush_interval, opts.read_only)?;
        Ok(Store {
            inner,
            threads,
            closed: false,
        })
    }

    /// Changes the pack size (like a remount with `pack=`; 0 turns packing off), at most
    /// 1 MiB. Packs already written stay as they are.
    pub fn set_pack(&self, pack: u32) {
        self.inner
            .pack
            .store(pack.min(compfs_codec::MAX_EXTENT as u32), Ordering::Relaxed);
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
        let _local = crate::object::LocalDurable::enter();
        self.inner.flush_all(false)?;
        self.inner.commit_durable()
    }

    /// [`Store::sync`], and for a store in a bucket the upload of the metadata snapshot (after
    /// the upload queue of `-o writeback`) before it returns, as unmount does.
    pub fn sync_remote(&self) -> Result<()> {
        self.inner.check_writable()?;
        self.inner.flush_all(false)?;
        self.inner.commit_durable()
    }

    /// One line on the metadata snapshot in the bucket of a store in one (none otherwise).
    pub fn remote_status(&self) -> Option<String> {
        self.inner.tuning.after_durable.as_ref().map(|h| h.status())
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
        // No reader is left: fetches ahead would only fill a cache the next opener may own.
        self.inner.tuning.backend.stop_prefetch();
        self.threads.stop(&self.inner);
        let r = if self.inner.read_only_open || self.inner.ro_flag.load(Ordering::SeqCst) {
            Ok(())
        } else {
            self.inner
                .flush_all(false)
                .and_then(|_| self.inner.commit_durable())
        };
        // A batch left (latched read-only, or the final commit failed) is dropped: aborted.
        drop(lock(&self.inner.held).take());
        self.inner.pool.shutdown();
        self.inner.bg.shutdown_pool();
        if r.is_ok() && !self.inner.read_only_open && !self.inner.ro_flag.load(Ordering::SeqCst) {
            self.compact_meta();
        }
        r
    }

    /// Compacts `meta.redb` after a clean close. redb splits full B-tree pages in halves and
    /// keeps freed pages in the file, so a file written by many small commits ends up 1.6-2.6
    /// times the bytes it stores (the /usr/include copy: 5.0-8.4 MB for 3.2 MB of records,
    /// depending on commit timing); compaction moves the live pages to the front and trims the
    /// file (5.1 MB). Everything is durable before it starts, and each of its steps is a
    /// durable redb commit, so a crash during it loses nothing. A failure only leaves the file
    /// larger: it is logged, not returned. Skipped if another handle to the store's state is
    /// still alive (compaction needs the database to itself).
    fn compact_meta(&mut self) {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return;
        };
        let start = Instant::now();
        match inner.db.compact() {
            Ok(_) => tracing::debug!(
                "compfs: metadata compacted in {:.2} s",
                start.elapsed().as_secs_f64()
            ),
            Err(e) => tracing::warn!(
                "compfs store {}: compacting the metadata failed (it stays larger): {e}",
                inner.dir.display()
            ),
        }
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
            let txn = self.inner.read_txn()?;
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
