//! What the load generator sends: the key distribution ([`Workload`]), the command mix
//! ([`Mix`]), their command-line forms, and the per-client [`Generator`] that turns them
//! into RESP commands.

use std::fmt;
use std::str::FromStr;

use bytes::BytesMut;

use super::zipf::{Rng, Zipf};
use super::BenchError;
use crate::resp::encode_command;

/// How keys are chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// Every key of the keyspace equally likely.
    Uniform,
    /// Zipf with exponent `s`: key `{prefix}0` is the most frequent, `{prefix}1` next...
    Zipf(f64),
    /// One key (sent verbatim, without the prefix) takes `share` of all operations; the
    /// rest are uniform over the keyspace.
    Viral { key: String, share: f64 },
}

impl FromStr for Workload {
    type Err = BenchError;

    /// `uniform`, `zipf:S` (S > 0), or `viral:KEY:SHARE` (0 <= SHARE <= 1). KEY may itself
    /// contain `:`; the last field is the share.
    fn from_str(s: &str) -> Result<Self, BenchError> {
        let bad = |why: &str| BenchError::Option {
            option: "workload",
            value: s.to_string(),
            why: format!("{why} (uniform, zipf:1.1, viral:KEY:0.3)"),
        };
        if s == "uniform" {
            return Ok(Workload::Uniform);
        }
        if let Some(exp) = s.strip_prefix("zipf:") {
            return match exp.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => Ok(Workload::Zipf(v)),
                _ => Err(bad("the Zipf exponent must be a number above 0")),
            };
        }
        if let Some(rest) = s.strip_prefix("viral:") {
            let (key, share) = rest.rsplit_once(':').ok_or_else(|| bad("missing share"))?;
            if key.is_empty() {
                return Err(bad("empty key"));
            }
            return match share.parse::<f64>() {
                Ok(v) if (0.0..=1.0).contains(&v) => Ok(Workload::Viral {
                    key: key.to_string(),
                    share: v,
                }),
                _ => Err(bad("the share must be a number from 0 to 1")),
            };
        }
        Err(bad("unknown workload"))
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::Uniform => write!(f, "uniform"),
            Workload::Zipf(s) => write!(f, "zipf:{s}"),
            Workload::Viral { key, share } => write!(f, "viral:{key}:{share}"),
        }
    }
}

/// Relative weights of the commands sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    pub get: u32,
    pub set: u32,
    pub incr: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            get: 80,
            set: 10,
            incr: 10,
        }
    }
}

impl FromStr for Mix {
    type Err = BenchError;

    /// `get=80,set=10,incr=10`; commands left out weigh 0; names are case-insensitive.
    fn from_str(s: &str) -> Result<Self, BenchError> {
        let bad = |why: String| BenchError::Option {
            option: "mix",
            value: s.to_string(),
            why,
        };
        let mut mix = Mix {
            get: 0,
            set: 0,
            incr: 0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?} is not NAME=WEIGHT")))?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|_| bad(format!("weight {weight:?} is not a whole number")))?;
            match name.trim().to_ascii_lowercase().as_str() {
                "get" => mix.get = weight,
                "set" => mix.set = weight,
                "incr" => mix.incr = weight,
                other => return Err(bad(format!("unknown command {other:?} (get, set, incr)"))),
            }
        }
        if mix.total() == 0 {
            return Err(bad("all weights are 0".into()));
        }
        Ok(mix)
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "get={},set={},incr={}", self.get, self.set, self.incr)
    }
}

impl Mix {
    fn total(&self) -> u64 {
        u64::from(self.get) + u64::from(self.set) + u64::from(self.incr)
    }
}

enum Keys {
    Uniform,
    Zipf(Zipf),
    Viral { key: Vec<u8>, share: f64 },
}

