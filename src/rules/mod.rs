//! Hot-key rules that SREs tune: the YAML model, validation with located errors, the
//! first-match lookup the data path calls, and live reload (see `reload`).
//!
//! A file has `defaults` (what every key gets) and an ordered list of `rules`, each a
//! Redis-style glob with a partial policy. The first rule whose pattern matches a key wins,
//! and its policy is the defaults with the rule's fields laid over them, nested fields too.
//! Merging happens once at load, so `resolve` only matches patterns and copies a small
//! struct. The reference for every field is `docs/rules.md`.
//!
//! It imports only `config`'s error type and YAML helper, and `glob` for its patterns.

mod admit;
mod locate;
mod model;
mod patch;
mod problem;
mod reload;
mod validate;

use std::path::Path;

use serde::Serialize;

use crate::config::{parse_yaml, ConfigError};

pub use crate::glob::{stringmatch, Glob, MAX_PATTERN_BYTES};
pub use admit::{Admission, Admit, OverLimit, Priority, Scope};
pub use model::{
    Balance, CachePolicy, ClientCache, ClientCacheKeys, CombinePolicy, Detection, Families,
    Idempotency, Policies, ReadPolicy, ReadTier, SaltBy, SaltPolicy, SaltedReads, Shards, Strategy,
    WritePolicy, FAMILY_NAMES, SALTABLE,
};
pub use reload::{spawn_reloader, RulesHandle, POLL_INTERVAL};
pub use validate::MAX_RULES;

/// The parsed, validated rules. Serializes to the effective rules (each rule already merged
/// over the defaults), which is also a valid rules document.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rules {
    version: u32,
    detection: Detection,
    epoch_ms: u64,
    defaults: Policies,
    balance: Balance,
    admission: Admission,
    rules: Vec<Rule>,
    /// Some rule has an `admit:` section: only then does the data path look for one.
    #[serde(skip)]
    any_admit: bool,
    #[serde(skip)]
    cost_floors: CostFloors,
}

/// The least a read must cost to be counted by cost (`proxy::conn::cost`): below
/// `hot_at_bytes_per_sec / hot_at_per_sec` bytes (or the node-time pair), a key crosses the
/// read-rate threshold before the cost one, so counting it would change nothing. The lowest
/// ratio over the defaults and every rule. Defaults: 8388 bytes, 50 µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostFloors {
    pub bytes: usize,
    pub node_us: u64,
}

impl CostFloors {
    fn of<'a>(policies: impl Iterator<Item = &'a ReadPolicy>) -> CostFloors {
        let (mut bytes, mut node_us) = (f64::INFINITY, f64::INFINITY);
        for r in policies {
            bytes = bytes.min(r.hot_at_bytes_per_sec / r.hot_at_per_sec);
            node_us = node_us.min(r.hot_at_node_ms_per_sec * 1000.0 / r.hot_at_per_sec);
        }
        CostFloors {
            bytes: (bytes.floor() as usize).max(1),
            node_us: (node_us.floor() as u64).max(1),
        }
    }
}

impl Default for CostFloors {
    fn default() -> Self {
        CostFloors::of(std::iter::once(&ReadPolicy::default()))
    }
}

/// One rule after merging: its pattern and its complete policies.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    #[serde(rename = "match")]
    pub pattern: Glob,
    pub read: ReadPolicy,
    pub write: WritePolicy,
    /// Treat matching keys as hot from their first request (a known event).
    pub pin: bool,
    /// Per-key admission limits (`crate::admit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admit: Option<Admit>,
}

/// What applies to one key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    /// Index of the rule that matched; `None` = the defaults.
    pub rule: Option<usize>,
    pub read: ReadPolicy,
    pub write: WritePolicy,
    pub pin: bool,
}

