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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use compfs_codec::{Algorithm, CodecSpec, Compressor, Decompressor};

use crate::error::BlkError;
use crate::pool::{ObjRef, Pool, PoolError, HUGE_THRESHOLD, PAGE};

/// Number of table shards; a power of two well above the core count keeps collisions rare.
pub const SHARDS: usize = 64;
/// zram allows up to 3 secondary (recompression) algorithms.
pub const MAX_RECOMP: usize = 3;

const FLAG_IDLE: u8 = 1;
/// Recompression found nothing smaller: skip the page next time (zram's ZRAM_INCOMPRESSIBLE).
const FLAG_NO_RECOMP: u8 = 2;
/// Codec index of a raw (huge) page.
const RAW: u8 = u8::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Empty,
    Same {
        /// The repeated word as stored (native byte order); bytes rather than a u64 so the
        /// entry needs no 8-byte alignment.
        word: [u8; 8],
        flags: u8,
    },
    Obj {
        obj: ObjRef,
        len: u16,
        /// Index into the store's codec list (0 primary, 1..=3 recompression), or RAW.
        codec: u8,
        flags: u8,
    },
    Backed {
        /// Slot in the backing file, native byte order (bytes: no 4-byte alignment).
        slot: [u8; 4],
        flags: u8,
    },
}

impl Entry {
    fn flags_mut(&mut self) -> Option<&mut u8> {
        match self {
            Entry::Empty => None,
            Entry::Same { flags, .. } | Entry::Obj { flags, .. } | Entry::Backed { flags, .. } => {
                Some(flags)
            }
        }
    }
}

/// Entries per table chunk (512 × 10 bytes, see the size assertion below), allocated on the
/// first write into it.
const CHUNK_ENTRIES: usize = 512;

static EMPTY: Entry = Entry::Empty;

// One entry per stored page: keep it at 10 bytes (16 with an aligned u64 or ObjRef inside).
const _: () = assert!(std::mem::size_of::<Entry>() == 10);

/// One shard's page table. Chunks are allocated when a page in them is first stored, so a large
/// device that is mostly unwritten costs a pointer per 512 pages (zram allocates its whole
/// table at `disksize`).
#[derive(Debug)]
struct Table {
    chunks: Vec<Option<Box<[Entry]>>>,
    len: usize,
    allocated: usize,
}

impl Table {
    fn new(len: usize) -> Table {
        Table {
            chunks: (0..len.div_ceil(CHUNK_ENTRIES)).map(|_| None).collect(),
            len,
            allocated: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The entry, without allocating (None for a page in an unallocated chunk: it is Empty).
    fn get_mut(&mut self, idx: usize) -> Option<&mut Entry> {
        self.chunks
            .get_mut(idx / CHUNK_ENTRIES)?
            .as_mut()
            .map(|c| &mut c[idx % CHUNK_ENTRIES])
    }

    /// Every entry of the allocated chunks, with its index.
    fn entries_mut(&mut self) -> impl Iterator<Item = (usize, &mut Entry)> {
        self.chunks
            .iter_mut()
            .enumerate()
            .filter_map(|(ci, c)| c.as_mut().map(|c| (ci, c)))
            .flat_map(|(ci, c)| {
                c.iter_mut()
                    .enumerate()
                    .map(move |(i, e)| (ci * CHUNK_ENTRIES + i, e))
            })
    }

    fn bytes(&self) -> u64 {
        (self.allocated * CHUNK_ENTRIES * std::mem::size_of::<Entry>()
            + self.chunks.capacity() * std::mem::size_of::<Option<Box<[Entry]>>>()) as u64
    }
}

impl std::ops::Index<usize> for Table {
    type Output = Entry;
    fn index(&self, idx: usize) -> &Entry {
        match self.chunks.get(idx / CHUNK_ENTRIES) {
            Some(Some(c)) => &c[idx % CHUNK_ENTRIES],
            _ => &EMPTY,
        }
    }
}

impl std::ops::IndexMut<usize> for Table {
    /// Allocates the chunk if needed: only used to store an entry.
    fn index_mut(&mut self, idx: usize) -> &mut Entry {
        let slot = &mut self.chunks[idx / CHUNK_ENTRIES];
        if slot.is_none() {
            self.allocated += 1;
        }
        let c = slot.get_or_insert_with(|| vec![Entry::Empty; CHUNK_ENTRIES].into_boxed_slice());
        &mut c[idx % CHUNK_ENTRIES]
    }
}

/// Which pages `recompress` and `writeback` act on (zram's `type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    Idle,
    Huge,
}

impl std::str::FromStr for PageKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "idle" => Ok(PageKind::Idle),
            "huge" => Ok(PageKind::Huge),
            _ => Err(format!("unknown page type '{s}': use idle or huge")),
        }
    }
}