/// One client's command stream. Keeps its key buffer and value between commands, so a
/// command costs a few random numbers and one copy into the write buffer.
pub(crate) struct Generator {
    rng: Rng,
    keys: Keys,
    keyspace: u64,
    /// Thresholds on `rng.below(total)`: below `get` is GET, below `get_set` is SET.
    get: u64,
    get_set: u64,
    total: u64,
    prefix_len: usize,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl Generator {
    /// `Err` for an empty keyspace or mix, or a Zipf exponent that is not above 0.
    pub(crate) fn new(
        workload: &Workload,
        mix: Mix,
        keyspace: u64,
        prefix: &str,
        value_size: usize,
        seed: u64,
    ) -> Result<Generator, BenchError> {
        if keyspace == 0 {
            return Err(BenchError::Setting("keyspace must be at least 1"));
        }
        if mix.total() == 0 {
            return Err(BenchError::Setting("the command mix has no weight"));
        }
        let keys = match workload {
            Workload::Uniform => Keys::Uniform,
            Workload::Zipf(s) => Keys::Zipf(
                Zipf::new(keyspace, *s)
                    .ok_or(BenchError::Setting("the Zipf exponent must be above 0"))?,
            ),
            Workload::Viral { key, share } => Keys::Viral {
                key: key.as_bytes().to_vec(),
                share: *share,
            },
        };
        Ok(Generator {
            rng: Rng::new(seed),
            keys,
            keyspace,
            get: u64::from(mix.get),
            get_set: u64::from(mix.get) + u64::from(mix.set),
            total: mix.total(),
            prefix_len: prefix.len(),
            key: prefix.as_bytes().to_vec(),
            // Digits, so an INCR after a SET on the same key counts on instead of failing
            // (up to 18 digits; longer values cannot be integers anyway).
            value: vec![b'1'; value_size],
        })
    }

    /// Appends one command to `out`; true if it is on the viral key.
    pub(crate) fn next(&mut self, out: &mut BytesMut) -> bool {
        let n = match &self.keys {
            Keys::Uniform => Some(self.rng.below(self.keyspace)),
            Keys::Zipf(z) => Some(z.sample(&mut self.rng) - 1),
            Keys::Viral { share, .. } => {
                (self.rng.unit() >= *share).then(|| self.rng.below(self.keyspace))
            }
        };
        let key: &[u8] = match (n, &self.keys) {
            (None, Keys::Viral { key, .. }) => key,
            (n, _) => {
                self.key.truncate(self.prefix_len);
                push_decimal(n.unwrap_or(0), &mut self.key);
                &self.key
            }
        };
        let r = if self.total == self.get {
            0
        } else {
            self.rng.below(self.total)
        };
        if r < self.get {
            encode_command(&[&b"GET"[..], key], out);
        } else if r < self.get_set {
            encode_command(&[&b"SET"[..], key, &self.value], out);
        } else {
            encode_command(&[&b"INCR"[..], key], out);
        }
        n.is_none()
    }
}

/// The key's number, appended without allocating. This duplicates `resp`'s integer
/// formatter on purpose: that one is private to `resp` (its public encoders all add a
/// type prefix and CRLF, and write into a `BytesMut`), and `format!`/`write!` would go
/// through `fmt` machinery once per command in the hot loop.
fn push_decimal(mut v: u64, out: &mut Vec<u8>) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_from_their_flag_forms() {
        assert_eq!("uniform".parse(), Ok(Workload::Uniform));
        assert_eq!("zipf:1.1".parse(), Ok(Workload::Zipf(1.1)));
        assert_eq!(
            "viral:likes:1:0.3".parse(),
            Ok(Workload::Viral {
                key: "likes:1".into(),
                share: 0.3
            })
        );
        for bad in [
            "",
            "zipf",
            "zipf:0",
            "zipf:-1",
            "zipf:x",
            "viral:k",
            "viral::0.5",
            "viral:k:1.5",
            "normal",
        ] {
            assert!(bad.parse::<Workload>().is_err(), "{bad:?} parsed");
        }
        for w in ["uniform", "zipf:0.99", "viral:a:b:0.25"] {
            assert_eq!(
                w.parse::<Workload>().map(|w| w.to_string()).as_deref(),
                Ok(w)
            );
        }
    }

    #[test]
    fn mixes_parse_with_missing_commands_at_zero() {
        assert_eq!("get=80,set=10,incr=10".parse(), Ok(Mix::default()));
        assert_eq!(
            "INCR=1".parse(),
            Ok(Mix {
                get: 0,
                set: 0,
                incr: 1
            })
        );
        for bad in ["", "get=0", "get", "get=-1", "del=5", "get=1.5"] {
            assert!(bad.parse::<Mix>().is_err(), "{bad:?} parsed");
        }
    }

    fn commands(g: &mut Generator, n: usize) -> Vec<(String, bool)> {
        (0..n)
            .map(|_| {
                let mut out = BytesMut::new();
                let viral = g.next(&mut out);
                (String::from_utf8_lossy(&out).into_owned(), viral)
            })
            .collect()
    }

    #[test]
    fn keys_carry_the_prefix_and_set_values_have_the_requested_size() {
        let mix = Mix {
            get: 0,
            set: 1,
            incr: 0,
        };
        let mut g = Generator::new(&Workload::Uniform, mix, 1, "k:", 3, 1).expect("valid");
        let (cmd, viral) = &commands(&mut g, 1)[0];
        assert_eq!(cmd, "*3\r\n$3\r\nSET\r\n$3\r\nk:0\r\n$3\r\n111\r\n");
        assert!(!viral);
    }

    #[test]
    fn viral_key_is_sent_verbatim_for_about_its_share() {
        let w = Workload::Viral {
            key: "likes:1".into(),
            share: 0.3,
        };
        let mix = Mix {
            get: 0,
            set: 0,
            incr: 1,
        };
        let mut g = Generator::new(&w, mix, 1000, "k:", 0, 5).expect("valid");
        let cmds = commands(&mut g, 20_000);
        let viral = cmds.iter().filter(|(_, v)| *v).count();
        assert!((5_600..6_400).contains(&viral), "{viral} viral of 20000");
        for (cmd, v) in &cmds {
            assert_eq!(
                *v,
                cmd == "*2\r\n$4\r\nINCR\r\n$7\r\nlikes:1\r\n",
                "{cmd:?}"
            );
        }
    }

    #[test]
    fn mix_weights_set_the_command_shares() {
        let mut g =
            Generator::new(&Workload::Zipf(1.1), Mix::default(), 100, "", 1, 3).expect("valid");
        let cmds = commands(&mut g, 10_000);
        let count = |name: &str| cmds.iter().filter(|(c, _)| c.contains(name)).count();
        assert!((7_700..8_300).contains(&count("\r\nGET\r\n")));
        assert!((800..1_200).contains(&count("\r\nSET\r\n")));
        assert!((800..1_200).contains(&count("\r\nINCR\r\n")));
    }

    #[test]
    fn key_numbers_are_plain_decimal_at_the_extremes() {
        for v in [0, 9, 10, 99, 100, 12_345, u64::MAX] {
            let mut out = b"k:".to_vec();
            push_decimal(v, &mut out);
            assert_eq!(out, format!("k:{v}").into_bytes());
        }
    }

    #[test]
    fn generator_rejects_empty_keyspace() {
        assert!(Generator::new(&Workload::Uniform, Mix::default(), 0, "", 1, 1).is_err());
    }
}
