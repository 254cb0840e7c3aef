//! The small top-k tracker that sits beside each sketch: the k keys with the largest estimates,
//! found by hash in a little open-addressed table, plus what a window needs per key.
//!
//! An entry remembers `base`, an upper bound on the key's counter when the window started:
//! exact for a key tracked across the boundary (its halved estimate), and `estimate - 1` for a
//! key admitted mid-window. So `estimate - base` never over-counts the window (collisions
//! aside), and `estimate - f * base` is a sliding-window count that is exact in steady state
//! (the counter then reads `rate * (1 + f)` at fraction `f` of a window, and `base = rate`).

/// One tracked key.
#[derive(Debug)]
pub struct Entry {
    pub hash: u64,
    pub key: Vec<u8>,
    pub estimate: u32,
    pub base: u32,
    /// The sliding count at which this thread next tells the aggregator about the key.
    pub next_report: u32,
    /// The estimate below which the sliding count cannot have reached `next_report`.
    pub gate: u32,
}

impl Entry {
    /// Occurrences inside the current window (a lower bound).
    pub fn window_count(&self) -> u32 {
        self.estimate.saturating_sub(self.base)
    }

    /// Occurrences over the last window length, at fraction `f` of the current window.
    pub fn sliding_count(&self, f: f64) -> f64 {
        self.estimate as f64 - f.clamp(0.0, 1.0) * self.base as f64
    }
}

pub struct TopK {
    cap: usize,
    entries: Vec<Entry>,
    /// The entries' estimates again, dense, so finding the minimum is a short vector scan.
    ests: Vec<u32>,
    /// Slot -> entry index + 1; 0 is empty. Linear probing, backward-shift deletion.
    slots: Box<[u16]>,
    mask: usize,
    /// When full, the smallest estimate held; a key must beat it to get in. 0 otherwise.
    floor: u32,
    min_idx: usize,
    /// Indices of the entries that may be the minimum: after a full scan, the `LOW` smallest;
    /// every entry whose estimate is below `low_bound` is in this list (estimates only grow
    /// between scans, and an admitted key below the bound joins it). So the minimum of the
    /// list is the minimum of all while it is at most `low_bound`, and finding the floor after
    /// an eviction costs `LOW` comparisons, not `cap` (a full scan per eviction took a fifth
    /// of the proxy's CPU with 8192 keys tracked over a uniform keyspace).
    low: Vec<u32>,
    low_bound: u32,
    scratch: Vec<(u32, u32)>,
    /// `next_report` given to keys admitted in this window.
    first_report: u32,
}

/// Candidates for the minimum kept after a full scan.
const LOW: usize = 64;

pub enum Offer {
    /// The key is tracked (already, or admitted now) at this index.
    Tracked(usize),
    Rejected,
}

