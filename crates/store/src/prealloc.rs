//! Preallocation (`fallocate`): reserved file ranges and the host space that backs them.
//!
//! A reserved range is a hole of a file that a later write is promised room for. The ranges
//! live in the `prealloc` table (key: inode and start, value: [`PreallocRec`]), disjoint from
//! the file's data (extent map and inline data): the first write into a range that lands as an
//! extent (or inline data) removes what it covers from the table. They count in `st_blocks`.
//!
//! The space behind them is held on the filesystem under the store by one file,
//! [`RESERVE_FILE`], allocated (host `fallocate`) to [`host_bytes`] of the reserved total: so
//! the host's `statfs` (and so compfs's) shows the space as used, an allocation that does not
//! fit fails with ENOSPC, and nothing else written to the store can take the space. Before a
//! flush appends extents over reserved ranges, the reserve file gives back what they covered,
//! under a lock held until the append is done (so no other append of this store slips in);
//! what compression saved stays free. Other releases (punch, truncate, unlink) shrink the file
//! after their commit. The table is the record; the file is resized to it at every open.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use redb::{ReadTransaction, ReadableTable, TableError};

use crate::error::{Error, Result};
use crate::meta::{self, dec, W};
use crate::records::{PreallocRec, EXT_HEADER_LEN};
use crate::store::{lock, Inner};
use crate::types::Ino;

/// The file in the store directory that holds the host space of the reservations.
pub const RESERVE_FILE: &str = "prealloc.reserve";

/// Granularity of a preallocation (ext4's block size): requests are widened to whole pages.
pub(crate) const PAGE: u64 = 4096;

/// Host bytes held for `reserved` bytes of ranges: the bytes themselves plus one extent header
/// per 4 KiB (the most headers the writes of those bytes can need when written in pages).
pub(crate) fn host_bytes(reserved: u64) -> u64 {
    reserved.saturating_add(
        reserved
            .div_ceil(PAGE)
            .saturating_mul(EXT_HEADER_LEN as u64),
    )
}

/// `[start, end)` widened to whole pages, capped at `max`.
pub(crate) fn widen(start: u64, end: u64, max: u64) -> (u64, u64) {
    let s = start - start % PAGE;
    let e = end.div_ceil(PAGE).saturating_mul(PAGE).min(max);
    (s, e.max(s))
}

/// The whole pages inside `[start, end)`.
pub(crate) fn narrow(start: u64, end: u64) -> (u64, u64) {
    let s = start.div_ceil(PAGE).saturating_mul(PAGE);
    let e = end - end % PAGE;
    (s, e.max(s))
}

