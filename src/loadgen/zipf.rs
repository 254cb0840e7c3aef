//! Random numbers for the load generator: a seeded SplitMix64 stream and a Zipf sampler
//! (rejection-inversion) that needs no table over the keyspace.

/// SplitMix64 (Steele, Lea and Flood): one add and two multiplies per number, passes
/// BigCrush, and any `u64` is a good seed, so each client derives its own stream from the
/// run's seed and its index.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-40 for any
    /// keyspace a benchmark uses). `n == 0` gives 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Zipf over ranks `1..=n` with exponent `s > 0`: P(k) is proportional to `k^-s`.
///
/// Rejection-inversion (W. Hörmann and G. Derflinger, "Rejection-inversion to generate
/// variates from monotone discrete distributions", 1996), in the form Apache Commons RNG
/// uses: invert the integral of a continuous hat over `[k - 1/2, k + 1/2]` and accept
/// with a cheap test that succeeds almost always, so a sample costs O(1) (about 1.03
/// tries) whatever `n` is, and construction costs nothing per key.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    /// `None` unless `n >= 1` and `s` is finite and positive.
    pub fn new(n: u64, s: f64) -> Option<Zipf> {
        if n == 0 || !s.is_finite() || s <= 0.0 {
            return None;
        }
        let mut z = Zipf {
            n: n as f64,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.threshold = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Some(z)
    }

    /// A rank in `1..=n`; rank 1 is the most frequent.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            // u runs from H(n + 1/2) down to H(3/2) - 1: the hat's mass, rank 1 included.
            let u = self.h_integral_n + rng.unit() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// `k^-s`.
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// The hat's integral, `(x^(1-s) - 1) / (1-s)`, written so that it stays exact at
    /// and near `s = 1` (where it tends to `ln x`).
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over_x((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        // Rounding can push t just below -1, where ln1p is undefined.
        let t = (x * (1.0 - self.s)).max(-1.0);
        (ln1p_over_x(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, continuous at 0.
fn ln1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, continuous at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampled frequency of ranks 1..=ranks against `k^-s / H(n, s)`.
    fn check_first_ranks(n: u64, s: f64, samples: u32, ranks: usize, tolerance: f64) {
        let z = Zipf::new(n, s).expect("valid parameters");
        let mut rng = Rng::new(42);
        let mut counts = vec![0u64; ranks + 1];
        for _ in 0..samples {
            let k = z.sample(&mut rng);
            assert!((1..=n).contains(&k), "rank {k} outside 1..={n}");
            if let Some(c) = counts.get_mut(k as usize) {
                *c += 1;
            }
        }
        let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        for (k, &count) in counts.iter().enumerate().skip(1) {
            let expected = (k as f64).powf(-s) / norm * f64::from(samples);
            let rel = (count as f64 - expected).abs() / expected;
            assert!(
                rel < tolerance,
                "rank {k}: {count} samples, expected {expected:.0} ({:.1}% off)",
                rel * 100.0
            );
        }
    }

    #[test]
    fn zipf_first_ranks_match_theory_for_s_1_1_over_a_million_keys() {
        check_first_ranks(1_000_000, 1.1, 1_000_000, 10, 0.03);
    }

    #[test]
    fn zipf_is_exact_near_s_equal_one_and_for_steep_exponents() {
        check_first_ranks(1_000, 1.0, 400_000, 5, 0.03);
        check_first_ranks(100, 2.0, 400_000, 5, 0.03);
        check_first_ranks(10_000, 0.6, 1_000_000, 3, 0.05);
    }

    #[test]
    fn zipf_over_one_key_always_gives_rank_one() {
        let z = Zipf::new(1, 1.1).expect("valid");
        let mut rng = Rng::new(7);
        assert!((0..1000).all(|_| z.sample(&mut rng) == 1));
    }

    #[test]
    fn zipf_rejects_empty_keyspace_and_bad_exponents() {
        assert!(Zipf::new(0, 1.0).is_none());
        assert!(Zipf::new(10, 0.0).is_none());
        assert!(Zipf::new(10, -1.0).is_none());
        assert!(Zipf::new(10, f64::NAN).is_none());
        assert!(Zipf::new(10, f64::INFINITY).is_none());
    }

    #[test]
    fn rng_below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[rng.below(10) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
        assert_eq!(rng.below(0), 0);
        assert!((0..1000).all(|_| (0.0..1.0).contains(&rng.unit())));
    }

    #[test]
    fn same_seed_gives_same_stream() {
        let (mut a, mut b) = (Rng::new(9), Rng::new(9));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
    }
}