impl std::fmt::Display for PageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PageKind::Idle => "idle",
            PageKind::Huge => "huge",
        })
    }
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

/// zram's `mm_stat`, `io_stat` and `bd_stat` figures plus what the summary needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    pub mem_used_total: u64,
    pub mem_limit: u64,
    pub mem_used_max: u64,
    pub same_pages: u64,
    pub pages_compacted: u64,
    pub huge_pages: u64,
    pub huge_pages_since: u64,
    pub failed_reads: u64,
    pub failed_writes: u64,
    pub invalid_io: u64,
    pub notify_free: u64,
    pub bd_count: u64,
    pub bd_reads: u64,
    pub bd_writes: u64,
    /// Size of the page table (fixed by the disk size, like zram's table, not in mem_used_total).
    pub table_bytes: u64,
    /// Device size in bytes.
    pub disksize: u64,
}

impl Stats {
    /// The `mm_stat` line in zram's field order and widths.
    pub fn mm_stat(&self) -> String {
        format!(
            "{:8} {:8} {:8} {:8} {:8} {:8} {:8} {:8} {:8}",
            self.orig_data_size,
            self.compr_data_size,
            self.mem_used_total,
            self.mem_limit,
            self.mem_used_max,
            self.same_pages,
            self.pages_compacted,
            self.huge_pages,
            self.huge_pages_since
        )
    }

    /// The `io_stat` line in zram's field order.
    pub fn io_stat(&self) -> String {
        format!(
            "{:8} {:8} {:8} {:8}",
            self.failed_reads, self.failed_writes, self.invalid_io, self.notify_free
        )
    }

    /// The `bd_stat` line (pages) in zram's field order.
    pub fn bd_stat(&self) -> String {
        format!(
            "{:8} {:8} {:8}",
            self.bd_count, self.bd_reads, self.bd_writes
        )
    }

    /// Parses the three lines back (used by the control client and tests).
    pub fn parse(mm: &str, io: &str, bd: &str) -> Option<Stats> {
        let nums = |s: &str| -> Option<Vec<u64>> {
            s.split_whitespace().map(|w| w.parse().ok()).collect()
        };
        let (m, i, b) = (nums(mm)?, nums(io)?, nums(bd)?);
        if m.len() != 9 || i.len() != 4 || b.len() != 3 {
            return None;
        }
        Some(Stats {
            orig_data_size: m[0],
            compr_data_size: m[1],
            mem_used_total: m[2],
            mem_limit: m[3],
            mem_used_max: m[4],
            same_pages: m[5],
            pages_compacted: m[6],
            huge_pages: m[7],
            huge_pages_since: m[8],
            failed_reads: i[0],
            failed_writes: i[1],
            invalid_io: i[2],
            notify_free: i[3],
            bd_count: b[0],
            bd_reads: b[1],
            bd_writes: b[2],
            table_bytes: 0,
            disksize: 0,
        })
    }
}

#[derive(Debug, Default)]
struct Counters {
    pages_stored: AtomicU64,
    compr_data_size: AtomicU64,
    same_pages: AtomicU64,
    huge_pages: AtomicU64,
    huge_pages_since: AtomicU64,
    failed_reads: AtomicU64,
    failed_writes: AtomicU64,
    invalid_io: AtomicU64,
    notify_free: AtomicU64,
    bd_count: AtomicU64,
    bd_reads: AtomicU64,
    bd_writes: AtomicU64,
}