/// The parts of `[start, end)` that no range of `covered` (sorted, disjoint) covers.
pub(crate) fn gaps(covered: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = start;
    for &(a, b) in covered {
        if b <= at {
            continue;
        }
        if a >= end {
            break;
        }
        if a > at {
            out.push((at, a.min(end)));
        }
        at = at.max(b);
        if at >= end {
            break;
        }
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// Merges `b` (sorted, disjoint) into `a` (sorted, disjoint): the sorted union, adjacent
/// ranges joined.
pub(crate) fn union(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (s, e) in all {
        match out.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Bytes of `ranges` (sorted, disjoint) inside `[start, end)`.
pub(crate) fn overlap(ranges: &[(u64, u64)], start: u64, end: u64) -> u64 {
    ranges
        .iter()
        .map(|&(a, b)| b.min(end).saturating_sub(a.max(start)))
        .sum()
}

/// The reserved ranges of `ino` that overlap `[start, end)`, in order: the one starting
/// before `start` (at most one, the ranges being disjoint) and those starting inside. Two
/// range lookups, however many ranges the file has (random writes into one large
/// `fallocate`d file split it into thousands).
fn overlapping_in<T>(t: &T, ino: Ino, start: u64, end: u64) -> Result<Vec<(u64, u64)>>
where
    T: ReadableTable<(u64, u64), &'static [u8]>,
{
    let mut out = Vec::new();
    if start >= end {
        return Ok(out);
    }
    if let Some(r) = t.range((ino, 0)..(ino, start))?.next_back() {
        let (k, v) = r?;
        let s = k.value().1;
        let e = s + dec(PreallocRec::decode(s, v.value()))?.len;
        if e > start {
            out.push((s, e));
        }
    }
    for r in t.range((ino, start)..(ino, end))? {
        let (k, v) = r?;
        let s = k.value().1;
        out.push((s, s + dec(PreallocRec::decode(s, v.value()))?.len));
    }
    Ok(out)
}

/// The reserved ranges of `ino` in a read transaction (none in a store whose metadata has no
/// `prealloc` table yet).
pub(crate) fn ranges_in(txn: &ReadTransaction, ino: Ino) -> Result<Vec<(u64, u64)>> {
    let t = match txn.open_table(meta::PREALLOC) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for r in t.range((ino, 0)..=(ino, u64::MAX))? {
        let (k, v) = r?;
        let s = k.value().1;
        let p = dec(PreallocRec::decode(s, v.value()))?;
        out.push((s, s + p.len));
    }
    Ok(out)
}

/// Total reserved bytes of every file.
pub(crate) fn total_in(txn: &ReadTransaction) -> Result<u64> {
    let t = match txn.open_table(meta::PREALLOC) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut sum = 0u64;
    for r in t.iter()? {
        let (k, v) = r?;
        sum = sum.saturating_add(dec(PreallocRec::decode(k.value().1, v.value()))?.len);
    }
    Ok(sum)
}

/// Host bytes held besides the ranges while any range is reserved: room for the metadata a
/// write into a range adds (redb grows its file for the commit; ext4 keeps reserved clusters
/// for the same reason). Released for the commit of such a write, topped up after it.
pub(crate) const POOL: u64 = 4 << 20;

/// The reserve file and what it holds.
pub(crate) struct Held {
    file: Option<File>,
    /// Reserved bytes the file holds room for.
    held: u64,
    /// Bytes of [`POOL`] it holds too (its length is `host_bytes(held) + pool`).
    pool: u64,
    /// Reserved bytes held for transactions not yet committed (not given back meanwhile).
    pending: u64,
}

/// The reservations of a store: the committed total and the host space held for it.
pub(crate) struct Reserve {
    /// Reserved bytes in the committed `prealloc` table.
    pub(crate) table: AtomicU64,
    pub(crate) state: Mutex<Held>,
}

impl Reserve {
    /// Opens the reserve file of `dir` and sizes it for `total` (the table's sum). A read-only
    /// store holds no file. Space the host no longer has is logged, not fatal: the ranges stay
    /// recorded, the writes into them are then not guaranteed.
    pub(crate) fn open(dir: &Path, total: u64, read_only: bool) -> Result<Reserve> {
        let r = Reserve {
            table: AtomicU64::new(total),
            state: Mutex::new(Held {
                file: None,
                held: 0,
                pool: 0,
                pending: 0,
            }),
        };
        if read_only {
            return Ok(r);
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(RESERVE_FILE))?;
        let len = f.metadata()?.len();
        {
            let mut g = lock(&r.state);
            g.file = Some(f);
            // Whatever the file held before (a crash may leave it larger or smaller).
            g.held = len;
            let pool = if total > 0 { POOL } else { 0 };
            let _ = g.set(0, 0);
            if let Err(e) = g.set(total, pool) {
                tracing::warn!(
                    "compfs store {}: {total} preallocated bytes are recorded but the host has \
                     no room to hold them ({e}); writes into them may find the disk full",
                    dir.display()
                );
            }
        }
        Ok(r)
    }
}

impl Held {
    /// Makes the file hold room for `n` reserved bytes and `pool` bytes of [`POOL`].
    fn set(&mut self, n: u64, pool: u64) -> Result<()> {
        let Some(f) = &self.file else {
            return Err(Error::ReadOnly("opened read-only".into()));
        };
        let want = host_bytes(n).saturating_add(pool);
        let have = f.metadata()?.len();
        if want > have {
            // Checked first: a host fallocate that does not fit may keep what it got before
            // failing (ext4 does) until it is given back, and other writers, this store's
            // included, would find the disk full meanwhile.
            if want - have > host_free(f)? {
                return Err(Error::NoSpace);
            }
            let big = || Error::InvalidArgument("reservation too large".into());
            let len = i64::try_from(want - have).map_err(|_| big())?;
            let at = i64::try_from(have).map_err(|_| big())?;
            // SAFETY: fallocate on a descriptor we own, plain integers.
            let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(f), 0, at, len) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                // Give back whatever part the host did allocate.
                let _ = f.set_len(have);
                // A range the host cannot even hold in one file does not fit either.
                if e.raw_os_error() == Some(libc::EFBIG) {
                    return Err(Error::NoSpace);
                }
                return Err(Error::from_io(e));
            }
        } else if want < have {
            f.set_len(want)?;
        }
        self.held = n;
        self.pool = pool;
        Ok(())
    }
}

/// Bytes the filesystem holding `f` has available to unprivileged users (`f_bavail`).
fn host_free(f: &File) -> Result<u64> {
    // SAFETY: statvfs is plain data filled by the call; the descriptor is ours.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstatvfs(std::os::fd::AsRawFd::as_raw_fd(f), &mut s) };
    if r != 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    Ok((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

impl Inner {
    /// Holds `n` more reserved bytes on the host (and the [`POOL`]; ENOSPC when they do not
    /// fit), before the transaction that records them. A failed commit gives them back in
    /// [`Inner::settle`].
    pub(crate) fn reserve_grow(&self, n: u64) -> Result<()> {
        let mut g = lock(&self.reserve.state);
        let to = g.held.saturating_add(n);
        g.set(to, POOL)?;
        g.pending = g.pending.saturating_add(n);
        Ok(())
    }

    /// After the transaction of a [`Inner::reserve_grow`] of `n` bytes committed or failed:
    /// they are no longer held for it (the committed total has them, or nobody does).
    fn reserve_done(&self, n: u64) {
        {
            let mut g = lock(&self.reserve.state);
            g.pending = g.pending.saturating_sub(n);
        }
        self.shrink_to_table();
    }

    /// After a commit that changed the reserved total by `delta`: records it, lets the
    /// reserve file give back what it holds beyond the committed total, and tops up the pool.
    pub(crate) fn settle(&self, delta: i64) {
        if delta == 0 {
            return;
        }
        let t = &self.reserve.table;
        let _ = t.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            Some(v.saturating_add_signed(delta))
        });
        self.shrink_to_table();
    }

    /// Shrinks the reserve file to the committed total if it holds more; holds the pool while
    /// any range is reserved (best effort: a full host gets it back later).
    pub(crate) fn shrink_to_table(&self) {
        let mut g = lock(&self.reserve.state);
        let table = self.reserve.table.load(Ordering::SeqCst);
        // Reservations grown for transactions not yet committed stay held.
        let n = g.held.min(table.saturating_add(g.pending));
        let pool = if table > 0 || g.pending > 0 { POOL } else { 0 };
        if (n, pool) == (g.held, g.pool) {
            return;
        }
        let kept = g.pool.min(pool);
        if g.set(n, pool).is_err() && g.set(n, kept).is_err() {
            // Holding too much wastes space, never data: the next open resizes.
            tracing::warn!(
                "compfs store {}: cannot resize {RESERVE_FILE}",
                self.dir.display()
            );
        }
    }

    /// Whether any file has reserved ranges (committed).
    pub(crate) fn any_reserved(&self) -> bool {
        self.reserve.table.load(Ordering::SeqCst) > 0
    }

    /// Reserved bytes of `ino` (committed).
    pub(crate) fn reserved_of(&self, ino: Ino) -> Result<u64> {
        if !self.any_reserved() {
            return Ok(0);
        }
        let txn = self.read_txn()?;
        Ok(ranges_in(&txn, ino)?.iter().map(|(a, b)| b - a).sum())
    }

    /// Before a flush of `ino` appends extents over `written` file ranges: gives back the host
    /// space of the reserved bytes they cover and the pool (for the commit's metadata), and
    /// returns the reserve lock, to be held until the append is done (the flush's commit then
    /// drops the ranges from the table and tops the pool up). `None` when nothing written is
    /// reserved.
    pub(crate) fn release_for_append(
        &self,
        ino: Ino,
        written: &[(u64, u64)],
    ) -> Result<Option<MutexGuard<'_, Held>>> {
        if written.is_empty() || !self.any_reserved() {
            return Ok(None);
        }
        let n = {
            let txn = self.read_txn()?;
            let t = match txn.open_table(meta::PREALLOC) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let mut n = 0u64;
            for &(s, e) in written {
                n += overlap(&overlapping_in(&t, ino, s, e)?, s, e);
            }
            n
        };
        if n == 0 {
            return Ok(None);
        }
        let mut g = lock(&self.reserve.state);
        let to = g.held.saturating_sub(n);
        if let Err(e) = g.set(to, 0) {
            tracing::warn!(
                "compfs store {}: cannot shrink {RESERVE_FILE}: {e}",
                self.dir.display()
            );
        }
        Ok(Some(g))
    }

    /// Reserves the holes of `[start, end)` of `ino` that are neither data (`data`: the file's
    /// data regions, sorted) nor reserved already: host space first (ENOSPC if it is not
    /// there), then the ranges are recorded. Returns the bytes newly reserved.
    pub(crate) fn reserve_range(
        &self,
        ino: Ino,
        data: &[(u64, u64)],
        start: u64,
        end: u64,
    ) -> Result<u64> {
        let have = {
            let txn = self.read_txn()?;
            ranges_in(&txn, ino)?
        };
        let taken = union(data, &have);
        let new = gaps(&taken, start, end);
        let n: u64 = new.iter().map(|(a, b)| b - a).sum();
        if n == 0 {
            return Ok(0);
        }
        self.reserve_grow(n)?;
        let r = self.write(false, |w| {
            for &(a, b) in &new {
                w.prealloc_add(ino, a, b)?;
            }
            Ok(())
        });
        // Committed: the table holds them now. Failed: the host space goes back.
        self.reserve_done(n);
        r.map(|()| n)
    }

    /// Drops the reservations of `ino` inside `[start, end)` (punch, truncate), in their own
    /// transaction; the host space is given back after the commit.
    pub(crate) fn unreserve(&self, ino: Ino, start: u64, end: u64) -> Result<()> {
        if start >= end || self.reserved_of(ino)? == 0 {
            return Ok(());
        }
        self.write(false, |w| w.prealloc_remove(ino, start, end).map(|_| ()))
    }
}

impl W<'_> {
    /// The reserved ranges of `ino` overlapping `[start, end)`.
    fn prealloc_overlapping(&self, ino: Ino, start: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        overlapping_in(self.prealloc()?, ino, start, end)
    }

    fn prealloc_put(&mut self, ino: Ino, s: u64, e: u64) -> Result<()> {
        let rec = PreallocRec { len: e - s };
        self.prealloc_mut()?
            .insert((ino, s), rec.encode().as_slice())?;
        Ok(())
    }

    /// Removes `[start, end)` from the reserved ranges of `ino` (ranges crossing the bounds
    /// keep their outside parts). Returns the bytes removed.
    pub(crate) fn prealloc_remove(&mut self, ino: Ino, start: u64, end: u64) -> Result<u64> {
        let mut gone = 0u64;
        for (s, e) in self.prealloc_overlapping(ino, start, end)? {
            self.prealloc_mut()?.remove((ino, s))?;
            if s < start {
                self.prealloc_put(ino, s, start)?;
            }
            if e > end {
                self.prealloc_put(ino, end, e)?;
            }
            gone += e.min(end) - s.max(start);
        }
        self.reserve_delta -= gone as i64;
        Ok(gone)
    }

    /// Records `[start, end)` (free of reservations) as reserved for `ino`, joined with
    /// adjacent ranges.
    pub(crate) fn prealloc_add(&mut self, ino: Ino, start: u64, end: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let (mut s, mut e) = (start, end);
        let near =
            self.prealloc_overlapping(ino, start.saturating_sub(1), end.saturating_add(1))?;
        for (a, b) in near {
            if a < end && b > start {
                return Err(meta::corrupt(format!(
                    "inode {ino}: preallocation {start}..{end} overlaps {a}..{b}"
                )));
            }
            self.prealloc_mut()?.remove((ino, a))?;
            s = s.min(a);
            e = e.max(b);
        }
        self.prealloc_put(ino, s, e)?;
        self.reserve_delta += (end - start) as i64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_bytes_adds_a_header_per_page() {
        assert_eq!(host_bytes(0), 0);
        assert_eq!(host_bytes(1), 1 + 48);
        assert_eq!(host_bytes(4096), 4096 + 48);
        assert_eq!(host_bytes(4097), 4097 + 96);
        assert_eq!(host_bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn widen_and_narrow_round_to_pages() {
        assert_eq!(widen(1, 2, u64::MAX), (0, 4096));
        assert_eq!(widen(4096, 8192, u64::MAX), (4096, 8192));
        assert_eq!(widen(4095, 4097, u64::MAX), (0, 8192));
        assert_eq!(widen(0, u64::MAX - 5, 1 << 40), (0, 1 << 40));
        assert_eq!(narrow(1, 8191), (4096, 4096));
        assert_eq!(narrow(0, 8192), (0, 8192));
        assert_eq!(narrow(4097, 100), (8192, 8192));
        assert_eq!(narrow(0, u64::MAX), (0, u64::MAX - u64::MAX % 4096));
    }

    #[test]
    fn gaps_are_what_nothing_covers() {
        assert_eq!(gaps(&[], 0, 10), vec![(0, 10)]);
        assert_eq!(gaps(&[(0, 10)], 0, 10), vec![]);
        assert_eq!(
            gaps(&[(2, 4), (6, 8)], 0, 10),
            vec![(0, 2), (4, 6), (8, 10)]
        );
        assert_eq!(gaps(&[(2, 4), (6, 8)], 3, 7), vec![(4, 6)]);
        assert_eq!(gaps(&[(0, 3), (20, 30)], 5, 10), vec![(5, 10)]);
        assert_eq!(gaps(&[(0, 3)], 5, 5), vec![]);
    }

    #[test]
    fn union_joins_touching_ranges() {
        assert_eq!(union(&[(0, 2)], &[(2, 4)]), vec![(0, 4)]);
        assert_eq!(union(&[(0, 2), (8, 9)], &[(1, 3)]), vec![(0, 3), (8, 9)]);
        assert_eq!(union(&[], &[]), vec![]);
    }

    #[test]
    fn overlap_counts_bytes_inside() {
        assert_eq!(overlap(&[(0, 10), (20, 30)], 5, 25), 10);
        assert_eq!(overlap(&[(0, 10)], 10, 20), 0);
    }

    proptest::proptest! {
        /// The two-lookup query returns exactly the ranges of the file that a scan of all of
        /// them finds overlapping, for disjoint ranges of two files side by side.
        #[test]
        fn overlapping_in_matches_a_scan(
            lens in proptest::collection::vec((0u64..50, 1u64..50), 0..40),
            start in 0u64..2500,
            len in 0u64..600,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
            let mut mine = Vec::new();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(meta::PREALLOC).unwrap();
                let mut at = 0;
                for (gap, l) in &lens {
                    let s = at + gap;
                    let rec = PreallocRec { len: *l };
                    t.insert((7u64, s), rec.encode().as_slice()).unwrap();
                    // Another file's ranges around it must not be returned.
                    t.insert((6u64, s), rec.encode().as_slice()).unwrap();
                    t.insert((8u64, s), rec.encode().as_slice()).unwrap();
                    mine.push((s, s + l));
                    at = s + l;
                }
            }
            txn.commit().unwrap();
            let end = start + len;
            // An empty query range overlaps nothing, even inside a reserved range.
            let want: Vec<(u64, u64)> = mine
                .iter()
                .copied()
                .filter(|&(a, b)| start < end && a < end && b > start)
                .collect();
            let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
            let t = txn.open_table(meta::PREALLOC).unwrap();
            proptest::prop_assert_eq!(overlapping_in(&t, 7, start, end).unwrap(), want);
        }
    }
}
