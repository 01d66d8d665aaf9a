//! The local cache of segment data in `cache_dir/cache/`: blocks of [`BLOCK`] bytes of chunks
//! (the last block of a chunk shorter), one file each, least recently used out once their
//! total passes the bound. The bookkeeping ([`LruIndex`]) is pure and tested alone.
//!
//! Files are written with O_DIRECT (`write_block`): a block goes from the GET's buffer to
//! the disk without a copy into the page cache, which on a cold sequential read cost the
//! daemon as much CPU as a tenth of the read's time. The block itself stays in memory
//! ([`Fresh`]) until it has been read to its end, so the reader that asked for it (or the
//! readahead that fetched it for that reader) does not read it back from the disk.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

use super::fresh::{self, Fresh};
use super::readahead;

/// Bytes of one cache block (and of one ranged GET): reading one extent fetches the block
/// around it, the next extents of the file usually come with it (sequential readahead).
pub const BLOCK: u64 = 1 << 20;

/// A cached block: segment, chunk start, block index in the chunk.
pub type Key = (u64, u64, u64);

/// Least-recently-used bookkeeping of sized entries under a byte bound.
#[derive(Debug, Default)]
pub struct LruIndex {
    entries: HashMap<Key, (u64, u64)>,
    order: BTreeMap<u64, Key>,
    tick: u64,
    total: u64,
    cap: u64,
}

impl LruIndex {
    pub fn new(cap: u64) -> LruIndex {
        LruIndex {
            cap,
            ..LruIndex::default()
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Whether `k` is present (without marking it used).
    pub fn contains(&self, k: Key) -> bool {
        self.entries.contains_key(&k)
    }

    /// Marks `k` used; whether it is present.
    pub fn touch(&mut self, k: Key) -> bool {
        let Some((t, _)) = self.entries.get(&k).copied() else {
            return false;
        };
        self.order.remove(&t);
        self.tick += 1;
        self.order.insert(self.tick, k);
        if let Some(e) = self.entries.get_mut(&k) {
            e.0 = self.tick;
        }
        true
    }

    /// Adds (or refreshes) `k` of `size` bytes; returns the entries evicted to stay in bounds
    /// (`k` itself when it alone exceeds the bound).
    pub fn insert(&mut self, k: Key, size: u64) -> Vec<Key> {
        self.remove(k);
        self.tick += 1;
        self.entries.insert(k, (self.tick, size));
        self.order.insert(self.tick, k);
        self.total += size;
        let mut out = Vec::new();
        while self.total > self.cap {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, s)) = self.entries.remove(&victim) {
                self.total -= s;
            }
            out.push(victim);
        }
        out
    }

    pub fn remove(&mut self, k: Key) -> bool {
        match self.entries.remove(&k) {
            Some((t, s)) => {
                self.order.remove(&t);
                self.total -= s;
                true
            }
            None => false,
        }
    }

    /// Removes every entry of segment `seg`; returns them.
    pub fn remove_segment(&mut self, seg: u64) -> Vec<Key> {
        let ks: Vec<Key> = self
            .entries
            .keys()
            .filter(|k| k.0 == seg)
            .copied()
            .collect();
        for k in &ks {
            self.remove(*k);
        }
        ks
    }
}

fn file_name(k: Key) -> String {
    format!("{:016x}-{:016x}-{:08x}", k.0, k.1, k.2)
}

fn parse_name(n: &str) -> Option<Key> {
    let mut it = n.split('-');
    let a = it.next().filter(|s| s.len() == 16)?;
    let b = it.next().filter(|s| s.len() == 16)?;
    let c = it.next().filter(|s| s.len() == 8)?;
    if it.next().is_some() {
        return None;
    }
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
        u64::from_str_radix(c, 16).ok()?,
    ))
}

/// The block cache of one store.
pub struct BlockCache {
    dir: PathBuf,
    index: Mutex<LruIndex>,
    fresh: Mutex<Fresh>,
}

