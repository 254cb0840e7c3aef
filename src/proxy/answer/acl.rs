//! The ACL commands, on the proxy's own users (`auth::Users`): WHOAMI, USERS, SETUSER,
//! DELUSER, GETUSER, LIST, DRYRUN, GENPASS, LOG and HELP, with Redis 7's replies. A
//! change applies to this proxy only, until it restarts: in a fleet, change every proxy
//! (or its config file; ACL SAVE and ACL LOAD are refused).

use bytes::{Bytes, BytesMut};

use crate::auth::{Selector, User};
use crate::command::{self, Cmd, Spec};
use crate::proxy::conn::round::{RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Flow, Session};
use crate::proxy::registry::clients::Filter;
use crate::resp::{Proto, Request, Value};

fn bulk(s: &str) -> Value {
    Value::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One ACL subcommand; the reply goes into `rb`.
pub fn handle(s: &mut Session, req: &Request, spec: &'static Spec, rb: &mut RoundBuilder) -> Flow {
    let reply = match spec.cmd {
        Cmd::AclWhoami => Ok(bulk(s.user().map_or("default", |u| &u.name))),
        Cmd::AclUsers => Ok(Value::Array(
            s.ctx().users.names().iter().map(|n| bulk(n)).collect(),
        )),
        Cmd::AclSetuser => set_user(s, req),
        Cmd::AclDeluser => del_user(s, req),
        Cmd::AclGetuser => Ok(s
            .ctx()
            .users
            .get(req.arg(2))
            .map_or(Value::Nil, |u| get_user(&u))),
        Cmd::AclList => Ok(Value::Array(
            s.ctx()
                .users
                .all()
                .iter()
                .map(|u| bulk(&u.describe()))
                .collect(),
        )),
        Cmd::AclDryrun => dry_run(s, req),
        Cmd::AclGenpass => gen_pass(req),
        Cmd::AclLog => log(s, req),
        Cmd::AclHelp => Ok(Value::Array(HELP.iter().map(|l| bulk(l)).collect())),
        _ => Err(Refusal(format!(
            "ERR saltshaker: {} is not supported through the proxy",
            spec.name
        ))),
    };
    let mut out = BytesMut::new();
    match reply {
        Ok(v) => v.encode(s.proto(), &mut out),
        Err(Refusal(e)) => return push(rb, err_bytes(&e)),
    }
    push(rb, out.freeze())
}

/// An ACL command's error reply, in Redis's words.
struct Refusal(String);

impl From<String> for Refusal {
    fn from(s: String) -> Self {
        Refusal(s)
    }
}

impl From<&str> for Refusal {
    fn from(s: &str) -> Self {
        Refusal(s.to_string())
    }
}

/// What an ACL command answers.
type Answer = Result<Value, Refusal>;

fn push(rb: &mut RoundBuilder, b: Bytes) -> Flow {
    rb.slots.push(Slot::Ready(b));
    Flow::Continue
}

fn ok() -> Value {
    Value::Simple(Bytes::from_static(b"OK"))
}

/// ACL SETUSER name rule...: all of the rules or none.
fn set_user(s: &mut Session, req: &Request) -> Answer {
    let name = req.arg(2);
    if name.iter().any(|b| b.is_ascii_whitespace() || *b == 0) {
        return Err("ERR Usernames can't contain spaces or null characters".into());
    }
    let args: Vec<String> = (3..req.argc()).map(|i| text(req.arg(i))).collect();
    let rules = crate::auth::split_rules(&args)
        .map_err(|at| format!("ERR Unmatched parenthesis in acl selector starting at '{at}'."))?;
    s.ctx()
        .users
        .set_user(name, &rules)
        .map_err(|(rule, why)| format!("ERR Error in ACL SETUSER modifier '{rule}': {why}"))?;
    tracing::info!(client = s.id(), user = %text(name), "ACL SETUSER changed a user of this proxy");
    Ok(ok())
}

/// ACL DELUSER name...: the clients logged in as a deleted user are closed, as in Redis.
fn del_user(s: &mut Session, req: &Request) -> Answer {
    let names: Vec<&[u8]> = (2..req.argc()).map(|i| req.arg(i)).collect();
    if names.iter().any(|n| *n == b"default") {
        return Err("ERR The 'default' user cannot be removed".into());
    }
    let n = s.ctx().users.delete(&names);
    for name in &names {
        let f = Filter {
            user: Some(text(name)),
            ..Filter::default()
        };
        s.ctx().clients.kill(&f);
    }
    Ok(Value::Integer(n as i64))
}

fn get_user(u: &User) -> Value {
    let strs = |v: Vec<String>| v.join(" ");
    let selector = |sel: &Selector| {
        Value::Map(vec![
            (bulk("commands"), bulk(&sel.describe_commands())),
            (bulk("keys"), bulk(&strs(sel.describe_keys()))),
            (bulk("channels"), bulk(&strs(sel.describe_channels()))),
        ])
    };
    Value::Map(vec![
        (
            bulk("flags"),
            Value::Array(u.flags().iter().map(|f| bulk(f)).collect()),
        ),
        (
            bulk("passwords"),
            Value::Array(
                u.hashes()
                    .iter()
                    .map(|h| bulk(&crate::auth::hex(h)))
                    .collect(),
            ),
        ),
        (bulk("commands"), bulk(&u.root.describe_commands())),
        (bulk("keys"), bulk(&strs(u.root.describe_keys()))),
        (bulk("channels"), bulk(&strs(u.root.describe_channels()))),
        (
            bulk("selectors"),
            Value::Array(u.selectors.iter().map(selector).collect()),
        ),
    ])
}

/// ACL DRYRUN user command arg...: OK, or why the user may not.
fn dry_run(s: &mut Session, req: &Request) -> Answer {
    let user = s
        .ctx()
        .users
        .get(req.arg(2))
        .ok_or_else(|| format!("ERR User '{}' not found", text(req.arg(2))))?;
    let args: Vec<&[u8]> = (3..req.argc()).map(|i| req.arg(i)).collect();
    if command::lookup(args[0]).is_none() {
        return Err(format!("ERR Command '{}' not found", text(args[0])).into());
    }
    let c = command::classify(args.as_slice()).map_err(|e| e.to_string())?;
    Ok(match user.check(&c, args.as_slice()) {
        Ok(()) => ok(),
        Err(d) => bulk(&d.dryrun()),
    })
}

/// ACL GENPASS [bits]: random hex, 256 bits unless asked.
fn gen_pass(req: &Request) -> Answer {
    let bits = match req.argc() {
        2 => 256,
        _ => match crate::resp::parse_i64(req.arg(2)) {
            Some(b) if b > 0 && b <= 4096 => b as usize,
            _ => return Err("ERR ACL GENPASS argument must be the number of bits for the output password, a positive number up to 4096".into()),
        },
    };
    let chars = bits.div_ceil(4);
    let mut raw = vec![0u8; chars.div_ceil(2)];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| "ERR saltshaker: no random bytes for ACL GENPASS".to_string())?;
    let mut hex = crate::auth::hex(&raw);
    hex.truncate(chars);
    Ok(bulk(&hex))
}

