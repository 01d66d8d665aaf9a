//! Offset arithmetic of file data as pure functions (no I/O, no locks, no store state), as
//! gocryptfs keeps its block arithmetic apart: the block pieces of a byte range, what a punch
//! or a truncation does to blocks, the part of an extent-map entry inside a window, the pieces
//! left when a range is cut out of a map entry, and sets of byte ranges. Each is tested below
//! against a byte-by-byte model.
//!
//! Callers keep ranges in bounds (a write's end is at most `MAX_FILE_SIZE`, a block is at most
//! a few MiB); the functions still never overflow: ends saturate at `u64::MAX`.

use std::ops::RangeInclusive;

/// The piece of a byte range that falls in one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockSpan {
    /// Block index (file offset / block size).
    pub block: u64,
    /// Offset of the piece within its block.
    pub start: usize,
    /// Length of the piece (at least 1).
    pub len: usize,
    /// Offset of the piece from the start of the range (an index into the caller's buffer).
    pub from: usize,
}

impl BlockSpan {
    /// Whether the piece is its whole block.
    pub fn is_whole(&self, block_size: u64) -> bool {
        self.start == 0 && self.len as u64 == block_size
    }
}

/// Iterator over the [`BlockSpan`]s of a byte range, in order (see [`block_spans`]).
pub(crate) struct BlockSpans {
    pos: u64,
    offset: u64,
    end: u64,
    block_size: u64,
}

impl Iterator for BlockSpans {
    type Item = BlockSpan;

    fn next(&mut self) -> Option<BlockSpan> {
        if self.pos >= self.end {
            return None;
        }
        let block = self.pos / self.block_size;
        let start = self.pos - block * self.block_size;
        let len = (self.end - self.pos).min(self.block_size - start);
        let span = BlockSpan {
            block,
            start: start as usize,
            len: len as usize,
            from: (self.pos - self.offset) as usize,
        };
        self.pos += len;
        Some(span)
    }
}

/// The pieces of `[offset, offset + len)` in blocks of `block_size` bytes (non-zero), in
/// order; none for an empty range.
pub(crate) fn block_spans(offset: u64, len: u64, block_size: u64) -> BlockSpans {
    BlockSpans {
        pos: offset,
        offset,
        end: offset.saturating_add(len),
        block_size: block_size.max(1),
    }
}

/// Bytes of block `block` that lie inside a file of `size` bytes (0 past the end of file).
pub(crate) fn block_len_in_file(size: u64, block: u64, block_size: u64) -> usize {
    size.saturating_sub(block.saturating_mul(block_size))
        .min(block_size) as usize
}

/// Blocks touched by `[start, start + len)`; `None` for an empty range (or one past
/// `u64::MAX`).
pub(crate) fn blocks_of(start: u64, len: u64, block_size: u64) -> Option<RangeInclusive<u64>> {
    let last = start.checked_add(len)?.checked_sub(1)?;
    if len == 0 {
        return None;
    }
    let bs = block_size.max(1);
    Some(start / bs..=last / bs)
}

/// What punching a hole does to one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PunchSpan {
    /// The hole covers the block up to the end of file: drop its buffer and its map range
    /// `[block * block_size, block * block_size + block_size)`.
    Drop(u64),
    /// The hole covers `[start, end)` of the block: zero those bytes.
    Zero {
        block: u64,
        start: usize,
        end: usize,
    },
}

/// The blocks changed by punching `[offset, offset + len)` in a file of `size` bytes (the hole
/// stops at the end of file).
pub(crate) fn punch_spans(offset: u64, len: u64, size: u64, block_size: u64) -> Vec<PunchSpan> {
    let e = block_size.max(1);
    let end = offset.saturating_add(len).min(size);
    let mut v = Vec::new();
    if offset >= end {
        return v;
    }
    let mut b = offset / e;
    while b * e < end {
        let (bs, be) = (b * e, (b * e + e).min(size));
        if offset <= bs && be <= end {
            v.push(PunchSpan::Drop(b));
        } else {
            v.push(PunchSpan::Zero {
                block: b,
                start: (offset.max(bs) - bs) as usize,
                end: (end.min(be) - bs) as usize,
            });
        }
        b += 1;
    }
    v
}

