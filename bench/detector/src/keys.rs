//! Key ids and their encoding for the detector benchmark, and the exact Zipf rank
//! probability its expected counts need. The sampler and PRNG are saltshaker's own
//! (`saltshaker::loadgen::{Zipf, Rng}`).

/// The exact probability of `rank` under Zipf over `1..=n` with exponent `s`. O(n) per
/// call: for choosing which ranks to expect, not for the sampling loop.
pub fn zipf_probability(n: u64, s: f64, rank: u64) -> f64 {
    let norm: f64 = (1..=n).map(|i| (i as f64).powf(-s)).sum();
    (rank as f64).powf(-s) / norm
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
    use saltshaker::loadgen::{Rng, Zipf};

    #[test]
    fn sampled_ranks_match_the_exact_probability() {
        let (n, s) = (1000, 0.99);
        let z = Zipf::new(n, s).expect("valid parameters");
        let mut rng = Rng::new(3);
        let mut counts = vec![0u64; n as usize + 1];
        let samples = 2_000_000;
        for _ in 0..samples {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        for rank in [1, 2, 10, 100] {
            let want = zipf_probability(n, s, rank) * samples as f64;
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
