//! Segment files in a bucket, behind the store's [`Backend`] seam. A segment is a set of chunk
//! objects, each holding a contiguous byte range of it (`segs/ID.seg/START-LEN`). Appends stay
//! in memory until `sync_data`, which PUTs every pending run of contiguous bytes as one chunk
//! and returns once every PUT completed: what the store syncs before a durable commit is then
//! in the bucket. Reads go through the local block cache with ranged GETs.
//!
//! The local segment directory holds one sparse placeholder file per segment in the bucket
//! (its length the segment's), so the store's scans of that directory (next segment id, GC's
//! orphans and sizes) work unchanged; placeholders are rebuilt from a listing at every open.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::blockcache::{BlockCache, BLOCK};
use super::layout::{block_spans, chunk_key, contiguous_runs, parse_chunk_key};
use super::queue::{self, Header};
use super::readahead::{self, Ahead, AheadQueue, Inflight};
use super::remote::Remote;
use crate::backend::{Backend, SegFile};
use crate::records::{parse_segment_file_name, segment_file_name, SEG_HEADER_LEN};

mod segfile;
use segfile::ObjectSegFile;

/// One segment: its uploaded chunks and the appends not uploaded yet.
#[derive(Default)]
struct SegState {
    /// Chunk start -> length (in the bucket, or in the upload queue when in `local`).
    chunks: BTreeMap<u64, u64>,
    /// Starts of the chunks still in the local upload queue (`-o writeback`), not yet in the
    /// bucket: reads of them are served from their queue file.
    local: BTreeSet<u64>,
    /// Offset -> bytes of appends not yet in a completed PUT.
    pending: BTreeMap<u64, Vec<u8>>,
}

impl SegState {
    fn end(&self) -> u64 {
        let c = self.chunks.iter().next_back().map(|(s, l)| s + l);
        let p = self
            .pending
            .iter()
            .next_back()
            .map(|(s, b)| s + b.len() as u64);
        c.unwrap_or(0).max(p.unwrap_or(0))
    }
}

pub(crate) struct Shared {
    pub(crate) remote: Arc<Remote>,
    cache: Option<BlockCache>,
    segs: Mutex<HashMap<u64, SegState>>,
    /// One upload at a time (the background syncer and a durable commit may both sync).
    upload: Mutex<()>,
    seg_dir: PathBuf,
    /// Bytes in `pending` of all segments.
    pending_bytes: AtomicU64,
    /// Blocks being fetched (by a reader or a readahead).
    inflight: Inflight,
    /// Blocks the store asked for ahead of a file's sequential reader ([`SegFile::prefetch`]).
    ahead_q: AheadQueue,
    /// Appended bytes held in memory (not yet uploaded) above which a writer uploads them
    /// itself, and waits: the dirty limit.
    dirty_limit: u64,
    /// The local upload queue of `-o writeback` (none: every sync PUTs).
    writeback: Option<Writeback>,
}

/// Where and how `-o writeback` queues its chunks (see [`ObjectBackend::open`]).
pub(crate) struct WritebackConfig {
    /// The queue's directory (`cache_dir/upload`).
    pub dir: PathBuf,
    /// The store's UUID, written into every queue file.
    pub uuid: [u8; 16],
    /// Bytes of chunk data the queue may hold (`-o upload_limit=`): a sync that would pass it
    /// waits for the uploader to make room.
    pub limit: u64,
}

/// A queued chunk: its place in the queue's order (see [`Writeback::next_seq`]), segment,
/// start and length.
#[derive(Clone, Copy)]
struct Queued {
    seq: u64,
    seg: u64,
    start: u64,
    len: u64,
}