/// What truncating a file to `size` bytes does to its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TruncSpan {
    /// Blocks from this index on lie wholly past the new end: drop them.
    pub first_gone: u64,
    /// The block the new end falls inside and the offset in it from which its bytes are past
    /// the end (zeroed); `None` when the end falls on a block boundary.
    pub tail: Option<(u64, usize)>,
}

/// See [`TruncSpan`].
pub(crate) fn truncate_span(size: u64, block_size: u64) -> TruncSpan {
    let e = block_size.max(1);
    TruncSpan {
        first_gone: size.div_ceil(e),
        tail: (size % e != 0).then(|| (size / e, (size % e) as usize)),
    }
}

/// The part of an extent-map entry at file offset `foff` (`len` bytes, starting `ext_offset`
/// bytes into its extent) inside the window `[off, end)`: its file range and the offset of its
/// first byte in the extent. `None` when they do not overlap.
pub(crate) fn entry_window(
    foff: u64,
    len: u32,
    ext_offset: u32,
    off: u64,
    end: u64,
) -> Option<(u64, u64, u64)> {
    let (s, e) = (foff.max(off), foff.saturating_add(len as u64).min(end));
    (s < e).then(|| (s, e, ext_offset as u64 + (s - foff)))
}

/// A run of an extent mapped at a file offset (an extent-map entry without its extent id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub file_off: u64,
    pub ext_offset: u32,
    pub len: u32,
}

/// Cuts `[start, end)` out of `p`: the pieces left before and after it (an entry that does not
/// overlap the range is left whole; an empty one leaves nothing).
pub(crate) fn cut(p: Piece, start: u64, end: u64) -> [Option<Piece>; 2] {
    if p.len == 0 {
        return [None, None];
    }
    let p_end = p.file_off.saturating_add(p.len as u64);
    if p_end <= start || p.file_off >= end || start >= end {
        return [Some(p), None];
    }
    let left = (p.file_off < start).then(|| Piece {
        len: (start - p.file_off) as u32,
        ..p
    });
    let right = (p_end > end).then(|| Piece {
        file_off: end,
        ext_offset: p.ext_offset + (end - p.file_off) as u32,
        len: (p_end - end) as u32,
    });
    [left, right]
}

/// Whether map entry `p`, of an extent of `raw_len` uncompressed bytes, is the whole of
/// block `block` of a file of `size` bytes cut in blocks of `block_size` bytes: it starts at
/// the block, maps its extent from the start to the end, and covers the block's bytes in the
/// file (all of them but for the last block, which may be shorter). What `defrag` leaves
/// alone when the codec and level match too.
pub(crate) fn is_whole_block(
    p: Piece,
    raw_len: u32,
    block: u64,
    block_size: u64,
    size: u64,
) -> bool {
    let want = block_len_in_file(size, block, block_size);
    want > 0
        && Some(p.file_off) == block.checked_mul(block_size)
        && p.ext_offset == 0
        && p.len == raw_len
        && p.len as usize == want
}

/// Adds `[s, e)` to a sorted set of disjoint byte ranges, merging it with every range it
/// overlaps or touches, so that the set stays sorted, disjoint and not adjacent.
pub(crate) fn range_insert(ranges: &mut Vec<(usize, usize)>, s: usize, e: usize) {
    let mut v = Vec::with_capacity(ranges.len() + 1);
    let (mut s, mut e) = (s, e);
    for &(a, b) in ranges.iter() {
        if b < s || a > e {
            v.push((a, b));
        } else {
            s = s.min(a);
            e = e.max(b);
        }
    }
    v.push((s, e));
    v.sort_unstable();
    *ranges = v;
}

/// Bytes covered by a set of disjoint ranges.
pub(crate) fn range_covered(ranges: &[(usize, usize)]) -> usize {
    ranges.iter().map(|(a, b)| b - a).sum()
}

/// The parts of `ranges` inside `[off, end)`, clipped to it.
pub(crate) fn range_clip(
    ranges: &[(usize, usize)],
    off: usize,
    end: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    ranges.iter().filter_map(move |&(a, b)| {
        let (s, e) = (a.max(off), b.min(end));
        (s < e).then_some((s, e))
    })
}

