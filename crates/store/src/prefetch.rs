//! File readahead for backends that fetch from far away (a bucket): when a file is read
//! sequentially, the segment bytes of its next extents are named to the backend
//! ([`crate::backend::SegFile::prefetch`]) before the reader asks for them. Readahead along a
//! segment alone cannot do this: a file's extents need not follow each other in one segment
//! (the flush pipeline appends them in the order they were encoded; a file written over time,
//! past a segment's end or rewritten by GC or defrag spreads over several segments).
//!
//! The decision ([`step`]) is pure and tested alone; [`Tracker`] keeps one stream per file.

use std::collections::HashMap;
use std::sync::Mutex;

use redb::ReadTransaction;

use crate::error::Result;
use crate::meta::{self, dec};
use crate::records::{ExtentRec, MapRec};
use crate::store::{lock, Inner};
use crate::types::Ino;

/// File bytes fetched ahead of a sequential reader, at most.
pub(crate) const WINDOW: u64 = 32 << 20;

/// Segment bytes fetched past the last extent of a file read sequentially to its end: the
/// head of the file written after it, which a reader going through a directory in order
/// (`tar c`, `cp -r`, rsync, of a tree written by one of them) opens next, so that its first
/// read need not wait for a GET. A cache block: one ranged GET, two when it straddles blocks.
pub(crate) const NEXT_FILE: u64 = 1 << 20;

/// Files whose read streams are followed at once; more, and all are forgotten (a reader that
/// goes on starts a new stream at its next read from offset 0 or is simply not helped).
const MAX_STREAMS: usize = 4096;

/// Map entries looked at per prefetch, at most (a window of tiny extents costs no more).
const MAX_ENTRIES: usize = 1024;

/// A file's read stream: where the next sequential read starts, and how far the file has
/// been fetched ahead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stream {
    pub next: u64,
    pub ahead: u64,
}

/// After a read of `n` bytes at `offset`, given the file's stream `prev`: the new stream, and
/// the file range to fetch ahead, if any. A read is sequential when it starts where the last
/// one ended, or at offset 0; then the file is kept fetched `window` bytes past the reader,
/// in steps of half a window. Any other read ends the stream.
pub(crate) fn step(
    prev: Option<Stream>,
    offset: u64,
    n: u64,
    window: u64,
) -> (Stream, Option<(u64, u64)>) {
    let end = offset.saturating_add(n);
    let sequential = offset == 0 || prev.is_some_and(|p| p.next == offset);
    if !sequential || n == 0 {
        return (
            Stream {
                next: end,
                ahead: end,
            },
            None,
        );
    }
    let ahead = prev
        .filter(|p| p.next == offset)
        .map_or(end, |p| p.ahead.max(end));
    if ahead >= end.saturating_add(window / 2) {
        return (Stream { next: end, ahead }, None);
    }
    let to = end.saturating_add(window);
    (
        Stream {
            next: end,
            ahead: to,
        },
        Some((ahead, to)),
    )
}

/// The read streams of the open store's files.
#[derive(Default)]
pub(crate) struct Tracker {
    streams: Mutex<HashMap<Ino, Stream>>,
}

impl Tracker {
    /// Records a read of `n` bytes at `offset` of `ino`; the file range to fetch ahead.
    pub(crate) fn read(&self, ino: Ino, offset: u64, n: u64) -> Option<(u64, u64)> {
        let mut s = lock(&self.streams);
        let (st, r) = step(s.get(&ino).copied(), offset, n, WINDOW);
        if s.len() >= MAX_STREAMS && !s.contains_key(&ino) {
            s.clear();
        }
        s.insert(ino, st);
        r
    }
}

/// The segment byte ranges (segment, offset, length) holding extents `xrs` (header and stored
/// bytes), in their order; an extent that follows the previous one in its segment within
/// `merge_gap` bytes extends its range.
fn segment_runs(xrs: &[ExtentRec], merge_gap: u64) -> Vec<(u64, u64, u64)> {
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for xr in xrs {
        let (seg, off) = (xr.segment, xr.seg_offset);
        let len = xr.footprint();
        if let Some(last) = runs.last_mut() {
            let last_end = last.1 + last.2;
            if last.0 == seg && off >= last.1 && off <= last_end.saturating_add(merge_gap) {
                last.2 = last.2.max(off + len - last.1);
                continue;
            }
        }
        runs.push((seg, off, len));
    }
    runs
}