/// The upload queue of `-o writeback` (see [`queue`]): chunks fsynced in `dir`, uploaded in
/// order by the uploader thread (or by [`Shared::drain_to`]) and deleted once their PUT
/// completed.
pub(crate) struct Writeback {
    dir: PathBuf,
    uuid: [u8; 16],
    /// Queued chunks, oldest first.
    fifo: Mutex<VecDeque<Queued>>,
    wake: Condvar,
    /// Notified whenever chunks leave the queue (uploaded, or dropped with their segment).
    room: Condvar,
    /// Bytes of chunk data in the queue.
    bytes: AtomicU64,
    /// Bound of `bytes` (see [`WritebackConfig::limit`]).
    limit: u64,
    /// How long a sync waits for room in a full queue while no chunk leaves it: the store's
    /// request deadline (`-o timeout=`), after which the sync fails with EIO.
    deadline: Duration,
    /// The sequence number of the next chunk queued (changed under the `fifo` lock): every
    /// chunk queued before a [`ObjectBackend::queue_mark`] has a smaller one.
    next_seq: AtomicU64,
    /// Syncs waiting for room in the queue now.
    waiting: AtomicU64,
    /// One upload of a queued chunk at a time (apart from `Shared::upload`, so that a durable
    /// commit queueing its chunks never waits behind a PUT).
    one: Mutex<()>,
    /// Set to stop the uploader thread.
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A queue file that failed its checksum: never uploaded, every later upload fails with it.
    damaged: Mutex<Option<String>>,
}

/// How long closing a store waits for the readahead's GETs under way (each is bounded by the
/// request timeout; a close is not held up longer by fetches nobody will read).
const READAHEAD_STOP: Duration = Duration::from_secs(30);

/// How long the uploader waits after a failed upload before it tries again.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

impl Shared {
    /// Readahead: fetches blocks `plan` (each with its chunk's length) by parallel ranged GETs
    /// into the cache. Blocks cached or being fetched by another thread are skipped; a failed
    /// GET only costs the reader a fetch of its own later.
    fn fetch_ahead(&self, plan: &[Ahead]) {
        let Some(cache) = &self.cache else {
            return;
        };
        let mut claims = Vec::new();
        let mut reqs = Vec::new();
        for &(k, cl) in plan {
            if cache.contains(k) {
                continue;
            }
            if let Some(claim) = self.inflight.claim(k) {
                // Fetched by a reader between the check above and the claim.
                if cache.contains(k) {
                    continue;
                }
                claims.push(claim);
                let (id, c, b) = k;
                reqs.push((chunk_key(id, c, cl), b * BLOCK..((b + 1) * BLOCK).min(cl)));
            }
        }
        let got = self.remote.get_ranges(&reqs);
        for (claim, data) in claims.into_iter().zip(got) {
            if let Ok(data) = data {
                cache.put(claim.key, data);
            }
        }
    }

    /// Queues `items` for fetching ahead, starting another worker to serve the queue (in
    /// batches of [`readahead::WORKER_BATCH`] parallel GETs) while fewer than
    /// [`readahead::WORKERS`] run.
    fn queue_ahead(self: &Arc<Self>, items: &[Ahead]) {
        if !self.ahead_q.push(items) {
            return;
        }
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name("compfs-s3-prefetch".into())
            .spawn(move || loop {
                let batch = shared.ahead_q.take(readahead::WORKER_BATCH);
                if batch.is_empty() {
                    break;
                }
                shared.fetch_ahead(&batch);
            });
        if spawned.is_err() {
            // No thread: the blocks stay queued for the next request; readers fetch their own.
            self.ahead_q.abandon();
        }
    }

    /// PUTs every pending run of contiguous bytes as one chunk; returns once all completed.
    /// A segment holding only its header waits for its first extents (nothing references it).
    fn sync_segment(&self, id: u64) -> io::Result<()> {
        let _one = lock(&self.upload);
        let runs: Vec<(u64, Vec<u64>, Vec<u8>)> = {
            let segs = lock(&self.segs);
            let Some(s) = segs.get(&id) else {
                return Ok(());
            };
            let header_only = s.chunks.is_empty()
                && s.pending.len() == 1
                && s.pending
                    .get(&0)
                    .is_some_and(|b| b.len() as u64 == SEG_HEADER_LEN);
            if header_only {
                return Ok(());
            }
            let writes: Vec<(u64, usize)> = s.pending.iter().map(|(o, b)| (*o, b.len())).collect();
            contiguous_runs(&writes)
                .into_iter()
                .map(|(start, offs, len)| {
                    let mut data = Vec::with_capacity(len as usize);
                    for o in &offs {
                        if let Some(b) = s.pending.get(o) {
                            data.extend_from_slice(b);
                        }
                    }
                    (start, offs, data)
                })
                .collect()
        };
        if let Some(wb) = &self.writeback {
            return self.queue_runs(wb, id, runs);
        }
        for (start, offs, data) in runs {
            let len = data.len() as u64;
            self.remote.put(&chunk_key(id, start, len), data)?;
            let end = {
                let mut segs = lock(&self.segs);
                let Some(s) = segs.get_mut(&id) else {
                    continue;
                };
                s.chunks.insert(start, len);
                for o in offs {
                    if let Some(b) = s.pending.remove(&o) {
                        self.pending_bytes
                            .fetch_sub(b.len() as u64, Ordering::Relaxed);
                    }
                }
                s.end()
            };
            // The placeholder's length follows the segment (GC reports sizes from it).
            if let Ok(f) = std::fs::OpenOptions::new()
                .write(true)
                .open(self.seg_dir.join(segment_file_name(id)))
            {
                let _ = f.set_len(end);
            }
        }
        Ok(())
    }

