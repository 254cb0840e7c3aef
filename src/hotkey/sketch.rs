//! The Count-Min sketch with conservative update, and the one hash per key that feeds both it
//! and the top-k tracker. Knows nothing of windows or threads.
//!
//! Row indexes. Each key is hashed once with xxh3 (seeded once per process, so nobody outside
//! can aim keys at one cell). The 64-bit result goes through one multiply-xorshift round (the
//! splitmix64 finaliser's first half, about one nanosecond) and the four rows take *disjoint*
//! 14-bit slices of the mixed value: bits 0..14, 14..28, 28..42 and 42..56. For a uniform hash
//! the four slices are independent, so two keys that collide in two rows collide in a third
//! with probability 2^-14. Double hashing (`h1 + i * h2`, what `probabilistic-collections`
//! does) fails exactly there: equal cells in rows 0 and 1 force `h1` and `h2` equal modulo
//! the width, hence equal cells in every row, and a cold key sharing two cells with a hot one
//! is reported hot. The extra mix makes every slice depend on all 64 bits of the xxh3 output
//! instead of on a fixed quarter of it, as insurance against structure in short-input paths;
//! `two_row_collisions_rarely_extend_to_a_third_row` measures the result.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

pub const ROWS: usize = 4;
pub const WIDTH_BITS: u32 = 14;
pub const WIDTH: usize = 1 << WIDTH_BITS;
const MASK: u64 = (WIDTH as u64) - 1;

/// Bytes of counters in one sketch (256 KiB).
pub const SKETCH_BYTES: usize = ROWS * WIDTH * std::mem::size_of::<u32>();

/// A key's identity inside the detector: the xxh3 hash and the mixed value the rows use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash {
    pub hash: u64,
    pub mixed: u64,
}

fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x5a17_5a4e);
        h.finish()
    })
}

#[inline]
pub fn hash_key(key: &[u8]) -> KeyHash {
    hash_with_seed(key, process_seed())
}

#[inline]
pub fn hash_with_seed(key: &[u8], seed: u64) -> KeyHash {
    let hash = xxhash_rust::xxh3::xxh3_64_with_seed(key, seed);
    KeyHash {
        hash,
        mixed: mix(hash),
    }
}

#[inline]
fn mix(h: u64) -> u64 {
    let m = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    m ^ (m >> 27)
}

/// The cell of `row` (0..4) for a mixed hash.
#[inline]
pub fn row_index(mixed: u64, row: usize) -> usize {
    ((mixed >> (row as u32 * WIDTH_BITS)) & MASK) as usize
}

/// Four rows of 2^14 `u32` counters.
pub struct CountMin {
    rows: Box<[[u32; WIDTH]; ROWS]>,
}

impl Default for CountMin {
    fn default() -> Self {
        Self::new()
    }
}

impl CountMin {
    pub fn new() -> Self {
        // Built on the heap: a 256 KiB array literal would pass through the stack first.
        let flat = vec![[0u32; WIDTH]; ROWS].into_boxed_slice();
        let rows: Box<[[u32; WIDTH]; ROWS]> = match flat.try_into() {
            Ok(rows) => rows,
            Err(_) => unreachable!("vec has exactly ROWS rows"),
        };
        CountMin { rows }
    }

