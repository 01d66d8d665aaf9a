//! Cold sequential reads from the bucket: which blocks to fetch ahead of a reader ([`plan`],
//! pure) and the set of blocks being fetched ([`Inflight`]), so that a reader needing a block
//! already on its way waits for it instead of sending a second GET.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::blockcache::Key;

/// Blocks fetched ahead of a sequential reader, at most (parallel ranged GETs).
pub const READAHEAD_BLOCKS: u64 = 8;

/// Blocks of a readahead under a cache bound of `cap` bytes: at most a quarter of the cache,
/// so that fetching ahead never pushes out what is being read.
pub fn window(cap: u64, block: u64) -> u64 {
    READAHEAD_BLOCKS.min(cap / 4 / block.max(1))
}

/// The block before block `b` of chunk `start` along the segment whose chunks (start ->
/// length) are `chunks`: the previous block of the same chunk, or the last one of the chunk
/// ending where this one starts; `None` at the first block of the segment's data.
pub fn previous(chunks: &BTreeMap<u64, u64>, start: u64, b: u64, block: u64) -> Option<(u64, u64)> {
    if b > 0 {
        return Some((start, b - 1));
    }
    let (&s, &l) = chunks.range(..start).next_back()?;
    (s + l == start && l > 0).then(|| (s, (l - 1) / block))
}

/// Up to `n` blocks following block `b` of chunk `start` along the segment (crossing into the
/// next chunks while they are contiguous): (chunk start, chunk length, block index).
pub fn plan(
    chunks: &BTreeMap<u64, u64>,
    start: u64,
    b: u64,
    n: u64,
    block: u64,
) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let Some(&len) = chunks.get(&start) else {
        return out;
    };
    let (mut cs, mut cl, mut nb) = (start, len, b + 1);
    while (out.len() as u64) < n {
        if nb * block >= cl {
            match chunks.get(&(cs + cl)) {
                Some(&l) if l > 0 => {
                    cs += cl;
                    cl = l;
                    nb = 0;
                }
                _ => break,
            }
        }
        out.push((cs, cl, nb));
        nb += 1;
    }
    out
}

/// Blocks some thread is fetching now.
#[derive(Default)]
pub struct Inflight {
    set: Mutex<HashSet<Key>>,
    done: Condvar,
}

/// A claim on a block being fetched: released (and waiters woken) when dropped, whether the
/// fetch succeeded or not.
pub struct Claim<'a> {
    owner: &'a Inflight,
    pub key: Key,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.owner.lock().remove(&self.key);
        self.owner.done.notify_all();
    }
}

impl Inflight {
    fn lock(&self) -> MutexGuard<'_, HashSet<Key>> {
        self.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `k` unless another thread is fetching it.
    pub fn claim(&self, k: Key) -> Option<Claim<'_>> {
        // Not `then_some`: it would build a claim while the lock is held, and its drop (when
        // `k` is taken) would release `k` and lock again.
        let fresh = self.lock().insert(k);
        if fresh {
            Some(Claim {
                owner: self,
                key: k,
            })
        } else {
            None
        }
    }

    pub fn contains(&self, k: Key) -> bool {
        self.lock().contains(&k)
    }

    /// Waits until nobody is fetching `k`.
    pub fn wait(&self, k: Key) {
        let g = self.lock();
        let _g = self
            .done
            .wait_while(g, |s| s.contains(&k))
            .unwrap_or_else(|p| p.into_inner());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn chunks(v: &[(u64, u64)]) -> BTreeMap<u64, u64> {
        v.iter().copied().collect()
    }

    #[test]
    fn plans_cross_contiguous_chunks_and_stop_at_gaps_and_the_end() {
        let c = chunks(&[(0, 25), (25, 10), (40, 5)]);
        // Blocks of 10: chunk 0 has blocks 0..3, chunk 25 has block 0, chunk 40 is after a gap.
        assert_eq!(
            plan(&c, 0, 0, 8, 10),
            vec![(0, 25, 1), (0, 25, 2), (25, 10, 0)]
        );
        assert_eq!(plan(&c, 0, 0, 1, 10), vec![(0, 25, 1)]);
        assert_eq!(plan(&c, 25, 0, 8, 10), vec![]);
        assert_eq!(plan(&c, 40, 0, 8, 10), vec![]);
        assert_eq!(plan(&c, 7, 0, 8, 10), vec![], "no such chunk");
        assert_eq!(plan(&c, 0, 0, 0, 10), vec![]);
    }

    #[test]
    fn the_previous_block_crosses_back_into_a_contiguous_chunk_only() {
        let c = chunks(&[(0, 25), (25, 10), (40, 5)]);
        assert_eq!(previous(&c, 0, 2, 10), Some((0, 1)));
        assert_eq!(previous(&c, 25, 0, 10), Some((0, 2)));
        assert_eq!(previous(&c, 0, 0, 10), None);
        assert_eq!(previous(&c, 40, 0, 10), None, "after a gap");
    }

    #[test]
    fn the_window_is_bounded_by_the_cache() {
        assert_eq!(window(1 << 30, 1 << 20), READAHEAD_BLOCKS);
        assert_eq!(window(3 << 20, 1 << 20), 0);
        assert_eq!(window(8 << 20, 1 << 20), 2);
        assert_eq!(window(0, 0), 0);
    }

    #[test]
    fn a_claim_excludes_others_until_dropped_and_wakes_waiters() {
        let f = std::sync::Arc::new(Inflight::default());
        let c = f.claim((1, 0, 0)).unwrap();
        assert!(f.claim((1, 0, 0)).is_none());
        assert!(f.contains((1, 0, 0)));
        let f2 = f.clone();
        let t = std::thread::spawn(move || f2.wait((1, 0, 0)));
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(c);
        t.join().unwrap();
        assert!(!f.contains((1, 0, 0)));
        assert!(f.claim((1, 0, 0)).is_some());
    }
}
