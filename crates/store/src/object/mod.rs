//! Stores whose segments and metadata snapshots live in an S3-compatible bucket
//! (`s3://BUCKET/PREFIX`), through the `object_store` crate's S3 client. The store itself runs
//! unchanged on a local cache directory holding `superblock`, `meta.redb` (the working
//! metadata database), placeholders of the segments and a bounded cache of segment data; the
//! bucket holds the superblock, every segment as chunk objects ([`segments`]) and a snapshot
//! of `meta.redb` uploaded by every durable commit ([`snapshot`]). See docs/format.md, "Stores
//! on object storage", for the layout and the commit protocol.

pub mod blockcache;
pub mod check;
pub mod fresh;
pub mod layout;
pub mod lease;
pub mod options;
pub mod queue;
pub mod readahead;
pub mod remote;
pub mod retry;
pub mod segments;
pub mod snapshot;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The data cache's directory inside the cache directory.
const DATA_CACHE_DIR: &str = "cache";

pub use check::{fsck_bucket, BucketReport};
pub use options::{split_options, write_request_counts, OptionError, REQUESTS_FILE};
pub use remote::{Remote, RemoteConfig, RemoteCounts, S3Url};
pub use segments::ObjectBackend;
use segments::WritebackConfig;

use crate::error::{Error, Result};
use crate::open::read_superblock;
use crate::records::{SEGMENT_DIR, SUPERBLOCK_FILE};
use crate::store::{Store, Tuning};
use crate::types::{CreateOptions, OpenOptions};
use blockcache::BlockCache;
use layout::{parse_chunk_key, parse_piece_key, MANIFEST_KEY, SUPERBLOCK_KEY};
use snapshot::{download, fetch_manifest, local_generation, MetaUploader};

/// What a [`DurableHook`] leaves to be done once the commit released its locks: the upload.
pub type AfterLocks = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// Called by every durable commit once redb committed, with redb's write lock held (so no
/// other commit changes `meta.redb` meanwhile): takes what an upload needs and returns the
/// upload, which the commit runs after it released its locks and before it returns. A failure
/// of either latches the store read-only.
pub trait DurableHook: Send + Sync {
    /// `periodic`: the flusher's commit (not an fsync, sync, unmount or GC); `changed`: since
    /// when commits changed the metadata after the previous call, if they did.
    fn after_durable_commit(
        &self,
        periodic: bool,
        changed: Option<Instant>,
    ) -> io::Result<Option<AfterLocks>>;
    /// Whether the flusher should commit now (a snapshot upload is due); `unseen`: since when
    /// commits changed the metadata that no durable commit passed on yet.
    fn upload_due(&self, _unseen: Option<Instant>) -> bool {
        false
    }
    /// One line on the snapshot in the bucket (`compfs.remote`, `compfs sync --remote`).
    fn status(&self) -> String {
        String::new()
    }
}

/// Default of `metadata_interval`: how long changes made durable by the flusher alone (no
/// fsync) wait at most before their snapshot is uploaded.
pub const DEFAULT_METADATA_INTERVAL: Duration = Duration::from_secs(60);

/// The flusher looks every 2 s (the default `Tuning::flush_interval`): an upload is made when
/// it would be due before the next look, so that none comes later than `metadata_interval`.
const FLUSH_TICK: Duration = Duration::from_secs(2);

/// Default bound of the local segment data cache.
pub const DEFAULT_CACHE_SIZE: u64 = 1 << 30;

/// Default dirty limit: appended segment bytes held in memory before their upload, above
/// which writers upload them themselves and wait.
pub const DEFAULT_DIRTY_LIMIT: u64 = 64 << 20;

/// Default bound of the upload queue of `-o writeback` (`-o upload_limit=`): 1 GiB, as the
/// data cache's. At 100 MB/s to the bucket that is 10 s of uploads, so a burst of fsynced
/// writes much larger than the dirty limit still returns at local-disk speed; and it bounds
/// what the cache directory's disk holds that the bucket has not (what a loss of the machine
/// costs beyond the last snapshot, and the space taken while the bucket is unreachable).
pub const DEFAULT_UPLOAD_LIMIT: u64 = 1 << 30;

