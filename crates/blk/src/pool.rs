//! A size-class object pool in the manner of zsmalloc (mm/zsmalloc.c), which zram stores its
//! compressed pages in.
//!
//! Objects are grouped into classes every [`CLASS_STEP`] bytes up to the huge threshold
//! ([`HUGE_THRESHOLD`], zsmalloc's `huge_class_size` on current kernels); one more class holds raw
//! 4 KiB pages. Each class allocates "zspages": runs of 1 to [`MAX_ZSPAGE_PAGES`] pages (see
//! [`pages_per_zspage`]) cut into equal slots. Objects
//! are addressed through handles, so [`Pool::compact`] can move them from sparse zspages into
//! fuller ones and free the emptied zspages without the caller's table changing.
//!
//! Memory accounting is honest: [`Pool::used_bytes`] counts every zspage page plus the pool's
//! own bookkeeping (slot owners, handle maps, free lists), i.e. what the pool really holds.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The page size: the unit zram compresses and the unit of a zspage.
pub const PAGE: usize = 4096;
/// Granularity of the size classes (zsmalloc uses 16 bytes on 4 KiB pages with 4-page zspages;
/// 32 keeps the per-object rounding under 1% for typical 1-3 KiB objects).
pub const CLASS_STEP: usize = 32;
/// Objects larger than this are not worth compressing: the page is stored raw in the huge
/// class, as zram does from zsmalloc's `huge_class_size` on. That is the first size class whose
/// objects cannot share a zspage chain: with CONFIG_ZSMALLOC_CHAIN_SIZE=8 (the default since
/// Linux 6.3) objects above 8 * 4096 / 9 = 3640 bytes. 3616 is the largest 32-byte class below
/// it. (With "3/4 of a page", 3072, as older descriptions of zram put it, compfs
/// stored the Silesia tar at orig/compr 1.66 where this kernel's zram reaches 1.78 with lz4.)
pub const HUGE_THRESHOLD: usize = 3616;
/// Number of classes: the compressed ones plus the huge (raw page) class.
pub const NUM_CLASSES: usize = HUGE_THRESHOLD / CLASS_STEP + 1;
/// The class index that holds raw pages.
pub const HUGE_CLASS: usize = NUM_CLASSES - 1;
/// Longest zspage chain, zsmalloc's `CONFIG_ZSMALLOC_CHAIN_SIZE` maximum.
pub const MAX_ZSPAGE_PAGES: usize = 16;
/// Pages per zspage of the huge class. One slot is one page, so a freed slot's page goes back
/// to the kernel at once (`MADV_DONTNEED`) whatever the zspage's length; grouping raw pages
/// spares the per-zspage bookkeeping (about 80 bytes: the zspage record and its slot-owner
/// allocation) and one `mmap` per raw page that one-page zspages cost (170 KB and 2,169 `mmap`
/// calls for the 2,169 raw pages of the Silesia tar with lz4).
pub const HUGE_ZSPAGE_PAGES: usize = 16;

const FREE: u32 = u32::MAX;

/// Where an object lives: its class and its handle within the class. Packed (5 bytes, no
/// alignment) because one sits in every page-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed)]
pub struct ObjRef {
    pub class: u8,
    pub handle: u32,
}

/// The pool refused an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Allocating another zspage would exceed the memory limit.
    #[error("memory limit of {limit} bytes reached")]
    Limit { limit: u64 },
    /// The object is larger than a page.
    #[error("object of {0} bytes is larger than a page")]
    TooLarge(usize),
    /// The kernel refused to map memory for a new zspage.
    #[error("cannot map memory for a zspage")]
    Map,
    /// More objects than handles can address.
    #[error("object handle space exhausted")]
    Handles,
}

/// The class an object of `len` bytes goes to.
pub fn class_of(len: usize) -> usize {
    if len > HUGE_THRESHOLD {
        HUGE_CLASS
    } else {
        len.max(1).div_ceil(CLASS_STEP) - 1
    }
}