impl Serialize for Glob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Default for Rules {
    /// The same as `rules/default.yaml`.
    fn default() -> Self {
        Rules {
            version: 1,
            detection: Detection::default(),
            epoch_ms: patch::default_epoch_ms(),
            defaults: Policies::default(),
            balance: Balance::default(),
            admission: Admission::default(),
            rules: Vec::new(),
            any_admit: false,
            cost_floors: CostFloors::default(),
        }
    }
}

impl Rules {
    /// Reads, parses and validates a rules file.
    pub fn load(path: &Path) -> Result<Rules, ConfigError> {
        let (text, file) = crate::config::read_file(path)?;
        Rules::parse(&text, &file)
    }

    /// Parses and validates YAML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Rules, ConfigError> {
        let doc: patch::RulesDoc = parse_yaml(text, file).map_err(|e| polish(e, text))?;
        Rules::build(doc).map_err(|p| {
            let (field, line, column) = locate::best(text, &p.fields);
            let mut message = p.message;
            if let Some(first) = p
                .fields
                .first()
                .filter(|f| **f != field && p.fields.len() > 1)
            {
                // Pointing at the field the file wrote; say where the other value came from.
                let name = first.rsplit('.').next().unwrap_or(first);
                message.push_str(&format!(
                    " ({name} is not written here: it comes from the defaults)"
                ));
            }
            ConfigError {
                file: file.into(),
                line,
                column,
                field,
                message,
            }
        })
    }

    /// Merges every rule over the defaults and checks the result.
    fn build(doc: patch::RulesDoc) -> Result<Rules, problem::Problem> {
        validate::version(doc.version)?;
        validate::detection(&doc.detection, doc.epoch_ms)?;
        validate::read("defaults.read", &doc.defaults.read)?;
        validate::write("defaults.write", &doc.defaults.write)?;
        validate::balance(&doc.balance)?;
        admit::admission(&doc.admission)?;
        let pats: Vec<&str> = doc.rules.iter().map(|r| r.pattern.as_str()).collect();
        let globs = validate::patterns(&pats)?;
        let mut rules = Vec::with_capacity(doc.rules.len());
        for (i, (r, pattern)) in doc.rules.iter().zip(globs).enumerate() {
            let read = r
                .read
                .as_ref()
                .map_or(doc.defaults.read, |p| p.over(doc.defaults.read));
            let write = r
                .write
                .as_ref()
                .map_or(doc.defaults.write, |p| p.over(doc.defaults.write));
            validate::read(&format!("rules[{i}].read"), &read)?;
            validate::write(&format!("rules[{i}].write"), &write)?;
            let mut admit = r.admit;
            if let Some(a) = admit.as_mut() {
                admit::check(&format!("rules[{i}].admit"), a)?;
            }
            rules.push(Rule {
                pattern,
                read,
                write,
                pin: r.pin,
                admit,
            });
        }
        Ok(Rules {
            version: doc.version,
            detection: doc.detection,
            epoch_ms: doc.epoch_ms,
            defaults: doc.defaults,
            balance: doc.balance,
            admission: doc.admission,
            any_admit: rules.iter().any(|r| r.admit.is_some()),
            cost_floors: CostFloors::of(
                std::iter::once(&doc.defaults.read).chain(rules.iter().map(|r| &r.read)),
            ),
            rules,
        })
    }

    /// The policy for `key`: the first matching rule, else the defaults.
    #[inline]
    pub fn resolve(&self, key: &[u8]) -> Resolved {
        for (i, r) in self.rules.iter().enumerate() {
            if r.pattern.matches(key) {
                return Resolved {
                    rule: Some(i),
                    read: r.read,
                    write: r.write,
                    pin: r.pin,
                };
            }
        }
        Resolved {
            rule: None,
            read: self.defaults.read,
            write: self.defaults.write,
            pin: false,
        }
    }

    pub fn window_ms(&self) -> u64 {
        self.detection.window_ms
    }

    pub fn top_k(&self) -> usize {
        self.detection.top_k
    }

    pub fn epoch_ms(&self) -> u64 {
        self.epoch_ms
    }

    /// Whether any rule limits admission (the data path skips the lookup otherwise).
    /// See [`CostFloors`].
    pub fn cost_floors(&self) -> CostFloors {
        self.cost_floors
    }

    pub fn any_admit(&self) -> bool {
        self.any_admit
    }

    /// The first rule matching `key` that has an `admit:` section, with its index. As
    /// `resolve`, first match wins: a key whose first matching rule has none is not limited.
    pub fn admit(&self, key: &[u8]) -> Option<(usize, &Admit)> {
        let (i, r) = self
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.pattern.matches(key))?;
        r.admit.as_ref().map(|a| (i, a))
    }

    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    pub fn balance(&self) -> &Balance {
        &self.balance
    }

    pub fn detection(&self) -> &Detection {
        &self.detection
    }

    pub fn defaults(&self) -> &Policies {
        &self.defaults
    }

    /// The merged rules, in match order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Lowest (read, write) hot threshold over defaults and rules: a detector that tracks
    /// keys from this rate up misses no rule.
    pub fn min_hot_at(&self) -> (f64, f64) {
        let d = (
            self.defaults.read.hot_at_per_sec,
            self.defaults.write.hot_at_per_sec,
        );
        self.rules.iter().fold(d, |(r, w), x| {
            (r.min(x.read.hot_at_per_sec), w.min(x.write.hot_at_per_sec))
        })
    }

    /// The lowest cost thresholds anywhere: (bytes per second, node ms per second).
    pub fn min_cost_hot_at(&self) -> (f64, f64) {
        let d = &self.defaults.read;
        let d = (d.hot_at_bytes_per_sec, d.hot_at_node_ms_per_sec);
        self.rules.iter().fold(d, |(b, n), x| {
            (
                b.min(x.read.hot_at_bytes_per_sec),
                n.min(x.read.hot_at_node_ms_per_sec),
            )
        })
    }

    /// Patterns of rules with `pin: true`, in rule order.
    pub fn pinned(&self) -> Vec<String> {
        self.rules
            .iter()
            .filter(|r| r.pin)
            .map(|r| r.pattern.to_string())
            .collect()
    }

    /// The effective rules as JSON, for `GET /rules`.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialization cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Makes parser errors read well: drop the path serde_yaml_ng repeats in its message, and
