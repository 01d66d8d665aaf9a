//! Block status extents for the `base:allocation` metadata context: the pure function that turns
//! per-page states into NBD block status descriptors (proto.md, `NBD_REPLY_TYPE_BLOCK_STATUS`).

use crate::pool::PAGE;
use crate::store::PageState;

/// `NBD_STATE_HOLE`: the extent is not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// `NBD_STATE_ZERO`: the extent reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;

/// The `base:allocation` flags of a page: never written (or trimmed) pages are holes that read
/// as zeros, same-filled zero pages are allocated zeros, everything else is data.
pub fn allocation_flags(state: PageState) -> u32 {
    match state {
        PageState::Unwritten => STATE_HOLE | STATE_ZERO,
        PageState::Zero => STATE_ZERO,
        PageState::Data => 0,
    }
}

/// Descriptors `(length, flags)` for the bytes `offset..offset + len`, consecutive from
/// `offset`, with neighbouring pages of equal flags merged. `run_of(page, max_pages)` gives
/// the flags of `page` and how many pages from it (1 to `max_pages`; other values are clamped)
/// are known to share them, so the caller can answer for a long unwritten stretch at once. At
/// most `max` descriptors are returned (`max` ≥ 1; 1 for `NBD_CMD_FLAG_REQ_ONE`): then they cover
/// less than `len`, which the spec allows (the client asks again from where the reply ended).
/// Every length is nonzero, the sum never exceeds `len`, and the sum equals `len` unless `max`
/// descriptors were returned. `len == 0` or `offset + len` overflowing gives no descriptors
/// (the caller refuses such requests).
pub fn extents(
    offset: u64,
    len: u32,
    max: usize,
    mut run_of: impl FnMut(u64, u64) -> (u32, u64),
) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    let Some(end) = offset.checked_add(u64::from(len)) else {
        return out;
    };
    let max = max.max(1);
    let page_size = PAGE as u64;
    let mut pos = offset;
    while pos < end {
        let page = pos / page_size;
        let last_page = (end - 1) / page_size;
        let (flags, pages) = run_of(page, last_page - page + 1);
        let pages = pages.clamp(1, last_page - page + 1);
        // At most `len` bytes, so it fits the u32 descriptor length.
        let n = (((page + pages) * page_size).min(end) - pos) as u32;
        let full = out.len() == max;
        match out.last_mut() {
            // The sum stays <= len (a u32), so the merged length cannot overflow.
            Some(last) if last.1 == flags => last.0 += n,
            _ if full => break,
            _ => out.push((n, flags)),
        }
        pos += u64::from(n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn merges_runs_and_respects_max() {
        let states = [0u32, 0, 3, 3, 2, 0];
        let f = |p: u64, _: u64| (states[p as usize], 1);
        let e = extents(0, 6 * PAGE as u32, 100, f);
        assert_eq!(
            e,
            vec![
                (2 * PAGE as u32, 0),
                (2 * PAGE as u32, 3),
                (PAGE as u32, 2),
                (PAGE as u32, 0)
            ]
        );
        // Unaligned start and end.
        let e = extents(100, 2 * PAGE as u32, 100, f);
        assert_eq!(e, vec![(2 * PAGE as u32 - 100, 0), (100, 3)]);
        // REQ_ONE: one descriptor, within the request.
        assert_eq!(
            extents(0, 6 * PAGE as u32, 1, f),
            vec![(2 * PAGE as u32, 0)]
        );
        assert_eq!(extents(0, 10, 1, f), vec![(10, 0)]);
        assert!(extents(0, 0, 1, f).is_empty());
        assert!(extents(u64::MAX, 10, 1, f).is_empty());
        // Runs longer than one page, and runs reported past the request are cut at its end.
        let long = |p: u64, max: u64| if p < 10 { (3, 10 - p) } else { (0, max + 5) };
        assert_eq!(
            extents(100, 20 * PAGE as u32, 10, long),
            vec![(10 * PAGE as u32 - 100, 3), (10 * PAGE as u32 + 100, 0)]
        );
    }

    proptest! {
        /// Against a byte-by-byte model: every byte's flags equal its page's flags, descriptors
        /// are nonzero, neighbours differ, the sum is len unless max was reached.
        #[test]
        fn matches_byte_model(states in proptest::collection::vec(0u32..4, 1..40),
                              offset in 0u64..(40 * PAGE as u64), len in 0u32..(40 * PAGE as u32),
                              max in 1usize..8, cap in 1u64..6) {
            let f = |p: u64| states[(p as usize) % states.len()];
            // Runs of up to `cap` equal pages, as a store that knows some stretches at once.
            let run = |p: u64, m: u64| {
                let n = (1..m.min(cap)).take_while(|&k| f(p + k) == f(p)).count() as u64 + 1;
                (f(p), n)
            };
            let e = extents(offset, len, max, run);
            prop_assert!(e.len() <= max);
            let sum: u64 = e.iter().map(|d| u64::from(d.0)).sum();
            prop_assert!(sum <= u64::from(len));
            if e.len() < max {
                prop_assert_eq!(sum, u64::from(len));
            }
            let mut pos = offset;
            for (i, &(l, fl)) in e.iter().enumerate() {
                prop_assert!(l > 0);
                if i > 0 {
                    prop_assert_ne!(e[i - 1].1, fl);
                }
                for page in pos / PAGE as u64..=(pos + u64::from(l) - 1) / PAGE as u64 {
                    prop_assert_eq!(f(page), fl);
                }
                pos += u64::from(l);
            }
            // The byte after a max-truncated reply starts a different run.
            if e.len() == max && sum < u64::from(len) {
                prop_assert_ne!(f(pos / PAGE as u64), e[max - 1].1);
            }
        }
    }
}
