//! zstd dictionaries of the page store: `--dict FILE` (zram's `algorithm_params dict=`) and
//! `--dict auto`, where the store samples the pages written to it, trains a dictionary once it
//! has enough of them and retrains as the data grows.
//!
//! Dictionaries are versioned: each one lives in a slot (1..=[`MAX_DICT_SLOT`]) and every
//! compressed entry names the slot it was compressed with in its codec byte (see
//! [`super::table::pack_codec`]). A slot counts the pages that use it; a dictionary that is no
//! longer the current one is freed when its count falls to zero. New pages are compressed
//! with the current dictionary; [`PageStore::dict_maintain`] (run by a low-priority thread)
//! trains when due and recompresses the pages of older dictionaries, or of none, with it.
//! The dictionaries' memory and the sample pages are counted in `mem_used_total`.
//!
//! The sample pages are only needed for the next training. Once a dictionary is trained, its
//! pages are moved onto it and writes have been quiet for [`IDLE_RETRAIN`] with no training
//! due, the reservoir is released (its memory leaves `mem_used_total`, `samples_released` in
//! the status counts the pages dropped). Sampling then starts over with the pages written
//! after that, so a later retraining learns from the data that made it due.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use compfs_codec::dict::MAX_DICT;
use compfs_codec::{DictError, Dictionary};

use super::*;

/// Sample pages kept for training (8 MiB): a uniform sample of every compressible page
/// written (reservoir sampling).
pub const SAMPLE_PAGES: usize = 2048;
/// Compressible pages written before the first training.
pub const FIRST_TRAINING: u64 = 2048;
/// Size of a trained dictionary (zstd's default for `--train`).
pub const DICT_SIZE: usize = 112_640;
/// Writes quiet for this long make a retraining due when the data grew by a quarter.
pub const IDLE_RETRAIN: Duration = Duration::from_secs(1);
/// Pages recompressed per shard lock hold by the background pass.
const BATCH: usize = 16;
/// Pages sampled since a release before a retraining may run.
const MIN_SAMPLES: u64 = 256;
/// Sample pages a new dictionary is judged on against the current one.
const JUDGE_PAGES: usize = 256;

/// How the store uses dictionaries.
#[derive(Debug)]
pub enum DictSetup {
    /// One dictionary for every page (`--dict FILE`).
    Fixed(Dictionary),
    /// Trained from the pages written (`--dict auto`).
    Auto,
}

/// Reads and checks a dictionary file (what `zstd --train` writes) for compression level
/// `level`.
pub fn load_dict(path: &Path, level: i32) -> Result<Dictionary, BlkError> {
    let file_err = |source| BlkError::DictFile {
        path: path.display().to_string(),
        source,
    };
    let len = std::fs::metadata(path)
        .map_err(|e| BlkError::io(format!("cannot read dictionary {}", path.display()), e))?
        .len();
    if len > MAX_DICT as u64 {
        return Err(file_err(DictError::TooLarge {
            len: usize::try_from(len).unwrap_or(usize::MAX),
        }));
    }
    let raw = std::fs::read(path)
        .map_err(|e| BlkError::io(format!("cannot read dictionary {}", path.display()), e))?;
    Dictionary::new(raw, level).map_err(file_err)
}

pub(super) struct Slot {
    pub(super) dict: Dictionary,
    /// 1 for the first dictionary, then one more for each installed.
    pub(super) version: u32,
    /// Stored pages compressed with this dictionary.
    pages: AtomicU64,
}

struct Table {
    /// Index = slot number; index 0 is never used.
    slots: Vec<Option<Arc<Slot>>>,
    current: u8,
}

/// The sample pages, each kept compressed with zstd:1 (no dictionary) to hold down their
/// memory; training unpacks them.
#[derive(Default)]
struct Reservoir {
    pages: Vec<Box<[u8]>>,
}

/// The codec sample pages are kept in.
fn sample_spec() -> CodecSpec {
    CodecSpec::with_level(Algorithm::Zstd, 1).spec
}

