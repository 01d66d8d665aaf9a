//! Store-trained zstd dictionaries (format version 3, issue 16): small files are sampled as
//! they are written; once enough samples exist a background thread trains a dictionary
//! ([`compfs_codec::Dictionary::train`]), records it in the `dicts` table and makes it the
//! current one; from then on small extents, inline data and packed extents (`pack`) of zstd
//! files are compressed with it when that is shorter than without (see [`dict_applies`]). Each
//! extent header, extent record and inline datum names the dictionary it was compressed with
//! (0 = none). A dictionary is
//! digested once per open (CDict and DDict, [`compfs_codec::Dictionary`]) and cached here,
//! never per file. A damaged dictionary (CRC mismatch, or entropy tables that do not load)
//! makes the extents and inline data using it unreadable (EIO), nothing else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use compfs_codec::ExtentPolicy;
use compfs_codec::{Algorithm, CodecSpec, Dictionary};
use redb::{Database, ReadableDatabase, ReadableTable};

use crate::records::DictRec;
use crate::store::{lock, Inner};

/// Blocks sampled for training: block 0 of a file, at most this long (so files of at most
/// 64 KiB with the default 128 KiB extents).
pub(crate) const SAMPLE_MAX: usize = 64 << 10;
/// Sample bytes collected before the first (and only) training of a store.
pub(crate) const SAMPLE_BYTES: usize = 4 << 20;
/// Fewest samples a training runs with.
pub(crate) const MIN_SAMPLES: usize = 128;
/// Size of a trained dictionary (zstd's default for `--train`).
pub(crate) const DICT_SIZE: usize = 112_640;
/// Extents of at most this many uncompressed bytes are tried with the dictionary (chosen by
/// measurement: see docs/benchmarks-fs.md, small files); inline data always is.
pub(crate) const DICT_MAX_EXTENT: usize = 32 << 10;

/// A dictionary of the store, digested.
pub(crate) struct StoreDict {
    pub id: u16,
    pub dict: Dictionary,
}

impl std::fmt::Debug for StoreDict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreDict({})", self.id)
    }
}

#[derive(Default)]
struct Samples {
    blocks: Vec<Vec<u8>>,
    bytes: usize,
    /// A training started (or the store already has a dictionary): no more sampling.
    closed: bool,
}

/// The dictionary state of an open store.
pub(crate) struct Dicts {
    /// Dictionaries are used and trained (`dict=on`, the default; off for read-only opens
    /// and `dict=off`). Reading extents that use one works either way.
    enabled: bool,
    /// Packed extents are compressed with the current dictionary too (`dict=on`; not with
    /// `dict=nopack`, which keeps it for small extents and inline data).
    packs: bool,
    /// zstd level dictionaries are trained and digested for.
    level: i32,
    current: RwLock<Option<Arc<StoreDict>>>,
    /// Dictionaries loaded by id; an error (damaged, missing) is remembered as its message.
    loaded: Mutex<HashMap<u16, Result<Arc<StoreDict>, String>>>,
    samples: Mutex<Samples>,
    /// Sampling goes on (enabled, no dictionary yet, no training started).
    sampling: AtomicBool,
    /// The training thread, joined when the store closes.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What an encode job needs of the dictionaries: the current one (when the file's codec can
/// use it) and where to offer samples.
#[derive(Clone, Default)]
pub(crate) struct DictCtx {
    pub cur: Option<Arc<StoreDict>>,
    sampler: Option<Arc<Dicts>>,
    /// A pack's context: the dictionary is used whatever the extent's length, not only on
    /// extents of at most [`DICT_MAX_EXTENT`], and alone (not tried against the codec without
    /// it; see `pack`).
    pub pack: bool,
}

impl DictCtx {
    /// Offers block 0 of a file as a training sample (see [`Dicts::offer`]).
    pub(crate) fn offer(&self, spec: CodecSpec, src: &[u8]) {
        if let Some(d) = &self.sampler {
            d.offer(spec, src);
        }
    }