/// ACL LOG [count | RESET].
fn log(s: &mut Session, req: &Request) -> Answer {
    let n = match req.argc() {
        2 => None,
        3 if req.arg(2).eq_ignore_ascii_case(b"RESET") => {
            s.ctx().acl_log.clear();
            return Ok(ok());
        }
        3 => match crate::resp::parse_i64(req.arg(2)) {
            Some(n) if n >= 0 => Some(n as usize),
            _ => return Err("ERR value is out of range, must be positive".into()),
        },
        _ => return Err("ERR syntax error".into()),
    };
    let entries = s.ctx().acl_log.newest(n);
    let now = std::time::Instant::now();
    Ok(Value::Array(
        entries
            .iter()
            .map(|e| {
                let age = now.duration_since(e.created).as_secs_f64();
                let age = Bytes::from(format!("{age:.3}"));
                Value::Map(vec![
                    (bulk("count"), Value::Integer(e.count as i64)),
                    (bulk("reason"), bulk(e.reason)),
                    (bulk("context"), bulk(e.context)),
                    (bulk("object"), bulk(&e.object)),
                    (bulk("username"), bulk(&e.username)),
                    (
                        bulk("age-seconds"),
                        match s.proto() {
                            Proto::Resp3 => Value::Double(age),
                            Proto::Resp2 => Value::Bulk(age),
                        },
                    ),
                    (bulk("client-info"), bulk(&e.client_info)),
                ])
            })
            .collect(),
    ))
}

/// Redis 7.0's ACL HELP, with what differs through the proxy.
const HELP: &[&str] = &[
    "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CAT [<category>]",
    "    List all commands that belong to <category>, or all command categories",
    "    when no category is specified.",
    "DELUSER <username> [<username> ...]",
    "    Delete a list of users.",
    "DRYRUN <username> <command> [<arg> ...]",
    "    Returns whether the user can execute the given command without executing the command.",
    "GETUSER <username>",
    "    Get the user's details.",
    "GENPASS [<bits>]",
    "    Generate a secure 256-bit user password. The optional `bits` argument can",
    "    be used to specify a different size.",
    "LIST",
    "    Show users details in config file format.",
    "LOAD",
    "    Refused through saltshaker: its users come from its config file.",
    "LOG [<count> | RESET]",
    "    Show the ACL log entries.",
    "SAVE",
    "    Refused through saltshaker: write changes into its config file.",
    "SETUSER <username> <attribute> [<attribute> ...]",
    "    Create or modify a user with the specified attributes (this proxy's, until it restarts).",
    "USERS",
    "    List all the registered usernames.",
    "WHOAMI",
    "    Return the current connection username.",
    "HELP",
    "    Prints this help.",
];
