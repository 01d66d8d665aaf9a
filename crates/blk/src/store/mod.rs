//! The page store: the device as an array of 4 KiB pages, each compressed on its own as zram
//! does (drivers/block/zram/zram_drv.c).
//!
//! A page is one of: never written (reads as zeros, costs nothing), a same-filled page (one
//! repeated 8-byte word, only the word is kept: `same_pages`), a compressed object in the
//! [`Pool`], a raw page in the pool's huge class when compression does not get it under
//! [`HUGE_THRESHOLD`] (`huge_pages`), or a page written back to the backing file.
//!
//! Locking: pages are spread over [`SHARDS`] mutex-protected shards (page `p` lives in shard
//! `p % SHARDS`), so connections working on different pages run in parallel; the pool has one
//! lock per size class. Lock order is always shard, then pool class.

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use compfs_codec::{Algorithm, CodecSpec, Compressor, Decompressor};

use crate::error::BlkError;
use crate::pool::{Pool, PoolError, HUGE_THRESHOLD, PAGE};

mod dict;
mod early;
mod maintenance;
mod policy;
mod stats;
mod table;

pub use dict::{load_dict, DictSetup, DictStatus, DICT_SIZE, FIRST_TRAINING, SAMPLE_PAGES};
pub use policy::{PolicyConfig, PolicyStatus, WritebackLimit};
pub use stats::Stats;
use stats::{add, sub, Counters};
use table::*;

/// Number of table shards; a power of two well above the core count keeps collisions rare.
pub const SHARDS: usize = 64;
/// zram allows up to 3 secondary (recompression) algorithms.
pub const MAX_RECOMP: usize = 3;

/// Which pages `recompress` and `writeback` act on (zram's `type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    Idle,
    Huge,
    /// Pages recompression could not shrink (zram's ZRAM_INCOMPRESSIBLE).
    Incompressible,
}

impl std::str::FromStr for PageKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "idle" => Ok(PageKind::Idle),
            "huge" => Ok(PageKind::Huge),
            "incompressible" => Ok(PageKind::Incompressible),
            _ => Err(format!(
                "unknown page type '{s}': use idle, huge or incompressible"
            )),
        }
    }
}

impl std::fmt::Display for PageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PageKind::Idle => "idle",
            PageKind::Huge => "huge",
            PageKind::Incompressible => "incompressible",
        })
    }
}

/// What a page holds, as block status reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Never written, trimmed or zeroed into a hole: reads as zeros and costs nothing.
    Unwritten,
    /// Allocated, known to read as zeros (a same-filled page of zero words).
    Zero,
    /// Anything else (compressed, huge, same-filled nonzero, or written back).
    Data,
}

/// How the store is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Device size in bytes, a multiple of 4096.
    pub size: u64,
    /// The codec every page is first compressed with.
    pub algo: CodecSpec,
    /// Secondary codecs for `recompress`, in priority order (at most 3).
    pub recomp: Vec<CodecSpec>,
    /// Memory limit in bytes (0: none), zram's `mem_limit`.
    pub mem_limit: u64,
}

#[derive(Debug)]
struct Backing {
    file: File,
    slots: Mutex<SlotAlloc>,
}

#[derive(Debug, Default)]
struct SlotAlloc {
    next: u32,
    free: Vec<u32>,
}

impl Backing {
    /// `n` free page slots of the backing file.
    fn alloc_slots(&self, n: usize) -> Vec<u32> {
        let mut sl = lock(&self.slots);
        (0..n)
            .map(|_| match sl.free.pop() {
                Some(x) => x,
                None => {
                    let x = sl.next;
                    sl.next += 1;
                    x
                }
            })
            .collect()
    }

    fn free_slots(&self, slots: &[u32]) {
        lock(&self.slots).free.extend_from_slice(slots);
    }

    /// Writes page `i` of `data` to `slots[i]`, runs of consecutive slots in one call.
    fn write_slots(&self, slots: &[u32], data: &[u8]) -> std::io::Result<()> {
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1].wrapping_add(1) {
                j += 1;
            }
            self.file
                .write_all_at(&data[i * PAGE..j * PAGE], u64::from(slots[i]) * PAGE as u64)?;
            i = j;
        }
        Ok(())
    }
}

struct Ctx {
    comp: Compressor,
    decomp: Decompressor,
    buf: Vec<u8>,
    page: Vec<u8>,
}

