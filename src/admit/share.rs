//! The second tier of a global limit: how one key's fleet-wide rate is split between the
//! proxies, from the demand each one reported in the registry. Pure, so the proxy's sync
//! (`global`) and the fleet simulator (`sim`) compute the same shares.

/// Max-min fair shares of `limit` over `demands` (commands per second each proxy was
/// offered in the last interval): a proxy asking for less than an equal share gets what it
/// asks, and what the quiet ones leave is split among the busy ones (so busy proxies borrow
/// from idle ones). Whatever nobody asks for is split equally, so a proxy whose load grows
/// has room before the next sync. The shares always add up to `limit`.
pub fn allocate(limit: f64, demands: &[f64]) -> Vec<f64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let mut share = vec![0.0; n];
    let mut open: Vec<usize> = (0..n).collect();
    let mut left = limit;
    loop {
        let fair = left / open.len() as f64;
        let (small, big): (Vec<usize>, Vec<usize>) =
            open.iter().partition(|&&i| demands[i].max(0.0) <= fair);
        if small.is_empty() {
            for &i in &big {
                share[i] = fair;
            }
            return share;
        }
        for &i in &small {
            share[i] = demands[i].max(0.0);
            left -= share[i];
        }
        if big.is_empty() {
            // Everybody is satisfied: the rest is split equally.
            let spare = left / n as f64;
            for s in share.iter_mut() {
                *s += spare;
            }
            return share;
        }
        open = big;
    }
}

/// `allocate`, for a fleet of `expected` proxies of which only `demands.len()` have written
/// an entry yet (a fleet starting together): each missing proxy is counted with the mean
/// demand of the others, so the first to sync does not take the whole limit. The shares
/// of the proxies that wrote come first, in order.
pub fn allocate_expecting(limit: f64, demands: &[f64], expected: Option<usize>) -> Vec<f64> {
    let missing = expected.unwrap_or(0).saturating_sub(demands.len());
    if missing == 0 || demands.is_empty() {
        return allocate(limit, demands);
    }
    let mean = demands.iter().sum::<f64>() / demands.len() as f64;
    let mut all = demands.to_vec();
    all.extend(std::iter::repeat_n(mean, missing));
    let mut s = allocate(limit, &all);
    s.truncate(demands.len());
    s
}

/// The demand a proxy reports: its measured rate smoothed over intervals, but a rise by
/// half or more taken at once (a burst that moves to this proxy must not wait for the
/// average). A demand measured over one interval is noisy (80 arrivals: about +/-11%), and a
/// proxy given exactly that refuses its upswings and wastes what it over-asked.
pub fn smooth(prev: Option<f64>, measured: f64) -> f64 {
    match prev {
        Some(p) if measured < p * 1.5 => p + SMOOTHING * (measured - p),
        _ => measured,
    }
}

/// Weight of the newest interval in `smooth`.
const SMOOTHING: f64 = 0.3;

/// One proxy's entry in a key's registry hash: "demand_per_sec:unix_ms".
pub fn encode(demand: f64, now_ms: u64) -> String {
    format!("{demand:.3}:{now_ms}")
}

pub fn decode(v: &[u8]) -> Option<(f64, u64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (d, t) = s.split_once(':')?;
    Some((d.parse().ok()?, t.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(v: &[f64]) -> f64 {
        v.iter().sum()
    }

    #[test]
    fn quiet_proxies_lend_to_busy_ones() {
        let s = allocate(1000.0, &[100.0, 2000.0, 50.0]);
        assert_eq!(s[0], 100.0);
        assert_eq!(s[2], 50.0);
        assert!((s[1] - 850.0).abs() < 1e-9);
        assert!((sum(&s) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn equal_split_when_all_are_busy_and_spare_split_when_none_is() {
        let s = allocate(900.0, &[1000.0, 5000.0, 700.0]);
        assert!(s.iter().all(|x| (x - 300.0).abs() < 1e-9), "{s:?}");
        let s = allocate(1000.0, &[100.0, 200.0]);
        assert_eq!(s, vec![450.0, 550.0]);
        assert!(allocate(10.0, &[]).is_empty());
        let s = allocate(60.0, &[0.0; 60]);
        assert!(s.iter().all(|x| (x - 1.0).abs() < 1e-9));
    }

    #[test]
    fn the_first_of_a_starting_fleet_takes_its_part_not_the_whole() {
        let s = allocate_expecting(600.0, &[100.0], Some(6));
        assert_eq!(s, vec![100.0]);
        let s = allocate_expecting(600.0, &[100.0, 300.0], None);
        assert_eq!(s, allocate(600.0, &[100.0, 300.0]));
    }

    #[test]
    fn demand_is_averaged_but_a_rise_is_taken_at_once() {
        assert_eq!(smooth(None, 40.0), 40.0);
        assert!((smooth(Some(100.0), 90.0) - 97.0).abs() < 1e-9);
        assert!((smooth(Some(100.0), 140.0) - 112.0).abs() < 1e-9);
        assert_eq!(smooth(Some(100.0), 150.0), 150.0);
    }

    #[test]
    fn entries_round_trip() {
        assert_eq!(decode(encode(12.5, 99).as_bytes()), Some((12.5, 99)));
        assert_eq!(decode(b"x:1"), None);
        assert_eq!(decode(b"12"), None);
    }
}