    /// Waits until the upload queue has room for `need` more bytes of chunk data (see
    /// [`queue::fits`]). Fails with EIO once no chunk left the queue for the store's deadline
    /// (the bucket is unreachable), or at once when the uploader stopped or met a damaged file.
    fn wait_for_room(&self, wb: &Writeback, need: u64) -> io::Result<()> {
        let mut fifo = lock(&wb.fifo);
        let queued = || wb.bytes.load(Ordering::Relaxed);
        if queue::fits(queued(), need, wb.limit) {
            return Ok(());
        }
        wb.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Decrement(&wb.waiting);
        tracing::info!(
            "compfs: the upload queue is full ({} bytes queued, {} more wanted, upload_limit {}): \
             waiting for the uploader",
            queued(),
            need,
            wb.limit
        );
        let mut since = Instant::now();
        let mut seen = queued();
        loop {
            if let Some(m) = &*lock(&wb.damaged) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, m.clone()));
            }
            if wb.stop.load(Ordering::SeqCst) {
                return Err(io::Error::other(
                    "the uploader of the upload queue was stopped",
                ));
            }
            let now = queued();
            if queue::fits(now, need, wb.limit) {
                return Ok(());
            }
            // Progress (a chunk uploaded): the bucket answers, slowly; the deadline starts over.
            if now < seen {
                seen = now;
                since = Instant::now();
            }
            let left = wb.deadline.saturating_sub(since.elapsed());
            if left.is_zero() {
                return Err(io::Error::other(format!(
                    "the upload queue is full ({now} bytes queued, upload_limit {}) and no chunk \
                     of it was uploaded for {} s: is the bucket unreachable?",
                    wb.limit,
                    wb.deadline.as_secs_f64()
                )));
            }
            fifo = wb
                .room
                .wait_timeout(fifo, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// `-o writeback`: writes the runs of segment `id` into the upload queue (once it has room
    /// for them), fsyncs them and the queue directory, then hands them to the uploader.
    fn queue_runs(
        &self,
        wb: &Writeback,
        id: u64,
        runs: Vec<(u64, Vec<u64>, Vec<u8>)>,
    ) -> io::Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        // One sync at a time gets here (`Shared::upload`): the room it waited for stays.
        self.wait_for_room(wb, runs.iter().map(|r| r.2.len() as u64).sum())?;
        std::fs::create_dir_all(&wb.dir)?;
        for (start, _, data) in &runs {
            let h = Header {
                uuid: wb.uuid,
                seg: id,
                start: *start,
                len: data.len() as u64,
                crc: crc32c::crc32c(data),
            };
            queue::write(&wb.dir, &h, data)?;
        }
        queue::sync_dir(&wb.dir)?;
        let mut fifo = lock(&wb.fifo);
        let end = {
            let mut segs = lock(&self.segs);
            let Some(s) = segs.get_mut(&id) else {
                // Removed meanwhile (GC): its queue files are garbage.
                for (start, _, data) in &runs {
                    let _ = std::fs::remove_file(wb.dir.join(queue::file_name(
                        id,
                        *start,
                        data.len() as u64,
                    )));
                }
                return Ok(());
            };
            for (start, offs, data) in runs {
                let len = data.len() as u64;
                s.chunks.insert(start, len);
                s.local.insert(start);
                fifo.push_back(Queued {
                    seq: wb.next_seq.fetch_add(1, Ordering::SeqCst),
                    seg: id,
                    start,
                    len,
                });
                wb.bytes.fetch_add(len, Ordering::Relaxed);
                for o in offs {
                    if let Some(b) = s.pending.remove(&o) {
                        self.pending_bytes
                            .fetch_sub(b.len() as u64, Ordering::Relaxed);
                    }
                }
            }
            s.end()
        };
        drop(fifo);
        wb.wake.notify_all();
        if let Ok(f) = std::fs::OpenOptions::new()
            .write(true)
            .open(self.seg_dir.join(segment_file_name(id)))
        {
            let _ = f.set_len(end);
        }
        Ok(())
    }

    /// Uploads the oldest chunk of the upload queue and deletes its file; whether there was one.
    /// A queue file failing its checksum is never uploaded: an error, now and for every later
    /// upload.
    fn upload_one(&self, wb: &Writeback) -> io::Result<bool> {
        let _one = lock(&wb.one);
        if wb.stop.load(Ordering::SeqCst) {
            return Err(io::Error::other(
                "the uploader of the upload queue was stopped",
            ));
        }
        if let Some(m) = &*lock(&wb.damaged) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, m.clone()));
        }
        let Some(Queued {
            seg: id,
            start,
            len,
            ..
        }) = lock(&wb.fifo).front().copied()
        else {
            return Ok(false);
        };
        let name = queue::file_name(id, start, len);
        let path = wb.dir.join(&name);
        let file = std::fs::read(&path)?;
        let data = match queue::verify(&name, &file) {
            Ok((h, _)) if h.uuid != wb.uuid => Err("the file belongs to another store".to_string()),
            Ok((_, d)) => Ok(d),
            Err(e) => Err(e.to_string()),
        };
        let data = data.map_err(|e| {
            let m = format!(
                "compfs: upload queue file {} is damaged ({e}): not uploaded; the data it holds \
                 is lost unless the file can be repaired",
                path.display()
            );
            tracing::error!("{m}");
            *lock(&wb.damaged) = Some(m.clone());
            drop(lock(&wb.fifo));
            wb.room.notify_all();
            io::Error::new(io::ErrorKind::InvalidData, m)
        })?;
        self.remote.put(&chunk_key(id, start, len), data)?;
        {
            let mut fifo = lock(&wb.fifo);
            let mut segs = lock(&self.segs);
            if let Some(s) = segs.get_mut(&id) {
                s.local.remove(&start);
            }
            fifo.pop_front();
            wb.bytes.fetch_sub(len, Ordering::Relaxed);
        }
        wb.room.notify_all();
        // Readers opened the file under the `segs` lock before this: their reads still work.
        std::fs::remove_file(&path)?;
        Ok(true)
    }

    /// Uploads every chunk queued before `mark` (see [`ObjectBackend::queue_mark`]; those
    /// queued since may go too): afterwards every chunk that a commit made before the mark was
    /// taken references is in the bucket.
    pub(crate) fn drain_to(&self, mark: u64) -> io::Result<()> {
        let Some(wb) = &self.writeback else {
            return Ok(());
        };
        let mut any = false;
        while lock(&wb.fifo).front().is_some_and(|q| q.seq < mark) {
            if !self.upload_one(wb)? {
                break;
            }
            any = true;
        }
        if any {
            queue::sync_dir(&wb.dir)?;
        }
        Ok(())
    }

    /// The uploader thread of `-o writeback`: uploads the queue as it fills, until stopped or
    /// the backend is dropped. A failed upload is tried again after a pause (the chunk stays
    /// queued; the next snapshot upload waits for it).
    fn uploader(weak: Weak<Shared>) {
        loop {
            let Some(sh) = weak.upgrade() else {
                return;
            };
            let Some(wb) = &sh.writeback else {
                return;
            };
            if wb.stop.load(Ordering::SeqCst) {
                return;
            }
            match sh.upload_one(wb) {
                Ok(true) => continue,
                Ok(false) => {
                    let fifo = lock(&wb.fifo);
                    if fifo.is_empty() && !wb.stop.load(Ordering::SeqCst) {
                        let _ = wb.wake.wait_timeout(fifo, RETRY_PAUSE);
                    }
                }
                Err(e) => {
                    tracing::warn!("compfs: upload of a queued chunk failed (tried again): {e}");
                    let fifo = lock(&wb.fifo);
                    if !wb.stop.load(Ordering::SeqCst) {
                        let _ = wb.wake.wait_timeout(fifo, RETRY_PAUSE);
                    }
                }
            }
        }
    }

    /// Uploads the pending appends of every segment.
    fn sync_all(&self) -> io::Result<()> {
        let ids: Vec<u64> = lock(&self.segs)
            .iter()
            .filter(|(_, s)| !s.pending.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.sync_segment(id)?;
        }
        Ok(())
    }
}