/// Options of a store in a bucket.
#[derive(Debug, Clone)]
pub struct ObjectOptions {
    pub remote: RemoteConfig,
    /// Where the metadata database and the data cache live (default:
    /// [`S3Url::default_cache_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// Bound of the data cache in bytes (0: no cache, every read a ranged GET of its bytes).
    pub cache_size: u64,
    /// Appended segment bytes not yet uploaded (held in memory) above which writes block
    /// until uploads catch up (`-o dirty_limit=`).
    pub dirty_limit: u64,
    /// How a read-write open takes the store's lease (timeout, `--force`).
    pub lease: lease::LeaseOptions,
    /// Changes made durable by the flusher alone are uploaded at most this long after they
    /// were first committed (an fsync, sync, unmount or GC uploads at once).
    pub metadata_interval: Duration,
    /// `-o writeback`: an fsync or sync returns once its segment bytes are fsynced in the
    /// upload queue in the cache directory; they are uploaded in the background, and the
    /// metadata snapshot (after them) by the flusher within `metadata_interval`, by unmount
    /// and by GC.
    pub writeback: bool,
    /// `-o writeback`: bytes of chunk data the upload queue may hold (`-o upload_limit=`). A
    /// durable commit whose runs would pass it waits for the uploader to make room; when no
    /// chunk leaves the queue for the request deadline (`-o timeout=`) it fails with EIO and
    /// the store turns read-only.
    pub upload_limit: u64,
}

thread_local! {
    static LOCAL_DURABLE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the durable commits of the current thread, while alive, as asked for by an fsync or
/// a sync: with `-o writeback` they need not upload anything (see [`DurableHook`]).
pub(crate) struct LocalDurable {
    was: bool,
}

impl LocalDurable {
    pub(crate) fn enter() -> LocalDurable {
        LocalDurable {
            was: LOCAL_DURABLE.with(|c| c.replace(true)),
        }
    }
}

impl Drop for LocalDurable {
    fn drop(&mut self) {
        let was = self.was;
        LOCAL_DURABLE.with(|c| c.set(was));
    }
}

fn local_durable() -> bool {
    LOCAL_DURABLE.with(|c| c.get())
}

impl Default for ObjectOptions {
    fn default() -> Self {
        ObjectOptions {
            remote: RemoteConfig::default(),
            cache_dir: None,
            cache_size: DEFAULT_CACHE_SIZE,
            dirty_limit: DEFAULT_DIRTY_LIMIT,
            lease: lease::LeaseOptions::default(),
            metadata_interval: DEFAULT_METADATA_INTERVAL,
            writeback: false,
            upload_limit: DEFAULT_UPLOAD_LIMIT,
        }
    }
}

impl ObjectOptions {
    pub fn cache_dir_for(&self, url: &S3Url) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(|| url.default_cache_dir())
    }
}

/// An open store in a bucket. Dropping it closes the store, then releases the lease (fields
/// drop in this order).
pub struct ObjectStoreHandle {
    pub store: Store,
    pub cache_dir: PathBuf,
    pub backend: ObjectBackend,
    /// The writer's lease (none for a read-only open): release it after the store closed.
    pub lease: Option<lease::Lease>,
}

impl ObjectStoreHandle {
    /// Closes the store (its last durable commit and snapshot upload), then releases the lease.
    pub fn close(self) -> Result<()> {
        let ObjectStoreHandle { store, lease, .. } = self;
        let r = store.close();
        if let Some(l) = lease {
            if r.is_ok() {
                l.release()?;
            }
            // A failed close keeps the lease until it expires: what the bucket holds is
            // then the last durable state, and a takeover is a decision for --force.
            else {
                l.abandon();
            }
        }
        r
    }

    /// Drops the handle as a crash of the process would: no final commit, no upload, the lease
    /// left to expire (for tests of a lost writer).
    pub fn abandon(self) {
        let ObjectStoreHandle {
            store,
            lease,
            backend,
            ..
        } = self;
        // The upload queue stays as it is (a crash stops its uploads too).
        backend.stop_uploader();
        if let Some(l) = lease {
            l.abandon();
        }
        std::mem::forget(store);
    }

    /// Requests and bytes sent to the bucket since the store was opened.
    pub fn counts(&self) -> RemoteCounts {
        self.backend.shared.remote.counts()
    }
}