impl TopK {
    pub fn new(cap: usize) -> Self {
        let cap = cap.clamp(1, super::MAX_TOP_K);
        let size = (cap * 2).next_power_of_two().max(16);
        TopK {
            cap,
            entries: Vec::with_capacity(cap),
            ests: Vec::with_capacity(cap),
            slots: vec![0u16; size].into_boxed_slice(),
            mask: size - 1,
            floor: 0,
            min_idx: 0,
            low: Vec::new(),
            low_bound: 0,
            scratch: Vec::new(),
            first_report: u32::MAX,
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Changes how many keys are tracked, keeping the hottest of those tracked now (with
    /// their window state). Called between windows, when the wanted depth changes.
    pub fn resize(&mut self, cap: usize) {
        let mut next = TopK::new(cap);
        next.first_report = self.first_report;
        let mut entries = std::mem::take(&mut self.entries);
        entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.estimate));
        entries.truncate(next.cap);
        for (i, e) in entries.into_iter().enumerate() {
            next.ests.push(e.estimate);
            next.insert_slot(e.hash, i);
            next.entries.push(e);
        }
        if next.entries.len() == next.cap {
            next.scan_floor();
        }
        *self = next;
    }

    pub fn set_first_report(&mut self, level: u32) {
        self.first_report = level;
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn entry_mut(&mut self, i: usize) -> &mut Entry {
        &mut self.entries[i]
    }

    /// Heap bytes held, keys included.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.entries.iter().map(|e| e.key.capacity()).sum::<usize>()
            + self.ests.capacity() * std::mem::size_of::<u32>()
            + self.slots.len() * std::mem::size_of::<u16>()
    }

    /// Records the key's fresh estimate. Cheap when the key is cold: one comparison.
    #[inline]
    pub fn offer(&mut self, hash: u64, key: &[u8], estimate: u32) -> Offer {
        // A tracked key's estimate only grows within a window, so it is >= the floor:
        // anything below the floor is neither tracked nor admissible.
        if estimate < self.floor {
            return Offer::Rejected;
        }
        if let Some(i) = self.find(hash) {
            self.entries[i].estimate = estimate;
            self.ests[i] = estimate;
            if i == self.min_idx && self.entries.len() == self.cap {
                self.refresh_floor();
            }
            return Offer::Tracked(i);
        }
        self.admit(hash, key, estimate)
    }

    #[inline(never)]
    fn admit(&mut self, hash: u64, key: &[u8], estimate: u32) -> Offer {
        if self.entries.len() < self.cap {
            let i = self.entries.len();
            self.entries
                .push(Entry::new(hash, key, estimate, self.first_report));
            self.ests.push(estimate);
            self.insert_slot(hash, i);
            if self.entries.len() == self.cap {
                self.scan_floor();
            }
            return Offer::Tracked(i);
        }
        if estimate <= self.floor {
            return Offer::Rejected;
        }
        let i = self.min_idx;
        let old = self.entries[i].hash;
        self.remove_slot(old);
        // Reuse the evicted key's buffer: a churning boundary should not churn the allocator.
        let e = &mut self.entries[i];
        e.key.clear();
        e.key.extend_from_slice(key);
        e.hash = hash;
        e.reset(estimate, self.first_report);
        self.ests[i] = estimate;
        self.insert_slot(hash, i);
        // Entry i was the minimum, so it is in `low`; it stays there only if it is still
        // below the bound.
        if estimate >= self.low_bound {
            if let Some(p) = self.low.iter().position(|&j| j as usize == i) {
                self.low.swap_remove(p);
            }
        }
        self.refresh_floor();
        Offer::Tracked(i)
    }

    /// Applies the sketch's decay and starts a new window: estimates halve `times` times and
    /// become the exact base of the next window. Keys decayed to nothing leave.
    pub fn roll(&mut self, times: u64, first_report: u32) {
        self.first_report = first_report;
        let shift = times.min(32) as u32;
        for e in &mut self.entries {
            e.estimate = e.estimate.checked_shr(shift).unwrap_or(0);
            e.base = e.estimate;
            e.next_report = first_report;
            e.gate = first_report;
        }
        for (est, e) in self.ests.iter_mut().zip(&self.entries) {
            *est = e.estimate;
        }
        if self.entries.iter().any(|e| e.estimate == 0) {
            self.entries.retain(|e| e.estimate > 0);
            self.ests.clear();
            self.ests.extend(self.entries.iter().map(|e| e.estimate));
            self.slots.fill(0);
            for i in 0..self.entries.len() {
                self.insert_slot(self.entries[i].hash, i);
            }
        }
        if self.entries.len() == self.cap {
            self.scan_floor();
        } else {
            self.floor = 0;
        }
    }

    #[inline]
    fn find(&self, hash: u64) -> Option<usize> {
        let mut pos = hash as usize & self.mask;
        loop {
            let s = self.slots[pos] as usize;
            if s == 0 {
                return None;
            }
            if self.entries[s - 1].hash == hash {
                return Some(s - 1);
            }
            pos = (pos + 1) & self.mask;
        }
    }

    fn insert_slot(&mut self, hash: u64, idx: usize) {
        let mut pos = hash as usize & self.mask;
        while self.slots[pos] != 0 {
            pos = (pos + 1) & self.mask;
        }
        self.slots[pos] = (idx + 1) as u16;
    }

    fn remove_slot(&mut self, hash: u64) {
        let mut pos = hash as usize & self.mask;
        loop {
            let s = self.slots[pos] as usize;
            if s == 0 {
                return;
            }
            if self.entries[s - 1].hash == hash {
                break;
            }
            pos = (pos + 1) & self.mask;
        }
        // Backward-shift: pull later members of the probe run into the hole.
        let mut hole = pos;
        let mut next = (hole + 1) & self.mask;
        loop {
            let s = self.slots[next] as usize;
            if s == 0 {
                break;
            }
            let home = self.entries[s - 1].hash as usize & self.mask;
            // Move it if its home is not within (hole, next].
            if (next.wrapping_sub(home) & self.mask) >= (next.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = self.slots[next];
                hole = next;
            }
            next = (next + 1) & self.mask;
        }
        self.slots[hole] = 0;
    }

    /// The minimum from the candidate list, or a full scan when the list cannot tell.
    #[inline(never)]
    fn refresh_floor(&mut self) {
        let best = self
            .low
            .iter()
            .map(|&j| (self.ests[j as usize], j as usize))
            .min();
        match best {
            Some((floor, i)) if floor <= self.low_bound => {
                self.floor = floor;
                self.min_idx = i;
            }
            _ => self.scan_floor(),
        }
    }

    /// Rebuilds the candidate list from all entries and takes the minimum.
    #[inline(never)]
    fn scan_floor(&mut self) {
        self.scratch.clear();
        self.scratch
            .extend(self.ests.iter().enumerate().map(|(i, &e)| (e, i as u32)));
        self.low.clear();
        if self.scratch.len() > LOW {
            self.scratch.select_nth_unstable(LOW);
            self.low_bound = self.scratch[LOW].0;
            self.scratch.truncate(LOW);
        } else {
            self.low_bound = u32::MAX;
        }
        self.low.extend(self.scratch.iter().map(|&(_, i)| i));
        let (floor, i) = self.scratch.iter().copied().min().unwrap_or((0, 0));
        self.floor = floor;
        self.min_idx = i as usize;
    }
}

impl Entry {
    fn new(hash: u64, key: &[u8], estimate: u32, next_report: u32) -> Self {
        let mut e = Entry {
            hash,
            key: key.to_vec(),
            estimate,
            base: 0,
            next_report,
            gate: next_report,
        };
        e.reset(estimate, next_report);
        e
    }

