//! Latency histogram of `saltshaker bench`: HdrHistogram (the well-kept crate made for
//! this), one per client task, merged at the end of a run. Values are microseconds, kept
//! to two significant digits (1%) up to an hour; a longer one is kept as an hour.

/// The largest value told apart: an hour, in microseconds.
const MAX_US: u64 = 3_600_000_000;

/// The exact maximum is kept beside the histogram, which reports a bucket's highest value.
#[derive(Clone, Debug)]
pub struct Histogram(hdrhistogram::Histogram<u64>, u64);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(
            hdrhistogram::Histogram::new_with_max(MAX_US, 2)
                .expect("two significant digits up to an hour is a valid histogram"),
            0,
        )
    }
}

impl Histogram {
    pub fn record(&mut self, us: u64) {
        self.0.saturating_record(us.min(MAX_US));
        self.1 = self.1.max(us);
    }

    pub fn merge(&mut self, other: &Histogram) {
        // Both were made by `default`, with the same bounds: adding cannot fail.
        let _ = self.0.add(&other.0);
        self.1 = self.1.max(other.1);
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    pub fn max(&self) -> u64 {
        self.1
    }

    /// The value at quantile `q` (0..=1), as HdrHistogram reports it, never above the
    /// true maximum. 0 when empty.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        self.0.value_at_quantile(q.clamp(0.0, 1.0)).min(self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn values_beyond_an_hour_are_kept_as_an_hour() {
        let mut h = Histogram::default();
        h.record(u64::MAX / 2);
        assert_eq!(h.count(), 1);
        assert_eq!(h.max(), u64::MAX / 2, "the exact maximum is kept");
        assert!(h.percentile(0.5) >= MAX_US);
    }
}
