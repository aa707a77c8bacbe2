//! Wire-order bookkeeping shared by marshal and unmarshal: which attributes an object has named,
//! whether a map's keys repeat, and putting entries that arrived out of order back in order.
//! (The Python backend does the same with a dict per container and `sorted()`.)

use std::cmp::Ordering;
use std::collections::HashSet;
use std::hash::Hash;

/// A byte range in an output buffer.
pub type Span = (usize, usize);

/// Which attributes of an object (by index in its sorted names) have been named so far: one
/// `u128` for the objects real schemas have, a `Vec<bool>` beyond 128 attributes.
pub struct AttrSet {
    small: u128,
    large: Vec<bool>,
}

impl AttrSet {
    pub fn new(n: usize) -> Self {
        AttrSet { small: 0, large: if n > 128 { vec![false; n] } else { Vec::new() } }
    }

    /// Marks `i`; true if it was already marked.
    #[inline]
    pub fn test_set(&mut self, i: usize) -> bool {
        if self.large.is_empty() {
            let bit = 1u128 << i;
            let was = self.small & bit != 0;
            self.small |= bit;
            was
        } else {
            std::mem::replace(&mut self.large[i], true)
        }
    }
}

/// A map's entries in arrival order, each a key and its span in the output. Keys usually arrive
/// sorted (state JSON and go-cty both write them so): a repeat is then caught by comparing with
/// the last key alone, and a hash set of the keys is built only from the first key out of order.
pub struct MapEntries<K> {
    entries: Vec<(K, Span)>,
    keyset: Option<HashSet<K>>,
}

impl<K: Clone + Eq + Hash + Ord> MapEntries<K> {
    pub fn new() -> Self {
        MapEntries { entries: Vec::new(), keyset: None }
    }

    /// Whether `key` repeats an earlier key (checked before its value is written).
    #[inline]
    pub fn is_duplicate(&mut self, key: &K) -> bool {
        if let Some(set) = &mut self.keyset {
            return !set.insert(key.clone());
        }
        let Some((last, _)) = self.entries.last() else {
            return false;
        };
        match key.cmp(last) {
            Ordering::Greater => false,
            Ordering::Equal => true,
            Ordering::Less => {
                let mut set: HashSet<K> = self.entries.iter().map(|(k, _)| k.clone()).collect();
                let duplicate = !set.insert(key.clone());
                self.keyset = Some(set);
                duplicate
            }
        }
    }

    #[inline]
    pub fn push(&mut self, key: K, span: Span) {
        self.entries.push((key, span));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries sorted by key when they did not arrive sorted; `None` when they did, and the
    /// output is already in wire order.
    pub fn unsorted(mut self) -> Option<Vec<(K, Span)>> {
        self.keyset.as_ref()?;
        self.entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Some(self.entries)
    }
}

impl<K: Clone + Eq + Hash + Ord> Default for MapEntries<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// Object attributes are written in sorted order as they arrive; when one arrives out of order,
/// what was written so far (from `region` on) moves to this side buffer with each attribute's
/// span, later values are added to it, and the object is assembled from it in sorted order.
pub struct Reordered {
    pub buf: Vec<u8>,
    spans: Vec<Option<Span>>,
}

impl Reordered {
    /// `spans` are those of attributes `0..spans.len()`, written in order from `region` on.
    pub fn start(out: &mut Vec<u8>, region: usize, spans: &[Span], n: usize) -> Self {
        let buf = out.split_off(region);
        let mut all = vec![None; n];
        for (slot, &(s, e)) in all.iter_mut().zip(spans) {
            *slot = Some((s - region, e - region));
        }
        Reordered { buf, spans: all }
    }

    /// Records that attribute `i`'s value is `buf[span]`.
    pub fn set(&mut self, i: usize, span: Span) {
        self.spans[i] = Some(span);
    }

    /// Attribute `i`'s value, if the input named it.
    pub fn value(&self, i: usize) -> Option<&[u8]> {
        self.spans[i].map(|(s, e)| &self.buf[s..e])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_set_marks_once_below_and_beyond_128() {
        for n in [3, 128, 300] {
            let mut seen = AttrSet::new(n);
            assert!(!seen.test_set(0));
            assert!(!seen.test_set(n - 1));
            assert!(seen.test_set(n - 1));
            assert!(seen.test_set(0));
        }
    }

    #[test]
    fn map_entries_catch_repeats_sorted_or_not() {
        let mut m: MapEntries<&str> = MapEntries::new();
        for (i, k) in ["a", "b", "d"].into_iter().enumerate() {
            assert!(!m.is_duplicate(&k));
            m.push(k, (i, i + 1));
        }
        assert!(m.is_duplicate(&"d"));
        assert!(m.is_duplicate(&"a")); // out of order: found through the key set
        assert!(!m.is_duplicate(&"c"));
        m.push("c", (3, 4));
        let sorted = m.unsorted().expect("arrived unsorted");
        assert_eq!(sorted.iter().map(|e| e.0).collect::<Vec<_>>(), ["a", "b", "c", "d"]);
        assert_eq!(sorted[2].1, (3, 4));

        let mut in_order: MapEntries<&str> = MapEntries::new();
        in_order.push("x", (0, 1));
        assert!(!in_order.is_duplicate(&"y"));
        assert!(in_order.unsorted().is_none());
    }

    #[test]
    fn reordered_keeps_spans_relative_to_the_region() {
        let mut out = b"{AAbb".to_vec();
        let mut side = Reordered::start(&mut out, 1, &[(1, 3)], 3);
        assert_eq!(out, b"{");
        let s = side.buf.len();
        side.buf.extend_from_slice(b"cc");
        side.set(2, (s, side.buf.len()));
        assert_eq!(side.value(0), Some(&b"AA"[..]));
        assert_eq!(side.value(1), None);
        assert_eq!(side.value(2), Some(&b"cc"[..]));
    }
}