thread_local! {
    /// Per-thread codec contexts and scratch buffers: after the first request of a thread the
    /// hot path allocates nothing.
    static CTX: RefCell<Ctx> = RefCell::new(Ctx {
        comp: Compressor::new(),
        decomp: Decompressor::new(),
        buf: Vec::with_capacity(2 * PAGE),
        page: vec![0u8; PAGE],
    });
}

fn with_ctx<R>(f: impl FnOnce(&mut Ctx) -> R) -> R {
    CTX.with(|c| match c.try_borrow_mut() {
        Ok(mut ctx) => f(&mut ctx),
        // Re-entrant use cannot happen (the store never calls itself while holding the
        // context); fall back to a fresh context rather than panic.
        Err(_) => f(&mut Ctx {
            comp: Compressor::new(),
            decomp: Decompressor::new(),
            buf: Vec::with_capacity(2 * PAGE),
            page: vec![0u8; PAGE],
        }),
    })
}

/// If the page is one 8-byte word repeated, that word (zram's `page_same_filled`).
pub fn same_filled(page: &[u8]) -> Option<u64> {
    let mut words = page.chunks_exact(8).map(|w| {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        u64::from_ne_bytes(a)
    });
    let first = words.next()?;
    words.all(|w| w == first).then_some(first)
}

fn fill_word(dst: &mut [u8], word: u64) {
    let b = word.to_ne_bytes();
    for chunk in dst.chunks_exact_mut(8) {
        chunk.copy_from_slice(&b);
    }
}

