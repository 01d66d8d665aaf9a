//! Background recompression (bcachefs's `background_compression`): a worker rewrites the
//! extents of cold files whose codec or level differs from the file's background target.
//!
//! * **Target** of a file: its `compfs.background_compression` property (inherited from the
//!   parent directory at creation, like `compfs.compression`), else the mount's
//!   `background_compression=` ([`BackgroundPolicy::spec`]); neither means no background work
//!   for that file. The mode follows the file's foreground mode: under `compress-force` every
//!   extent is compressed, otherwise the heuristic decides, as for `compfs defrag`.
//! * **Cold**: a file whose mtime is at least `background_delay` old and that has no buffered
//!   writes. Extents carry no timestamps; the file's mtime is the time of its newest data.
//! * **Rewrite**: [`Inner::defrag_file`], the code of `compfs defrag`, block by block with the
//!   same skip rule (codec **and** level recorded per extent), the same commit protocol (one
//!   metadata transaction per batch replacing the block's map range after its new extent is
//!   appended; the old extents stay referenced until then and are reclaimed by GC) and the same
//!   check that a block did not change between its read and its commit. A crash or remount loses
//!   no progress: what is left is recomputed from the per-extent codec and level.
//! * **Yielding**: compression runs on a pool of its own under `SCHED_IDLE`, the worker thread
//!   at nice 10; before each batch the worker waits while the store is busy (any user read,
//!   write or metadata change within [`IDLE_AFTER`]).
//! * **Figures** ([`BackgroundStats`], in `compfs stats`): pending extents and bytes (recomputed
//!   by every pass), and what this mount did: extents and bytes rewritten, bytes saved.
//!
//! Raw extents that the target does not shrink stay raw; a file whose pass left only those is
//! remembered (with its mtime and target) so later passes do not try them again until the file
//! changes. The memory is per mount: after a remount such extents are tried once more.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use compfs_codec::{CodecSpec, Mode};
use redb::ReadableTable;

use crate::defrag::{DefragRun, DefragTarget};
use crate::error::Result;
use crate::meta::{self, dec};
use crate::pool::Pool;
use crate::records::{ExtentRec, InodeRec, MapRec};
use crate::store::{lock, Inner, Store};
use crate::types::*;

/// The property that names a file's or directory's background codec and level.
pub const BACKGROUND_XATTR: &[u8] = b"compfs.background_compression";

/// Default of `background_delay=` (bcachefs has no delay; the issue asks for 60 s).
pub const DEFAULT_BACKGROUND_DELAY: Duration = Duration::from_secs(60);

/// The store counts as busy this long after its last foreground read, write or change.
pub const IDLE_AFTER: Duration = Duration::from_millis(500);

/// How a mount recompresses in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackgroundPolicy {
    /// `background_compression=ALG[:LEVEL]`: the target of files without the property.
    pub spec: Option<CodecSpec>,
    /// `background_delay=SECS`: how long a file stays unmodified before it is rewritten.
    pub delay: Duration,
}

impl Default for BackgroundPolicy {
    fn default() -> Self {
        BackgroundPolicy {
            spec: None,
            delay: DEFAULT_BACKGROUND_DELAY,
        }
    }
}

/// Background recompression figures (`compfs stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackgroundStats {
    /// Files with a background target whose extents are not all at it, at the last pass.
    pub files_pending: u64,
    /// Distinct extents (and inline data) not at their file's target, at the last pass.
    pub extents_pending: u64,
    /// Uncompressed bytes of those extents.
    pub bytes_pending: u64,
    /// Extents rewritten by the background worker since open.
    pub extents_done: u64,
    /// File bytes rewritten by the background worker since open.
    pub bytes_done: u64,
    /// Stored bytes saved by those rewrites (before minus after).
    pub bytes_saved: u64,
    /// Completed scans of the store.
    pub passes: u64,
}