    /// A key admitted mid-window: only what it gets from now on counts towards this window.
    fn reset(&mut self, estimate: u32, next_report: u32) {
        self.estimate = estimate;
        self.base = estimate.saturating_sub(1);
        self.next_report = next_report;
        self.gate = next_report;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hotkey::sketch::{hash_key, CountMin};
    use std::collections::HashMap;

    fn feed(top: &mut TopK, cm: &mut CountMin, key: &[u8]) {
        let h = hash_key(key);
        let est = cm.add(h.mixed);
        top.offer(h.hash, key, est);
    }

    #[test]
    fn finds_the_heavy_hitters_among_a_long_tail() {
        let (mut top, mut cm) = (TopK::new(64), CountMin::new());
        let mut exact: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut x = 12345u64;
        for n in 0..300_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // 20 heavy keys get half the traffic; the rest is spread over 200k keys.
            let key = if n % 2 == 0 {
                format!("heavy:{}", (x >> 33) % 20)
            } else {
                format!("tail:{}", (x >> 33) % 200_000)
            };
            feed(&mut top, &mut cm, key.as_bytes());
            *exact.entry(key.into_bytes()).or_default() += 1;
        }
        for i in 0..20 {
            let key = format!("heavy:{i}").into_bytes();
            let e = top.entries().iter().find(|e| *e.key == key[..]);
            let e = e.unwrap_or_else(|| panic!("heavy:{i} not tracked"));
            assert!(e.estimate >= exact[&key]);
            assert!(e.estimate - exact[&key] < 50, "estimate too high");
        }
    }

