//! A token bucket in explicit time (microseconds from any origin), so the proxy and the
//! fleet simulator (`sim`) run the same code, one on the clock and one in virtual time.

/// Tokens refill at `rate` per second up to `burst`; a command takes one. A bucket may go
/// into debt (negative tokens) only through `reserve`: a delayed command holds its token
/// while it waits, so waiting commands never exceed the rate either.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    tokens: f64,
    at_us: u64,
}

impl Bucket {
    /// A full bucket: a key nobody used lately may take its whole burst at once.
    pub fn full(burst: f64, now_us: u64) -> Bucket {
        Bucket {
            tokens: burst,
            at_us: now_us,
        }
    }

    /// A bucket holding `tokens` (a proxy that joins a global limit starts low).
    pub fn with(tokens: f64, now_us: u64) -> Bucket {
        Bucket {
            tokens,
            at_us: now_us,
        }
    }

    fn refill(&mut self, rate: f64, burst: f64, now_us: u64) {
        if now_us > self.at_us {
            let add = rate * (now_us - self.at_us) as f64 / 1e6;
            self.tokens = (self.tokens + add).min(burst);
            self.at_us = now_us;
        }
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, rate: f64, burst: f64, now_us: u64) -> bool {
        self.refill(rate, burst, now_us);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes one token now or, when none is left, the next one due within `max_wait_us`:
    /// returns how long to wait (0 = at once), or None when even that is too long (nothing
    /// is taken then).
    pub fn reserve(&mut self, rate: f64, burst: f64, now_us: u64, max_wait_us: u64) -> Option<u64> {
        self.refill(rate, burst, now_us);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Some(0);
        }
        if rate <= 0.0 {
            return None;
        }
        let wait = ((1.0 - self.tokens) / rate * 1e6).ceil() as u64;
        if wait > max_wait_us {
            return None;
        }
        self.tokens -= 1.0;
        Some(wait)
    }

    /// Takes `n` tokens whatever is left: the bucket may go into debt, and is refused
    /// (`has_tokens`) until it has refilled past it. For what is known only after a command
    /// ran (the bytes of its reply).
    pub fn charge(&mut self, rate: f64, burst: f64, now_us: u64, n: f64) {
        self.refill(rate, burst, now_us);
        self.tokens -= n;
    }

    /// True when the bucket is not in debt.
    pub fn has_tokens(&mut self, rate: f64, burst: f64, now_us: u64) -> bool {
        self.refill(rate, burst, now_us);
        self.tokens > 0.0
    }

    /// True when the bucket is back at its burst: it knows nothing a new bucket would not,
    /// so it may be forgotten (this is what bounds the memory of limits).
    pub fn is_full(&self, rate: f64, burst: f64, now_us: u64) -> bool {
        let elapsed = now_us.saturating_sub(self.at_us) as f64 / 1e6;
        self.tokens + rate * elapsed >= burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_the_burst_then_the_rate() {
        let mut b = Bucket::full(10.0, 0);
        let first = (0..100).filter(|_| b.take(100.0, 10.0, 0)).count();
        assert_eq!(first, 10);
        // One second later: 100 more, not 110 (the burst caps the refill).
        let later = (0..1000).filter(|_| b.take(100.0, 10.0, 1_000_000)).count();
        assert_eq!(later, 10);
        // Over 10 s at 1 ms steps and 5 offered per ms: the rate plus one burst.
        let mut b = Bucket::full(10.0, 0);
        let mut n = 0;
        for ms in 0..10_000u64 {
            n += (0..5).filter(|_| b.take(100.0, 10.0, ms * 1000)).count();
        }
        assert!((1000..=1011).contains(&n), "{n}");
        assert!(!b.is_full(100.0, 10.0, 10_000_000));
        assert!(b.is_full(100.0, 10.0, 10_200_000));
    }

    #[test]
    fn reserve_waits_for_the_next_token_and_holds_it() {
        let mut b = Bucket::full(1.0, 0);
        assert_eq!(b.reserve(10.0, 1.0, 0, 1_000_000), Some(0));
        // Empty: the next token is 100 ms away, the one after 200 ms.
        assert_eq!(b.reserve(10.0, 1.0, 0, 1_000_000), Some(100_000));
        assert_eq!(b.reserve(10.0, 1.0, 0, 1_000_000), Some(200_000));
        // Too far: refused, and nothing taken.
        assert_eq!(b.reserve(10.0, 1.0, 0, 250_000), None);
        assert_eq!(b.reserve(10.0, 1.0, 0, 300_000), Some(300_000));
        assert!(!b.take(10.0, 1.0, 300_000));
    }
}
