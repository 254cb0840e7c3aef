//! `POST /hotkeys/promote?key=K[&shards=N]` and `POST /hotkeys/demote?key=K`: an SRE
//! salts a key before a known event and ends it after. The key is percent-encoded in the
//! query string, so any binary key can be named. Both answer JSON, and both take effect
//! at the next epoch boundary on every proxy (the registry in the backend carries them).

use hyper::{Method, StatusCode};

use super::AdminState;
use crate::rules::{ReadTier, Strategy};
use crate::salt::record::Record;
use crate::salt::SaltTable;

/// Shard count when the request does not say.
const DEFAULT_SHARDS: u32 = 4;

pub async fn action(
    state: &AdminState,
    method: &Method,
    action: &str,
    query: Option<&str>,
) -> (StatusCode, String) {
    let fail = |status: StatusCode, msg: &str| {
        (
            status,
            serde_json::json!({ "error": msg }).to_string() + "\n",
        )
    };
    if !matches!(action, "promote" | "demote") {
        return fail(
            StatusCode::NOT_FOUND,
            "try POST /hotkeys/promote or /hotkeys/demote",
        );
    }
    if method != Method::POST {
        return fail(StatusCode::METHOD_NOT_ALLOWED, "use POST");
    }
    let Some(ctl) = state.salt.as_ref() else {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "salting is not running");
    };
    let mut key = None;
    let mut shards = DEFAULT_SHARDS;
    for pair in query.unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "key" => key = percent_decode(v),
            "shards" => match v.parse::<u32>() {
                Ok(n) if (1..=1024).contains(&n) => shards = n,
                _ => return fail(StatusCode::BAD_REQUEST, "shards must be 1 to 1024"),
            },
            _ => {}
        }
    }
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return fail(
            StatusCode::BAD_REQUEST,
            "give the key: ?key=NAME (percent-encoded)",
        );
    };
    let shown = state.show(&key);
    let result = if action == "promote" {
        ctl.promote(key, shards).await.map(Some)
    } else {
        ctl.demote(key).await
    };
    match result {
        Ok(Some(rec)) => {
            tracing::info!(key = %shown, action, "salting changed by an admin request");
            (StatusCode::OK, record_json(&shown, &rec).to_string() + "\n")
        }
        Ok(None) => fail(StatusCode::NOT_FOUND, "the key is not salted"),
        Err(e) => fail(StatusCode::CONFLICT, &e.to_string()),
    }
}

fn record_json(shown: &str, r: &Record) -> serde_json::Value {
    serde_json::json!({
        "key": shown,
        "kind": r.kind,
        "shards": r.target_n(),
        "from_ms": r.steps.first().map(|s| s.from_ms),
        // When the last change of its shards takes effect, and whether a shard of a key
        // salted by member is being moved off a master it shares (`salt::relocate`).
        "last_step_ms": r.steps.last().map(|s| s.from_ms),
        "moving_shard": r.holds_until() > crate::salt::now_ms(),
        "demote_ms": r.demote_ms,
        "pinned": r.pinned,
        "folding": r.fold.is_some(),
        "by": r.by,
    })
}

/// The salted keys, for `/hotkeys`, each with its exactness: `write` is `exact` (each
/// increment its own write) or `combine` (batched, every reply still exact), `read` is the
/// merged reads' tier (`exact`, or `display` with its refresh period).
pub fn listing(state: &AdminState, table: &SaltTable) -> serde_json::Value {
    let rules = state.rules.load();
    serde_json::Value::Array(
        table
            .iter()
            .map(|e| {
                let mut j = record_json(&state.show(&e.key), &e.rec);
                let r = rules.resolve(&e.key);
                let write = match r.write.strategy {
                    Strategy::SaltCombine | Strategy::Auto => "combine",
                    _ => "exact",
                };
                j["exactness"] = match r.read.salted.tier {
                    ReadTier::Display => serde_json::json!({
                        "write": write, "read": "display", "refresh_ms": r.read.salted.refresh_ms,
                    }),
                    ReadTier::Exact => serde_json::json!({ "write": write, "read": "exact" }),
                };
                j
            })
            .collect(),
    )
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_percent_decoded_and_bad_escapes_refused() {
        assert_eq!(percent_decode("vote%3Afinal"), Some(b"vote:final".to_vec()));
        assert_eq!(percent_decode("a+b%00"), Some(b"a b\x00".to_vec()));
        assert_eq!(percent_decode("bad%4"), None);
        assert_eq!(percent_decode("bad%zz"), None);
    }
}