/// The dictionary state of a store.
pub(super) struct Dicts {
    table: RwLock<Table>,
    auto: bool,
    level: i32,
    /// Bytes of the dictionaries and sample pages.
    bytes: AtomicU64,
    next_version: AtomicU32,
    samples: Mutex<Reservoir>,
    seen: AtomicU64,
    /// `seen` when the reservoir was last released: sampling restarts from there.
    seen_at_release: AtomicU64,
    /// Sample pages dropped by releases.
    samples_released: AtomicU64,
    seen_at_training: AtomicU64,
    start: Instant,
    last_write_ms: AtomicU64,
    /// A dictionary was installed and pages of others may remain.
    stale: AtomicBool,
    /// A training (train, judge, install) is under way: the status reports busy until the
    /// new dictionary is current or rejected, so a reader never sees a finished training
    /// without its outcome.
    training: AtomicBool,
    trainings: AtomicU64,
    train_ms_last: AtomicU64,
    train_ms_total: AtomicU64,
    recompressed: AtomicU64,
    /// Where the background pass resumes in each shard.
    cursors: Mutex<Vec<usize>>,
}

impl std::fmt::Debug for Dicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dicts")
            .field("auto", &self.auto)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// splitmix64: the reservoir's choice of slot for the n-th page.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What `dict stat` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DictStatus {
    /// Version of the current dictionary (0: none yet).
    pub version: u32,
    /// Dictionaries held (the current one and older ones still in use).
    pub dicts: u32,
    /// Bytes of dictionaries and sample pages (part of `mem_used_total`).
    pub bytes: u64,
    /// Stored pages compressed with the current dictionary.
    pub pages: u64,
    pub trainings: u64,
    pub train_ms_last: u64,
    pub train_ms_total: u64,
    /// Pages moved to a newer dictionary by the background pass.
    pub recompressed: u64,
    /// Sample pages held.
    pub samples: u64,
    /// Sample pages released once no training was due (their memory returned).
    pub samples_released: u64,
    /// Training or recompression is due or under way.
    pub busy: bool,
}

impl DictStatus {
    /// The `dict` line of `compfs blk stat`.
    pub fn line(&self) -> String {
        format!(
            "version {} dicts {} bytes {} pages {} trainings {} train_ms_last {} train_ms_total {} recompressed {} samples {} busy {} samples_released {}",
            self.version,
            self.dicts,
            self.bytes,
            self.pages,
            self.trainings,
            self.train_ms_last,
            self.train_ms_total,
            self.recompressed,
            self.samples,
            u8::from(self.busy),
            self.samples_released
        )
    }

    /// Parses [`DictStatus::line`] back.
    pub fn parse(s: &str) -> Option<DictStatus> {
        let w: Vec<&str> = s.split_whitespace().collect();
        let get = |k: &str| -> Option<u64> {
            let i = w.iter().position(|x| *x == k)?;
            w.get(i + 1)?.parse().ok()
        };
        Some(DictStatus {
            version: u32::try_from(get("version")?).ok()?,
            dicts: u32::try_from(get("dicts")?).ok()?,
            bytes: get("bytes")?,
            pages: get("pages")?,
            trainings: get("trainings")?,
            train_ms_last: get("train_ms_last")?,
            train_ms_total: get("train_ms_total")?,
            recompressed: get("recompressed")?,
            samples: get("samples")?,
            busy: get("busy")? != 0,
            // Absent from servers before the release existed.
            samples_released: get("samples_released").unwrap_or(0),
        })
    }
}