    #[test]
    fn resizing_keeps_the_hottest_keys_findable_and_admits_more() {
        let (mut top, mut cm) = (TopK::new(16), CountMin::new());
        // key i is seen i + 1 times: the 16 tracked are the hottest 16 of 64.
        for i in 0..64u32 {
            for _ in 0..=i {
                feed(&mut top, &mut cm, format!("k{i}").as_bytes());
            }
        }
        top.resize(8);
        assert_eq!(top.len(), 8);
        for i in 56..64u32 {
            let h = hash_key(format!("k{i}").as_bytes());
            assert!(top.find(h.hash).is_some(), "k{i} kept");
        }
        top.resize(256);
        assert_eq!(top.cap(), 256);
        for i in 0..64u32 {
            feed(&mut top, &mut cm, format!("k{i}").as_bytes());
        }
        assert_eq!(top.len(), 64, "room for every key after growing");
        for (i, e) in top.entries().iter().enumerate() {
            assert_eq!(top.find(e.hash), Some(i));
        }
    }

    #[test]
    fn eviction_keeps_the_table_consistent() {
        let mut top = TopK::new(8);
        for i in 0..10_000u32 {
            let key = i.to_le_bytes();
            // Rising estimates force an eviction on every offer once full.
            top.offer(
                u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                &key,
                i + 1,
            );
        }
        assert_eq!(top.len(), 8);
        for e in top.entries() {
            assert!(top.find(e.hash).is_some());
            assert!(e.estimate > 9_992);
        }
    }

    #[test]
    fn window_count_of_a_key_tracked_across_the_boundary_is_exact() {
        let (mut top, mut cm) = (TopK::new(4), CountMin::new());
        for _ in 0..100 {
            feed(&mut top, &mut cm, b"k");
        }
        cm.halve(1);
        top.roll(1, 10);
        assert_eq!(top.entries()[0].base, 50);
        for _ in 0..30 {
            feed(&mut top, &mut cm, b"k");
        }
        let e = &top.entries()[0];
        assert_eq!(e.window_count(), 30);
        assert_eq!(e.next_report, 10);
        // Steady state at 30 per window would read base 30; here the sliding count blends
        // the last window's 50 with this one's 30.
        assert!((e.sliding_count(0.5) - 55.0).abs() < 1e-9);
    }

    #[test]
    fn the_floor_is_always_the_smallest_estimate() {
        // The candidate list must give the exact minimum whatever the mix of growing tracked
        // keys, admissions below and above its bound, and rolls.
        let mut top = TopK::new(300);
        let mut est: HashMap<u64, u32> = HashMap::new();
        let mut x = 99u64;
        for n in 0..200_000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = (x >> 33) % 2_000;
            let e = est.entry(key).or_default();
            *e += 1 + (x >> 60) as u32 % 3;
            top.offer(
                key.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                &key.to_le_bytes(),
                *e,
            );
            if top.len() == top.cap {
                let min = top.entries().iter().map(|e| e.estimate).min();
                assert_eq!(Some(top.floor), min, "after {n} offers");
                assert_eq!(top.entries()[top.min_idx].estimate, top.floor);
            }
            if n % 50_000 == 49_999 {
                top.roll(1, 1);
                est.values_mut().for_each(|v| *v /= 2);
            }
        }
    }

    #[test]
    fn tracks_as_many_keys_as_the_rules_allow() {
        // The rules accept top_k up to MAX_TOP_K; the tracker must hold that many (it once
        // stopped at 1024 without a word).
        let cap = crate::hotkey::MAX_TOP_K;
        let mut top = TopK::new(cap);
        for i in 0..cap as u64 + 100 {
            top.offer(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), &i.to_le_bytes(), 5);
        }
        assert_eq!(top.len(), cap);
        for e in top.entries() {
            assert!(top.find(e.hash).is_some());
        }
    }

    #[test]
    fn keys_that_decay_to_nothing_leave() {
        let mut top = TopK::new(4);
        top.offer(1, b"a", 3);
        top.offer(2, b"b", 100);
        top.roll(2, 1);
        assert_eq!(top.len(), 1);
        assert_eq!(&*top.entries()[0].key, b"b");
        assert!(top.find(2).is_some() && top.find(1).is_none());
    }
}
