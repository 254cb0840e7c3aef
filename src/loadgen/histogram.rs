//! Latency histogram: log-linear buckets in the manner of HdrHistogram, one per client
//! task, merged at the end of a run.
//!
//! Values are microseconds. Below 256 µs every value has its own bucket; above, each
//! power-of-two range is cut into 128 equal buckets, so a bucket is at most 1/128 (0.8%)
//! wide relative to its values. Recording is a leading-zero count and two shifts.

/// Values below this get exact buckets; also the number of buckets per doubling above it,
/// times two.
const LINEAR: u64 = 256;
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Largest value kept apart from the rest: 2^32 µs, over an hour. Larger ones are counted
/// in the last bucket; the exact maximum is kept on the side.
const TOP_BITS: u32 = 32;
const BUCKETS: usize = LINEAR as usize + (TOP_BITS - SUB_BITS - 1) as usize * SUB as usize;

#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let v = v.min((1u64 << TOP_BITS) - 1);
    // v has `bits` significant bits, bits >= 9; keep the top 8 (128..256).
    let bits = 64 - v.leading_zeros();
    let shift = bits - SUB_BITS - 1;
    let top = v >> shift;
    LINEAR as usize + (shift as usize - 1) * SUB as usize + (top - SUB) as usize
}

/// The largest value that lands in bucket `i`.
fn highest_in(i: usize) -> u64 {
    if i < LINEAR as usize {
        return i as u64;
    }
    let j = i - LINEAR as usize;
    let shift = (j / SUB as usize) as u32 + 1;
    let top = SUB + (j % SUB as usize) as u64;
    ((top + 1) << shift) - 1
}

impl Histogram {
    pub fn record(&mut self, us: u64) {
        self.counts[index(us)] += 1;
        self.total += 1;
        self.max = self.max.max(us);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1): the highest value equivalent to the bucket
    /// holding the `ceil(q * count)`-th smallest sample, as HdrHistogram reports it, and
    /// never above the true maximum. 0 when empty.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                if i == BUCKETS - 1 {
                    return self.max;
                }
                return highest_in(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_within_one_percent() {
        let mut prev = 0;
        for v in 0..(1u64 << 20) {
            let i = index(v);
            assert!(i == prev || i == prev + 1, "gap at {v}");
            prev = i;
            let hi = highest_in(i);
            assert!(hi >= v && (hi - v) as f64 <= v as f64 / 100.0 + 1e-9 || v < LINEAR);
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
        assert_eq!(index((1 << TOP_BITS) - 1), BUCKETS - 1);
    }

    #[test]
    fn percentiles_of_one_to_ten_thousand_are_within_one_percent() {
        let mut h = Histogram::default();
        for v in 1..=10_000 {
            h.record(v);
        }
        for (q, want) in [(0.5, 5_000.0), (0.99, 9_900.0), (0.999, 9_990.0)] {
            let got = h.percentile(q) as f64;
            assert!(
                (got - want).abs() / want <= 0.01,
                "p{q}: got {got}, want {want}"
            );
        }
        assert_eq!(h.percentile(1.0), 10_000);
        assert_eq!(h.percentile(0.0), 1);
        assert_eq!(h.max(), 10_000);
        assert_eq!(h.count(), 10_000);
    }

    #[test]
    fn small_latencies_are_exact_and_a_rare_outlier_shows_only_in_the_tail() {
        let mut h = Histogram::default();
        for _ in 0..999 {
            h.record(120);
        }
        h.record(2_000_000);
        assert_eq!(h.percentile(0.5), 120);
        assert_eq!(h.percentile(0.99), 120);
        assert!(h.percentile(0.9999) >= 1_980_000);
        assert_eq!(h.max(), 2_000_000);
    }

    #[test]
    fn merged_histograms_equal_one_that_saw_everything() {
        let (mut a, mut b, mut all) = (
            Histogram::default(),
            Histogram::default(),
            Histogram::default(),
        );
        for v in 0..5_000u64 {
            let x = v * 37 % 70_001;
            if v % 3 == 0 { &mut a } else { &mut b }.record(x);
            all.record(x);
        }
        a.merge(&b);
        for q in [0.1, 0.5, 0.9, 0.99, 0.999] {
            assert_eq!(a.percentile(q), all.percentile(q));
        }
        assert_eq!((a.count(), a.max()), (all.count(), all.max()));
    }

    #[test]
    fn empty_histogram_reports_zero() {
        assert_eq!(Histogram::default().percentile(0.99), 0);
    }

    #[test]
    fn values_beyond_an_hour_land_in_the_last_bucket_and_keep_the_max() {
        let mut h = Histogram::default();
        h.record(u64::MAX / 2);
        assert_eq!(h.max(), u64::MAX / 2);
        assert_eq!(h.percentile(0.5), u64::MAX / 2);
    }
}