/// Of extents `xrs`, the one written last: the one ending furthest into the newest segment
/// (segments are numbered in the order they are opened, and a segment is appended to in
/// order). What follows it in the store was written after the file's data, whatever the
/// order of its extents in the file.
fn written_last<'a>(xrs: impl Iterator<Item = &'a ExtentRec>) -> Option<&'a ExtentRec> {
    xrs.max_by_key(|x| (x.segment, x.seg_offset.saturating_add(x.footprint())))
}

impl Inner {
    /// Names to the backend the segment bytes of `ino`'s extents holding file bytes
    /// `from..to.min(size)` (a hint: errors only end it); when the range reaches the end of
    /// the file (`to >= size`), also the [`NEXT_FILE`] segment bytes written after its last
    /// extent (`Inner::after_last`).
    pub(crate) fn prefetch_file(
        &self,
        txn: &ReadTransaction,
        ino: Ino,
        from: u64,
        to: u64,
        size: u64,
    ) {
        let end = to.min(size);
        if from >= end {
            return;
        }
        let xrs = match self.extents_of(txn, ino, from, end) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!("compfs: no readahead for inode {ino}: {e}");
                return;
            }
        };
        let mut runs = segment_runs(&xrs, 64 << 10);
        if to >= size {
            match self.last_extent(txn, ino) {
                Ok(last) => {
                    if let Some(xr) = written_last(xrs.iter().chain(last.as_ref())) {
                        runs.extend(self.after_last(xr));
                    }
                }
                Err(e) => tracing::debug!("compfs: no readahead past inode {ino}: {e}"),
            }
        }
        for (seg, off, len) in runs {
            match self.seg_file(seg) {
                Ok(f) => f.prefetch(off, len),
                Err(e) => tracing::debug!("compfs: no readahead in segment {seg}: {e}"),
            }
        }
    }

    /// The [`NEXT_FILE`] segment bytes after extent `xr`, the last written of a file: (segment,
    /// offset, length), or the head of the next segment when `xr` ends its segment.
    fn after_last(&self, xr: &ExtentRec) -> Option<(u64, u64, u64)> {
        let at = xr.seg_offset.saturating_add(xr.footprint());
        let f = self.seg_file(xr.segment).ok()?;
        if at < f.size().ok()? {
            return Some((xr.segment, at, NEXT_FILE));
        }
        let next = xr.segment.checked_add(1)?;
        self.seg_file(next).ok()?;
        Some((next, 0, NEXT_FILE))
    }

    /// The extent record of `ino`'s last map entry (its data that ends the file).
    fn last_extent(&self, txn: &ReadTransaction, ino: Ino) -> Result<Option<ExtentRec>> {
        let map = txn.open_table(meta::EXTMAP)?;
        let Some(r) = map.range((ino, 0)..=(ino, u64::MAX))?.next_back() else {
            return Ok(None);
        };
        let (_, v) = r?;
        let m = dec(MapRec::decode(v.value()))?;
        let extents = txn.open_table(meta::EXTENTS)?;
        match extents.get(m.extent)? {
            Some(v) => Ok(Some(dec(ExtentRec::decode(v.value()))?)),
            None => Ok(None),
        }
    }

    /// The extent records behind file bytes `from..to` of `ino`, in file order.
    fn extents_of(
        &self,
        txn: &ReadTransaction,
        ino: Ino,
        from: u64,
        to: u64,
    ) -> Result<Vec<ExtentRec>> {
        let map = txn.open_table(meta::EXTMAP)?;
        let extents = txn.open_table(meta::EXTENTS)?;
        let mut ids = Vec::new();
        if let Some(r) = map.range((ino, 0)..(ino, from))?.next_back() {
            let (k, v) = r?;
            let m = dec(MapRec::decode(v.value()))?;
            if k.value().1.saturating_add(m.len as u64) > from {
                ids.push(m.extent);
            }
        }
        for r in map.range((ino, from)..(ino, to))?.take(MAX_ENTRIES) {
            let (_, v) = r?;
            let m = dec(MapRec::decode(v.value()))?;
            if ids.last() != Some(&m.extent) {
                ids.push(m.extent);
            }
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(v) = extents.get(id)? {
                out.push(dec(ExtentRec::decode(v.value()))?);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_read_from_the_start_fetches_a_window_ahead() {
        let (s, r) = step(None, 0, 100, 1000);
        assert_eq!(r, Some((100, 1100)));
        assert_eq!(
            s,
            Stream {
                next: 100,
                ahead: 1100
            }
        );
    }

    #[test]
    fn a_sequential_reader_is_kept_a_window_ahead_in_half_window_steps() {
        let mut st = None;
        let mut fetched: Vec<(u64, u64)> = Vec::new();
        for i in 0..50u64 {
            let (s, r) = step(st, i * 100, 100, 1000);
            st = Some(s);
            if let Some(r) = r {
                fetched.push(r);
            }
            let end = (i + 1) * 100;
            // Always at least half a window fetched past the reader.
            assert!(s.ahead >= end + 500, "read {i}: {s:?}");
            assert!(s.ahead <= end + 1000);
        }
        // The fetched ranges follow each other without overlap or gap.
        for w in fetched.windows(2) {
            assert_eq!(w[0].1, w[1].0, "{fetched:?}");
        }
        assert_eq!(fetched[0].0, 100);
        assert!(
            fetched.len() < 20,
            "in steps, not per read: {}",
            fetched.len()
        );
    }

    #[test]
    fn a_jump_ends_the_stream_and_a_read_at_zero_starts_one() {
        let (s, _) = step(None, 0, 100, 1000);
        let (s, r) = step(Some(s), 5000, 100, 1000);
        assert_eq!(r, None, "random read: no readahead");
        assert_eq!(
            s,
            Stream {
                next: 5100,
                ahead: 5100
            }
        );
        // Sequential again from where the jump left off: a fresh window from its end.
        let (s, r) = step(Some(s), 5100, 100, 1000);
        assert_eq!(r, Some((5200, 6200)));
        assert_eq!(s.ahead, 6200);
        let (_, r) = step(Some(s), 0, 10, 1000);
        assert_eq!(r, Some((10, 1010)), "a reread from the start");
        assert_eq!(step(None, 7, 0, 1000).1, None, "empty read");
        assert_eq!(step(None, 7, 10, 1000).1, None, "a first read elsewhere");
        assert_eq!(step(None, u64::MAX - 1, 10, 1000).1, None);
        // Saturating, not overflowing, at the end of the offset space.
        assert_eq!(step(None, 0, u64::MAX, 1000).1, None);
    }

    fn xr(segment: u64, seg_offset: u64, stored_len: u32) -> ExtentRec {
        ExtentRec {
            segment,
            seg_offset,
            stored_len,
            raw_len: stored_len,
            codec: 0,
            level: 0,
            crc: 0,
            refs: 1,
            ino: 2,
            dict: 0,
        }
    }

    #[test]
    fn neighbouring_extents_of_a_segment_merge_into_one_run() {
        let h = crate::records::EXT_HEADER_LEN as u64;
        let x = [
            xr(1, 100, 50),
            xr(1, 150 + h, 50),
            xr(1, 10_000, 10),
            xr(2, 0, 10),
            xr(1, 0, 10),
        ];
        assert_eq!(
            segment_runs(&x, 0),
            vec![
                (1, 100, 100 + 2 * h),
                (1, 10_000, 10 + h),
                (2, 0, 10 + h),
                (1, 0, 10 + h)
            ]
        );
        let merged = segment_runs(&x, 20_000);
        assert_eq!(merged[0], (1, 100, 10_000 - 100 + 10 + h));
        assert_eq!(merged.len(), 3, "{merged:?}");
    }

    #[test]
    fn the_extent_written_last_is_the_one_ending_furthest_in_the_newest_segment() {
        let x = [
            xr(2, 500, 10),
            xr(3, 100, 10),
            xr(3, 40, 10),
            xr(1, 900, 10),
        ];
        assert_eq!(written_last(x.iter()), Some(&x[1]));
        // The file's last extent by offset need not be the last written.
        let y = [xr(4, 0, 100), xr(4, 5000, 100), xr(4, 200, 100)];
        assert_eq!(written_last(y.iter()), Some(&y[1]));
        assert_eq!(written_last([].iter()), None);
    }
}
