//! Scores of a salted sorted set: parsing, formatting as Redis does, reading
//! `WITHSCORES` replies, and rank order. Shared by the sorted set's commands and reads.

use std::cmp::Ordering;

use bytes::Bytes;

use crate::resp::Value;

pub fn float(b: &[u8]) -> Option<f64> {
    let f: f64 = std::str::from_utf8(b).ok()?.parse().ok()?;
    (!f.is_nan()).then_some(f)
}

pub fn score(v: &Value) -> Option<f64> {
    match v {
        Value::Bulk(b) | Value::Double(b) => float(b),
        _ => None,
    }
}

/// A score as Redis writes it: the shortest form that reads back the same.
pub fn fmt(f: f64) -> Bytes {
    if f.is_infinite() {
        return Bytes::from_static(if f > 0.0 { b"inf" } else { b"-inf" });
    }
    Bytes::from(format!("{f}"))
}

/// Member/score pairs of a WITHSCORES reply in either protocol.
pub fn scored(v: &Value) -> Vec<(Bytes, f64)> {
    let Value::Array(a) = v else { return vec![] };
    if a.iter().all(|x| matches!(x, Value::Array(_))) {
        return a
            .iter()
            .filter_map(|x| match x {
                Value::Array(p) if p.len() == 2 => match (&p[0], score(&p[1])) {
                    (Value::Bulk(m), Some(s)) => Some((m.clone(), s)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
    }
    a.chunks(2)
        .filter_map(|c| match (&c[0], c.get(1).and_then(score)) {
            (Value::Bulk(m), Some(s)) => Some((m.clone(), s)),
            _ => None,
        })
        .collect()
}

pub fn order(rev: bool) -> impl Fn(&(Bytes, f64), &(Bytes, f64)) -> Ordering {
    move |x, y| {
        let o =
            x.1.partial_cmp(&y.1)
                .unwrap_or(Ordering::Equal)
                .then_with(|| x.0.cmp(&y.0));
        if rev {
            o.reverse()
        } else {
            o
        }
    }
}