thread_local! {
    /// Set on the store's own threads: their commits are not foreground activity.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a store-internal one (see [`Shared::busy`]).
pub(crate) fn mark_quiet() {
    QUIET.with(|q| q.set(true));
}

/// Background state shared by the worker and the rest of the store.
pub(crate) struct Shared {
    pub policy: RwLock<BackgroundPolicy>,
    pub stats: Mutex<BackgroundStats>,
    /// Metadata transactions of foreground (non-store) threads.
    pub fg_txns: AtomicU64,
    /// The activity figure at its last change, and when that was seen.
    last: Mutex<(u64, Instant)>,
    /// Files a pass finished, with the mtime and target they had: skipped until either changes.
    settled: Mutex<HashMap<Ino, (Timestamp, CodecSpec)>>,
    /// The worker's compression pool (made on first use).
    pool: OnceLock<Pool>,
    pool_threads: usize,
    /// Set when the store closes: a running pass stops after its current batch.
    pub stop: AtomicBool,
    /// The foreground activity figure when a completed pass left nothing pending: the worker
    /// skips its scans until the figure moves or the policy changes.
    nothing_left_at: Mutex<Option<u64>>,
}

impl Shared {
    pub(crate) fn new(policy: BackgroundPolicy, pool_threads: usize) -> Shared {
        Shared {
            policy: RwLock::new(policy),
            stats: Mutex::new(BackgroundStats::default()),
            fg_txns: AtomicU64::new(0),
            last: Mutex::new((0, Instant::now())),
            settled: Mutex::new(HashMap::new()),
            pool: OnceLock::new(),
            pool_threads: pool_threads.max(1),
            stop: AtomicBool::new(false),
            nothing_left_at: Mutex::new(None),
        }
    }

    /// Counts a metadata transaction of the calling thread unless it is a store thread.
    pub(crate) fn note_txn(&self) {
        if !QUIET.with(|q| q.get()) {
            self.fg_txns.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn policy(&self) -> BackgroundPolicy {
        self.policy.read().map(|p| *p).unwrap_or_default()
    }

    pub(crate) fn shutdown_pool(&self) {
        if let Some(p) = self.pool.get() {
            p.shutdown();
        }
    }
}

/// A file a pass found with extents off its target.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    ino: Ino,
    target: CodecSpec,
    mtime: Timestamp,
    cold: bool,
    extents: u64,
    bytes: u64,
}

/// The distinct extents (inline data counted as one) of a file that are not stored as
/// `(codec, level)`, or, when the store has a current dictionary `cur` and the target is zstd,
/// small ones not compressed with it (see `defrag`); and their uncompressed bytes.
/// `pack_cur`: the dictionary packs use (none with `dict=nopack`).
fn off_target(
    map: &impl ReadableTable<(u64, u64), &'static [u8]>,
    extents: &impl ReadableTable<u64, &'static [u8]>,
    ino: Ino,
    rec: &InodeRec,
    want: (u8, i8),
    (cur, pack_cur): (Option<u16>, Option<u16>),
) -> Result<(u64, u64)> {
    let (mut n, mut bytes) = (0u64, 0u64);
    let zstd = want.0 == compfs_codec::Algorithm::Zstd.id();
    let off = |codec: u8, level: i8, dict: u16, small: bool, cur: Option<u16>| {
        crate::defrag::planned_as((codec, level, dict), want, cur) != want
            || (zstd && small && cur.is_some_and(|c| c != dict))
    };
    if let Some(i) = &rec.inline {
        if off(i.codec, i.level, i.dict, true, cur) {
            n += 1;
            bytes += i.raw_len as u64;
        }
    }
    let mut seen = BTreeSet::new();
    for row in map.range((ino, 0)..=(ino, u64::MAX))? {
        let (_, v) = row?;
        let m = dec(MapRec::decode(v.value()))?;
        if !seen.insert(m.extent) {
            continue;
        }
        let Some(x) = extents.get(m.extent)? else {
            return Err(meta::corrupt("map entry names a missing extent"));
        };
        let x = dec(ExtentRec::decode(x.value()))?;
        // Packs try the dictionary whatever their length (see `pack`).
        let (small, cur) = if x.ino == crate::pack::PACK_OWNER {
            (true, pack_cur)
        } else {
            (x.raw_len as usize <= crate::dict::DICT_MAX_EXTENT, cur)
        };
        if off(x.codec, x.level, x.dict, small, cur) {
            n += 1;
            bytes += x.raw_len as u64;
        }
    }
    Ok((n, bytes))
}

/// The `(codec id, level)` extents of `spec` record.
pub(crate) fn recorded(spec: CodecSpec) -> (u8, i8) {
    (spec.algorithm().id(), spec.level() as i8)
}

/// Parses a stored property value (validated when set; a damaged one counts as absent).
fn parse_prop(v: &[u8]) -> Option<CodecSpec> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| CodecSpec::parse(s).ok())
        .map(|p| p.spec)
}