/// The slot size of a class.
pub fn class_size(class: usize) -> usize {
    if class >= HUGE_CLASS {
        PAGE
    } else {
        (class + 1) * CLASS_STEP
    }
}

/// Pages per zspage for a slot size: the count in 1..=16 that leaves the smallest fraction of a
/// full zspage as unusable tail (the fewest pages on ties). With zsmalloc's historical limit of
/// 4 pages the tail averages 4.3% for 1-3 KiB objects (up to 11%), which alone would break a 5%
/// overhead budget; newer kernels allow chains of up to 16 pages (CONFIG_ZSMALLOC_CHAIN_SIZE)
/// for the same reason. Long chains cost nothing while partly filled, since zspage memory
/// grows a page at a time.
pub fn pages_per_zspage(size: usize) -> usize {
    let waste_ppm = |k: usize| ((k * PAGE) % size) * 1_000_000 / (k * PAGE);
    (1..=MAX_ZSPAGE_PAGES)
        .min_by_key(|&k| (waste_ppm(k), k))
        .unwrap_or(1)
}

#[derive(Debug, Clone, Copy)]
struct Loc {
    zspage: u32,
    slot: u32,
}

/// A zspage's memory: the whole chain's address range mapped from the kernel at once
/// (`mmap`, anonymous, not backed by swap reservation), of which the first `len` bytes are in
/// use. Pages past `len` are never touched, so they cost no memory; growing is moving `len`.
///
/// Not taken from malloc: zspages grown a page at a time by `realloc` inside a glibc arena
/// left about 4% of the pool as resident holes and chunk headers that `malloc_trim` could not
/// return (2 MiB on the Silesia tar), all invisible to `mem_used_total`. Mapped pages are
/// exactly what the kernel holds for the pool, and `munmap` hands them back at once.
struct PageMem {
    ptr: std::ptr::NonNull<u8>,
    /// Mapped length (the whole chain).
    cap: usize,
    /// Bytes in use, a multiple of [`PAGE`] (or `cap`), at most `cap`.
    len: usize,
}

// SAFETY: PageMem exclusively owns its mapping, like a Vec<u8> owns its buffer; access goes
// through &self / &mut self only.
unsafe impl Send for PageMem {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for PageMem {}

impl PageMem {
    /// Maps `cap` bytes (a multiple of [`PAGE`]) of which none are in use yet.
    fn map(cap: usize) -> Result<PageMem, PoolError> {
        // SAFETY: a fresh anonymous private mapping at an address of the kernel's choosing;
        // no existing memory is affected. The result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(PoolError::Map);
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>()).ok_or(PoolError::Map)?;
        Ok(PageMem { ptr, cap, len: 0 })
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Bytes counted as used memory: the pages in use.
    fn capacity(&self) -> usize {
        self.len
    }

    /// Puts `by` more bytes in use (zero-filled: untouched anonymous pages read as zeros).
    fn resize_by(&mut self, by: usize) {
        self.len = (self.len + by).min(self.cap);
    }

    /// Hands the page at `offset` (a multiple of [`PAGE`], below `len`) back to the kernel;
    /// it reads as zeros afterwards and costs memory again only once written.
    fn discard_page(&mut self, offset: usize) {
        if offset % PAGE != 0 || offset + PAGE > self.len {
            return;
        }
        // SAFETY: the range is one whole page inside this mapping (checked above), which only
        // this PageMem uses; MADV_DONTNEED on a private anonymous mapping only zero-fills it.
        unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(offset).cast(),
                PAGE,
                libc::MADV_DONTNEED,
            );
        }
    }
}

impl Drop for PageMem {
    fn drop(&mut self) {
        // SAFETY: ptr/cap are exactly the mapping made in `map`, unmapped only here.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.cap);
        }
    }
}