impl BlockCache {
    /// Opens the cache in `dir` (created if missing) with a bound of `cap` bytes; blocks left
    /// by an earlier mount are kept (oldest first out), stray files removed.
    pub fn open(dir: &Path, cap: u64) -> io::Result<BlockCache> {
        std::fs::create_dir_all(dir)?;
        let mut found = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name();
            match name.to_str().and_then(parse_name) {
                Some(k) => {
                    let m = e.metadata()?;
                    found.push((m.modified().ok(), k, m.len()));
                }
                None => {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        found.sort();
        let c = BlockCache {
            dir: dir.to_path_buf(),
            index: Mutex::new(LruIndex::new(cap)),
            fresh: Mutex::new(Fresh::new(fresh::capacity(readahead::window(cap, BLOCK)))),
        };
        for (_, k, len) in found {
            let out = c.lock().insert(k, len);
            c.unlink(&out);
        }
        Ok(c)
    }

    fn lock(&self) -> MutexGuard<'_, LruIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fresh(&self) -> MutexGuard<'_, Fresh> {
        self.fresh.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes the files of `keys` (evicted) and their copies in memory.
    fn unlink(&self, keys: &[Key]) {
        for k in keys {
            self.fresh().remove(*k);
            let _ = std::fs::remove_file(self.dir.join(file_name(*k)));
        }
    }

    /// Bytes cached now.
    pub fn bytes(&self) -> u64 {
        self.lock().total()
    }

    /// The bound, in bytes.
    pub fn cap(&self) -> u64 {
        self.lock().cap()
    }

    /// Whether block `k` is cached (without marking it used).
    pub fn contains(&self, k: Key) -> bool {
        self.fresh().contains(k) || self.lock().contains(k)
    }

    /// Bytes of blocks held in memory now (see [`Fresh`]).
    pub fn memory_bytes(&self) -> u64 {
        self.fresh().bytes()
    }

    /// Reads `buf.len()` bytes at `off` of block `k` if it is cached.
    pub fn read(&self, k: Key, off: u64, buf: &mut [u8]) -> bool {
        let held = self.fresh().get(k);
        if let Some(d) = held {
            let (from, to) = (off as usize, off as usize + buf.len());
            if let Some(src) = d.get(from..to) {
                buf.copy_from_slice(src);
                if to == d.len() {
                    // Read to its end: a sequential reader is done with it.
                    self.fresh().remove(k);
                }
                self.lock().touch(k);
                return true;
            }
        }
        if !self.lock().touch(k) {
            return false;
        }
        let ok = std::fs::File::open(self.dir.join(file_name(k)))
            .and_then(|f| f.read_exact_at(buf, off))
            .is_ok();
        if !ok {
            // Evicted meanwhile, or damaged: forget it, the caller fetches the block.
            self.lock().remove(k);
        }
        ok
    }

    /// Stores block `k`: in memory until read to its end, and in its file (written to a
    /// temporary name and renamed, so a reader never sees part of it). A failure to write the
    /// file only costs a later fetch.
    pub fn put(&self, k: Key, data: Bytes) {
        let tmp = self.dir.join(format!(
            "tmp.{}.{:?}",
            file_name(k),
            std::thread::current().id()
        ));
        let len = data.len() as u64;
        let ok = write_block(&tmp, &data)
            .and_then(|_| std::fs::rename(&tmp, self.dir.join(file_name(k))))
            .is_ok();
        self.fresh().insert(k, data);
        if !ok {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        let out = self.lock().insert(k, len);
        self.unlink(&out);
    }

    /// Drops every block of segment `seg` (deleted by GC).
    pub fn drop_segment(&self, seg: u64) {
        self.fresh().remove_segment(seg);
        let out = self.lock().remove_segment(seg);
        self.unlink(&out);
    }
}

/// Alignment of an O_DIRECT write's buffer, offset and length: a page, which covers the
/// logical block size of the disks this runs on (512 B or 4 KiB).
const DIRECT_ALIGN: usize = 4096;

/// `len` rounded up to a multiple of `align` (a power of two).
fn padded_len(len: usize, align: usize) -> usize {
    len.div_ceil(align) * align
}

/// Writes `data` as the new file `path`, with O_DIRECT where the file system takes it (not
/// tmpfs before Linux 6.6, some FUSE and network file systems: EINVAL), else buffered.
fn write_block(path: &Path, data: &[u8]) -> io::Result<()> {
    match write_direct(path, data) {
        // EINVAL from the kernel, or no aligned buffer: both map to InvalidInput.
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => std::fs::write(path, data),
        r => r,
    }
}

/// The O_DIRECT write of [`write_block`]: the bytes padded to [`DIRECT_ALIGN`] in an aligned
/// buffer, then the file cut back to `data`'s length.
fn write_direct(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    thread_local! {
        // One buffer per thread (the readahead workers, the readers), kept: a block's worth of
        // memory allocated and freed per write made the allocator's arenas grow.
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let len = padded_len(data.len(), DIRECT_ALIGN);
    BUF.with_borrow_mut(|raw| {
        if raw.len() < len + DIRECT_ALIGN {
            raw.resize(len + DIRECT_ALIGN, 0);
        }
        let skew = raw.as_ptr().align_offset(DIRECT_ALIGN);
        let buf = raw
            .get_mut(skew..skew + len)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        buf[..data.len()].copy_from_slice(data);
        // The padding: zeros, not an earlier block's bytes (cut off below, but written).
        buf[data.len()..].fill(0);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        f.write_all_at(buf, 0)?;
        if len != data.len() {
            f.set_len(data.len() as u64)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lru_evicts_least_recently_used_first_and_keeps_the_bound() {
        let mut l = LruIndex::new(100);
        assert!(l.insert((1, 0, 0), 40).is_empty());
        assert!(l.insert((1, 0, 1), 40).is_empty());
        assert!(l.touch((1, 0, 0)));
        assert_eq!(l.insert((2, 0, 0), 40), vec![(1, 0, 1)]);
        assert_eq!(l.total(), 80);
        // An entry larger than the bound does not stay.
        let out = l.insert((3, 0, 0), 200);
        assert!(out.contains(&(3, 0, 0)));
        assert_eq!(l.total(), 0, "everything older went out first");
        l.insert((2, 0, 1), 10);
        l.insert((2, 0, 2), 10);
        l.insert((4, 0, 0), 10);
        assert_eq!(l.remove_segment(2).len(), 2);
        assert_eq!(l.total(), 10);
        assert!(!l.touch((2, 0, 0)));
    }

    #[test]
    fn cache_files_stay_within_the_bound_and_survive_reopen() {
        let t = tempfile::tempdir().unwrap();
        let c = BlockCache::open(t.path(), 3000).unwrap();
        for i in 0..10u64 {
            c.put((1, 0, i), Bytes::from(vec![i as u8; 1000]));
        }
        assert!(c.bytes() <= 3000);
        let on_disk: u64 = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(on_disk, c.bytes());
        let mut b = [0u8; 10];
        assert!(c.read((1, 0, 9), 5, &mut b));
        assert_eq!(b, [9; 10]);
        assert!(!c.read((1, 0, 0), 0, &mut b));
        std::fs::write(t.path().join("junk"), b"x").unwrap();
        drop(c);
        let c = BlockCache::open(t.path(), 2000).unwrap();
        assert!(c.bytes() <= 2000);
        assert!(!t.path().join("junk").exists());
        c.drop_segment(1);
        assert_eq!(c.bytes(), 0);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }

    #[test]
    fn lengths_pad_to_the_alignment() {
        assert_eq!(padded_len(0, 4096), 0);
        assert_eq!(padded_len(1, 4096), 4096);
        assert_eq!(padded_len(4096, 4096), 4096);
        assert_eq!(padded_len(1 << 20, 4096), 1 << 20);
        assert_eq!(padded_len((1 << 20) + 1, 4096), (1 << 20) + 4096);
    }

    #[test]
    fn blocks_of_any_length_are_written_whole_with_or_without_o_direct() {
        // The temporary directory (a disk file system here: O_DIRECT) and tmpfs (which may
        // refuse it).
        for base in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
            let Ok(t) = tempfile::tempdir_in(&base) else {
                continue;
            };
            for len in [0usize, 1, 4095, 4096, 4097, 300_000, 1 << 20] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                let p = t.path().join(format!("b{len}"));
                write_block(&p, &data).unwrap();
                assert_eq!(std::fs::read(&p).unwrap(), data, "{} {len}", base.display());
            }
        }
    }

    #[test]
    fn a_block_read_to_its_end_leaves_memory_and_is_read_from_its_file() {
        let t = tempfile::tempdir().unwrap();
        let c = BlockCache::open(t.path(), 1 << 30).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        c.put((1, 0, 0), Bytes::from(data.clone()));
        assert_eq!(c.memory_bytes(), 10_000);
        let mut b = vec![0u8; 4000];
        assert!(c.read((1, 0, 0), 0, &mut b));
        assert_eq!(b, data[..4000]);
        assert_eq!(c.memory_bytes(), 10_000, "not read to its end yet");
        let mut b = vec![0u8; 6000];
        assert!(c.read((1, 0, 0), 4000, &mut b));
        assert_eq!(b, data[4000..]);
        assert_eq!(c.memory_bytes(), 0, "read to its end");
        assert!(c.contains((1, 0, 0)));
        let mut b = vec![0u8; 100];
        assert!(c.read((1, 0, 0), 9_900, &mut b), "from the file now");
        assert_eq!(b, data[9_900..]);
        // A read past the end is a miss, not a short copy.
        assert!(!c.read((1, 0, 0), 9_950, &mut b));
        c.put((2, 0, 0), Bytes::from(vec![5u8; 100]));
        c.drop_segment(2);
        assert!(!c.contains((2, 0, 0)));
        assert_eq!(c.memory_bytes(), 0);
    }
}