/// place errors it reports without a position (duplicate keys, missing fields).
fn polish(mut e: ConfigError, text: &str) -> ConfigError {
    for prefix in [format!("{}: ", e.field), format!("{}: ", parent(&e.field))] {
        if let Some(rest) = e.message.strip_prefix(&prefix) {
            e.message = rest.to_string();
            break;
        }
    }
    // serde names our Rust types ("expected struct RuleDoc"); say what the file needs.
    if let Some(i) = e.message.find("expected struct ") {
        e.message.truncate(i);
        e.message.push_str("expected a mapping of `field: value`");
    }
    let quoted = |m: &str, head: &str| {
        m.strip_prefix(head)
            .and_then(|r| r.split('`').nth(1))
            .map(str::to_string)
    };
    if let Some(name) = quoted(&e.message, "duplicate field") {
        if let Some((path, line, column)) = locate::duplicate(text, &e.field, &name) {
            (e.field, e.line, e.column) = (path, line, column);
        }
    } else if let Some(name) = quoted(&e.message, "missing field") {
        if e.line <= 1 && e.column <= 1 && !e.field.is_empty() {
            if let Some((line, column)) = locate::find(text, &e.field) {
                (e.line, e.column) = (line, column);
            }
        }
        e.field = if e.field.is_empty() {
            name
        } else {
            format!("{}.{name}", e.field)
        };
    }
    e
}

fn parent(path: &str) -> &str {
    path.rfind(['.', '[']).map_or("", |i| &path[..i])
}

#[cfg(test)]
mod tests;