fn add(a: &AtomicU64, v: u64) {
    a.fetch_add(v, Ordering::Relaxed);
}
fn sub(a: &AtomicU64, v: u64) {
    a.fetch_sub(v, Ordering::Relaxed);
}
fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
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
        self.decode(ctx, page, e, dst)
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
                let alg = if codec == RAW {
                    Algorithm::None
                } else {
                    match self.codecs.get(codec as usize) {
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
        let len = ctx.comp.compress(spec, src, &mut ctx.buf)?;
        let (bytes, codec, len) = if len > HUGE_THRESHOLD {
            (src, RAW, PAGE)
        } else {
            (&ctx.buf[..len], codec as u8, len)
        };
        let obj = self.pool.alloc(bytes).map_err(|e| match e {
            PoolError::Limit { limit } => BlkError::NoSpace { limit },
            e => BlkError::Pool(e),
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

    /// Marks every stored page idle; reading or writing a page clears its mark (zram's
    /// `idle=all`).
    pub fn mark_idle(&self) -> u64 {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut t = lock(shard);
            for (_, e) in t.entries_mut() {
                if let Some(f) = e.flags_mut() {
                    *f |= FLAG_IDLE;
                    n += 1;
                }
            }
        }
        n
    }

    fn selected(kind: PageKind, e: &Entry) -> bool {
        match (kind, e) {
            (PageKind::Idle, Entry::Obj { flags, .. }) => flags & FLAG_IDLE != 0,
            (PageKind::Huge, Entry::Obj { codec, .. }) => *codec == RAW,
            _ => false,
        }
    }

    /// Decodes every page that `kind` selects and `keep` accepts and hands it to `f` with its
    /// shard's table locked: the walk `recompress` and `writeback` share.
    fn walk_selected(
        &self,
        kind: PageKind,
        keep: impl Fn(&Entry) -> bool,
        mut f: impl FnMut(&mut Ctx, &mut Table, usize, Entry, &[u8]) -> Result<(), BlkError>,
    ) -> Result<(), BlkError> {
        with_ctx(|ctx| {
            let mut page_buf = vec![0u8; PAGE];
            for (s, shard) in self.shards.iter().enumerate() {
                let mut t = lock(shard);
                for idx in 0..t.len() {
                    let e = t[idx];
                    if !Self::selected(kind, &e) || !keep(&e) {
                        continue;
                    }
                    let page = idx as u64 * SHARDS as u64 + s as u64;
                    self.decode(ctx, page, e, &mut page_buf)?;
                    f(ctx, &mut t, idx, e, &page_buf)?;
                }
            }
            Ok(())
        })
    }

    /// Re-compresses idle or huge pages with the secondary codecs in priority order, keeping a
    /// result only when it is smaller (zram's `recompress type=... threshold=...`). Pages whose
    /// compressed size is below `threshold` (if nonzero) are skipped. Returns pages changed.
    pub fn recompress(&self, kind: PageKind, threshold: u64) -> Result<u64, BlkError> {
        if self.codecs.len() < 2 {
            return Err(BlkError::NoRecomp);
        }
        let keep = |e: &Entry| match e {
            Entry::Obj { len, flags, .. } => {
                flags & FLAG_NO_RECOMP == 0 && (threshold == 0 || u64::from(*len) >= threshold)
            }
            _ => false,
        };
        let mut changed = 0;
        self.walk_selected(kind, keep, |ctx, t, idx, e, data| {
            let Entry::Obj {
                len, codec, flags, ..
            } = e
            else {
                return Ok(());
            };
            let first = if codec == RAW { 1 } else { codec as usize + 1 };
            for ci in first..self.codecs.len() {
                let n = ctx.comp.compress(self.codecs[ci], data, &mut ctx.buf)?;
                if n < len as usize && n <= HUGE_THRESHOLD {
                    let obj = match self.pool.alloc(&ctx.buf[..n]) {
                        Ok(o) => o,
                        // Out of memory for the new copy: leave the page as it is.
                        Err(PoolError::Limit { .. }) => return Ok(()),
                        Err(e) => return Err(BlkError::Pool(e)),
                    };
                    add(&self.c.pages_stored, 1);
                    add(&self.c.compr_data_size, n as u64);
                    self.free_entry(e);
                    t[idx] = Entry::Obj {
                        obj,
                        len: n as u16,
                        codec: ci as u8,
                        flags,
                    };
                    changed += 1;
                    return Ok(());
                }
            }
            if let Some(f) = t.get_mut(idx).and_then(Entry::flags_mut) {
                *f |= FLAG_NO_RECOMP;
            }
            Ok(())
        })?;
        Ok(changed)
    }

    /// Moves idle or huge pages to the backing file (zram's `writeback=idle|huge`); reads
    /// fetch them from there. Returns pages written.
    pub fn writeback(&self, kind: PageKind) -> Result<u64, BlkError> {
        let b = self.backing.as_ref().ok_or(BlkError::NoBacking)?;
        let mut written = 0;
        self.walk_selected(
            kind,
            |_| true,
            |_, t, idx, e, data| {
                let Entry::Obj { flags, .. } = e else {
                    return Ok(());
                };
                let slot = {
                    let mut sl = lock(&b.slots);
                    match sl.free.pop() {
                        Some(x) => x,
                        None => {
                            let x = sl.next;
                            sl.next += 1;
                            x
                        }
                    }
                };
                if let Err(err) = b.file.write_all_at(data, u64::from(slot) * PAGE as u64) {
                    lock(&b.slots).free.push(slot);
                    return Err(BlkError::BackingIo(err));
                }
                self.free_entry(e);
                t[idx] = Entry::Backed {
                    slot: slot.to_ne_bytes(),
                    flags: flags & !FLAG_IDLE,
                };
                add(&self.c.bd_count, 1);
                add(&self.c.bd_writes, 1);
                written += 1;
                Ok(())
            },
        )?;
        Ok(written)
    }

    /// Compacts the pool; returns pages freed.
    pub fn compact(&self) -> u64 {
        self.pool.compact()
    }

    /// Drops every page and resets the statistics (zram's `reset`).
    pub fn reset(&self) {
        for shard in self.shards.iter() {
            let mut t = lock(shard);
            for (_, e) in t.entries_mut() {
                self.free_entry(*e);
                *e = Entry::Empty;
            }
        }
        if let Some(b) = &self.backing {
            *lock(&b.slots) = SlotAlloc::default();
        }
        let c = &self.c;
        for a in [
            &c.huge_pages_since,
            &c.failed_reads,
            &c.failed_writes,
            &c.invalid_io,
            &c.notify_free,
            &c.bd_reads,
            &c.bd_writes,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        self.pool.compact();
        self.pool.reset_compacted();
        self.pool.reset_max();
    }

    /// The statistics now.
    pub fn stats(&self) -> Stats {
        let c = &self.c;
        Stats {
            orig_data_size: get(&c.pages_stored) * PAGE as u64,
            compr_data_size: get(&c.compr_data_size),
            mem_used_total: self.pool.used_bytes(),
            mem_limit: self.pool.limit(),
            mem_used_max: self.pool.max_bytes(),
            same_pages: get(&c.same_pages),
            pages_compacted: self.pool.pages_compacted(),
            huge_pages: get(&c.huge_pages),
            huge_pages_since: get(&c.huge_pages_since),
            failed_reads: get(&c.failed_reads),
            failed_writes: get(&c.failed_writes),
            invalid_io: get(&c.invalid_io),
            notify_free: get(&c.notify_free),
            bd_count: get(&c.bd_count),
            bd_reads: get(&c.bd_reads),
            bd_writes: get(&c.bd_writes),
            table_bytes: self.shards.iter().map(|s| lock(s).bytes()).sum(),
            disksize: self.cfg.size,
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