/// The gaps of `[0, len)` not covered by any of the (possibly overlapping, unsorted) `ranges`,
/// in order. Sorts `ranges`.
pub(crate) fn range_gaps(ranges: &mut [(usize, usize)], len: usize) -> Vec<(usize, usize)> {
    ranges.sort_unstable();
    let mut gaps = Vec::new();
    let mut pos = 0;
    for &(s, e) in ranges.iter() {
        if s >= e {
            continue;
        }
        if s > pos {
            gaps.push((pos, s.min(len)));
        }
        pos = pos.max(e);
        if pos >= len {
            break;
        }
    }
    if pos < len {
        gaps.push((pos, len));
    }
    gaps.retain(|&(a, b)| a < b);
    gaps
}

/// Appends `[s, e)` to a list of data regions in file order, extending the last region when
/// the new one starts where it ends.
pub(crate) fn region_push(regions: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    match regions.last_mut() {
        Some(last) if last.1 == s => last.1 = e,
        _ => regions.push((s, e)),
    }
}

/// `SEEK_DATA` over sorted data regions of a file of `size` bytes: the first data byte at or
/// after `offset`, `None` if there is none (ENXIO).
pub(crate) fn seek_data(regions: &[(u64, u64)], size: u64, offset: u64) -> Option<u64> {
    if offset >= size {
        return None;
    }
    regions
        .iter()
        .find(|&&(_, e)| e > offset)
        .map(|&(s, _)| s.max(offset))
}

