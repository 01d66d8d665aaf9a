//! Blocks just fetched from the bucket, held in memory until they are read to their end (or
//! pushed out by newer ones, oldest first): the block cache writes its files with O_DIRECT, so
//! a sequential reader, which reads a block right after its fetch, takes it from here and not
//! from the disk. The bookkeeping is pure and tested alone; [`super::blockcache::BlockCache`]
//! holds one behind a lock.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::blockcache::Key;

/// Blocks held at most: the readahead's window (the blocks fetched ahead of a reader) and 8
/// more (those it is reading, its own misses).
pub fn capacity(window_blocks: u64) -> usize {
    usize::try_from(window_blocks.saturating_add(8)).unwrap_or(usize::MAX)
}

/// Fetched blocks in memory, oldest first out past `cap` entries.
#[derive(Debug, Default)]
pub struct Fresh {
    blocks: HashMap<Key, Bytes>,
    order: VecDeque<Key>,
    cap: usize,
}

impl Fresh {
    pub fn new(cap: usize) -> Fresh {
        Fresh {
            cap,
            ..Fresh::default()
        }
    }

    /// Holds `data` as block `k` (replacing an older copy), dropping the oldest past the bound.
    pub fn insert(&mut self, k: Key, data: Bytes) {
        if self.cap == 0 {
            return;
        }
        if self.blocks.insert(k, data).is_none() {
            self.order.push_back(k);
        }
        while self.blocks.len() > self.cap {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.blocks.remove(&old);
        }
    }

    pub fn get(&self, k: Key) -> Option<Bytes> {
        self.blocks.get(&k).cloned()
    }

    pub fn contains(&self, k: Key) -> bool {
        self.blocks.contains_key(&k)
    }

    pub fn remove(&mut self, k: Key) {
        if self.blocks.remove(&k).is_some() {
            self.order.retain(|o| *o != k);
        }
    }

    /// Drops every block of segment `seg` (deleted by GC).
    pub fn remove_segment(&mut self, seg: u64) {
        self.blocks.retain(|k, _| k.0 != seg);
        self.order.retain(|k| k.0 != seg);
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.blocks.values().map(|b| b.len() as u64).sum()
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn b(n: u8) -> Bytes {
        Bytes::from(vec![n; 4])
    }

    #[test]
    fn the_oldest_block_goes_first_past_the_bound() {
        let mut f = Fresh::new(2);
        f.insert((1, 0, 0), b(0));
        f.insert((1, 0, 1), b(1));
        f.insert((1, 0, 0), b(9)); // replaced, not reordered, not counted twice
        assert_eq!(f.len(), 2);
        assert_eq!(f.get((1, 0, 0)).unwrap()[0], 9);
        f.insert((1, 0, 2), b(2));
        assert!(!f.contains((1, 0, 0)), "oldest out");
        assert!(f.contains((1, 0, 1)) && f.contains((1, 0, 2)));
        assert_eq!(f.bytes(), 8);
    }

    #[test]
    fn removed_blocks_leave_no_trace_in_the_order() {
        let mut f = Fresh::new(2);
        for i in 0..100 {
            f.insert((1, 0, i), b(i as u8));
            f.remove((1, 0, i));
        }
        assert!(f.is_empty());
        assert!(f.order.is_empty());
        f.insert((2, 0, 0), b(0));
        f.insert((3, 0, 0), b(0));
        f.insert((2, 0, 1), b(0));
        f.remove_segment(2);
        assert_eq!(f.len(), 1);
        assert_eq!(f.order.len(), 1);
        assert!(f.contains((3, 0, 0)));
    }

    #[test]
    fn a_zero_bound_holds_nothing_and_capacity_has_a_floor() {
        let mut f = Fresh::new(0);
        f.insert((1, 0, 0), b(0));
        assert!(f.is_empty());
        assert_eq!(capacity(0), 8);
        assert_eq!(capacity(64), 72);
        assert_eq!(capacity(u64::MAX), usize::MAX);
    }
}
