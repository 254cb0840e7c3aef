//! A rule's `admit:` section (per-key admission limits) and the top-level `admission:`
//! section (when a node counts as overloaded), with their checks. What the proxy does with
//! them lives in `crate::admit`; `docs/rules.md` is the reference for every field.

use serde::{Deserialize, Serialize};

use super::problem::{problem, range, Problem};

/// What happens to a command on a key over its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverLimit {
    /// Refused with a `THROTTLED` error naming the rule and the limit.
    #[default]
    Reject,
    /// INCR, INCRBY, DECR and DECRBY: 1 in `sample_one_in` is sent, its delta multiplied;
    /// the others are answered with the value the key last showed. Other commands: rejected.
    Sample,
    /// Waits for a token up to `max_delay_ms`, then is rejected.
    Delay,
}

/// Which keys an overloaded node sheds first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Shed first: at `admission.shed_low_at_pending`.
    Low,
    /// Shed at `admission.shed_normal_at_pending`.
    #[default]
    Normal,
    /// Never shed: only the key's own limit applies.
    High,
}

/// Whose limit it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Each proxy enforces the whole limit on its own.
    #[default]
    Local,
    /// The fleet shares the limit: each proxy admits from its allocation, re-synced
    /// through the registry every `sync_ms`.
    Global,
}

/// A rule's `admit:` section. Absent fields take the defaults below; `burst` is filled in
/// at load (a tenth of the rate, at least 1), so `/rules` shows what is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admit {
    /// Commands per second admitted per matching key. None: no per-key limit, and
    /// `over_limit` applies only while the key's node sheds this priority.
    #[serde(default)]
    pub limit_per_sec: Option<f64>,
    /// Bytes per second a matching key's commands may move (request and reply, charged as
    /// each reply is written). A key that has moved more is refused until it is back under;
    /// this proxy's own count, whatever `scope` says.
    #[serde(default)]
    pub limit_bytes_per_sec: Option<f64>,
    /// Commands a key may take at once above its rate (the bucket's size).
    #[serde(default)]
    pub burst: Option<f64>,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default)]
    pub over_limit: OverLimit,
    /// Sample: one increment in this many is sent. Default 10.
    #[serde(default = "default_sample_one_in")]
    pub sample_one_in: u32,
    /// Delay: the longest a command waits for a token. Default 100 ms.
    #[serde(default = "default_max_delay_ms")]
    pub max_delay_ms: u64,
    #[serde(default)]
    pub priority: Priority,
    /// Global: how often allocations are re-synced. Default 2000 ms.
    #[serde(default = "default_sync_ms")]
    pub sync_ms: u64,
    /// Global: a proxy's allocation before its first sync, as a share of the limit.
    /// Default 5 percent.
    #[serde(default = "default_start_share_pct")]
    pub start_share_pct: f64,
    /// Global: the fleet's size, for the fallback when the registry cannot be reached
    /// (`limit / proxies` each). Default: the number of proxies the last sync saw.
    #[serde(default)]
    pub proxies: Option<u32>,
}

fn default_sample_one_in() -> u32 {
    10
}
fn default_max_delay_ms() -> u64 {
    100
}
fn default_sync_ms() -> u64 {
    2000
}
fn default_start_share_pct() -> f64 {
    5.0
}

impl Admit {
    /// The byte bucket's size: one second at the byte limit.
    pub fn burst_bytes(&self) -> f64 {
        self.limit_bytes_per_sec.unwrap_or(0.0)
    }

    /// The bucket size in force.
    pub fn burst(&self) -> f64 {
        self.burst
            .unwrap_or_else(|| self.limit_per_sec.map_or(1.0, |l| (l / 10.0).max(1.0)))
    }
}

/// The top-level `admission:` section: when a node sheds which priority. A node is
/// overloaded when this many commands the proxy sent it are still unanswered
/// (`saltshaker_backend_pending_commands`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admission {
    /// Default 5000 commands.
    pub shed_low_at_pending: u64,
    /// Default 20000 commands.
    pub shed_normal_at_pending: u64,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            shed_low_at_pending: 5000,
            shed_normal_at_pending: 20000,
        }
    }
}

/// Checks one rule's section, and fills in its burst.
pub fn check(base: &str, a: &mut Admit) -> Result<(), Problem> {
    if let Some(l) = a.limit_per_sec {
        if !l.is_finite() || l <= 0.0 || l > 1e9 {
            return Err(problem(
                base,
                &["limit_per_sec"],
                format!("{l} must be a positive rate per second, at most 1e9"),
            ));
        }
    }
    if let Some(l) = a.limit_bytes_per_sec {
        if !l.is_finite() || l < 1024.0 || l > 1e15 {
            return Err(problem(
                base,
                &["limit_bytes_per_sec"],
                format!("{l} must be a rate in bytes per second, 1024..=1e15"),
            ));
        }
    }
    let burst = a.burst();
    if !burst.is_finite() || !(1.0..=1e9).contains(&burst) {
        return Err(problem(
            base,
            &["burst"],
            format!("{burst} is out of range: must be 1..=1e9 commands"),
        ));
    }
    if a.limit_per_sec.is_some() {
        a.burst = Some(burst);
    } else if a.burst.is_some() {
        return Err(problem(
            base,
            &["burst", "limit_per_sec"],
            "burst needs limit_per_sec: without a rate there is no bucket".into(),
        ));
    }
    range(base, "sample_one_in", a.sample_one_in, 2, 1_000_000, "")?;
    range(base, "max_delay_ms", a.max_delay_ms, 1, 10_000, " ms")?;
    range(base, "sync_ms", a.sync_ms, 100, 60_000, " ms")?;
    let pct = a.start_share_pct;
    if !(0.0..=100.0).contains(&pct) {
        return Err(problem(
            base,
            &["start_share_pct"],
            format!("{pct} is out of range: must be 0..=100 percent"),
        ));
    }
    if let Some(n) = a.proxies {
        range(base, "proxies", n, 1, 100_000, " proxies")?;
    }
    if a.scope == Scope::Global && a.limit_per_sec.is_none() {
        return Err(problem(
            base,
            &["scope", "limit_per_sec"],
            "scope: global needs limit_per_sec: there is no limit to share".into(),
        ));
    }
    if a.over_limit == OverLimit::Delay && a.limit_per_sec.is_none() {
        return Err(problem(
            base,
            &["over_limit", "limit_per_sec"],
            "over_limit: delay needs limit_per_sec: there is no token to wait for".into(),
        ));
    }
    Ok(())
}

pub fn admission(a: &Admission) -> Result<(), Problem> {
    range(
        "admission",
        "shed_low_at_pending",
        a.shed_low_at_pending,
        1,
        10_000_000,
        " commands",
    )?;
    range(
        "admission",
        "shed_normal_at_pending",
        a.shed_normal_at_pending,
        a.shed_low_at_pending,
        10_000_000,
        " commands (at least shed_low_at_pending)",
    )
}