/// The compressed RAM device.
#[derive(Debug)]
pub struct PageStore {
    cfg: Config,
    pages: u64,
    /// Codec list: index 0 the primary, then the recompression codecs by priority.
    codecs: Vec<CodecSpec>,
    shards: Box<[Mutex<Table>]>,
    pool: Pool,
    c: Counters,
    backing: Option<Backing>,
    /// zstd dictionaries (`--dict`), if in use.
    dicts: Option<dict::Dicts>,
    /// The clock of page access times (`Table::atime`).
    epoch: Instant,
    /// The writeback budget, `writeback_batch_size` and what the memory policy did.
    wb: Mutex<policy::WbState>,
    policy: policy::PolicyCounters,
    /// `--policy`: how the background memory policy runs (None: off).
    policy_cfg: Option<PolicyConfig>,
    /// Raw slots held for writes acknowledged before compression (`early.rs`).
    spares: Mutex<Vec<crate::pool::ObjRef>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Shard data is only mutated by complete assignments, so a poisoned lock (a panic in
    // another thread) still guards a consistent table.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PageStore {
    /// Creates an empty device.
    pub fn new(cfg: Config) -> Result<PageStore, BlkError> {
        if cfg.size == 0 || cfg.size % PAGE as u64 != 0 {
            return Err(BlkError::BadSize(cfg.size));
        }
        if cfg.recomp.len() > MAX_RECOMP {
            return Err(BlkError::TooManyRecomp(cfg.recomp.len()));
        }
        let pages = cfg.size / PAGE as u64;
        if pages > u64::from(u32::MAX) * SHARDS as u64 {
            return Err(BlkError::BadSize(cfg.size));
        }
        let shards = (0..SHARDS as u64)
            .map(|s| {
                let n = pages / SHARDS as u64 + u64::from(s < pages % SHARDS as u64);
                Mutex::new(Table::new(n as usize))
            })
            .collect();
        let mut codecs = vec![cfg.algo];
        codecs.extend(cfg.recomp.iter().copied());
        Ok(PageStore {
            pool: Pool::new(cfg.mem_limit),
            cfg,
            pages,
            codecs,
            shards,
            c: Counters::default(),
            backing: None,
            dicts: None,
            epoch: Instant::now(),
            wb: Mutex::new(policy::WbState::default()),
            policy: policy::PolicyCounters::default(),
            policy_cfg: None,
            spares: Mutex::new(Vec::new()),
        })
    }

    /// Attaches a backing file for writeback (created if missing, truncated to empty).
    pub fn with_backing(mut self, path: &Path) -> Result<PageStore, BlkError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| BlkError::io(format!("cannot open backing file {}", path.display()), e))?;
        self.backing = Some(Backing {
            file,
            slots: Mutex::new(SlotAlloc::default()),
        });
        Ok(self)
    }

    pub fn size(&self) -> u64 {
        self.cfg.size
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Seconds since the store started: the clock of page access times.
    fn now(&self) -> u32 {
        u32::try_from(self.epoch.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    fn shard(&self, page: u64) -> (&Mutex<Table>, usize) {
        (
            &self.shards[(page % SHARDS as u64) as usize],
            (page / SHARDS as u64) as usize,
        )
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), BlkError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.cfg.size => Ok(()),
            _ => {
                add(&self.c.invalid_io, 1);
                Err(BlkError::OutOfRange {
                    offset,
                    len,
                    size: self.cfg.size,
                })
            }
        }
    }

    /// Counts a request refused before it reached the store (zram's `invalid_io`).
    pub fn count_invalid(&self) {
        add(&self.c.invalid_io, 1);
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlkError> {
        self.check_range(offset, buf.len() as u64)?;
        let r = self.for_pages(offset, buf.len(), |page, in_page, range| {
            let dst = &mut buf[range];
            if in_page == 0 && dst.len() == PAGE {
                self.read_page(page, dst)
            } else {
                with_ctx(|ctx| {
                    let mut tmp = std::mem::take(&mut ctx.page);
                    let r = self.read_page_ctx(ctx, page, &mut tmp);
                    if r.is_ok() {
                        dst.copy_from_slice(&tmp[in_page..in_page + dst.len()]);
                    }
                    ctx.page = tmp;
                    r
                })
            }
        });
        if r.is_err() {
            add(&self.c.failed_reads, 1);
        }
        r
    }

    /// Writes `data` at `offset`; partial pages are read, modified and written back.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), BlkError> {
        self.check_range(offset, data.len() as u64)?;
        let r = self.for_pages(offset, data.len(), |page, in_page, range| {
            self.write_page(page, in_page, &data[range])
        });
        if r.is_err() {
            add(&self.c.failed_writes, 1);
        }
        r
    }

    /// Frees the pages wholly inside the range (NBD TRIM, zram discard). Partial pages at the
    /// edges keep their data, as the kernel's discard does.
    pub fn trim(&self, offset: u64, len: u64) -> Result<(), BlkError> {
        self.check_range(offset, len)?;
        let first = offset.div_ceil(PAGE as u64);
        let end = (offset + len) / PAGE as u64;
        for page in first..end {
            let (shard, idx) = self.shard(page);
            let mut t = lock(shard);
            if t[idx] != Entry::Empty {
                self.free_entry(t[idx]);
                t[idx] = Entry::Empty;
                add(&self.c.notify_free, 1);
            }
        }
        Ok(())
    }

    /// Writes zeros: whole pages are freed (or, with `no_hole`, kept as allocated same-filled
    /// zero pages); partial pages get zeros by read-modify-write.
    pub fn write_zeroes(&self, offset: u64, len: u64, no_hole: bool) -> Result<(), BlkError> {
        self.check_range(offset, len)?;
        let zeros = [0u8; PAGE];
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let page = pos / PAGE as u64;
            let in_page = (pos % PAGE as u64) as usize;
            let n = ((PAGE - in_page) as u64).min(end - pos) as usize;
            if n == PAGE && !no_hole {
                let (shard, idx) = self.shard(page);
                let mut t = lock(shard);
                if t[idx] != Entry::Empty {
                    self.free_entry(t[idx]);
                    t[idx] = Entry::Empty;
                }
            } else if let Err(e) = self.write_page(page, in_page, &zeros[..n]) {
                add(&self.c.failed_writes, 1);
                return Err(e);
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// What page `page` holds (block status). Does not count as an access: the idle mark stays.
    /// A page past the end is reported unwritten (callers check the range first).
    pub fn page_state(&self, page: u64) -> PageState {
        if page >= self.pages {
            return PageState::Unwritten;
        }
        let (shard, idx) = self.shard(page);
        match lock(shard)[idx] {
            Entry::Empty => PageState::Unwritten,
            Entry::Same { word, .. } if word == [0u8; 8] => PageState::Zero,
            _ => PageState::Data,
        }
    }

    /// The state of page `page` and how many pages from it (at least 1, at most `max`) are
    /// known to share it. Pages `g * G .. (g + 1) * G` with `G = SHARDS * CHUNK_ENTRIES` (128 MiB)
    /// live in chunk `g` of every shard, so when no shard ever allocated that chunk the whole
    /// group is unwritten and one look at 64 shards answers for 32,768 pages; otherwise one page.
    pub fn page_run(&self, page: u64, max: u64) -> (PageState, u64) {
        const GROUP: u64 = (SHARDS * CHUNK_ENTRIES) as u64;
        let max = max.max(1);
        let group = page / GROUP;
        if page < self.pages
            && self
                .shards
                .iter()
                .all(|s| lock(s).chunk_unallocated(group as usize))
        {
            let end = ((group + 1) * GROUP).min(self.pages);
            return (PageState::Unwritten, (end - page).min(max));
        }
        (self.page_state(page), 1)
    }

    /// Calls `f(page, offset_in_page, range_in_buffer)` for each page the range covers.
    fn for_pages(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>) -> Result<(), BlkError>,
    ) -> Result<(), BlkError> {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let page = pos / PAGE as u64;
            let in_page = (pos % PAGE as u64) as usize;
            let n = (PAGE - in_page).min(len - done);
            f(page, in_page, done..done + n)?;
            done += n;
        }
        Ok(())
    }

    fn read_page(&self, page: u64, dst: &mut [u8]) -> Result<(), BlkError> {
        with_ctx(|ctx| self.read_page_ctx(ctx, page, dst))
    }

    /// Decodes page `page` into `dst` (exactly one page) and clears its idle mark.
    fn read_page_ctx(&self, ctx: &mut Ctx, page: u64, dst: &mut [u8]) -> Result<(), BlkError> {
        let (shard, idx) = self.shard(page);
        let mut t = lock(shard);
        let Some(e) = t.get_mut(idx) else {
            dst.fill(0);
            return Ok(());
        };
        if let Some(f) = e.flags_mut() {
            *f &= !FLAG_IDLE;
        }
        let e = *e;
        t.touch(idx, self.now());
        self.decode(ctx, page, e, dst)?;
        if self.policy_cfg.is_some() && policy::demoted(&e) {
            // The policy moved this page out of the fast path (secondary codec or backing
            // file) but it is in use again: store it with the primary codec.
            if let Ok(new) = self.encode(ctx, dst, 0) {
                t[idx] = new;
                self.free_entry(e);
                self.policy.count_promoted();
            }
        }
        Ok(())
    }

    fn decode(&self, ctx: &mut Ctx, page: u64, e: Entry, dst: &mut [u8]) -> Result<(), BlkError> {
        match e {
            Entry::Empty => {
                dst.fill(0);
                Ok(())
            }
            Entry::Same { word, .. } => {
                fill_word(dst, u64::from_ne_bytes(word));
                Ok(())
            }
            Entry::Obj {
                obj, len, codec, ..
            } => {
                if codec != RAW && dict_slot(codec) != 0 {
                    return self.decode_dict(ctx, page, obj, len, dict_slot(codec), dst);
                }
                let alg = if codec == RAW {
                    Algorithm::None
                } else {
                    match self.codecs.get(codec_index(codec)) {
                        Some(s) => s.algorithm(),
                        None => {
                            return Err(BlkError::Corrupt {
                                page,
                                detail: format!("unknown codec index {codec}"),
                            })
                        }
                    }
                };
                let r = self.pool.with(obj, len as usize, |src| {
                    ctx.decomp.decompress(alg, src, dst)
                });
                match r {
                    Some(Ok(())) => Ok(()),
                    Some(Err(e)) => Err(BlkError::Corrupt {
                        page,
                        detail: e.to_string(),
                    }),
                    None => Err(BlkError::Corrupt {
                        page,
                        detail: "dangling pool handle".into(),
                    }),
                }
            }
            Entry::Backed { slot, .. } => {
                let slot = u32::from_ne_bytes(slot);
                let b = self.backing.as_ref().ok_or(BlkError::NoBacking)?;
                b.file
                    .read_exact_at(dst, u64::from(slot) * PAGE as u64)
                    .map_err(BlkError::BackingIo)?;
                add(&self.c.bd_reads, 1);
                Ok(())
            }
        }
    }

    /// Decodes a page compressed with the dictionary in slot `slot`.
    fn decode_dict(
        &self,
        ctx: &mut Ctx,
        page: u64,
        obj: crate::pool::ObjRef,
        len: u16,
        slot: u8,
        dst: &mut [u8],
    ) -> Result<(), BlkError> {
        let corrupt = |detail: String| BlkError::Corrupt { page, detail };
        let d = self
            .dicts
            .as_ref()
            .and_then(|d| d.get(slot))
            .ok_or_else(|| corrupt(format!("no dictionary in slot {slot}")))?;
        match self.pool.with(obj, len as usize, |src| {
            ctx.decomp.decompress_dict(&d.dict, src, dst)
        }) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(corrupt(format!("dictionary version {}: {e}", d.version))),
            None => Err(corrupt("dangling pool handle".into())),
        }
    }

    /// Writes `data` at `in_page` within `page`, under the shard lock so concurrent partial
    /// writes to one page cannot lose each other's bytes.
    fn write_page(&self, page: u64, in_page: usize, data: &[u8]) -> Result<(), BlkError> {
        let (shard, idx) = self.shard(page);
        with_ctx(|ctx| {
            let mut t = lock(shard);
            let mut full = std::mem::take(&mut ctx.page);
            let r = (|| {
                let src: &[u8] = if in_page == 0 && data.len() == PAGE {
                    data
                } else {
                    self.decode(ctx, page, t[idx], &mut full)?;
                    full[in_page..in_page + data.len()].copy_from_slice(data);
                    &full
                };
                let new = self.encode(ctx, src, 0)?;
                let old = t[idx];
                t[idx] = new;
                t.touch(idx, self.now());
                self.free_entry(old);
                Ok(())
            })();
            ctx.page = full;
            r
        })
    }

    /// Stores one page with codec `codec` (index into the codec list) and returns its entry.
    fn encode(&self, ctx: &mut Ctx, src: &[u8], codec: usize) -> Result<Entry, BlkError> {
        if let Some(word) = same_filled(src) {
            add(&self.c.same_pages, 1);
            add(&self.c.pages_stored, 1);
            return Ok(Entry::Same {
                word: word.to_ne_bytes(),
                flags: 0,
            });
        }
        let spec = self.codecs[codec];
        let dict = match &self.dicts {
            Some(d) if codec == 0 => {
                d.offer(&mut ctx.comp, src);
                d.acquire_current()
            }
            _ => None,
        };
        let release = |slot: u8| {
            if let Some(d) = &self.dicts {
                d.release(slot);
            }
        };
        let len = match &dict {
            Some((slot, s)) => ctx
                .comp
                .compress_dict(&s.dict, src, &mut ctx.buf)
                .inspect_err(|_| release(*slot))?,
            None => ctx.comp.compress(spec, src, &mut ctx.buf)?,
        };
        let slot = dict.map_or(0, |(slot, _)| slot);
        let (bytes, codec, len) = if len > HUGE_THRESHOLD {
            if slot != 0 {
                release(slot);
            }
            (src, RAW, PAGE)
        } else {
            (&ctx.buf[..len], pack_codec(codec, slot), len)
        };
        let obj = self.pool.alloc(bytes).map_err(|e| {
            if codec != RAW && slot != 0 {
                release(slot);
            }
            match e {
                PoolError::Limit { limit } => BlkError::NoSpace { limit },
                e => BlkError::Pool(e),
            }
        })?;
        add(&self.c.pages_stored, 1);
        add(&self.c.compr_data_size, len as u64);
        if codec == RAW {
            add(&self.c.huge_pages, 1);
            add(&self.c.huge_pages_since, 1);
        }
        Ok(Entry::Obj {
            obj,
            len: len as u16,
            codec,
            flags: 0,
        })
    }

    /// Releases what an entry holds and takes it out of the statistics.
    fn free_entry(&self, e: Entry) {
        match e {
            Entry::Empty => {}
            Entry::Same { .. } => {
                sub(&self.c.same_pages, 1);
                sub(&self.c.pages_stored, 1);
            }
            Entry::Obj {
                obj, len, codec, ..
            } => {
                self.pool.free(obj);
                if codec != RAW && dict_slot(codec) != 0 {
                    if let Some(d) = &self.dicts {
                        d.release(dict_slot(codec));
                    }
                }
                sub(&self.c.pages_stored, 1);
                sub(&self.c.compr_data_size, u64::from(len));
                if codec == RAW {
                    sub(&self.c.huge_pages, 1);
                }
            }
            Entry::Backed { slot, .. } => {
                if let Some(b) = &self.backing {
                    lock(&b.slots).free.push(u32::from_ne_bytes(slot));
                }
                sub(&self.c.bd_count, 1);
            }
        }
    }

    /// Codec names, primary first.
    pub fn codecs(&self) -> &[CodecSpec] {
        &self.codecs
    }

    /// Pages in the device.
    pub fn pages(&self) -> u64 {
        self.pages
    }
}
