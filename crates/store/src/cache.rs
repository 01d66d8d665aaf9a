//! A bounded LRU cache of decompressed extents, keyed by extent id (ids are never reused and an
//! extent's content never changes, so entries never go stale; GC moves bytes, not content).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub(crate) struct Lru {
    cap: usize,
    used: usize,
    tick: u64,
    map: HashMap<u64, (Arc<Vec<u8>>, u64)>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    pub(crate) fn new(cap: usize) -> Lru {
        Lru {
            cap,
            used: 0,
            tick: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub(crate) fn get(&mut self, id: u64) -> Option<Arc<Vec<u8>>> {
        self.tick += 1;
        let tick = self.tick;
        let (v, t) = self.map.get_mut(&id)?;
        self.order.remove(t);
        *t = tick;
        self.order.insert(tick, id);
        Some(v.clone())
    }

    /// Whether `id` is cached; a hit counts as a use for the LRU order.
    pub(crate) fn contains(&mut self, id: u64) -> bool {
        self.get(id).is_some()
    }

    pub(crate) fn insert(&mut self, id: u64, v: Arc<Vec<u8>>) {
        if v.len() > self.cap {
            return;
        }
        self.remove(id);
        self.tick += 1;
        self.used += v.len();
        self.order.insert(self.tick, id);
        self.map.insert(id, (v, self.tick));
        while self.used > self.cap {
            let Some((&t, &old)) = self.order.iter().next() else {
                break;
            };
            self.order.remove(&t);
            if let Some((v, _)) = self.map.remove(&old) {
                self.used -= v.len();
            }
        }
    }

    pub(crate) fn remove(&mut self, id: u64) {
        if let Some((v, t)) = self.map.remove(&id) {
            self.used -= v.len();
            self.order.remove(&t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recent_within_bound() {
        let mut c = Lru::new(100);
        c.insert(1, Arc::new(vec![0; 40]));
        c.insert(2, Arc::new(vec![0; 40]));
        assert!(c.get(1).is_some());
        c.insert(3, Arc::new(vec![0; 40]));
        assert!(c.get(2).is_none());
        assert!(c.get(1).is_some() && c.get(3).is_some());
        assert!(c.used <= 100);
        c.insert(4, Arc::new(vec![0; 101]));
        assert!(c.get(4).is_none());
    }
}