impl Inner {
    /// A figure that moves with every foreground read, write and metadata change.
    fn activity(&self) -> u64 {
        let c = &self.counters;
        c.user_written.load(Ordering::Relaxed)
            + c.user_read.load(Ordering::Relaxed)
            + self.bg.fg_txns.load(Ordering::Relaxed)
    }

    /// Whether a foreground read, write or metadata change happened within [`IDLE_AFTER`].
    pub(crate) fn busy(&self) -> bool {
        let now = self.activity();
        let mut last = lock(&self.bg.last);
        if last.0 != now {
            *last = (now, Instant::now());
            return true;
        }
        last.1.elapsed() < IDLE_AFTER
    }

    /// Whether `ino` has writes buffered in memory (not blocking: a locked file counts as busy).
    fn has_dirty(&self, ino: Ino) -> bool {
        let st = lock(&self.files).get(&ino).cloned();
        match st {
            None => false,
            Some(st) => match st.try_lock() {
                Ok(g) => g.dirty.is_some(),
                Err(_) => true,
            },
        }
    }

    /// Every regular file with a background target and extents off it (settled files
    /// excepted), in inode order.
    fn scan(&self, pol: &BackgroundPolicy) -> Result<Vec<Candidate>> {
        let txn = self.read_txn()?;
        let inodes = txn.open_table(meta::INODES)?;
        let xattrs = txn.open_table(meta::XATTRS)?;
        let map = txn.open_table(meta::EXTMAP)?;
        let extents = txn.open_table(meta::EXTENTS)?;
        let now = Timestamp::now();
        let mut settled = std::mem::take(&mut *lock(&self.bg.settled));
        let mut kept = HashMap::new();
        let mut out = Vec::new();
        for row in inodes.iter()? {
            let (k, v) = row?;
            let ino = k.value();
            let rec = dec(InodeRec::decode(v.value()))?;
            if rec.kind != FileKind::File {
                continue;
            }
            let own = xattrs
                .get((ino, BACKGROUND_XATTR))?
                .and_then(|v| parse_prop(v.value()));
            let Some(target) = own.or(pol.spec) else {
                continue;
            };
            if let Some(v) = settled.remove(&ino).filter(|v| *v == (rec.mtime, target)) {
                kept.insert(ino, v);
                continue;
            }
            let cur = self.dicts.current().map(|d| d.id);
            let pack_cur = self.pack_dict(target).map(|d| d.id);
            let (n, bytes) =
                off_target(&map, &extents, ino, &rec, recorded(target), (cur, pack_cur))?;
            if n == 0 {
                continue;
            }
            let age = now.secs.saturating_sub(rec.mtime.secs);
            let cold = age >= 0 && age as u64 >= pol.delay.as_secs();
            out.push(Candidate {
                ino,
                target,
                mtime: rec.mtime,
                cold,
                extents: n,
                bytes,
            });
        }
        // Entries of files removed or changed since are dropped; the worker adds new ones.
        lock(&self.bg.settled).extend(kept);
        Ok(out)
    }