impl std::ops::Deref for PageMem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the first `len` (≤ cap) bytes are mapped readable for self's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for PageMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, writable, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for PageMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageMem")
            .field("cap", &self.cap)
            .field("len", &self.len)
            .finish()
    }
}

#[derive(Debug)]
struct ZsPage {
    /// Brought into use a page at a time as slots are first used, so a partly filled zspage
    /// holds only the pages its slots reach (zsmalloc allocates the whole chain up front).
    mem: PageMem,
    /// Slot → handle owning it, or FREE.
    owners: Box<[u32]>,
    used: u32,
}

impl ZsPage {
    fn free_slot(&self) -> Option<usize> {
        self.owners.iter().position(|&o| o == FREE)
    }

    /// Bytes `mem` must grow by for `slot` of a class of `size`-byte slots in a zspage of
    /// `pages` pages.
    fn growth_for(&self, slot: usize, size: usize, pages: usize) -> usize {
        let need = (slot + 1) * size;
        if need <= self.mem.len() {
            0
        } else {
            need.next_multiple_of(PAGE).min(pages * PAGE) - self.mem.len()
        }
    }

    /// Grows `mem` by `by` bytes; returns the change in allocated capacity.
    fn grow(&mut self, by: usize) -> u64 {
        let before = self.mem.capacity();
        self.mem.resize_by(by);
        (self.mem.capacity() - before) as u64
    }
}

#[derive(Debug)]
struct Class {
    size: usize,
    pages: usize,
    objs: usize,
    zspages: Vec<Option<ZsPage>>,
    free_ids: Vec<u32>,
    /// zspages with at least one free slot.
    partial: BTreeSet<u32>,
    handles: Vec<Loc>,
    free_handles: Vec<u32>,
    live_zspages: usize,
    /// Allocated bytes of all zspages' memory.
    mem_bytes: u64,
    /// What `bytes()` returned after the last change, to update the pool total by the delta.
    accounted: u64,
}

/// Approximate heap cost of one BTreeSet element (node share of key + pointers).
const SET_ELEM_COST: u64 = 16;

impl Class {
    fn new(class: usize) -> Class {
        let size = class_size(class);
        let pages = if class >= HUGE_CLASS {
            HUGE_ZSPAGE_PAGES
        } else {
            pages_per_zspage(size)
        };
        Class {
            size,
            pages,
            objs: pages * PAGE / size,
            zspages: Vec::new(),
            free_ids: Vec::new(),
            partial: BTreeSet::new(),
            handles: Vec::new(),
            free_handles: Vec::new(),
            live_zspages: 0,
            mem_bytes: 0,
            accounted: 0,
        }
    }

    /// Bookkeeping of one zspage besides its memory and its record in `zspages` (counted
    /// with that vector's capacity): the slot-owner array as malloc holds it (8 bytes of chunk
    /// header, 16-byte granules, at least 32 bytes).
    fn zspage_meta(&self) -> u64 {
        (self.objs * 4 + 8).next_multiple_of(16).max(32) as u64
    }

    fn is_huge(&self) -> bool {
        self.size == PAGE
    }

    /// Memory a zspage holds: its pages in use, less (huge class) the pages of freed slots,
    /// which were handed back when freed.
    fn resident(&self, zp: &ZsPage) -> u64 {
        if self.is_huge() {
            u64::from(zp.used) * PAGE as u64
        } else {
            zp.mem.capacity() as u64
        }
    }

    /// New memory that putting an object into `slot` of `zp` takes: the pages past the
    /// zspage's length it reaches, or, in the huge class, its own page (a free huge slot's page
    /// is never resident).
    fn slot_cost(&self, zp: &ZsPage, slot: usize) -> (usize, u64) {
        let growth = zp.growth_for(slot, self.size, self.pages);
        let cost = if self.is_huge() {
            PAGE as u64
        } else {
            growth as u64
        };
        (growth, cost)
    }