/// `SEEK_HOLE` over sorted data regions of a file of `size` bytes: the first hole at or after
/// `offset` (the end of file counts as one), `None` when `offset` is past the end (ENXIO).
pub(crate) fn seek_hole(regions: &[(u64, u64)], size: u64, offset: u64) -> Option<u64> {
    if offset >= size {
        return None;
    }
    let mut pos = offset;
    for &(s, e) in regions {
        if s > pos {
            break;
        }
        if e > pos {
            pos = e;
        }
    }
    Some(pos.min(size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bs() -> impl Strategy<Value = u64> {
        prop_oneof![Just(1u64), Just(4), Just(7), Just(16), 1u64..40]
    }

    proptest! {
        /// Every byte of the range is in exactly one span, at the right block, in-block offset
        /// and buffer index; spans are in order and never cross a block.
        #[test]
        fn block_spans_cover_each_byte_once(offset in 0u64..200, len in 0u64..200, e in bs()) {
            let spans: Vec<BlockSpan> = block_spans(offset, len, e).collect();
            let mut next = 0usize;
            for s in &spans {
                prop_assert!(s.len >= 1 && (s.start + s.len) as u64 <= e);
                prop_assert_eq!(s.from, next);
                for i in 0..s.len {
                    let pos = offset + (s.from + i) as u64;
                    prop_assert_eq!(pos / e, s.block);
                    prop_assert_eq!((pos % e) as usize, s.start + i);
                }
                prop_assert_eq!(s.is_whole(e), s.start == 0 && s.len as u64 == e);
                next += s.len;
            }
            prop_assert_eq!(next as u64, len);
        }

        #[test]
        fn block_len_in_file_counts_bytes(size in 0u64..300, b in 0u64..40, e in bs()) {
            let model = (b * e..b * e + e).filter(|&p| p < size).count();
            prop_assert_eq!(block_len_in_file(size, b, e), model);
        }

        #[test]
        fn blocks_of_is_the_blocks_of_each_byte(start in 0u64..300, len in 0u64..100, e in bs()) {
            let model: Vec<u64> = {
                let mut v: Vec<u64> = (start..start + len).map(|p| p / e).collect();
                v.dedup();
                v
            };
            let got: Vec<u64> = blocks_of(start, len, e).into_iter().flatten().collect();
            prop_assert_eq!(got, model);
        }

        /// Applying the punch spans to a byte model zeroes exactly the bytes of the hole inside
        /// the file; dropped blocks lie wholly in the hole (up to the end of file).
        #[test]
        fn punch_spans_zero_exactly_the_hole(
            offset in 0u64..200, len in 0u64..200, size in 0u64..200, e in bs()
        ) {
            let mut zeroed = vec![false; size as usize];
            for s in punch_spans(offset, len, size, e) {
                match s {
                    PunchSpan::Drop(b) => {
                        for p in b * e..(b * e + e).min(size) {
                            prop_assert!(p >= offset && p < offset + len, "dropped byte {} outside the hole", p);
                            zeroed[p as usize] = true;
                        }
                    }
                    PunchSpan::Zero { block, start, end } => {
                        prop_assert!(start < end && end as u64 <= e);
                        for i in start..end {
                            zeroed[(block * e) as usize + i] = true;
                        }
                    }
                }
            }
            for (p, z) in zeroed.iter().enumerate() {
                let p = p as u64;
                prop_assert_eq!(*z, p >= offset && p < offset.saturating_add(len), "byte {}", p);
            }
        }

        #[test]
        fn truncate_span_splits_kept_and_gone_bytes(size in 0u64..300, e in bs()) {
            let t = truncate_span(size, e);
            // Every byte of a dropped block is past the end; every block before holds one
            // byte inside it.
            prop_assert!(t.first_gone * e >= size);
            prop_assert!(t.first_gone == 0 || (t.first_gone - 1) * e < size);
            match t.tail {
                Some((b, from)) => {
                    prop_assert_eq!(b + 1, t.first_gone);
                    prop_assert_eq!(b * e + from as u64, size);
                    prop_assert!(from > 0 && (from as u64) < e);
                }
                None => prop_assert_eq!(size % e, 0),
            }
        }

        #[test]
        fn entry_window_maps_each_byte(
            foff in 0u64..100, len in 0u32..60, xo in 0u32..50, off in 0u64..120, wl in 0u64..60
        ) {
            let end = off + wl;
            let model: Vec<(u64, u64)> = (foff..foff + len as u64)
                .filter(|p| *p >= off && *p < end)
                .map(|p| (p, xo as u64 + (p - foff)))
                .collect();
            let got: Vec<(u64, u64)> = match entry_window(foff, len, xo, off, end) {
                Some((s, e, src)) => (s..e).map(|p| (p, src + (p - s))).collect(),
                None => Vec::new(),
            };
            prop_assert_eq!(got, model);
        }

        /// Cutting keeps the file->extent mapping of every byte outside the range and drops
        /// the bytes inside it.
        #[test]
        fn cut_keeps_the_mapping_outside_the_range(
            foff in 0u64..100, len in 0u32..60, xo in 0u32..50, start in 0u64..170, cl in 0u64..80
        ) {
            let p = Piece { file_off: foff, ext_offset: xo, len };
            let end = start + cl;
            let model: Vec<(u64, u64)> = (foff..foff + len as u64)
                .filter(|b| *b < start || *b >= end)
                .map(|b| (b, xo as u64 + (b - foff)))
                .collect();
            let mut got = Vec::new();
            for q in cut(p, start, end).into_iter().flatten() {
                prop_assert!(q.len > 0);
                for i in 0..q.len as u64 {
                    got.push((q.file_off + i, q.ext_offset as u64 + i));
                }
            }
            got.sort_unstable();
            prop_assert_eq!(got, model);
        }

        /// A whole block maps exactly the block's bytes in the file from one extent's start
        /// to its end.
        #[test]
        fn whole_block_is_one_extent_of_the_block(
            foff in 0u64..200, len in 0u32..60, xo in 0u32..20, extra in 0u32..20,
            b in 0u64..20, size in 0u64..300, e in bs()
        ) {
            let p = Piece { file_off: foff, ext_offset: xo, len };
            let raw = xo + len + extra;
            let bytes: Vec<u64> = (b * e..b * e + e).filter(|&q| q < size).collect();
            let model = !bytes.is_empty()
                && xo == 0
                && extra == 0
                && (foff..foff + len as u64).eq(bytes.iter().copied());
            prop_assert_eq!(is_whole_block(p, raw, b, e, size), model);
        }

        /// A range set built by `range_insert` covers exactly the union of the inserted ranges,
        /// and stays sorted, disjoint and non-adjacent; clip and gaps agree with the model.
        #[test]
        fn range_sets_match_a_byte_model(
            ins in proptest::collection::vec((0usize..100, 0usize..30), 0..12),
            off in 0usize..120, wl in 0usize..60
        ) {
            let mut set = Vec::new();
            let mut model = [false; 140];
            for (s, l) in ins {
                range_insert(&mut set, s, s + l);
                for m in model.iter_mut().skip(s).take(l) {
                    *m = true;
                }
            }
            for w in set.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "{:?}", set);
            }
            let covered: Vec<bool> = (0..140).map(|p| set.iter().any(|&(a, b)| p >= a && p < b)).collect();
            // Empty inserted ranges may leave empty entries; they cover nothing.
            prop_assert_eq!(&covered[..], &model[..]);
            prop_assert_eq!(range_covered(&set), model.iter().filter(|m| **m).count());
            let end = off + wl;
            let mut clipped = [false; 140];
            for (s, e) in range_clip(&set, off, end) {
                prop_assert!(s >= off && e <= end && s < e);
                clipped[s..e].iter_mut().for_each(|c| *c = true);
            }
            for p in 0..140 {
                prop_assert_eq!(clipped[p], model[p] && p >= off && p < end);
            }
        }

        #[test]
        fn range_gaps_are_the_uncovered_bytes(
            rs in proptest::collection::vec((0usize..100, 0usize..30), 0..10), len in 0usize..120
        ) {
            let mut ranges: Vec<(usize, usize)> = rs.iter().map(|&(s, l)| (s, s + l)).collect();
            let gaps = range_gaps(&mut ranges, len);
            let mut in_gap = vec![false; len];
            for w in gaps.windows(2) {
                prop_assert!(w[0].1 < w[1].0);
            }
            for &(a, b) in &gaps {
                prop_assert!(a < b && b <= len);
                in_gap[a..b].iter_mut().for_each(|g| *g = true);
            }
            for (p, g) in in_gap.iter().enumerate() {
                let covered = rs.iter().any(|&(s, l)| p >= s && p < s + l);
                prop_assert_eq!(*g, !covered, "byte {}", p);
            }
        }

        /// Regions from map entries; seek_data/seek_hole against scanning bytes one by one.
        #[test]
        fn seek_matches_a_byte_scan(
            entries in proptest::collection::vec((0u64..20, 1u64..15), 0..8),
            size in 0u64..200, offset in 0u64..220
        ) {
            // Entries in file order, non-overlapping, as the extent map holds them.
            let mut regions = Vec::new();
            let mut data = vec![false; 250];
            let mut pos = 0;
            for (gap, len) in entries {
                let s = pos + gap;
                if s + len > size {
                    break;
                }
                region_push(&mut regions, s, s + len);
                data[s as usize..(s + len) as usize].iter_mut().for_each(|d| *d = true);
                pos = s + len;
            }
            for w in regions.windows(2) {
                prop_assert!(w[0].1 < w[1].0);
            }
            let is_data = |p: u64| p < size && data[p as usize];
            let want_data = (offset < size).then(|| (offset..size).find(|&p| is_data(p))).flatten();
            prop_assert_eq!(seek_data(&regions, size, offset), want_data);
            let want_hole = (offset < size).then(|| (offset..size).find(|&p| !is_data(p)).unwrap_or(size));
            prop_assert_eq!(seek_hole(&regions, size, offset), want_hole);
        }
    }

    #[test]
    fn empty_and_extreme_ranges() {
        assert_eq!(blocks_of(5, 0, 4), None);
        assert_eq!(
            blocks_of(u64::MAX - 1, 1, 4),
            Some(u64::MAX / 4..=u64::MAX / 4)
        );
        assert_eq!(blocks_of(u64::MAX, 1, 4), None);
        assert_eq!(block_spans(u64::MAX - 1, 10, 4).count(), 1);
        assert!(punch_spans(10, 5, 10, 4).is_empty());
        assert_eq!(
            entry_window(u64::MAX - 1, 5, 0, 0, u64::MAX),
            Some((u64::MAX - 1, u64::MAX, 0))
        );
    }
}