    /// One background pass: scans, then rewrites the cold candidates. `hold` is called before
    /// each batch (no lock held); it may wait, and returns false to stop the pass.
    pub(crate) fn background_pass(
        &self,
        hold: &mut dyn FnMut() -> bool,
    ) -> Result<BackgroundStats> {
        self.check_writable()?;
        let pol = self.bg.policy();
        let activity = self.activity();
        let found = self.scan(&pol)?;
        {
            let mut s = lock(&self.bg.stats);
            s.files_pending = found.len() as u64;
            s.extents_pending = found.iter().map(|c| c.extents).sum();
            s.bytes_pending = found.iter().map(|c| c.bytes).sum();
        }
        if !found.iter().any(|c| c.cold) {
            let mut s = lock(&self.bg.stats);
            s.passes += 1;
            if found.is_empty() {
                *lock(&self.bg.nothing_left_at) = Some(activity);
            }
            return Ok(*s);
        }
        let pool = match self.bg.pool.get() {
            Some(p) => p,
            None => {
                let p = Pool::named(self.bg.pool_threads, "compfs-bgzip", true)?;
                self.bg.pool.get_or_init(|| p)
            }
        };
        let mut stopped = false;
        for c in found.iter().filter(|c| c.cold) {
            if stopped || !hold() {
                stopped = true;
                break;
            }
            if self.has_dirty(c.ino) {
                continue;
            }
            let mode = self.file_policy(c.ino)?.mode;
            let target = DefragTarget {
                spec: Some(c.target),
                level: None,
                force: mode == Mode::Force,
                extent_size: None,
            };
            let run = DefragRun {
                pool,
                control: &mut |_| {
                    let go = hold();
                    stopped |= !go;
                    go
                },
            };
            let res = self.defrag_file(c.ino, &target, run);
            self.maybe_forget(c.ino);
            let r = match res {
                Ok(r) => r,
                // Removed, or no longer a regular file, since the scan.
                Err(
                    crate::Error::NotFound | crate::Error::IsDir | crate::Error::InvalidArgument(_),
                ) => continue,
                Err(e) => return Err(e),
            };
            let mut s = lock(&self.bg.stats);
            s.extents_done += r.extents_rewritten;
            s.bytes_done += r.bytes_rewritten;
            s.bytes_saved += r.disk_before.saturating_sub(r.disk_after);
            if !stopped {
                s.files_pending = s.files_pending.saturating_sub(1);
                s.extents_pending = s.extents_pending.saturating_sub(c.extents);
                s.bytes_pending = s.bytes_pending.saturating_sub(c.bytes);
                drop(s);
                lock(&self.bg.settled).insert(c.ino, (c.mtime, c.target));
            }
        }
        let mut s = lock(&self.bg.stats);
        if !stopped {
            s.passes += 1;
        }
        Ok(*s)
    }
}

/// How often the worker looks for work: a quarter of the delay, from 200 ms to 15 s.
pub(crate) fn tick(delay: Duration) -> Duration {
    (delay / 4).clamp(Duration::from_millis(200), Duration::from_secs(15))
}

/// The worker thread: every [`tick`], once the store is idle, a pass; it waits while the
/// store is busy and stops when the store closes.
pub(crate) fn worker_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<()>) {
    mark_quiet();
    crate::pool::set_nice(10);
    loop {
        let iv = match weak.upgrade() {
            Some(inner) => tick(inner.bg.policy().delay),
            None => return,
        };
        match rx.recv_timeout(iv) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(inner) = weak.upgrade() else { return };
        if inner.ro_flag.load(Ordering::SeqCst) || inner.busy() {
            continue;
        }
        if *lock(&inner.bg.nothing_left_at) == Some(inner.activity()) {
            continue;
        }
        let mut hold = || loop {
            if inner.bg.stop.load(Ordering::SeqCst) || inner.ro_flag.load(Ordering::SeqCst) {
                return false;
            }
            if !inner.busy() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if let Err(e) = inner.background_pass(&mut hold) {
            tracing::warn!("compfs background recompression: {e}");
        }
    }
}

impl Store {
    /// Changes the mount's background target and delay (like a remount with other options).
    pub fn set_background(&self, p: BackgroundPolicy) {
        if let Ok(mut g) = self.inner.bg.policy.write() {
            *g = p;
        }
        *lock(&self.inner.bg.nothing_left_at) = None;
    }

    /// The background target and delay in force.
    pub fn background(&self) -> BackgroundPolicy {
        self.inner.bg.policy()
    }

    /// Runs one background pass now, without waiting for the store to be idle (tests, and
    /// stores that are not mounted): returns the figures after it.
    pub fn background_pass(&self) -> Result<BackgroundStats> {
        self.inner.background_pass(&mut || true)
    }

    /// The `compfs.background_compression` property of `ino`.
    pub fn background_compression(&self, ino: Ino) -> Result<Option<CodecSpec>> {
        match self.getxattr(ino, BACKGROUND_XATTR) {
            Ok(v) => Ok(parse_prop(&v)),
            Err(crate::Error::NoXattr) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_follows_the_delay_within_bounds() {
        assert_eq!(tick(Duration::from_secs(60)), Duration::from_secs(15));
        assert_eq!(tick(Duration::from_secs(4)), Duration::from_secs(1));
        assert_eq!(tick(Duration::ZERO), Duration::from_millis(200));
        assert_eq!(tick(Duration::from_secs(3600)), Duration::from_secs(15));
    }

    #[test]
    fn damaged_property_values_count_as_absent() {
        assert!(parse_prop(b"zstd:9").is_some());
        assert!(parse_prop(b"brotli").is_none());
        assert!(parse_prop(&[0xff, 0xfe]).is_none());
        assert!(parse_prop(b"").is_none());
    }
}
