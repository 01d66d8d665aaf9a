//! Cold sequential reads from the bucket: which blocks to fetch ahead of a reader ([`plan`]
//! along a segment, [`blocks_in`] for a byte range the store names; both pure), the queue of
//! blocks to fetch ahead ([`AheadQueue`]) and the set of blocks being fetched ([`Inflight`]),
//! so that a reader needing a block already on its way waits for it instead of sending a
//! second GET.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::blockcache::Key;

/// Blocks fetched ahead of a sequential reader, at most (parallel ranged GETs; 64 MiB).
pub const READAHEAD_BLOCKS: u64 = 64;

/// Blocks of a readahead under a cache bound of `cap` bytes: at most a quarter of the cache,
/// so that fetching ahead never pushes out what is being read.
pub fn window(cap: u64, block: u64) -> u64 {
    READAHEAD_BLOCKS.min(cap / 4 / block.max(1))
}

/// Blocks one file readahead ([`crate::backend::SegFile::prefetch`]) may ask for under a
/// cache bound of `cap` bytes: a quarter of the cache.
pub fn prefetch_limit(cap: u64, block: u64) -> usize {
    usize::try_from(cap / 4 / block.max(1)).unwrap_or(usize::MAX)
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

/// The blocks holding bytes `off..off + len` of a segment whose chunks (start -> length) are
/// `chunks`, in order: (chunk start, chunk length, block index). Bytes in no chunk (not
/// uploaded yet, or past the end) have no block.
pub fn blocks_in(
    chunks: &BTreeMap<u64, u64>,
    off: u64,
    len: u64,
    block: u64,
) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let end = off.saturating_add(len);
    if len == 0 || block == 0 {
        return out;
    }
    let first = chunks.range(..=off).next_back().map_or(off, |(s, _)| *s);
    for (&cs, &cl) in chunks.range(first..end) {
        let ce = cs.saturating_add(cl);
        if ce <= off || cl == 0 {
            continue;
        }
        let lo = off.max(cs) - cs;
        let hi = end.min(ce) - cs;
        for b in lo / block..=(hi - 1) / block {
            out.push((cs, cl, b));
        }
    }
    out
}

/// A block to fetch ahead: its key and the length of its chunk.
pub type Ahead = (Key, u64);

/// Workers serving the queue at once, at most, and the blocks each takes at a time (its
/// parallel GETs): 4 x 2 measured 19% faster than one worker taking 8, and 8 x 4 with a
/// 32-block window 16% faster again than 4 x 2 with 8, and 16 x 4 with 64 blocks 9% faster
/// than that (docs/benchmarks-s3.md): the local server answers one GET slowly (it streams in
/// 4 KiB reads), so more of them must be in flight to keep both of its cores and the daemon's
/// decompression busy.
pub const WORKERS: usize = 16;
pub const WORKER_BATCH: usize = 4;

/// Blocks queued at most; older requests go first when more arrive (the reader has moved on).
pub const MAX_QUEUED: usize = 256;

/// Blocks to fetch ahead of readers, taken in order by up to [`WORKERS`] workers.
#[derive(Default)]
pub struct AheadQueue {
    /// The blocks, and how many workers are serving them.
    q: Mutex<(VecDeque<Ahead>, usize)>,
    /// Set by [`AheadQueue::close`]: nothing is queued any more.
    closed: std::sync::atomic::AtomicBool,
    /// Notified when the last worker stops (the queue is empty and nothing is being fetched
    /// ahead any more).
    idle: Condvar,
}

impl AheadQueue {
    fn lock(&self) -> MutexGuard<'_, (VecDeque<Ahead>, usize)> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `items` (those queued already once). Returns whether the caller must start a
    /// worker (something new was queued and fewer than [`WORKERS`] run; it now counts as
    /// running).
    pub fn push(&self, items: &[Ahead]) -> bool {
        let mut g = self.lock();
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let mut added = false;
        for it in items {
            if !g.0.iter().any(|q| q.0 == it.0) {
                g.0.push_back(*it);
                added = true;
            }
        }
        while g.0.len() > MAX_QUEUED {
            g.0.pop_front();
        }
        let start = added && g.1 < WORKERS;
        if start {
            g.1 += 1;
        }
        start
    }

    /// Up to `n` blocks for a worker; none when the queue is empty, and that worker then
    /// counts as stopped (a later [`AheadQueue::push`] starts another).
    pub fn take(&self, n: usize) -> Vec<Ahead> {
        let mut g = self.lock();
        let k = n.min(g.0.len());
        let out: Vec<Ahead> = g.0.drain(..k).collect();
        if out.is_empty() {
            g.1 = g.1.saturating_sub(1);
            if g.1 == 0 {
                self.idle.notify_all();
            }
        }
        out
    }

    /// Stops fetching ahead for good: drops the queued blocks, refuses new ones, and waits (at
    /// most `timeout`) for the fetches under way; whether they ended. Called before the store
    /// closes, so that no worker writes into the cache directory once the store released it
    /// (a next mount may already use that directory).
    pub fn close(&self, timeout: std::time::Duration) -> bool {
        {
            let mut g = self.lock();
            self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            g.0.clear();
        }
        self.wait_idle(timeout)
    }