    /// Asks the CPU to bring the four cells of `mixed` into cache, without waiting for
    /// them. In the proxy the sketch is rarely in cache when a command comes (the request
    /// path touches far more memory than the sketch), and `perf annotate` put 80% of
    /// `observe`'s time on the four loads; `Local::observe` therefore prefetches a key's
    /// cells one observation before it counts them.
    #[inline]
    pub fn prefetch(&self, mixed: u64) {
        #[cfg(target_arch = "x86_64")]
        for row in 0..ROWS {
            let cell: *const u32 = &self.rows[row][row_index(mixed, row)];
            // A prefetch is a hint: it never faults and changes no memory.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    cell as *const i8,
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = mixed;
    }

    /// Counts one occurrence and returns the key's new estimate.
    ///
    /// Conservative update: only the cells holding the minimum move, and only up to
    /// `min + 1`, so a cell shared with a hot key is not pushed further by a cold one.
    #[cfg(test)]
    pub fn add(&mut self, mixed: u64) -> u32 {
        self.add_weighted(mixed, 1)
    }

    /// Counts `w` occurrences at once (a weighted observation), conservatively: the cells
    /// below `min + w` rise to it, the others stay.
    #[inline]
    pub fn add_weighted(&mut self, mixed: u64, w: u32) -> u32 {
        let i = [
            row_index(mixed, 0),
            row_index(mixed, 1),
            row_index(mixed, 2),
            row_index(mixed, 3),
        ];
        let r = &mut *self.rows;
        let c = [r[0][i[0]], r[1][i[1]], r[2][i[2]], r[3][i[3]]];
        let new = c[0].min(c[1]).min(c[2].min(c[3])).saturating_add(w);
        r[0][i[0]] = c[0].max(new);
        r[1][i[1]] = c[1].max(new);
        r[2][i[2]] = c[2].max(new);
        r[3][i[3]] = c[3].max(new);
        new
    }

    /// A plain (non-conservative) update, kept for the comparison test.
    #[cfg(test)]
    pub fn add_plain(&mut self, mixed: u64) -> u32 {
        let mut est = u32::MAX;
        for row in 0..ROWS {
            let cell = &mut self.rows[row][row_index(mixed, row)];
            *cell = cell.saturating_add(1);
            est = est.min(*cell);
        }
        est
    }

    #[cfg(test)]
    pub fn estimate(&self, mixed: u64) -> u32 {
        (0..ROWS)
            .map(|row| self.rows[row][row_index(mixed, row)])
            .min()
            .unwrap_or(0)
    }

    /// Decay: halves every counter `times` times (a window per halving).
    pub fn halve(&mut self, times: u64) {
        if times == 0 {
            return;
        }
        let shift = times.min(32) as u32;
        for row in self.rows.iter_mut() {
            for cell in row.iter_mut() {
                *cell = cell.checked_shr(shift).unwrap_or(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(i: u64) -> Vec<u8> {
        format!("user:{i}").into_bytes()
    }

    /// A skewed stream: key i appears about n / (i + 1) times.
    fn skewed(keys: u64, n: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let h: f64 = (1..=keys).map(|i| 1.0 / i as f64).sum();
        for i in 0..keys {
            let c = ((n as f64) / ((i + 1) as f64 * h)).ceil() as u64;
            for _ in 0..c {
                out.push(i);
            }
        }
        // Shuffle so the order is not sorted by heat.
        for j in (1..out.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.swap(j, (x % (j as u64 + 1)) as usize);
        }
        out
    }

    #[test]
    fn never_underestimates() {
        let stream = skewed(50_000, 400_000);
        let mut cm = CountMin::new();
        let mut exact: HashMap<u64, u32> = HashMap::new();
        for &k in &stream {
            cm.add(hash_key(&key(k)).mixed);
            *exact.entry(k).or_default() += 1;
        }
        for (k, n) in exact {
            assert!(cm.estimate(hash_key(&key(k)).mixed) >= n, "key {k}");
        }
    }

    #[test]
    fn conservative_update_beats_plain_update_on_a_skewed_stream() {
        let stream = skewed(100_000, 500_000);
        let (mut cons, mut plain) = (CountMin::new(), CountMin::new());
        let mut exact: HashMap<u64, u32> = HashMap::new();
        for &k in &stream {
            let m = hash_key(&key(k)).mixed;
            cons.add(m);
            plain.add_plain(m);
            *exact.entry(k).or_default() += 1;
        }
        let (mut err_cons, mut err_plain) = (0u64, 0u64);
        for (&k, &n) in &exact {
            let m = hash_key(&key(k)).mixed;
            err_cons += (cons.estimate(m) - n) as u64;
            err_plain += (plain.estimate(m) - n) as u64;
        }
        assert!(
            err_cons * 2 < err_plain,
            "conservative {err_cons} vs plain {err_plain}"
        );
    }

    #[test]
    fn halving_halves_every_estimate_and_many_halvings_empty_it() {
        let mut cm = CountMin::new();
        let m = hash_key(b"counter").mixed;
        for _ in 0..1000 {
            cm.add(m);
        }
        cm.halve(1);
        assert_eq!(cm.estimate(m), 500);
        cm.halve(2);
        assert_eq!(cm.estimate(m), 125);
        cm.halve(40);
        assert_eq!(cm.estimate(m), 0);
    }

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let mut cm = CountMin::new();
        let m = hash_key(b"k").mixed;
        cm.rows[0][row_index(m, 0)] = u32::MAX;
        cm.rows[1][row_index(m, 1)] = u32::MAX;
        cm.rows[2][row_index(m, 2)] = u32::MAX;
        cm.rows[3][row_index(m, 3)] = u32::MAX;
        assert_eq!(cm.add(m), u32::MAX);
    }

    #[test]
    fn two_row_collisions_rarely_extend_to_a_third_row() {
        // 400k keys give about 600 pairs equal in rows 0 and 1 (28 bits); independent rows
        // predict 600 / 2^14 (about 0.04) of them equal in row 2 as well.
        let mut v: Vec<(u32, u32)> = (0..400_000u64)
            .map(|i| {
                let m = hash_with_seed(&key(i), 7).mixed;
                let pair = (row_index(m, 0) << 14 | row_index(m, 1)) as u32;
                let rest = (row_index(m, 2) << 14 | row_index(m, 3)) as u32;
                (pair, rest)
            })
            .collect();
        v.sort_unstable();
        let (mut pairs, mut third) = (0, 0);
        for w in v.windows(2) {
            if w[0].0 == w[1].0 {
                pairs += 1;
                if w[0].1 >> 14 == w[1].1 >> 14 {
                    third += 1;
                }
            }
        }
        assert!(pairs > 200, "expected some two-row collisions, got {pairs}");
        assert!(
            third <= 2,
            "{third} of {pairs} two-row collisions hit row 2"
        );
    }
}