    /// The same dictionary, without sampling (written ranges of partial blocks).
    pub(crate) fn no_sample(&self) -> DictCtx {
        DictCtx {
            cur: self.cur.clone(),
            sampler: None,
            pack: self.pack,
        }
    }

    /// The dictionary to try on `len` uncompressed bytes under `spec` (`inline`: as inline
    /// data), if any (see [`dict_applies`]).
    pub(crate) fn for_len(&self, spec: CodecSpec, len: usize, inline: bool) -> Option<&StoreDict> {
        self.cur.as_deref().filter(|_| {
            dict_applies(spec, len, inline) || (self.pack && spec.algorithm() == Algorithm::Zstd)
        })
    }
}

impl Inner {
    /// The dictionary context of an encode under `policy`.
    pub(crate) fn dict_ctx(&self, policy: &ExtentPolicy) -> DictCtx {
        let zstd = policy.spec.algorithm() == Algorithm::Zstd;
        DictCtx {
            cur: if zstd { self.dicts.current() } else { None },
            sampler: (zstd && self.dicts.sampling.load(Ordering::Relaxed))
                .then(|| self.dicts.clone()),
            pack: false,
        }
    }

    /// The dictionary context of a pack under `policy`: the current dictionary whatever the
    /// pack's length, unless packs do not use it (`dict=nopack`, `dict=off`); no sampling
    /// (the members are offered one by one, see `pack`).
    pub(crate) fn pack_dict_ctx(&self, policy: &ExtentPolicy) -> DictCtx {
        DictCtx {
            cur: self.pack_dict(policy.spec),
            sampler: None,
            pack: true,
        }
    }

    /// The dictionary packs of `spec` are compressed with now, if any.
    pub(crate) fn pack_dict(&self, spec: CodecSpec) -> Option<Arc<StoreDict>> {
        if spec.algorithm() == Algorithm::Zstd && self.dicts.packs {
            self.dicts.current()
        } else {
            None
        }
    }

    /// Starts the training of the store's dictionary in a thread of its own when enough
    /// samples were collected (called by the background flusher; never on the write path).
    pub(crate) fn dict_maintain(self: &Arc<Inner>) {
        let Some(samples) = self.dicts.take_due() else {
            return;
        };
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("compfs-dict".into())
            .spawn(move || {
                if let Some(inner) = weak.upgrade() {
                    let _ = inner.train_and_install(&samples);
                }
            });
        match spawned {
            Ok(h) => *lock(&self.dicts.thread) = Some(h),
            Err(e) => {
                tracing::warn!("compfs: cannot start the dictionary training: {e}");
            }
        }
    }

    /// Trains a dictionary from `samples`, records it in the `dicts` table (a commit of its
    /// own, before any extent can use it) and makes it the current one. Returns its id.
    pub(crate) fn train_and_install(&self, samples: &[Vec<u8>]) -> crate::Result<Option<u16>> {
        let r = self.train_and_install_inner(samples);
        match &r {
            Ok(Some(id)) => tracing::info!(
                "compfs: store {} trained dictionary {id} from {} samples",
                self.dir.display(),
                samples.len()
            ),
            // A failed training leaves the store without a dictionary until it is reopened.
            Ok(None) => {}
            Err(e) => tracing::warn!("compfs: dictionary not recorded: {e}"),
        }
        r
    }

    fn train_and_install_inner(&self, samples: &[Vec<u8>]) -> crate::Result<Option<u16>> {
        let dict = match self.dicts.train(samples) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("compfs: dictionary training failed: {e}");
                return Ok(None);
            }
        };
        self.check_writable()?;
        let rec = DictRec::new(dict.level() as i8, dict.raw().to_vec());
        let id = self.write(false, |w| {
            let last = w.dicts()?.last()?.map(|(k, _)| k.value());
            let id = match last {
                None => 1,
                Some(u16::MAX) => return Err(crate::meta::corrupt("dictionary ids exhausted")),
                Some(l) => l + 1,
            };
            w.dicts_mut()?.insert(id, rec.encode().as_slice())?;
            Ok(id)
        })?;
        self.dicts.install(id, dict);
        Ok(Some(id))
    }
}