/// Counts one down when dropped.
struct Decrement<'a>(&'a AtomicU64);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn seg_id(path: &Path) -> io::Result<u64> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_segment_file_name)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a segment file name"))
}

/// The segment backend of a store in a bucket.
#[derive(Clone)]
pub struct ObjectBackend {
    pub(crate) shared: Arc<Shared>,
}

impl ObjectBackend {
    /// Lists the segment chunks of the bucket and lays the placeholders in `seg_dir` (removing
    /// those of segments the bucket has not). `cache` is the block cache (none: every read is
    /// a ranged GET of just its bytes); `dirty_limit` bounds the appended bytes held in
    /// memory before their upload; `writeback`: the upload queue of `-o writeback` (it must be
    /// empty: see [`recover_queue`]).
    pub(crate) fn open(
        remote: Arc<Remote>,
        seg_dir: &Path,
        cache: Option<BlockCache>,
        dirty_limit: u64,
        writeback: Option<WritebackConfig>,
    ) -> io::Result<ObjectBackend> {
        let mut segs: HashMap<u64, SegState> = HashMap::new();
        for (key, size) in remote.list(super::layout::SEGS_FOLDER)? {
            let Some((id, start, len)) = parse_chunk_key(&key) else {
                tracing::warn!("compfs: ignoring object {key} (not a segment chunk)");
                continue;
            };
            if size != len {
                return Err(io::Error::other(format!(
                    "object {key} has {size} bytes, its name says {len}"
                )));
            }
            segs.entry(id).or_default().chunks.insert(start, len);
        }
        if !segs.is_empty() {
            std::fs::create_dir_all(seg_dir)?;
        }
        let listing = match std::fs::read_dir(seg_dir) {
            Ok(l) => Some(l),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        for e in listing.into_iter().flatten() {
            let e = e?;
            let id = e.file_name().to_str().and_then(parse_segment_file_name);
            if !id.is_some_and(|id| segs.contains_key(&id)) {
                std::fs::remove_file(e.path())?;
            }
        }
        for (id, s) in &segs {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(seg_dir.join(segment_file_name(*id)))?;
            f.set_len(s.end())?;
        }
        let writeback = writeback.map(|c| Writeback {
            dir: c.dir,
            uuid: c.uuid,
            fifo: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            room: Condvar::new(),
            bytes: AtomicU64::new(0),
            limit: c.limit,
            deadline: remote.deadline(),
            next_seq: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            one: Mutex::new(()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            damaged: Mutex::new(None),
        });
        let shared = Arc::new(Shared {
            remote,
            cache,
            segs: Mutex::new(segs),
            upload: Mutex::new(()),
            seg_dir: seg_dir.to_path_buf(),
            pending_bytes: AtomicU64::new(0),
            inflight: Inflight::default(),
            ahead_q: AheadQueue::default(),
            dirty_limit,
            writeback,
        });
        if let Some(wb) = &shared.writeback {
            let weak = Arc::downgrade(&shared);
            let t = std::thread::Builder::new()
                .name("compfs-s3-upload".into())
                .spawn(move || Shared::uploader(weak))?;
            *lock(&wb.thread) = Some(t);
        }
        Ok(ObjectBackend { shared })
    }

    /// `-o writeback`: uploads every chunk queued so far (in queue order; the uploader thread
    /// does the same in the background).
    pub fn drain(&self) -> io::Result<()> {
        self.shared.drain_to(self.queue_mark())
    }

    /// `-o writeback`: the upload queue's mark now, for [`ObjectBackend::drain_to`] (0 without
    /// a queue).
    pub fn queue_mark(&self) -> u64 {
        self.shared
            .writeback
            .as_ref()
            .map_or(0, |wb| wb.next_seq.load(Ordering::SeqCst))
    }

    /// `-o writeback`: uploads every chunk queued before `mark` was taken
    /// ([`ObjectBackend::queue_mark`]).
    pub fn drain_to(&self, mark: u64) -> io::Result<()> {
        self.shared.drain_to(mark)
    }

    /// Chunks and bytes in the upload queue (`-o writeback`), none without it.
    pub fn queued(&self) -> Option<(usize, u64)> {
        self.shared
            .writeback
            .as_ref()
            .map(|wb| (lock(&wb.fifo).len(), wb.bytes.load(Ordering::Relaxed)))
    }

    /// The upload queue's bound (`-o upload_limit=`) and the syncs waiting for room in it now
    /// (`-o writeback`), none without it.
    pub fn queue_limit(&self) -> Option<(u64, u64)> {
        self.shared
            .writeback
            .as_ref()
            .map(|wb| (wb.limit, wb.waiting.load(Ordering::SeqCst)))
    }

    /// Stops the uploader thread (after the upload under way) and waits for it: what a crash
    /// does to it (for tests of a lost writer), the queue left in place.
    pub fn stop_uploader(&self) {
        if let Some(wb) = &self.shared.writeback {
            wb.stop.store(true, Ordering::SeqCst);
            wb.wake.notify_all();
            // Under the queue's lock: a waiter checks `stop` and waits under it.
            drop(lock(&wb.fifo));
            wb.room.notify_all();
            if let Some(t) = lock(&wb.thread).take() {
                let _ = t.join();
            }
            // An upload under way elsewhere (a drain) ends before this returns; none starts.
            drop(lock(&wb.one));
        }
    }

    /// Requests and bytes sent to the bucket so far.
    pub fn counts(&self) -> super::RemoteCounts {
        self.shared.remote.counts()
    }

    /// Bytes in the local block cache.
    pub fn cached_bytes(&self) -> u64 {
        self.shared.cache.as_ref().map_or(0, |c| c.bytes())
    }

    /// Waits (at most `timeout`) until the readahead workers stopped: every block queued
    /// for fetching ahead so far was fetched into the cache (or its GET failed). Whether they
    /// did.
    pub fn wait_readahead(&self, timeout: std::time::Duration) -> bool {
        self.shared.ahead_q.wait_idle(timeout)
    }

    /// Bytes appended and not yet uploaded.
    pub fn pending_bytes(&self) -> u64 {
        self.shared.pending_bytes.load(Ordering::Relaxed)
    }

    fn file(&self, id: u64) -> Arc<dyn SegFile> {
        Arc::new(ObjectSegFile {
            shared: self.shared.clone(),
            id,
        })
    }
}

impl Backend for ObjectBackend {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegFile>> {
        let id = seg_id(path)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        let mut segs = lock(&self.shared.segs);
        if segs.contains_key(&id) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        segs.insert(id, SegState::default());
        drop(segs);
        Ok(self.file(id))
    }

    fn open(&self, path: &Path, _write: bool) -> io::Result<Arc<dyn SegFile>> {
        let id = seg_id(path)?;
        if !lock(&self.shared.segs).contains_key(&id) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(self.file(id))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let id = seg_id(path)?;
        // No upload of a queued chunk meanwhile: its segment is going.
        let _one = self.shared.writeback.as_ref().map(|wb| lock(&wb.one));
        let chunks: Vec<(u64, u64, bool)> = match lock(&self.shared.segs).get(&id) {
            Some(s) => s
                .chunks
                .iter()
                .map(|(a, b)| (*a, *b, s.local.contains(a)))
                .collect(),
            None => return Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        if let Some(wb) = &self.shared.writeback {
            let mut fifo = lock(&wb.fifo);
            fifo.retain(|q| {
                if q.seg == id {
                    wb.bytes.fetch_sub(q.len, Ordering::Relaxed);
                }
                q.seg != id
            });
            drop(fifo);
            wb.room.notify_all();
        }
        for (start, len, local) in chunks {
            if local {
                if let Some(wb) = &self.shared.writeback {
                    match std::fs::remove_file(wb.dir.join(queue::file_name(id, start, len))) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                }
            } else {
                self.shared.remote.delete(&chunk_key(id, start, len))?;
            }
        }
        lock(&self.shared.segs).remove(&id);
        if let Some(c) = &self.shared.cache {
            c.drop_segment(id);
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn prefetches(&self) -> bool {
        self.shared.cache.is_some()
    }

    fn stop_prefetch(&self) {
        if !self.shared.ahead_q.close(READAHEAD_STOP) {
            tracing::warn!("compfs: readahead GETs still under way at close; not waiting longer");
        }
    }

    /// Placeholders need no durability: they are rebuilt from the bucket at every open.
    fn sync_dir(&self, _path: &Path) -> io::Result<()> {
        Ok(())
    }
}
