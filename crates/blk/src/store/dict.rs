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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(s: &str) -> CodecSpec {
        CodecSpec::parse(s).unwrap().spec
    }

    fn store(pages: u64, algo: &str) -> PageStore {
        PageStore::new(Config {
            size: pages * PAGE as u64,
            algo: spec(algo),
            recomp: vec![spec("zstd:9")],
            mem_limit: 0,
        })
        .unwrap()
    }

    fn page(kind: u64, seed: u64) -> Vec<u8> {
        // Two families of data, so a dictionary trained on one differs from one of the other.
        if kind == 0 {
            compfs_testdata::text(PAGE, seed)
        } else {
            compfs_testdata::generate(compfs_testdata::Kind::Mixed, PAGE, seed + 1_000_000)
        }
    }

    /// A dictionary trained on pages of `kind` (trained once per kind and shared).
    fn dict_of(kind: u64, level: i32) -> Dictionary {
        static RAW: std::sync::OnceLock<[Vec<u8>; 2]> = std::sync::OnceLock::new();
        let raw = RAW.get_or_init(|| {
            [0, 1].map(|k| {
                let samples: Vec<Vec<u8>> = (0..200).map(|i| page(k, 10_000 + i)).collect();
                Dictionary::train(&samples, 16 << 10, 1)
                    .unwrap()
                    .raw()
                    .to_vec()
            })
        });
        Dictionary::new(raw[kind as usize].clone(), level).unwrap()
    }

    fn slot_pages(s: &PageStore) -> std::collections::HashMap<u8, u64> {
        let mut m = std::collections::HashMap::new();
        for shard in s.shards.iter() {
            let mut t = lock(shard);
            for (_, e, _) in t.entries_mut() {
                if let Entry::Obj { codec, .. } = *e {
                    if codec != RAW && dict_slot(codec) != 0 {
                        *m.entry(dict_slot(codec)).or_insert(0) += 1;
                    }
                }
            }
        }
        m
    }

    /// The per-slot counts equal the entries that name each slot, and only the current
    /// dictionary or ones still in use are held.
    fn check_counts(s: &PageStore) {
        let d = s.dicts.as_ref().unwrap();
        let used = slot_pages(s);
        let t = read(&d.table);
        for (i, slot) in t.slots.iter().enumerate() {
            let n = used.get(&(i as u8)).copied().unwrap_or(0);
            match slot {
                Some(sl) => {
                    assert_eq!(sl.pages.load(Ordering::Relaxed), n, "slot {i}");
                    assert!(n > 0 || i == usize::from(t.current), "unused slot {i} kept");
                }
                None => assert_eq!(n, 0, "pages name empty slot {i}"),
            }
        }
    }

    fn drain(s: &PageStore) {
        for _ in 0..10_000 {
            if !s.dict_maintain().unwrap() {
                return;
            }
        }
        panic!("dictionary work did not finish");
    }

    #[test]
    fn fixed_dictionary_pages_round_trip_and_memory_is_counted() {
        let plain = store(256, "zstd:1");
        let s = store(256, "zstd:1")
            .with_dict(DictSetup::Fixed(dict_of(0, 1)))
            .unwrap();
        for p in 0..256u64 {
            plain.write(p * PAGE as u64, &page(0, p)).unwrap();
            s.write(p * PAGE as u64, &page(0, p)).unwrap();
        }
        let mut buf = vec![0u8; PAGE];
        for p in 0..256u64 {
            s.read(p * PAGE as u64, &mut buf).unwrap();
            assert_eq!(buf, page(0, p));
        }
        let (a, b) = (plain.stats(), s.stats());
        assert!(b.compr_data_size < a.compr_data_size, "{b:?} vs {a:?}");
        let st = s.dict_status().unwrap();
        assert_eq!((st.version, st.dicts, st.pages), (1, 1, 256));
        assert!(b.mem_used_total >= st.bytes && st.bytes > 16 << 10);
        check_counts(&s);
        // Recompression with a secondary codec takes pages off the dictionary.
        s.mark_idle(None);
        s.recompress(PageKind::Idle, 0, 0).unwrap();
        check_counts(&s);
        for p in 0..256u64 {
            s.read(p * PAGE as u64, &mut buf).unwrap();
            assert_eq!(buf, page(0, p));
        }
    }

    #[test]
    fn older_dictionaries_stay_readable_and_are_freed_when_unused() {
        let s = store(128, "zstd:1")
            .with_dict(DictSetup::Fixed(dict_of(0, 1)))
            .unwrap();
        for p in 0..128u64 {
            s.write(p * PAGE as u64, &page(0, p)).unwrap();
        }
        let d = s.dicts.as_ref().unwrap();
        let first = d.status().bytes;
        d.install(dict_of(1, 1)).unwrap();
        // Both held: the old one still has pages.
        assert_eq!(d.status().dicts, 2);
        check_counts(&s);
        let mut buf = vec![0u8; PAGE];
        for p in 0..64u64 {
            s.write(p * PAGE as u64, &page(1, p)).unwrap();
        }
        check_counts(&s);
        for p in 0..128u64 {
            s.read(p * PAGE as u64, &mut buf).unwrap();
            assert_eq!(buf, page(if p < 64 { 1 } else { 0 }, p), "page {p}");
        }
        // Trimming the last pages of the old dictionary frees it.
        s.trim(64 * PAGE as u64, 64 * PAGE as u64).unwrap();
        let st = d.status();
        assert_eq!((st.dicts, st.version), (1, 2));
        assert!(st.bytes < first + dict_of(1, 1).memory() as u64);
        check_counts(&s);
    }

    #[test]
    fn background_pass_moves_pages_to_the_newest_and_frees_the_old() {
        let s = store(200, "zstd:1")
            .with_dict(DictSetup::Fixed(dict_of(0, 1)))
            .unwrap();
        for p in 0..200u64 {
            s.write(p * PAGE as u64, &page(p % 2, p)).unwrap();
        }
        let d = s.dicts.as_ref().unwrap();
        d.install(dict_of(1, 1)).unwrap();
        drain(&s);
        check_counts(&s);
        let st = d.status();
        assert!(st.recompressed > 0 && !st.busy, "{st:?}");
        // Every page that still fits moved, so the old dictionary is gone.
        let used = slot_pages(&s);
        assert_eq!(used.len(), 1, "{used:?}");
        assert_eq!(st.dicts, 1);
        let mut buf = vec![0u8; PAGE];
        for p in 0..200u64 {
            s.read(p * PAGE as u64, &mut buf).unwrap();
            assert_eq!(buf, page(p % 2, p));
        }
    }

    #[test]
    fn auto_trains_retrains_and_recompresses() {
        let n = 2 * FIRST_TRAINING + 64;
        let plain = store(n, "zstd:1");
        let s = store(n, "zstd:1").with_dict(DictSetup::Auto).unwrap();
        assert_eq!(s.dict_status().unwrap().version, 0);
        let mut buf = vec![0u8; PAGE];
        for p in 0..FIRST_TRAINING {
            s.write(p * PAGE as u64, &page(0, p)).unwrap();
            plain.write(p * PAGE as u64, &page(0, p)).unwrap();
        }
        assert!(s.dict_status().unwrap().busy);
        drain(&s);
        let st = s.dict_status().unwrap();
        assert_eq!((st.version, st.trainings), (1, 1), "{st:?}");
        assert!(st.pages > FIRST_TRAINING / 2, "{st:?}");
        // The data doubles with another kind: a second dictionary replaces the first.
        for p in FIRST_TRAINING..n {
            s.write(p * PAGE as u64, &page(1, p)).unwrap();
            plain.write(p * PAGE as u64, &page(1, p)).unwrap();
        }
        drain(&s);
        let st = s.dict_status().unwrap();
        assert_eq!(st.trainings, 2, "{st:?}");
        check_counts(&s);
        for p in 0..n {
            s.read(p * PAGE as u64, &mut buf).unwrap();
            assert_eq!(buf, page(u64::from(p >= FIRST_TRAINING), p), "page {p}");
        }
        assert!(s.stats().compr_data_size < plain.stats().compr_data_size);
    }

    /// Makes the last write look `secs` old (the quiet rule uses the time since start).
    fn age_writes(s: &mut PageStore, secs: u64) {
        let d = s.dicts.as_mut().unwrap();
        d.start = d
            .start
            .checked_sub(Duration::from_secs(secs))
            .unwrap_or(d.start);
        d.last_write_ms.store(0, Ordering::Relaxed);
    }

    /// Makes writes look ongoing however long the test takes (a slow debug training must not
    /// let the quiet rule fire).
    fn writes_ongoing(s: &PageStore) {
        let d = s.dicts.as_ref().unwrap();
        d.last_write_ms.store(u64::MAX / 4, Ordering::Relaxed);
    }

    #[test]
    fn samples_are_released_when_no_training_is_due_and_sampling_restarts() {
        let n = 2 * FIRST_TRAINING + 512;
        let mut s = store(n, "zstd:1").with_dict(DictSetup::Auto).unwrap();
        for p in 0..FIRST_TRAINING {
            s.write(p * PAGE as u64, &page(0, p)).unwrap();
        }
        writes_ongoing(&s);
        drain(&s);
        let st = s.dict_status().unwrap();
        assert_eq!(
            (st.trainings, st.samples),
            (1, SAMPLE_PAGES as u64),
            "{st:?}"
        );
        // Writes go on: the samples stay and nothing is pending.
        assert!(!st.busy, "{st:?}");
        let before = s.stats().mem_used_total;
        age_writes(&mut s, 5);
        assert!(s.dict_status().unwrap().busy, "a due release shows as busy");
        drain(&s);
        let st = s.dict_status().unwrap();
        assert_eq!(st.samples, 0, "{st:?}");
        assert_eq!(st.samples_released, SAMPLE_PAGES as u64);
        assert!(!st.busy, "{st:?}");
        let cur = s.dicts.as_ref().unwrap().get(1).unwrap();
        assert_eq!(
            st.bytes,
            cur.dict.memory() as u64,
            "only the dictionary is left"
        );
        assert!(s.stats().mem_used_total < before);
        // New writes refill the reservoir from zero; doubling the data retrains on them.
        for p in FIRST_TRAINING..n {
            s.write(p * PAGE as u64, &page(1, p)).unwrap();
        }
        let st = s.dict_status().unwrap();
        assert_eq!(st.samples, (n - FIRST_TRAINING).min(SAMPLE_PAGES as u64));
        drain(&s);
        let st = s.dict_status().unwrap();
        assert_eq!(st.trainings, 2, "{st:?}");
        check_counts(&s);
        let mut buf = vec![0u8; PAGE];
        for p in 0..n {
            s.read(p * PAGE as u64, &mut buf).unwrap();
            assert_eq!(buf, page(u64::from(p >= FIRST_TRAINING), p), "page {p}");
        }
    }

    #[test]
    fn dictionaries_need_zstd_and_a_sound_file() {
        assert!(matches!(
            store(8, "lz4").with_dict(DictSetup::Auto),
            Err(BlkError::DictNeedsZstd(_))
        ));
        let dir = std::env::temp_dir().join(format!("compfs-blk-dict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dict_of(0, 3);
        let cases: [(&str, Vec<u8>); 3] = [
            ("garbage", b"not a dictionary at all".to_vec()),
            ("truncated", good.raw()[..100].to_vec()),
            ("empty", vec![]),
        ];
        for (name, bytes) in cases {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            let e = load_dict(&p, 3).unwrap_err();
            assert!(matches!(e, BlkError::DictFile { .. }), "{name}: {e}");
        }
        let p = dir.join("good");
        std::fs::write(&p, good.raw()).unwrap();
        assert_eq!(load_dict(&p, 3).unwrap().id(), good.id());
        assert!(matches!(
            load_dict(&dir.join("missing"), 3),
            Err(BlkError::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, u64, u64),
        Partial(u64, u16, u8),
        Trim(u64),
        Install(u64),
        Maintain,
        Recompress,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..32u64, 0..2u64, 0..1000u64).prop_map(|(p, k, s)| Op::Write(p, k, s)),
            1 => (0..32u64, 0..4000u16, any::<u8>()).prop_map(|(p, o, b)| Op::Partial(p, o, b)),
            1 => (0..32u64).prop_map(Op::Trim),
            1 => (0..2u64).prop_map(Op::Install),
            2 => Just(Op::Maintain),
            1 => Just(Op::Recompress),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any sequence of writes, trims, new dictionaries, background steps and
        /// recompressions reads back as the model and keeps the per-dictionary counts exact.
        #[test]
        fn store_with_dictionaries_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
            let dicts = [dict_of(0, 1), dict_of(1, 1)];
            let s = store(32, "zstd:1").with_dict(DictSetup::Fixed(dict_of(0, 1))).unwrap();
            let mut model = vec![vec![0u8; PAGE]; 32];
            for o in ops {
                match o {
                    Op::Write(p, k, seed) => {
                        let d = page(k, seed);
                        s.write(p * PAGE as u64, &d).unwrap();
                        model[p as usize] = d;
                    }
                    Op::Partial(p, off, b) => {
                        s.write(p * PAGE as u64 + u64::from(off), &[b; 7]).unwrap();
                        model[p as usize][usize::from(off)..usize::from(off) + 7].fill(b);
                    }
                    Op::Trim(p) => {
                        s.trim(p * PAGE as u64, PAGE as u64).unwrap();
                        model[p as usize].fill(0);
                    }
                    Op::Install(k) => {
                        let raw = dicts[k as usize].raw().to_vec();
                        s.dicts.as_ref().unwrap().install(Dictionary::new(raw, 1).unwrap());
                    }
                    Op::Maintain => {
                        s.dict_maintain().unwrap();
                    }
                    Op::Recompress => {
                        s.mark_idle(None);
                        s.recompress(PageKind::Idle, 0, 0).unwrap();
                    }
                }
                check_counts(&s);
            }
            let mut buf = vec![0u8; PAGE];
            for (p, want) in model.iter().enumerate() {
                s.read(p as u64 * PAGE as u64, &mut buf).unwrap();
                prop_assert_eq!(&buf, want, "page {}", p);
            }
        }
    }
}