/// Whether a dictionary is tried for `len` uncompressed bytes under `spec`.
pub(crate) fn dict_applies(spec: CodecSpec, len: usize, inline: bool) -> bool {
    spec.algorithm() == Algorithm::Zstd && (inline || len <= DICT_MAX_EXTENT)
}

/// The level the store's dictionaries are digested for: the store's default zstd level, or
/// zstd's default when the default codec is another.
pub(crate) fn dict_level(default: CodecSpec) -> i32 {
    if default.algorithm() == Algorithm::Zstd {
        default.level()
    } else {
        CodecSpec::default_for(Algorithm::Zstd).level()
    }
}

impl Dicts {
    /// The state of a store opened with `enabled` dictionaries (`packs`: for packed extents
    /// too): the newest dictionary in the table becomes the current one (loaded now, so a
    /// damaged one is logged at open and not used for writing).
    pub(crate) fn open(
        db: &Database,
        enabled: bool,
        packs: bool,
        level: i32,
    ) -> crate::Result<Dicts> {
        let d = Dicts {
            enabled,
            packs: enabled && packs,
            level,
            current: RwLock::new(None),
            loaded: Mutex::new(HashMap::new()),
            samples: Mutex::new(Samples::default()),
            sampling: AtomicBool::new(false),
            thread: Mutex::new(None),
        };
        let newest = {
            let txn = db.begin_read()?;
            match txn.open_table(crate::meta::DICTS) {
                Ok(t) => t.last()?.map(|(k, _)| k.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(id) = newest {
            lock(&d.samples).closed = true;
            match d.get(db, id) {
                Ok(cur) => {
                    if enabled {
                        *d.current.write().unwrap_or_else(|p| p.into_inner()) = Some(cur);
                    }
                }
                Err(e) => tracing::error!("compfs: dictionary {id} not used for writing: {e}"),
            }
        } else if !enabled {
            lock(&d.samples).closed = true;
        } else {
            d.sampling.store(true, Ordering::Relaxed);
        }
        Ok(d)
    }

    /// The dictionary new small extents and inline data are compressed with, if any.
    pub(crate) fn current(&self) -> Option<Arc<StoreDict>> {
        if !self.enabled {
            return None;
        }
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Dictionary `id`, loaded from the `dicts` table on first use and checked (CRC-32C,
    /// zstd's own parse). The error is a description of the damage.
    pub(crate) fn get(&self, db: &Database, id: u16) -> Result<Arc<StoreDict>, String> {
        if let Some(r) = lock(&self.loaded).get(&id) {
            return r.clone();
        }
        let r = load(db, id, self.level);
        lock(&self.loaded).insert(id, r.clone());
        r
    }

    /// Offers block 0 of a zstd file (its first `src.len()` bytes) as a training sample.
    pub(crate) fn offer(&self, spec: CodecSpec, src: &[u8]) {
        if !self.enabled || spec.algorithm() != Algorithm::Zstd || src.len() > SAMPLE_MAX {
            return;
        }
        let mut s = lock(&self.samples);
        if s.closed || s.bytes >= SAMPLE_BYTES {
            return;
        }
        s.bytes += src.len();
        s.blocks.push(src.to_vec());
    }

    /// Takes the samples when a training is due (enough of them, none ran yet).
    pub(crate) fn take_due(&self) -> Option<Vec<Vec<u8>>> {
        let mut s = lock(&self.samples);
        if s.closed || s.bytes < SAMPLE_BYTES || s.blocks.len() < MIN_SAMPLES {
            return None;
        }
        s.closed = true;
        s.bytes = 0;
        self.sampling.store(false, Ordering::Relaxed);
        Some(std::mem::take(&mut s.blocks))
    }

    /// Takes whatever samples there are when there are at least `min` (a training asked for
    /// explicitly).
    pub(crate) fn take_all(&self, min: usize) -> Option<Vec<Vec<u8>>> {
        let mut s = lock(&self.samples);
        if s.closed || s.blocks.len() < min {
            return None;
        }
        s.closed = true;
        s.bytes = 0;
        self.sampling.store(false, Ordering::Relaxed);
        Some(std::mem::take(&mut s.blocks))
    }

    /// Waits for a training under way (the store is closing).
    pub(crate) fn join_training(&self) {
        let h = lock(&self.thread).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Trains a dictionary from `samples` (slow: run off the write path).
    pub(crate) fn train(&self, samples: &[Vec<u8>]) -> Result<Dictionary, String> {
        let total: usize = samples.iter().map(|s| s.len()).sum();
        // zstd wants the samples to be many times the dictionary.
        let size = DICT_SIZE.min(total / 8).max(1024);
        Dictionary::train(samples, size, self.level).map_err(|e| e.to_string())
    }

    /// Makes `dict`, just committed as id `id`, the current dictionary.
    pub(crate) fn install(&self, id: u16, dict: Dictionary) {
        let d = Arc::new(StoreDict { id, dict });
        lock(&self.loaded).insert(id, Ok(d.clone()));
        if self.enabled {
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(d);
        }
    }
}

/// Reads and checks dictionary `id`.
pub(crate) fn load(db: &Database, id: u16, level: i32) -> Result<Arc<StoreDict>, String> {
    let rec = (|| -> crate::Result<Option<DictRec>> {
        let txn = db.begin_read()?;
        let t = match txn.open_table(crate::meta::DICTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let v = t.get(id)?;
        Ok(match v {
            Some(v) => Some(crate::meta::dec(DictRec::decode(v.value()))?),
            None => None,
        })
    })()
    .map_err(|e| format!("dictionary {id} unreadable: {e}"))?;
    let rec = rec.ok_or_else(|| format!("dictionary {id} is missing"))?;
    digest(id, &rec, level)
}

/// Checks a dictionary record and digests it for `level` (the record's own level when the
/// store uses none).
pub(crate) fn digest(id: u16, rec: &DictRec, level: i32) -> Result<Arc<StoreDict>, String> {
    rec.check()
        .map_err(|e| format!("dictionary {id} is damaged: {e}"))?;
    let level = if level == 0 { rec.level as i32 } else { level };
    let dict = Dictionary::new(rec.bytes.clone(), level)
        .map_err(|e| format!("dictionary {id} is damaged: {e}"))?;
    Ok(Arc::new(StoreDict { id, dict }))
}

impl crate::Store {
    /// Trains the store's dictionary now from the samples collected so far (at least 4),
    /// instead of waiting for enough of them; returns its id (`None` when there is nothing to
    /// train from or the store already has one). For tests and benchmarks.
    #[doc(hidden)]
    pub fn train_dictionary_now(&self) -> crate::Result<Option<u16>> {
        self.train_dictionary_with(Vec::new())
    }

    /// [`Store::train_dictionary_now`] with `extra` samples added to those collected (the
    /// power-cut workload, whose files are flushed too rarely to sample enough of them).
    #[doc(hidden)]
    pub fn train_dictionary_with(&self, extra: Vec<Vec<u8>>) -> crate::Result<Option<u16>> {
        self.inner.dicts.join_training();
        let min = 4usize.saturating_sub(extra.len());
        match self.inner.dicts.take_all(min) {
            Some(mut s) => {
                s.extend(extra);
                self.inner.train_and_install(&s)
            }
            None => Ok(None),
        }
    }

    /// The id of the dictionary new small extents are compressed with, if any.
    pub fn current_dictionary(&self) -> Option<u16> {
        self.inner.dicts.current().map(|d| d.id)
    }
}

#[cfg(test)]
#[path = "dict_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "dict_pack_tests.rs"]
mod pack_tests;
