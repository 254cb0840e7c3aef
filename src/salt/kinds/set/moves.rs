//! A set shard's moves: the fold's (shard into the base key) and the spread's (base-key
//! members into their shards), each in journaled batches copied before they are removed,
//! so a member is always in at least one part and a re-run changes nothing twice.

use bytes::Bytes;

use crate::backend::Backend;
use crate::resp::Value;
use crate::salt::journal::{self, Claimed};
use crate::salt::kind::{bulks, cmd};
use crate::salt::names::{shard_name, Place};
use crate::salt::record::{hex, unhex, Move, Record};
use crate::salt::{as_i64, call, failpoint, now_ms, Salt, SaltError};

/// The `shard` of a journaled move that spreads base-key members into their shards.
pub const SPREAD: u32 = u32::MAX;

/// The next batch of base-key members a spread moves into their shards (hex-encoded for
/// the journal); empty when the base key holds no more.
pub async fn spread_batch(backend: &Backend, key: &[u8]) -> Result<Vec<String>, SaltError> {
    let node = backend.node_of(key);
    let r = call(
        backend,
        &[(node, cmd(&[b"SSCAN", key, b"0", b"COUNT", b"256"]))],
    )
    .await?;
    let members: Vec<String> = match &r[0] {
        Value::Array(a) if a.len() == 2 => bulks(&a[1]).iter().map(|m| hex(m)).collect(),
        v => {
            return Err(SaltError::Reply(format!(
                "unexpected SSCAN reply from the base key: {v:?}"
            )))
        }
    };
    if !members.is_empty() {
        return Ok(members);
    }
    // SSCAN may return an empty first page of a non-empty set: ask directly.
    let n = call(backend, &[(node, cmd(&[b"SCARD", key]))]).await?;
    if as_i64(&n[0]).unwrap_or(0) == 0 {
        return Ok(Vec::new());
    }
    let r = call(backend, &[(node, cmd(&[b"SRANDMEMBER", key, b"64"]))]).await?;
    Ok(bulks(&r[0]).iter().map(|m| hex(m)).collect())
}

/// A journaled spread batch, safe to run again: copy each member into its shard, then
/// remove the batch from the base key.
async fn apply_spread(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    mv: &Move,
) -> Result<(), SaltError> {
    let members: Vec<Vec<u8>> = mv
        .members
        .iter()
        .map(|h| unhex(h).ok_or(SaltError::Journal("bad member in the journal".into())))
        .collect::<Result<_, _>>()?;
    let mut by: Vec<Vec<&[u8]>> = vec![Vec::new(); rec.salts.len()];
    let now = now_ms();
    for m in &members {
        by[rec.member_salt(m, now)].push(m);
    }
    let adds: Vec<(usize, Bytes)> = by
        .iter()
        .enumerate()
        .filter(|(_, ms)| !ms.is_empty())
        .map(|(i, ms)| {
            let shard = shard_name(key, rec.salts[i], backend.tag());
            let mut a: Vec<&[u8]> = vec![b"SADD", &shard];
            a.extend(ms.iter().copied());
            (backend.node_of(&shard), cmd(&a))
        })
        .collect();
    let mut rem: Vec<&[u8]> = vec![b"SREM", key];
    rem.extend(members.iter().map(|m| &m[..]));
    journal::steps(
        backend,
        vec![
            (adds, "spread-after-add"),
            (
                vec![(backend.node_of(key), cmd(&rem))],
                "spread-after-remove",
            ),
        ],
    )
    .await
}

/// Most members journaled in one fold move (their total size is also bounded): the
/// journal rides in the registry record, which every proxy reads each tick.
const MOVE_MEMBERS: usize = 256;
const MOVE_BYTES: usize = 16 * 1024;

/// Moves set shard `i` into the base key, batch by batch (see the module notes).
pub async fn move_set(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    c: &mut Claimed,
    i: usize,
) -> Result<(), SaltError> {
    let shard = shard_name(key, c.rec.salts[i], backend.tag());
    let node = backend.node_of(&shard);
    // Each batch empties part of the shard; a shard written as fast as it is moved is
    // left for the next pass rather than chased forever.
    for _ in 0..10_000 {
        let count = MOVE_MEMBERS.to_string();
        let r = call(
            backend,
            &[(
                node,
                cmd(&[b"SSCAN", &shard, b"0", b"COUNT", count.as_bytes()]),
            )],
        )
        .await?;
        let page = match &r[0] {
            Value::Array(a) if a.len() == 2 => bulks(&a[1]),
            v => {
                return Err(SaltError::Reply(format!(
                    "unexpected SSCAN reply from a shard: {v:?}"
                )))
            }
        };
        let mut members = Vec::new();
        let mut bytes = 0;
        for m in page {
            if members.len() >= MOVE_MEMBERS || bytes >= MOVE_BYTES {
                break;
            }
            bytes += m.len();
            members.push(hex(&m));
        }
        if members.is_empty() {
            // SSCAN may return an empty first page of a non-empty set: ask directly.
            let n = call(backend, &[(node, cmd(&[b"SCARD", &shard]))]).await?;
            if as_i64(&n[0]).unwrap_or(0) == 0 {
                return Ok(());
            }
            let r = call(backend, &[(node, cmd(&[b"SRANDMEMBER", &shard, b"64"]))]).await?;
            members = bulks(&r[0]).iter().map(|m| hex(m)).collect();
        }
        let mv = Move {
            id: journal::move_id(salt),
            shard: i as u32,
            delta: vec![],
            members,
            scores: vec![],
            ttl_ms: None,
        };
        journal::journal(backend, key, c, Some(mv.clone())).await?;
        failpoint("fold-after-journal").await;
        apply_set(backend, key, &c.rec, &mv).await?;
        journal::journal(backend, key, c, None).await?;
        salt.metrics.fold_moves.inc();
    }
    Ok(())
}

/// A journaled set move, safe to run again: copy into the base key, then remove from the
/// shard.
pub async fn apply_set(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    mv: &Move,
) -> Result<(), SaltError> {
    if mv.shard == SPREAD {
        return apply_spread(backend, key, rec, mv).await;
    }
    let salt = *rec.salts.get(mv.shard as usize).ok_or(SaltError::Journal(
        "a journaled move names a shard the record does not have".into(),
    ))?;
    let shard = shard_name(key, salt, backend.tag());
    let members: Vec<Vec<u8>> = mv
        .members
        .iter()
        .map(|h| unhex(h).ok_or(SaltError::Journal("bad member in the journal".into())))
        .collect::<Result<_, _>>()?;
    let with = |name: &[u8], target: &[u8]| {
        let mut a: Vec<&[u8]> = vec![name, target];
        a.extend(members.iter().map(|m| &m[..]));
        cmd(&a)
    };
    journal::steps(
        backend,
        vec![
            (
                vec![(backend.node_of(key), with(b"SADD", key))],
                "fold-after-add",
            ),
            (
                vec![(backend.node_of(&shard), with(b"SREM", &shard))],
                "fold-after-take",
            ),
        ],
    )
    .await
}
