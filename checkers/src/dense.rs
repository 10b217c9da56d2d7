//! A map from integer keys that stores dense keys in a vector. Offsets start at zero and grow
//! one by one, and workloads write values from a counter, so the analyses' two big maps (offset
//! to value, value to what is known of it) are nearly always dense: indexing a vector instead of
//! hashing keeps neighbouring offsets in neighbouring memory, which is what makes checking
//! millions of ops fast. Keys that would leave the vector mostly empty (negative, huge, sparse)
//! go to a hash map, so no input can make the vector blow up.

use rustc_hash::FxHashMap;

/// Keys below this always fit in the vector, whatever the number of entries.
const SLACK: usize = 4096;

#[derive(Debug, Clone)]
pub(crate) struct DenseMap<V> {
    dense: Vec<Option<V>>,
    sparse: FxHashMap<i64, V>,
    len: usize,
}

impl<V> Default for DenseMap<V> {
    fn default() -> Self {
        DenseMap {
            dense: Vec::new(),
            sparse: FxHashMap::default(),
            len: 0,
        }
    }
}

impl<V> DenseMap<V> {
    pub(crate) fn get(&self, key: i64) -> Option<&V> {
        match usize::try_from(key) {
            Ok(i) if i < self.dense.len() => self.dense[i].as_ref(),
            _ => self.sparse.get(&key),
        }
    }

    pub(crate) fn get_mut(&mut self, key: i64) -> Option<&mut V> {
        match usize::try_from(key) {
            Ok(i) if i < self.dense.len() => self.dense[i].as_mut(),
            _ => self.sparse.get_mut(&key),
        }
    }

    /// The entry for `key`, inserted with `make` when absent.
    pub(crate) fn get_or_insert_with(&mut self, key: i64, make: impl FnOnce() -> V) -> &mut V {
        let index = usize::try_from(key).ok().filter(|&i| self.fits(i));
        match index {
            Some(i) => {
                if i >= self.dense.len() {
                    self.grow(i);
                }
                let slot = &mut self.dense[i];
                if slot.is_none() {
                    self.len += 1;
                }
                slot.get_or_insert_with(make)
            }
            None => {
                let len = &mut self.len;
                self.sparse.entry(key).or_insert_with(|| {
                    *len += 1;
                    make()
                })
            }
        }
    }

    /// Makes room in the vector for keys up to `max`, when `count` keys are about to arrive
    /// in no particular order and would keep it about half full. Without this, keys arriving
    /// out of order (values of one partition after another) would first go to the hash map and
    /// then be moved, over and over, as the vector grows.
    pub(crate) fn reserve_for(&mut self, max: i64, count: usize) {
        if let Ok(max) = usize::try_from(max) {
            let limit = 2 * (self.len + count) + SLACK;
            if max >= self.dense.len() && max < limit {
                // A little headroom: the keys that come later (values sent after the ones in
                // the final log) would otherwise double the vector for a handful of entries.
                self.grow((max + max / 8).min(limit - 1));
            }
        }
    }

    /// Whether index `i` belongs in the vector: it does while the vector stays about half full.
    fn fits(&self, i: usize) -> bool {
        i < self.dense.len() || i < 2 * self.len + SLACK
    }

    /// Grows the vector to cover index `i` (at least doubling it, never past what `fits`
    /// allows) and moves the entries it now covers out of the hash map.
    fn grow(&mut self, i: usize) {
        let old = self.dense.len();
        let new = (2 * old).min(2 * self.len + SLACK).max(i + 1);
        self.dense.reserve_exact(new - old);
        self.dense.resize_with(new, || None);
        if self.sparse.is_empty() {
            return;
        }
        let moving: Vec<i64> = self
            .sparse
            .keys()
            .copied()
            .filter(|&k| usize::try_from(k).is_ok_and(|k| (old..new).contains(&k)))
            .collect();
        for k in moving {
            self.dense[k as usize] = self.sparse.remove(&k);
        }
    }

    /// Every entry, dense keys first in key order, then the others in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i64, &V)> {
        let dense = self
            .dense
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i as i64, v.as_ref()?)));
        dense.chain(self.sparse.iter().map(|(&k, v)| (k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_keys_behave_alike() {
        let mut m = DenseMap::default();
        let keys = [0, 5, -3, 1 << 40, 4095, 9000, i64::MIN, i64::MAX, 3];
        for (n, &k) in keys.iter().enumerate() {
            *m.get_or_insert_with(k, || 0) += n as i64 + 1;
        }
        for (n, &k) in keys.iter().enumerate() {
            assert_eq!(m.get(k), Some(&(n as i64 + 1)), "key {k}");
        }
        *m.get_mut(-3).unwrap() = 100;
        assert_eq!(m.get(-3), Some(&100));
        assert_eq!(m.get(7), None);
        let mut all: Vec<i64> = m.iter().map(|(k, _)| k).collect();
        all.sort_unstable();
        let mut expect = keys.to_vec();
        expect.sort_unstable();
        assert_eq!(all, expect);
    }

    #[test]
    fn sparse_keys_move_into_the_vector_as_it_grows() {
        let mut m = DenseMap::default();
        m.get_or_insert_with(10_000, || 1);
        assert!(m.dense.len() < 10_000);
        for k in 0..10_000 {
            m.get_or_insert_with(k, || 0);
        }
        assert!(m.dense.len() > 10_000);
        assert!(m.sparse.is_empty());
        assert_eq!(m.get(10_000), Some(&1));
        assert_eq!(m.iter().count(), 10_001);
    }

    #[test]
    fn reserved_keys_go_straight_to_the_vector() {
        let mut m = DenseMap::default();
        m.reserve_for(99_999, 100_000);
        for k in (0..100_000).rev() {
            m.get_or_insert_with(k, || k);
        }
        assert!(m.sparse.is_empty());
        assert_eq!(m.get(77), Some(&77));
        let mut sparse = DenseMap::<i64>::default();
        sparse.reserve_for(1 << 40, 10);
        assert!(sparse.dense.is_empty());
    }

    #[test]
    fn huge_keys_do_not_grow_the_vector() {
        let mut m = DenseMap::default();
        for k in 0..100 {
            m.get_or_insert_with(k * 1_000_000, || k);
        }
        assert!(m.dense.len() <= 2 * 100 + SLACK);
        assert_eq!(m.get(99_000_000), Some(&99));
    }
}