impl MetaUploaderHook {
    fn new(
        remote: Arc<Remote>,
        cache_dir: PathBuf,
        last: Option<layout::Manifest>,
        up: Option<MetaUploader>,
        interval: Duration,
        writeback: Option<ObjectBackend>,
    ) -> MetaUploaderHook {
        MetaUploaderHook {
            writeback,
            remote,
            cache_dir,
            last,
            inner: Mutex::new(up.map(Arc::new)),
            interval,
            state: Arc::new(Mutex::new(Pending {
                // Unknown at first (the local file may hold commits the bucket lacks): the
                // first durable commit uploads.
                since: Some(Instant::now()),
                copies: BTreeMap::new(),
                draining: 0,
            })),
        }
    }

    fn uploader(&self) -> io::Result<Arc<MetaUploader>> {
        let mut g = lock(&self.inner);
        if let Some(u) = &*g {
            return Ok(u.clone());
        }
        let sb = read_superblock(&self.cache_dir).map_err(|e| io::Error::other(e.to_string()))?;
        let u = Arc::new(MetaUploader::new(
            self.remote.clone(),
            &self.cache_dir,
            sb.uuid,
            self.last.as_ref(),
        ));
        *g = Some(u.clone());
        Ok(u)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The earlier of two times, if any.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl DurableHook for MetaUploaderHook {
    fn after_durable_commit(
        &self,
        periodic: bool,
        changed: Option<Instant>,
    ) -> io::Result<Option<AfterLocks>> {
        let mut st = lock(&self.state);
        st.since = earliest(st.since, changed);
        let Some(since) = st.since else {
            // The bucket holds this state already, or a copy on its way there does.
            return Ok(None);
        };
        if periodic && (since.elapsed() + FLUSH_TICK < self.interval || !st.copies.is_empty()) {
            // Not due yet, or an upload is under way: a later commit of the flusher uploads.
            return Ok(None);
        }
        if self.writeback.is_some() && !periodic && local_durable() {
            // An fsync or sync: its bytes are in the upload queue, fsynced; the flusher
            // uploads the snapshot within `interval` (after the queue).
            return Ok(None);
        }
        // Under redb's write lock: the image of this commit, and the chunks it references
        // (every chunk queued so far: the commit synced its segments before).
        let up = self.uploader()?;
        let mark = self.writeback.as_ref().map(|b| (b.clone(), b.queue_mark()));
        let copy = up.take_copy()?;
        let seq = copy.seq();
        st.copies.insert(seq, since);
        st.since = None;
        drop(st);
        let state = self.state.clone();
        Ok(Some(Box::new(move || {
            let r = upload_after_locks(mark, &up, copy, &state);
            let mut st = lock(&state);
            match &r {
                // The bucket holds this copy's image or a later one: every earlier copy's too.
                Ok(()) => st.copies.retain(|&s, _| s > seq),
                Err(_) => {
                    let t = st.copies.remove(&seq);
                    st.since = earliest(st.since, t);
                }
            }
            r
        })))
    }

    fn upload_due(&self, unseen: Option<Instant>) -> bool {
        let st = lock(&self.state);
        // An upload under way: the next one is due once it is done.
        st.copies.is_empty()
            && st
                .since
                .into_iter()
                .chain(unseen)
                .any(|t| t.elapsed() + FLUSH_TICK >= self.interval)
    }

    fn status(&self) -> String {
        let gen = lock(&self.inner).as_ref().map_or(0, |u| u.generation());
        let (pending, draining) = {
            let st = lock(&self.state);
            (
                earliest(st.since, st.copies.values().min().copied()),
                st.draining,
            )
        };
        let mut queue = match self.writeback.as_ref().and_then(|b| b.queued()) {
            Some((n, bytes)) => format!("; upload queue: {n} chunks, {bytes} bytes"),
            None => String::new(),
        };
        if let Some((limit, waiting)) = self.writeback.as_ref().and_then(|b| b.queue_limit()) {
            queue.push_str(&format!(" (upload_limit {limit} bytes"));
            if waiting > 0 {
                queue.push_str(&format!("; syncs waiting for room: {waiting}"));
            }
            queue.push(')');
        }
        if draining > 0 {
            queue.push_str("; a snapshot upload is waiting for the upload queue");
        }
        match pending {
            None => format!(
                "{}: metadata snapshot generation {gen} in the bucket, no changes pending{queue}",
                self.remote.url
            ),
            Some(t) => format!(
                "{}: metadata snapshot generation {gen} in the bucket, changes pending for {:.1} s \
                 (uploaded within {} s){queue}",
                self.remote.url,
                t.elapsed().as_secs_f64(),
                self.interval.as_secs()
            ),
        }
    }
}

/// Step 2 of a snapshot upload, after the commit's locks: drains the upload queue up to `mark`
/// (`-o writeback`), then uploads `copy`.
fn upload_after_locks(
    mark: Option<(ObjectBackend, u64)>,
    up: &MetaUploader,
    copy: snapshot::MetaCopy,
    state: &Mutex<Pending>,
) -> io::Result<()> {
    if let Some((b, mark)) = mark {
        // Data before metadata in the bucket: every chunk this copy references first.
        lock(state).draining += 1;
        let r = b.drain_to(mark);
        lock(state).draining -= 1;
        r?;
    }
    up.upload_copy(copy).map(|_| ())
}

/// What the bucket lacks of the committed metadata (see [`MetaUploaderHook`]).
struct Pending {
    /// Since when the bucket lacks committed changes that no copy taken for upload holds.
    since: Option<Instant>,
    /// Copies of `meta.redb` taken and not uploaded yet, by number: since when the changes
    /// they hold wait.
    copies: BTreeMap<u64, Instant>,
    /// Uploads waiting for the upload queue to drain now.
    draining: u32,
}

/// The [`DurableHook`] of a store in a bucket: uploads the metadata snapshot (made once the
/// superblock exists, which `Store::create` writes after the metadata) at every durable commit
/// asked for and, for those of the flusher, once `interval` passed since the first change the
/// bucket lacks. Under the commit's locks it only copies `meta.redb` and notes the upload
/// queue's mark; the drain of the queue up to that mark and the PUTs come after.
struct MetaUploaderHook {
    /// `-o writeback`: the backend whose upload queue goes before each snapshot.
    writeback: Option<ObjectBackend>,
    remote: Arc<Remote>,
    cache_dir: PathBuf,
    last: Option<layout::Manifest>,
    inner: Mutex<Option<Arc<MetaUploader>>>,
    interval: Duration,
    state: Arc<Mutex<Pending>>,
}

/// A scratch directory `.TAG-PID-NAME` beside the cache directory `cache_dir` (its parent is
/// created); the caller removes it before and after use.
pub(super) fn scratch_beside(cache_dir: &Path, tag: &str) -> Result<PathBuf> {
    let parent = cache_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&parent)?;
    Ok(parent.join(format!(
        ".{tag}-{}-{}",
        std::process::id(),
        cache_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    )))
}

fn not_store(url: &S3Url, reason: &str) -> Error {
    Error::NotAStore {
        path: PathBuf::from(url.to_string()),
        reason: reason.to_string(),
    }
}

/// Whether `url` holds a store (a superblock object).
pub fn is_store(url: &S3Url, cfg: &RemoteConfig) -> Result<bool> {
    let r = Remote::connect(url, cfg)?;
    Ok(r.get(SUPERBLOCK_KEY)?.is_some())
}

/// Creates a store in the bucket. Refuses a prefix holding a store's objects unless
/// `opts.force`, which deletes them first. The store is built in a scratch directory beside
/// the cache directory (removed afterwards); the superblock object is written last.
pub fn create(url: &S3Url, o: &ObjectOptions, opts: &CreateOptions, tuning: Tuning) -> Result<()> {
    let remote = Arc::new(Remote::connect(url, &o.remote)?);
    let mut ours = Vec::new();
    for folder in [layout::SEGS_FOLDER, "meta"] {
        for (k, _) in remote.list(folder)? {
            if parse_chunk_key(&k).is_some() || parse_piece_key(&k).is_some() || k == MANIFEST_KEY {
                ours.push(k);
            }
        }
    }
    let has_sb = remote.get(SUPERBLOCK_KEY)?.is_some();
    if (has_sb || !ours.is_empty()) && !opts.force {
        return Err(Error::AlreadyExists(PathBuf::from(url.to_string())));
    }
    // No mkfs under a running mount: the lease, released when this function returns.
    // `mkfs --force` replaces the store, so it also takes over an expired lease.
    let lo = lease::LeaseOptions {
        force: o.lease.force || opts.force,
        ..o.lease
    };
    let lease = lease::acquire(remote.clone(), &lo)?;
    remote.set_gate(lease.gate());
    if has_sb {
        remote.delete(SUPERBLOCK_KEY)?;
    }
    for k in ours {
        remote.delete(&k)?;
    }
    let scratch = scratch_beside(&o.cache_dir_for(url), "mkfs")?;
    let _ = std::fs::remove_dir_all(&scratch);
    let r = (|| -> Result<()> {
        let backend = ObjectBackend::open(
            remote.clone(),
            &scratch.join(SEGMENT_DIR),
            None,
            o.dirty_limit,
            None,
        )?;
        let hook = MetaUploaderHook::new(
            remote.clone(),
            scratch.clone(),
            None,
            None,
            o.metadata_interval,
            None,
        );
        let t = Tuning {
            backend: Arc::new(backend),
            after_durable: Some(Arc::new(hook)),
            ..tuning
        };
        let s = Store::create_tuned(
            &scratch,
            &CreateOptions {
                force: false,
                ..*opts
            },
            t,
        )?;
        s.close()?;
        let sb = std::fs::read(scratch.join(SUPERBLOCK_FILE))?;
        remote.put(SUPERBLOCK_KEY, sb)?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    r?;
    lease.release()?;
    Ok(())
}

/// Opens the store in the bucket: fetches the superblock, and the latest metadata snapshot
/// unless the cache directory already holds it, lists the segments, and opens the store on
/// the cache directory with the bucket as its segment backend.
pub fn open(
    url: &S3Url,
    o: &ObjectOptions,
    opts: &OpenOptions,
    tuning: Tuning,
) -> Result<ObjectStoreHandle> {
    let remote = Arc::new(Remote::connect(url, &o.remote)?);
    let sb_bytes = remote
        .get(SUPERBLOCK_KEY)?
        .ok_or_else(|| not_store(url, "the bucket has no compfs superblock there"))?;
    // One writer: the lease first, so that the snapshot fetched below is the latest one and
    // no other mount writes after it.
    let lease = if opts.read_only {
        None
    } else {
        let l = lease::acquire(remote.clone(), &o.lease)?;
        remote.set_gate(l.gate());
        Some(l)
    };
    let cache_dir = o.cache_dir_for(url);
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cache_dir)?;
    }
    let tmp = cache_dir.join(format!("{SUPERBLOCK_FILE}.download"));
    std::fs::write(&tmp, &sb_bytes)?;
    std::fs::rename(&tmp, cache_dir.join(SUPERBLOCK_FILE))?;
    let sb = read_superblock(&cache_dir)?;
    let m = fetch_manifest(&remote)?
        .ok_or_else(|| not_store(url, "the bucket has no metadata manifest"))?;
    if m.uuid != sb.uuid {
        return Err(not_store(
            url,
            "the metadata manifest belongs to another store (UUID mismatch)",
        ));
    }
    let meta = cache_dir.join(crate::records::META_FILE);
    let here = local_generation(&cache_dir, &sb.uuid);
    // Chunks a crash left in the upload queue go to the bucket before anything else, and only
    // onto the state they belong to.
    recover_queue(
        &remote,
        &cache_dir,
        &sb.uuid,
        here == Some(m.gen),
        opts.read_only,
    )?;
    if here != Some(m.gen) {
        // The cache directory holds no snapshot of this store (it is new, or it served another
        // store at the same bucket and prefix before, one made anew by mkfs --force, say), or
        // an older one: another mount wrote the store since, and may have deleted a segment
        // whose blocks are cached here and made a new one with the same id (a takeover from
        // an older snapshot, then GC). Cached blocks are named by segment, chunk and block
        // only: they are not known to be this state's, so they go.
        match std::fs::remove_dir_all(cache_dir.join(DATA_CACHE_DIR)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    if here != Some(m.gen) || !meta.exists() {
        download(&remote, &m, &cache_dir)?;
    }
    let cache = if o.cache_size > 0 {
        Some(BlockCache::open(
            &cache_dir.join(DATA_CACHE_DIR),
            o.cache_size,
        )?)
    } else {
        None
    };
    std::fs::create_dir_all(cache_dir.join(SEGMENT_DIR))?;
    let backend = ObjectBackend::open(
        remote.clone(),
        &cache_dir.join(SEGMENT_DIR),
        cache,
        o.dirty_limit,
        (o.writeback && !opts.read_only).then(|| WritebackConfig {
            dir: cache_dir.join(queue::QUEUE_DIR),
            uuid: sb.uuid,
            limit: o.upload_limit,
        }),
    )?;
    let hook: Option<Arc<dyn DurableHook>> = if opts.read_only {
        None
    } else {
        let up = MetaUploader::new(remote.clone(), &cache_dir, sb.uuid, Some(&m));
        Some(Arc::new(MetaUploaderHook::new(
            remote.clone(),
            cache_dir.clone(),
            Some(m),
            Some(up),
            o.metadata_interval,
            o.writeback.then(|| backend.clone()),
        )))
    };
    let t = Tuning {
        backend: Arc::new(backend.clone()),
        after_durable: hook,
        ..tuning
    };
    let store = Store::open_tuned(&cache_dir, opts, t)?;
    if !opts.read_only {
        // Only now, with the store open (so no other mount on this machine uploads): pieces
        // of an upload cut short are garbage.
        let up = MetaUploader::new(
            remote.clone(),
            &cache_dir,
            sb.uuid,
            fetch_manifest(&remote)?.as_ref(),
        );
        up.delete_stray_pieces()?;
    }
    Ok(ObjectStoreHandle {
        store,
        cache_dir,
        backend,
        lease,
    })
}

/// Uploads the chunks a mount with `-o writeback` left in `cache_dir`'s upload queue (a crash
/// or power cut before they were uploaded), each verified against its checksum, and deletes
/// them. `current`: the cache directory's metadata is the bucket's latest snapshot or newer
/// (else another mount wrote the store since, and these chunks belong to a state the bucket
/// no longer continues: refused, as is a read-only open, which uploads nothing).
fn recover_queue(
    remote: &Remote,
    cache_dir: &Path,
    uuid: &[u8; 16],
    current: bool,
    read_only: bool,
) -> Result<()> {
    let dir = cache_dir.join(queue::QUEUE_DIR);
    let files = queue::list(&dir)?;
    if files.is_empty() {
        return Ok(());
    }
    let refuse = |why: String| {
        Error::Io(io::Error::other(format!(
            "{}: the upload queue holds {} chunks not yet in the bucket (left by a -o writeback \
             mount that did not unmount): {why}",
            dir.display(),
            files.len()
        )))
    };
    if read_only {
        return Err(refuse(
            "mount the store read-write from this cache directory first to upload them".into(),
        ));
    }
    if !current {
        return Err(refuse(
            "the bucket's metadata moved on since this cache directory's last snapshot (another \
             mount wrote the store), so they cannot be uploaded; move the directory aside to \
             mount (what it holds is lost to the store)"
                .into(),
        ));
    }
    for (name, (seg, start, len)) in &files {
        let path = dir.join(name);
        let bytes = std::fs::read(&path)?;
        let data = match queue::verify(name, &bytes) {
            Ok((h, _)) if &h.uuid != uuid => {
                return Err(refuse(format!("{name} belongs to another store")))
            }
            Ok((_, d)) => d,
            Err(e) => {
                tracing::error!(
                    "compfs: upload queue file {} is damaged: {e}",
                    path.display()
                );
                return Err(refuse(format!(
                    "{name} is damaged ({e}): not uploaded; the data it holds is lost unless \
                     the file can be repaired"
                )));
            }
        };
        remote.put(&layout::chunk_key(*seg, *start, *len), data)?;
        std::fs::remove_file(&path)?;
    }
    queue::sync_dir(&dir)?;
    tracing::info!(
        "compfs: {}: uploaded {} chunks left in the upload queue",
        remote.url,
        files.len()
    );
    Ok(())
}