impl Dicts {
    pub(super) fn new(level: i32, auto: bool) -> Dicts {
        Dicts {
            table: RwLock::new(Table {
                slots: vec![None; usize::from(MAX_DICT_SLOT) + 1],
                current: 0,
            }),
            auto,
            level,
            bytes: AtomicU64::new(0),
            next_version: AtomicU32::new(1),
            samples: Mutex::new(Reservoir::default()),
            seen: AtomicU64::new(0),
            seen_at_release: AtomicU64::new(0),
            samples_released: AtomicU64::new(0),
            seen_at_training: AtomicU64::new(0),
            start: Instant::now(),
            last_write_ms: AtomicU64::new(0),
            stale: AtomicBool::new(false),
            training: AtomicBool::new(false),
            trainings: AtomicU64::new(0),
            train_ms_last: AtomicU64::new(0),
            train_ms_total: AtomicU64::new(0),
            recompressed: AtomicU64::new(0),
            cursors: Mutex::new(vec![0; SHARDS]),
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The current dictionary with one page counted against it, for a page about to be
    /// stored; the caller calls [`Dicts::release`] if it does not store the page with it.
    pub(super) fn acquire_current(&self) -> Option<(u8, Arc<Slot>)> {
        let t = read(&self.table);
        let s = t.slots.get(usize::from(t.current))?.as_ref()?;
        s.pages.fetch_add(1, Ordering::Relaxed);
        Some((t.current, s.clone()))
    }

    /// The dictionary in slot `slot`, if any.
    pub(super) fn get(&self, slot: u8) -> Option<Arc<Slot>> {
        read(&self.table).slots.get(usize::from(slot))?.clone()
    }

    /// One page of slot `slot` is gone; frees the dictionary when it was the last page of an
    /// older dictionary.
    pub(super) fn release(&self, slot: u8) {
        let Some(s) = self.get(slot) else { return };
        if s.pages.fetch_sub(1, Ordering::Relaxed) == 1 {
            let mut t = write(&self.table);
            self.free_if_unused(&mut t, slot);
        }
    }

    fn free_if_unused(&self, t: &mut Table, slot: u8) {
        if slot == 0 || slot == t.current {
            return;
        }
        let i = usize::from(slot);
        let unused = matches!(&t.slots[i], Some(s) if s.pages.load(Ordering::Relaxed) == 0);
        if unused {
            if let Some(s) = t.slots[i].take() {
                self.bytes
                    .fetch_sub(s.dict.memory() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Makes `dict` the current dictionary; the previous one is freed if no page uses it.
    /// Returns the new slot, or None when every slot is taken by a dictionary still in use.
    pub(super) fn install(&self, dict: Dictionary) -> Option<u8> {
        let mut t = write(&self.table);
        let slot = (1..=MAX_DICT_SLOT).find(|&s| t.slots[usize::from(s)].is_none())?;
        self.bytes
            .fetch_add(dict.memory() as u64, Ordering::Relaxed);
        let version = self.next_version.fetch_add(1, Ordering::Relaxed);
        t.slots[usize::from(slot)] = Some(Arc::new(Slot {
            dict,
            version,
            pages: AtomicU64::new(0),
        }));
        let old = std::mem::replace(&mut t.current, slot);
        self.free_if_unused(&mut t, old);
        self.cursors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fill(0);
        self.stale.store(true, Ordering::Relaxed);
        Some(slot)
    }

    /// Whether another dictionary than `slot` became current (its install reset the cursors).
    fn cursors_reset_since(&self, slot: u8) -> bool {
        self.current_slot() != slot
    }

    fn current_slot(&self) -> u8 {
        read(&self.table).current
    }

    /// Offers a compressible page that is being written to the sampler (auto mode).
    pub(super) fn offer(&self, comp: &mut Compressor, page: &[u8]) {
        if !self.auto {
            return;
        }
        // Position in the sample since the last release.
        let n = self
            .seen
            .fetch_add(1, Ordering::Relaxed)
            .saturating_sub(self.seen_at_release.load(Ordering::Relaxed));
        self.last_write_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
        let cap = SAMPLE_PAGES as u64;
        let j = if n < cap { n } else { mix(n) % (n + 1) };
        if j >= cap {
            return;
        }
        let mut packed = Vec::new();
        if comp.compress(sample_spec(), page, &mut packed).is_err() || page.len() != PAGE {
            return;
        }
        let packed: Box<[u8]> = packed.into();
        let mut r = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let add_len = packed.len() as u64;
        if r.pages.len() < SAMPLE_PAGES {
            r.pages.push(packed);
            self.bytes.fetch_add(add_len, Ordering::Relaxed);
        } else if let Some(p) = r.pages.get_mut(j as usize) {
            let old = std::mem::replace(p, packed);
            self.bytes.fetch_add(add_len, Ordering::Relaxed);
            self.bytes.fetch_sub(old.len() as u64, Ordering::Relaxed);
        }
    }

    /// Writes have been quiet for [`IDLE_RETRAIN`].
    fn quiet(&self) -> bool {
        let now = self.start.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_write_ms.load(Ordering::Relaxed))
            >= IDLE_RETRAIN.as_millis() as u64
    }

    fn sample_count(&self) -> usize {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pages
            .len()
    }

    /// The reservoir can go: a dictionary was trained and its pages moved, writes are quiet
    /// and no training is due or under way.
    fn release_due(&self) -> bool {
        self.auto
            && self.trainings.load(Ordering::Acquire) > 0
            && !self.training.load(Ordering::Acquire)
            && !self.stale.load(Ordering::Relaxed)
            && self.quiet()
            && !self.training_due()
            && self.sample_count() > 0
    }

    /// Drops the sample pages and restarts sampling from the pages written from now on.
    /// Returns the pages dropped.
    fn release_samples(&self) -> u64 {
        let mut r = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let pages = std::mem::take(&mut r.pages);
        let bytes: u64 = pages.iter().map(|p| p.len() as u64).sum();
        self.seen_at_release
            .store(self.seen.load(Ordering::Relaxed), Ordering::Relaxed);
        drop(r);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.samples_released
            .fetch_add(pages.len() as u64, Ordering::Relaxed);
        pages.len() as u64
    }

    fn training_due(&self) -> bool {
        if !self.auto {
            return false;
        }
        let seen = self.seen.load(Ordering::Relaxed);
        let at = self.seen_at_training.load(Ordering::Relaxed);
        if at == 0 {
            return seen >= FIRST_TRAINING;
        }
        // After a release the reservoir must refill before a training can learn from it.
        let samples = seen.saturating_sub(self.seen_at_release.load(Ordering::Relaxed));
        let grown = seen >= 2 * at || (self.quiet() && seen * 4 >= at * 5);
        grown && samples >= MIN_SAMPLES
    }

    fn status(&self) -> DictStatus {
        let t = read(&self.table);
        let cur = t.slots.get(usize::from(t.current)).and_then(|s| s.as_ref());
        let busy = self.training.load(Ordering::Acquire)
            || self.training_due()
            || self.stale.load(Ordering::Relaxed)
            || self.release_due();
        DictStatus {
            version: cur.map_or(0, |s| s.version),
            dicts: t.slots.iter().filter(|s| s.is_some()).count() as u32,
            bytes: self.bytes(),
            pages: cur.map_or(0, |s| s.pages.load(Ordering::Relaxed)),
            trainings: self.trainings.load(Ordering::Acquire),
            train_ms_last: self.train_ms_last.load(Ordering::Relaxed),
            train_ms_total: self.train_ms_total.load(Ordering::Relaxed),
            recompressed: self.recompressed.load(Ordering::Relaxed),
            samples: self.sample_count() as u64,
            busy,
            samples_released: self.samples_released.load(Ordering::Relaxed),
        }
    }
}

impl PageStore {
    /// Sets up dictionaries; only for a zstd primary codec.
    pub fn with_dict(mut self, setup: DictSetup) -> Result<PageStore, BlkError> {
        if self.cfg.algo.algorithm() != Algorithm::Zstd {
            return Err(BlkError::DictNeedsZstd(self.cfg.algo.to_string()));
        }
        let level = self.cfg.algo.level();
        let d = match setup {
            DictSetup::Fixed(dict) => {
                let d = Dicts::new(level, false);
                d.install(dict);
                d.stale.store(false, Ordering::Relaxed);
                d
            }
            DictSetup::Auto => Dicts::new(level, true),
        };
        self.dicts = Some(d);
        Ok(self)
    }

    /// The dictionary status, if dictionaries are in use.
    pub fn dict_status(&self) -> Option<DictStatus> {
        self.dicts.as_ref().map(Dicts::status)
    }

    /// One step of background dictionary work: trains a new dictionary when one is due
    /// (keeping it only if it compresses the samples at least 1% better than the current
    /// one), else recompresses up to one batch of pages per shard onto the current
    /// dictionary, else releases the sample pages when that is due. Returns whether anything
    /// was left to do.
    pub fn dict_maintain(&self) -> Result<bool, BlkError> {
        let Some(d) = &self.dicts else {
            return Ok(false);
        };
        if d.training_due() {
            self.train(d)?;
            return Ok(true);
        }
        if !d.stale.load(Ordering::Relaxed) {
            if d.release_due() {
                let n = d.release_samples();
                tracing::info!("released {n} dictionary sample pages (no training due)");
                return Ok(true);
            }
            return Ok(false);
        }
        let looked_at = self.recompress_onto_current(d)?;
        if looked_at == 0 {
            d.stale.store(false, Ordering::Relaxed);
            // Moving pages left holes in the pool's zspages: give them back.
            self.pool.compact();
        }
        Ok(looked_at > 0)
    }

    fn train(&self, d: &Dicts) -> Result<(), BlkError> {
        /// Clears `Dicts::training` however the training ends.
        struct Busy<'a>(&'a AtomicBool);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        // Set before `seen_at_training` so that `training_due` turning false never shows
        // an idle store.
        d.training.store(true, Ordering::Release);
        let _busy = Busy(&d.training);
        let t0 = Instant::now();
        d.seen_at_training
            .store(d.seen.load(Ordering::Relaxed).max(1), Ordering::Relaxed);
        let packed: Vec<Box<[u8]>> = d
            .samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pages
            .clone();
        let mut samples = Vec::with_capacity(packed.len());
        with_ctx(|ctx| -> Result<(), BlkError> {
            for p in &packed {
                let mut page = vec![0u8; PAGE];
                ctx.decomp
                    .decompress(Algorithm::Zstd, p, &mut page)
                    .map_err(|e| BlkError::Corrupt {
                        page: 0,
                        detail: format!("dictionary sample: {e}"),
                    })?;
                samples.push(page);
            }
            Ok(())
        })?;
        drop(packed);
        let dict = match Dictionary::train(&samples, DICT_SIZE, d.level) {
            Ok(x) => x,
            Err(e) => {
                tracing::info!("dictionary training skipped: {e}");
                return Ok(());
            }
        };
        let ms = t0.elapsed().as_millis() as u64;
        let judge: Vec<&[u8]> = samples
            .iter()
            .step_by((samples.len() / JUDGE_PAGES).max(1))
            .map(|p| &p[..])
            .collect();
        let cur = d.acquire_current();
        let (new_total, old_total) = with_ctx(|ctx| -> Result<(u64, u64), BlkError> {
            let (mut n, mut o) = (0u64, 0u64);
            for p in &judge {
                n += ctx.comp.compress_dict(&dict, p, &mut ctx.buf)? as u64;
                o += match &cur {
                    Some((_, s)) => ctx.comp.compress_dict(&s.dict, p, &mut ctx.buf)?,
                    None => ctx.comp.compress(self.codecs[0], p, &mut ctx.buf)?,
                } as u64;
            }
            Ok((n, o))
        })?;
        if let Some((slot, _)) = cur {
            d.release(slot);
        }
        if new_total * 100 <= old_total * 99 {
            tracing::info!(
                "dictionary trained in {ms} ms from {} pages: samples {old_total} -> {new_total} bytes",
                samples.len()
            );
            if d.install(dict).is_none() {
                tracing::info!("no free dictionary slot; keeping the current dictionary");
            }
        }
        // Counted once the outcome is in place: a reader that sees the count sees the
        // dictionary it produced (or knows it was rejected).
        d.train_ms_last.store(ms, Ordering::Relaxed);
        d.train_ms_total.fetch_add(ms, Ordering::Relaxed);
        d.trainings.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Moves up to [`BATCH`] pages per shard that were compressed with the primary codec but
    /// not the current dictionary onto it. Pages from an older dictionary move whenever they
    /// still fit (so it can be freed); pages without one only when they shrink. Pages that
    /// stay are flagged and not looked at again until they are rewritten. Each shard is
    /// resumed where the previous call stopped. Returns the pages looked at.
    fn recompress_onto_current(&self, d: &Dicts) -> Result<u64, BlkError> {
        let cur = d.current_slot();
        if cur == 0 {
            return Ok(0);
        }
        let mut moved = 0u64;
        let mut looked_at = 0u64;
        let mut cursors = std::mem::take(&mut *d.cursors.lock().unwrap_or_else(|e| e.into_inner()));
        cursors.resize(SHARDS, 0);
        let r = with_ctx(|ctx| -> Result<(), BlkError> {
            let mut page_buf = vec![0u8; PAGE];
            for (s, shard) in self.shards.iter().enumerate() {
                let mut t = lock(shard);
                let mut done = 0;
                let start = cursors[s].min(t.len());
                cursors[s] = 0;
                for idx in start..t.len() {
                    if done == BATCH {
                        cursors[s] = idx;
                        break;
                    }
                    let e = t[idx];
                    let Entry::Obj {
                        len, codec, flags, ..
                    } = e
                    else {
                        continue;
                    };
                    if codec == RAW || codec_index(codec) != 0 || dict_slot(codec) == cur {
                        continue;
                    }
                    let from = dict_slot(codec);
                    if flags & FLAG_NO_DICT != 0 {
                        continue;
                    }
                    done += 1;
                    looked_at += 1;
                    let page = idx as u64 * SHARDS as u64 + s as u64;
                    self.decode(ctx, page, e, &mut page_buf)?;
                    let Some((slot, sl)) = d.acquire_current() else {
                        return Ok(());
                    };
                    let n = ctx.comp.compress_dict(&sl.dict, &page_buf, &mut ctx.buf)?;
                    let keep = n <= HUGE_THRESHOLD && (from != 0 || n < usize::from(len));
                    let obj = if keep {
                        match self.pool.alloc(&ctx.buf[..n]) {
                            Ok(o) => Some(o),
                            Err(PoolError::Limit { .. }) => None,
                            Err(e) => {
                                d.release(slot);
                                return Err(BlkError::Pool(e));
                            }
                        }
                    } else {
                        None
                    };
                    let Some(obj) = obj else {
                        d.release(slot);
                        if let Some(f) = t.get_mut(idx).and_then(Entry::flags_mut) {
                            *f |= FLAG_NO_DICT;
                        }
                        continue;
                    };
                    add(&self.c.pages_stored, 1);
                    add(&self.c.compr_data_size, n as u64);
                    self.free_entry(e);
                    t[idx] = Entry::Obj {
                        obj,
                        len: n as u16,
                        codec: pack_codec(0, slot),
                        flags: flags & !(FLAG_NO_DICT | FLAG_PENDING),
                    };
                    moved += 1;
                }
            }
            Ok(())
        });
        // A concurrent install reset the cursors: keep its reset.
        if !d.cursors_reset_since(cur) {
            *d.cursors.lock().unwrap_or_else(|e| e.into_inner()) = cursors;
        }
        d.recompressed.fetch_add(moved, Ordering::Relaxed);
        r.map(|()| looked_at)
    }
}

#[cfg(test)]
#[path = "dict_tests.rs"]
mod tests;