    /// Frees `slot` of zspage `id` (its owner already cleared); in the huge class its page goes
    /// back to the kernel. Returns the bytes released.
    fn discard_slot(&mut self, id: u32, slot: usize) -> u64 {
        if !self.is_huge() {
            return 0;
        }
        if let Some(zp) = self.zspages.get_mut(id as usize).and_then(|z| z.as_mut()) {
            zp.mem.discard_page(slot * PAGE);
            self.mem_bytes -= PAGE as u64;
            return PAGE as u64;
        }
        0
    }

    /// Everything this class holds on the heap.
    fn bytes(&self) -> u64 {
        self.mem_bytes
            + self.live_zspages as u64 * self.zspage_meta()
            + (self.zspages.capacity() * std::mem::size_of::<Option<ZsPage>>()) as u64
            + (self.free_ids.capacity() * 4) as u64
            + self.partial.len() as u64 * SET_ELEM_COST
            + (self.handles.capacity() * std::mem::size_of::<Loc>()) as u64
            + (self.free_handles.capacity() * 4) as u64
    }

    fn slot_range(&self, slot: usize) -> std::ops::Range<usize> {
        slot * self.size..(slot + 1) * self.size
    }

    fn new_handle(&mut self, loc: Loc) -> Result<u32, PoolError> {
        if let Some(h) = self.free_handles.pop() {
            self.handles[h as usize] = loc;
            return Ok(h);
        }
        let h = u32::try_from(self.handles.len()).map_err(|_| PoolError::Handles)?;
        if h == FREE {
            return Err(PoolError::Handles);
        }
        self.handles.push(loc);
        Ok(h)
    }

    fn get(&self, handle: u32) -> Option<(&ZsPage, Loc)> {
        let loc = *self.handles.get(handle as usize)?;
        let zp = self.zspages.get(loc.zspage as usize)?.as_ref()?;
        (zp.owners.get(loc.slot as usize) == Some(&handle)).then_some((zp, loc))
    }

    /// Unmaps an empty zspage; returns the bytes released.
    fn release_zspage(&mut self, id: u32) -> u64 {
        let mut released = 0;
        if let Some(zp) = self.zspages[id as usize].take() {
            released = self.resident(&zp);
            self.mem_bytes -= released;
        }
        self.partial.remove(&id);
        self.free_ids.push(id);
        self.live_zspages -= 1;
        released
    }
}

/// The pool: one lock per class, so allocations of different sizes and all reads proceed in
/// parallel.
#[derive(Debug)]
pub struct Pool {
    classes: Box<[RwLock<Class>]>,
    used: AtomicU64,
    max: AtomicU64,
    limit: AtomicU64,
    compacted: AtomicU64,
}

fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    // A poisoned lock means a panic while holding it; the class data is still structurally
    // valid (every mutation is completed before any call that could panic), so carry on.
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// A pool that refuses to grow past `limit` bytes (0: no limit).
    pub fn new(limit: u64) -> Pool {
        Pool {
            classes: (0..NUM_CLASSES)
                .map(|c| RwLock::new(Class::new(c)))
                .collect(),
            used: AtomicU64::new(0),
            max: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
            compacted: AtomicU64::new(0),
        }
    }

    /// Bytes the pool holds: zspage pages plus bookkeeping.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The largest `used_bytes` seen since creation or the last reset of the maximum.
    pub fn max_bytes(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    pub fn reset_max(&self) {
        self.max.store(self.used_bytes(), Ordering::Relaxed);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Pages freed by compaction so far (zram's `pages_compacted`).
    pub fn pages_compacted(&self) -> u64 {
        self.compacted.load(Ordering::Relaxed)
    }

    pub fn reset_compacted(&self) {
        self.compacted.store(0, Ordering::Relaxed);
    }

    fn account(&self, c: &mut Class) {
        let now = c.bytes();
        if now >= c.accounted {
            let v = self.used.fetch_add(now - c.accounted, Ordering::Relaxed) + (now - c.accounted);
            self.max.fetch_max(v, Ordering::Relaxed);
        } else {
            self.used.fetch_sub(c.accounted - now, Ordering::Relaxed);
        }
        c.accounted = now;
    }

    /// Stores `data` and returns its reference.
    pub fn alloc(&self, data: &[u8]) -> Result<ObjRef, PoolError> {
        if data.len() > PAGE {
            return Err(PoolError::TooLarge(data.len()));
        }
        let class = class_of(data.len());
        let mut c = write_lock(&self.classes[class]);
        let (size, pages, objs) = (c.size, c.pages, c.objs);
        let existing = c.partial.first().copied();
        let (slot, growth, cost, meta) =
            match existing.and_then(|id| c.zspages[id as usize].as_ref()) {
                Some(zp) => match zp.free_slot() {
                    Some(slot) => {
                        let (growth, cost) = c.slot_cost(zp, slot);
                        (slot, growth, cost, 0)
                    }
                    // Unreachable by construction (ids in `partial` have a free slot); report
                    // rather than panic.
                    None => return Err(PoolError::Handles),
                },
                None => {
                    let growth = size.next_multiple_of(PAGE).min(pages * PAGE);
                    (0, growth, growth as u64, c.zspage_meta())
                }
            };
        let limit = self.limit();
        if limit != 0 && cost > 0 && self.used_bytes() + cost + meta > limit {
            return Err(PoolError::Limit { limit });
        }
        let id = match existing {
            Some(id) => id,
            None => {
                let zp = ZsPage {
                    mem: PageMem::map(pages * PAGE)?,
                    owners: vec![FREE; objs].into_boxed_slice(),
                    used: 0,
                };
                let id = match c.free_ids.pop() {
                    Some(id) => {
                        c.zspages[id as usize] = Some(zp);
                        id
                    }
                    None => {
                        let id = u32::try_from(c.zspages.len()).map_err(|_| PoolError::Handles)?;
                        c.zspages.push(Some(zp));
                        id
                    }
                };
                c.live_zspages += 1;
                c.partial.insert(id);
                id
            }
        };
        let handle = c.new_handle(Loc {
            zspage: id,
            slot: slot as u32,
        })?;
        let range = c.slot_range(slot);
        let huge = c.is_huge();
        let mut grown = 0;
        if let Some(zp) = c.zspages[id as usize].as_mut() {
            grown = zp.grow(growth);
            if huge {
                grown = PAGE as u64;
            }
            zp.mem[range.start..range.start + data.len()].copy_from_slice(data);
            zp.owners[slot] = handle;
            zp.used += 1;
            if zp.used as usize == objs {
                c.partial.remove(&id);
            }
        }
        c.mem_bytes += grown;
        self.account(&mut c);
        Ok(ObjRef {
            class: class as u8,
            handle,
        })
    }

    /// Runs `f` on the first `len` bytes of the object. `None` if the reference is dangling.
    pub fn with<R>(&self, obj: ObjRef, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let c = read_lock(self.classes.get(obj.class as usize)?);
        let (zp, loc) = c.get(obj.handle)?;
        if len > c.size {
            return None;
        }
        let start = loc.slot as usize * c.size;
        Some(f(zp.mem.get(start..start + len)?))
    }

    /// Overwrites the start of an existing object with `data` (at most its class's size);
    /// `false` if the reference is dangling or `data` does not fit. Used to fill a slot
    /// allocated ahead of need, so that storing into it cannot fail.
    pub fn fill(&self, obj: ObjRef, data: &[u8]) -> bool {
        let Some(lock) = self.classes.get(obj.class as usize) else {
            return false;
        };
        let mut c = write_lock(lock);
        let size = c.size;
        let Some((_, loc)) = c.get(obj.handle) else {
            return false;
        };
        if data.len() > size {
            return false;
        }
        let start = loc.slot as usize * size;
        match c.zspages[loc.zspage as usize].as_mut() {
            Some(zp) => match zp.mem.get_mut(start..start + data.len()) {
                Some(dst) => {
                    dst.copy_from_slice(data);
                    true
                }
                None => false,
            },
            None => false,
        }
    }

    /// Frees an object; freeing a dangling reference does nothing.
    pub fn free(&self, obj: ObjRef) {
        let Some(lock) = self.classes.get(obj.class as usize) else {
            return;
        };
        let mut c = write_lock(lock);
        let Some((_, loc)) = c.get(obj.handle) else {
            return;
        };
        let objs = c.objs;
        let mut empty = false;
        if let Some(zp) = c.zspages[loc.zspage as usize].as_mut() {
            zp.owners[loc.slot as usize] = FREE;
            zp.used -= 1;
            empty = zp.used == 0;
        }
        c.discard_slot(loc.zspage, loc.slot as usize);
        if empty {
            c.release_zspage(loc.zspage);
        } else if objs > 1 {
            c.partial.insert(loc.zspage);
        }
        if c.live_zspages == 0 {
            // No object is left, so no handle is outstanding: drop the bookkeeping too.
            c.zspages = Vec::new();
            c.free_ids = Vec::new();
            c.handles = Vec::new();
            c.free_handles = Vec::new();
            c.partial.clear();
        } else {
            c.free_handles.push(obj.handle);
        }
        self.account(&mut c);
    }

    /// Moves objects out of the sparsest zspages of every class into the fullest ones and frees
    /// the zspages that become empty. Returns the number of pages freed.
    pub fn compact(&self) -> u64 {
        let mut freed = 0u64;
        let mut tmp = vec![0u8; PAGE];
        for lock in self.classes.iter() {
            let mut c = write_lock(lock);
            if c.is_huge() {
                // One slot is one page and a free slot holds no memory: moving raw pages
                // between zspages would free nothing.
                continue;
            }
            let mut ids: Vec<(u32, u32)> = c
                .zspages
                .iter()
                .enumerate()
                .filter_map(|(i, z)| z.as_ref().map(|z| (z.used, i as u32)))
                .filter(|&(used, _)| (used as usize) < c.objs)
                .collect();
            ids.sort_unstable();
            // Two pointers: `lo` is the sparsest source, `hi` the fullest non-full destination.
            let (mut lo, mut hi) = (0usize, ids.len());
            while lo + 1 < hi {
                let src = ids[lo].1;
                let dst = ids[hi - 1].1;
                let (size, objs, pages) = (c.size, c.objs, c.pages);
                // Take one object from src.
                let Some(szp) = c.zspages[src as usize].as_ref() else {
                    lo += 1;
                    continue;
                };
                let Some(s_slot) = szp.owners.iter().position(|&o| o != FREE) else {
                    freed += c.release_zspage(src) / PAGE as u64;
                    lo += 1;
                    continue;
                };
                let handle = szp.owners[s_slot];
                tmp[..size].copy_from_slice(&szp.mem[s_slot * size..(s_slot + 1) * size]);
                let Some(dzp) = c.zspages[dst as usize].as_mut() else {
                    hi -= 1;
                    continue;
                };
                let Some(d_slot) = dzp.free_slot() else {
                    c.partial.remove(&dst);
                    hi -= 1;
                    continue;
                };
                let growth = dzp.growth_for(d_slot, size, pages);
                let grown = dzp.grow(growth);
                dzp.mem[d_slot * size..(d_slot + 1) * size].copy_from_slice(&tmp[..size]);
                dzp.owners[d_slot] = handle;
                dzp.used += 1;
                let dst_full = dzp.used as usize == objs;
                c.mem_bytes += grown;
                c.handles[handle as usize] = Loc {
                    zspage: dst,
                    slot: d_slot as u32,
                };
                let mut src_empty = false;
                if let Some(szp) = c.zspages[src as usize].as_mut() {
                    szp.owners[s_slot] = FREE;
                    szp.used -= 1;
                    src_empty = szp.used == 0;
                }
                if dst_full {
                    c.partial.remove(&dst);
                    hi -= 1;
                }
                if src_empty {
                    freed += c.release_zspage(src) / PAGE as u64;
                    lo += 1;
                }
            }
            // Shrink the bookkeeping vectors that the moves left oversized.
            while matches!(c.zspages.last(), Some(None)) {
                c.zspages.pop();
            }
            let n = c.zspages.len() as u32;
            c.free_ids.retain(|&id| id < n);
            c.free_ids.shrink_to_fit();
            c.zspages.shrink_to_fit();
            self.account(&mut c);
        }
        self.compacted.fetch_add(freed, Ordering::Relaxed);
        freed
    }

    /// Number of resident zspage pages (zspages grow a page at a time; free huge slots hold
    /// none), for tests and the summary.
    pub fn pool_pages(&self) -> u64 {
        self.classes
            .iter()
            .map(|l| read_lock(l).mem_bytes / PAGE as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(32), 0);
        assert_eq!(class_of(33), 1);
        assert_eq!(class_of(HUGE_THRESHOLD), HUGE_CLASS - 1);
        assert_eq!(class_of(HUGE_THRESHOLD + 1), HUGE_CLASS);
        assert_eq!(class_size(HUGE_CLASS), PAGE);
        for c in 0..NUM_CLASSES {
            let s = class_size(c);
            let k = pages_per_zspage(s);
            assert!((1..=MAX_ZSPAGE_PAGES).contains(&k));
            // Tail waste stays under one slot and under 1/8 of the zspage for every class.
            let waste = (k * PAGE) % s;
            assert!(
                waste * 8 <= k * PAGE,
                "class {c} size {s} k {k} waste {waste}"
            );
        }
    }

    #[test]
    fn alloc_read_free_compact() {
        let pool = Pool::new(0);
        let mut refs = Vec::new();
        for i in 0..200u32 {
            let data: Vec<u8> = (0..1000 + i as usize)
                .map(|b| (b as u32 ^ i) as u8)
                .collect();
            refs.push((pool.alloc(&data).unwrap(), data));
        }
        for (r, d) in &refs {
            assert_eq!(pool.with(*r, d.len(), |s| s.to_vec()).unwrap(), *d);
        }
        let before = pool.pool_pages();
        // Free every other object: half the memory is now fragmentation.
        for (i, (r, _)) in refs.iter().enumerate() {
            if i % 2 == 0 {
                pool.free(*r);
            }
        }
        let freed = pool.compact();
        assert!(freed > 0);
        assert_eq!(pool.pages_compacted(), freed);
        assert!(pool.pool_pages() < before);
        for (i, (r, d)) in refs.iter().enumerate() {
            if i % 2 == 1 {
                assert_eq!(pool.with(*r, d.len(), |s| s.to_vec()).unwrap(), *d);
            } else {
                assert!(pool.with(*r, d.len(), |_| ()).is_none());
            }
        }
        for (i, (r, _)) in refs.iter().enumerate() {
            if i % 2 == 1 {
                pool.free(*r);
            }
        }
        assert_eq!(pool.pool_pages(), 0);
        pool.compact();
    }

    #[test]
    fn huge_slots_hand_their_page_back() {
        let pool = Pool::new(0);
        let pages: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; PAGE]).collect();
        let mut refs: Vec<ObjRef> = pages.iter().map(|p| pool.alloc(p).unwrap()).collect();
        assert!(refs.iter().all(|r| r.class as usize == HUGE_CLASS));
        // 40 raw pages in three 16-page zspages: 40 pages of memory, not 48.
        assert_eq!(pool.pool_pages(), 40);
        let used_full = pool.used_bytes();
        for r in &refs[5..15] {
            pool.free(*r);
        }
        assert_eq!(pool.pool_pages(), 30);
        // Ten pages fewer, less the free-handle list that grew meanwhile.
        let fell = used_full - pool.used_bytes();
        assert!(
            fell <= 10 * PAGE as u64 && fell > 10 * PAGE as u64 - 256,
            "{fell}"
        );
        // Compaction has nothing to gain in the huge class.
        assert_eq!(pool.compact(), 0);
        // The freed slots are used again and read back what was written, not stale data.
        for (i, r) in refs.iter_mut().enumerate().take(15).skip(5) {
            *r = pool.alloc(&pages[39 - i]).unwrap();
        }
        assert_eq!(pool.pool_pages(), 40);
        for (i, r) in refs.iter().enumerate() {
            let want = if (5..15).contains(&i) {
                &pages[39 - i]
            } else {
                &pages[i]
            };
            assert_eq!(pool.with(*r, PAGE, |s| s == &want[..]), Some(true), "{i}");
        }
        for r in &refs {
            pool.free(*r);
        }
        assert_eq!(pool.pool_pages(), 0);
        assert_eq!(pool.used_bytes(), 0);
    }

    proptest::proptest! {
        /// Random allocations (compressed sizes and raw pages), frees and compactions against a
        /// map of what each live reference holds.
        #[test]
        fn pool_matches_model(ops in proptest::collection::vec((0u8..4, 1usize..=PAGE, proptest::prelude::any::<u16>()), 1..300)) {
            let pool = Pool::new(0);
            let mut live: Vec<(ObjRef, Vec<u8>)> = Vec::new();
            for (i, (op, len, pick)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => {
                        let len = if op == 1 { PAGE } else { len };
                        let data: Vec<u8> = (0..len).map(|b| (b ^ i) as u8).collect();
                        let r = pool.alloc(&data).unwrap();
                        live.push((r, data));
                    }
                    2 if !live.is_empty() => {
                        let (r, _) = live.swap_remove(pick as usize % live.len());
                        pool.free(r);
                    }
                    _ => {
                        pool.compact();
                    }
                }
                proptest::prop_assert!(pool.pool_pages() * PAGE as u64 <= pool.used_bytes());
            }
            for (r, d) in &live {
                proptest::prop_assert_eq!(pool.with(*r, d.len(), |s| s == &d[..]), Some(true));
            }
            for (r, _) in &live {
                pool.free(*r);
            }
            proptest::prop_assert_eq!(pool.pool_pages(), 0);
            proptest::prop_assert_eq!(pool.used_bytes(), 0);
        }
    }

    #[test]
    fn fill_overwrites_an_object_in_place() {
        let pool = Pool::new(0);
        let raw = pool.alloc(&[1u8; PAGE]).unwrap();
        let small = pool.alloc(&[2u8; 100]).unwrap();
        let used = pool.used_bytes();
        assert!(pool.fill(raw, &[9u8; PAGE]));
        assert_eq!(
            pool.with(raw, PAGE, |b| b.to_vec()).unwrap(),
            vec![9u8; PAGE]
        );
        assert_eq!(
            pool.with(small, 100, |b| b.to_vec()).unwrap(),
            vec![2u8; 100]
        );
        assert!(!pool.fill(small, &[3u8; PAGE]), "larger than its class");
        assert_eq!(pool.used_bytes(), used, "no allocation");
        pool.free(raw);
        assert!(!pool.fill(raw, &[9u8; PAGE]), "dangling");
    }

    #[test]
    fn limit_refuses_growth() {
        let pool = Pool::new(64 * 1024);
        let page = vec![7u8; PAGE];
        let mut n = 0;
        loop {
            match pool.alloc(&page) {
                Ok(_) => n += 1,
                Err(PoolError::Limit { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(n > 10 && n < 16, "{n}");
        assert!(pool.used_bytes() <= 64 * 1024);
        assert!(pool.alloc(&[1u8; PAGE + 1]).is_err());
    }
}
