//! Stream generators for the detector benchmark: a small PRNG, a Zipf sampler and the key
//! encoding. Written here so the benchmark needs no dependency beyond saltshaker.

/// splitmix64: fast, good enough for workload generation.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Zipf over ranks 1..=n with exponent s, by rejection-inversion (Hörmann and Derflinger,
/// 1996, as in Apache Commons RNG): O(1) per sample and no table, so 10M keys cost nothing.
pub struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    cut: f64,
}

impl Zipf {
    pub fn new(n: u64, s: f64) -> Self {
        let mut z = Zipf {
            n: n as f64,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            cut: 0.0,
        };
        z.h_x1 = z.h_integral(1.5) - 1.0;
        z.h_n = z.h_integral(n as f64 + 0.5);
        z.cut = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// A rank in 1..=n; rank 1 is the hottest.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_n + rng.next_f64() * (self.h_x1 - self.h_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.cut || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// The exact probability of `rank`, for reporting.
    pub fn probability(n: u64, s: f64, rank: u64) -> f64 {
        let norm: f64 = (1..=n).map(|i| (i as f64).powf(-s)).sum();
        (rank as f64).powf(-s) / norm
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// Key ids: a bijective scramble of (rank, phase), so a new phase is a new hot set and hot
/// keys are not neighbours.
pub fn key_id(rank: u64, phase: u64) -> u64 {
    let mut z = rank ^ (phase << 40);
    z = (z ^ (z >> 31)).wrapping_mul(0x7fb5_d329_728e_a185);
    z = (z ^ (z >> 27)).wrapping_mul(0x81da_def4_bc2d_d44d);
    z ^ (z >> 33)
}

/// "obj:" and 16 hex digits: a 20-byte key, like many real ones.
pub fn encode(id: u64, buf: &mut [u8; 20]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[..4].copy_from_slice(b"obj:");
    for i in 0..16 {
        buf[4 + i] = HEX[((id >> (60 - 4 * i)) & 0xf) as usize];
    }
    &buf[..]
}

pub fn decode(key: &[u8]) -> Option<u64> {
    let hex = key.strip_prefix(b"obj:")?;
    u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_matches_its_distribution() {
        let (n, s) = (1000, 0.99);
        let z = Zipf::new(n, s);
        let mut rng = Rng(3);
        let mut counts = vec![0u64; n as usize + 1];
        let samples = 2_000_000;
        for _ in 0..samples {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        for rank in [1, 2, 10, 100] {
            let want = Zipf::probability(n, s, rank) * samples as f64;
            let got = counts[rank as usize] as f64;
            assert!(
                (got - want).abs() < 5.0 * want.sqrt() + 1.0,
                "rank {rank}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn keys_round_trip() {
        let mut buf = [0u8; 20];
        assert_eq!(decode(encode(key_id(5, 1), &mut buf)), Some(key_id(5, 1)));
    }
}