    /// The worker could not be started: the next push tries again.
    pub fn abandon(&self) {
        let mut g = self.lock();
        g.1 = g.1.saturating_sub(1);
        if g.1 == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until no worker runs (so every block queued so far was fetched, or its fetch
    /// failed), for at most `timeout`; whether that happened.
    pub fn wait_idle(&self, timeout: std::time::Duration) -> bool {
        let g = self.lock();
        let (g, _) = self
            .idle
            .wait_timeout_while(g, timeout, |g| g.1 > 0)
            .unwrap_or_else(|p| p.into_inner());
        g.1 == 0
    }

    /// Blocks queued now.
    pub fn len(&self) -> usize {
        self.lock().0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
    fn blocks_in_a_range_are_those_of_the_chunks_holding_it() {
        let c = chunks(&[(0, 25), (25, 10), (40, 5)]);
        assert_eq!(blocks_in(&c, 0, 1, 10), vec![(0, 25, 0)]);
        assert_eq!(
            blocks_in(&c, 9, 20, 10),
            vec![(0, 25, 0), (0, 25, 1), (0, 25, 2), (25, 10, 0)]
        );
        assert_eq!(blocks_in(&c, 24, 2, 10), vec![(0, 25, 2), (25, 10, 0)]);
        assert_eq!(blocks_in(&c, 35, 5, 10), vec![], "a gap holds no block");
        assert_eq!(blocks_in(&c, 36, 100, 10), vec![(40, 5, 0)]);
        assert_eq!(blocks_in(&c, 45, 100, 10), vec![], "past the end");
        assert_eq!(blocks_in(&c, 3, 0, 10), vec![]);
        assert_eq!(blocks_in(&c, u64::MAX - 1, u64::MAX, 10), vec![]);
        assert_eq!(blocks_in(&BTreeMap::new(), 0, 100, 10), vec![]);
    }

    /// Against a model: every byte of the range that some chunk holds is in one listed block,
    /// and every listed block holds some byte of the range.
    #[test]
    fn blocks_in_matches_a_byte_model() {
        let c = chunks(&[(0, 7), (7, 13), (20, 3), (30, 11), (41, 1)]);
        let block = 4;
        for off in 0..45u64 {
            for len in 0..20u64 {
                let got = blocks_in(&c, off, len, block);
                let mut want = Vec::new();
                for x in off..off + len {
                    if let Some((&cs, &cl)) = c.range(..=x).next_back() {
                        if x < cs + cl {
                            let k = (cs, cl, (x - cs) / block);
                            if !want.contains(&k) {
                                want.push(k);
                            }
                        }
                    }
                }
                assert_eq!(got, want, "off {off} len {len}");
            }
        }
    }

    #[test]
    fn the_queue_starts_up_to_its_workers_drops_the_oldest_and_stops_when_empty() {
        let q = AheadQueue::default();
        let a = |b: u64| ((1, 0, b), 100);
        assert!(q.push(&[a(0), a(1)]), "the first push starts a worker");
        assert!(!q.push(&[a(1)]), "nothing new queued: no second worker");
        for i in 1..WORKERS {
            assert!(q.push(&[a(1 + i as u64)]), "worker {} of {WORKERS}", i + 1);
        }
        let w = WORKERS as u64;
        assert!(!q.push(&[a(w + 1)]), "never more than {WORKERS} at once");
        assert_eq!(q.len(), WORKERS + 2, "a block is queued once");
        let all: Vec<Ahead> = (0..w + 2).map(a).collect();
        assert_eq!(q.take(WORKERS + 1), all[..WORKERS + 1]);
        assert_eq!(q.take(2), all[WORKERS + 1..]);
        // Each worker finds the queue empty and stops.
        for _ in 0..WORKERS {
            assert_eq!(q.take(2), vec![]);
        }
        assert!(
            q.wait_idle(std::time::Duration::ZERO),
            "no worker left: idle"
        );
        assert!(q.push(&[a(3)]), "so the next push starts one again");
        assert!(!q.wait_idle(std::time::Duration::ZERO), "a worker runs");
        q.abandon();
        assert!(
            q.push(&[a(4)]),
            "an abandoned worker is started by the next push"
        );
        let many: Vec<Ahead> = (0..MAX_QUEUED as u64 + 10).map(a).collect();
        q.push(&many);
        assert_eq!(q.len(), MAX_QUEUED);
        assert_eq!(q.take(1), vec![a(10)], "the oldest went first");
    }

    #[test]
    fn a_closed_queue_takes_nothing_and_waits_for_its_workers() {
        let q = AheadQueue::default();
        let a = |b: u64| ((1, 0, b), 4 << 20);
        assert!(q.push(&[a(0), a(1)]), "a worker starts");
        assert!(
            !q.close(std::time::Duration::from_millis(10)),
            "the worker still runs"
        );
        assert!(q.is_empty(), "the queued blocks are dropped");
        assert!(!q.push(&[a(2)]), "no worker starts once closed");
        assert!(q.is_empty());
        assert!(
            q.take(2).is_empty(),
            "the running worker finds nothing and stops"
        );
        assert!(q.close(std::time::Duration::from_millis(10)));
    }

    #[test]
    fn the_window_is_bounded_by_the_cache() {
        assert_eq!(window(1 << 30, 1 << 20), READAHEAD_BLOCKS);
        assert_eq!(window(3 << 20, 1 << 20), 0);
        assert_eq!(window(8 << 20, 1 << 20), 2);
        assert_eq!(window(0, 0), 0);
        assert_eq!(prefetch_limit(1 << 30, 1 << 20), 256);
        assert_eq!(prefetch_limit(3 << 20, 1 << 20), 0);
        assert_eq!(prefetch_limit(8 << 20, 1 << 20), 2);
        assert_eq!(prefetch_limit(0, 0), 0);
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
