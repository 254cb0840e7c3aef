//! Who a client is and what it may run: the default user's password, and named users
//! with hashed passwords, key patterns and command categories in Redis ACL's spirit.
//!
//! ```yaml
//! auth:
//!   users:
//!     - name: app
//!       passwords_sha256: ["<hex SHA-256 of the password>"]   # saltshaker passwd
//!       keys: ["app:*", "session:*"]                          # ~pattern
//!       commands: ["+@read", "+@write", "-@dangerous", "+ping"]
//! ```
//!
//! `commands` apply in order from nothing allowed, as Redis's ACL rules do: `+@cat` and
//! `-@cat` (Redis's categories, from `COMMAND INFO`), `+name` and `-name` (a container
//! takes its subcommands with it), `+parent|sub`, and `+@all` / `-@all`. A command with
//! Redis's `no_auth` flag (AUTH, HELLO, QUIT, RESET) is always allowed, as in Redis.
//! A denied command or key gets Redis's own NOPERM text.
//!
//! Passwords are kept as SHA-256, as Redis keeps them (`ACL GETUSER` shows `#<hex>`).
//! Without users and without `password`, every connection is the default user with
//! every permission (Redis's `nopass`). With users but no `password`, the default user
//! is off and every connection must AUTH as one of them.
//!
//! The users are live: `ACL SETUSER` and `ACL DELUSER` change this proxy's users until it
//! restarts (`acl`: the rule language; `log`: ACL LOG).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ring::digest;
use serde::{Deserialize, Serialize};

mod acl;
mod log;

pub use acl::{split_rules, Denied, Selector, User};
pub use log::{Entry, Log};

/// `auth:` in the config file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The default user's password: clients must AUTH with it (or as a named user).
    pub password: Option<String>,
    /// Named users (`AUTH user pass`, `HELLO 3 AUTH user pass`).
    pub users: Vec<UserConfig>,
}

/// One named user.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// Hex SHA-256 of each password the user may give (more than one while rotating).
    #[serde(default)]
    pub passwords_sha256: Vec<String>,
    /// Key patterns (Redis glob, an optional leading `~`, or `%R~`/`%W~` for read or
    /// write only); `*` is every key. Default none.
    #[serde(default)]
    pub keys: Vec<String>,
    /// Pub/sub channel patterns (an optional leading `&`). Default every channel, as
    /// before channels were checked.
    #[serde(default = "every_channel")]
    pub channels: Vec<String>,
    /// ACL command rules, applied in order from nothing allowed.
    #[serde(default)]
    pub commands: Vec<String>,
    /// false: the user cannot log in (WRONGPASS), as Redis's `off`.
    #[serde(default = "enabled")]
    pub enabled: bool,
}

fn enabled() -> bool {
    true
}

fn every_channel() -> Vec<String> {
    vec!["*".into()]
}

/// Why a login failed: Redis's error texts.
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
pub const NO_PASSWORD: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";

/// The proxy's users: built from the config, changed live by ACL SETUSER and DELUSER
/// (until the proxy restarts; ACL SAVE is refused). Sessions keep their user's `Arc` and
/// look it up again when `epoch` moves, so a change applies to connected clients at
/// their next command, as in Redis.
#[derive(Debug)]
pub struct Users {
    table: RwLock<HashMap<Vec<u8>, Arc<User>>>,
    epoch: AtomicU64,
}

impl Users {
    /// Builds the users; an error is (field, problem) for a located message. The
    /// `default` user always exists, as in Redis: with `password` it needs that password;
    /// with neither password nor users it is `nopass` (nobody needs to log in); with
    /// users and no password it is off.
    pub fn new(cfg: &AuthConfig) -> Result<Users, (String, String)> {
        let mut named = HashMap::new();
        let default = match &cfg.password {
            Some(p) => User::everything("default", vec![sha256(p.as_bytes())]),
            None if cfg.users.is_empty() => User::everything("default", Vec::new()),
            None => {
                let mut d = User::everything("default", Vec::new());
                d.enabled = false;
                d.nopass = false;
                d
            }
        };
        named.insert(b"default".to_vec(), Arc::new(default));
        for (i, u) in cfg.users.iter().enumerate() {
            let at = format!("auth.users[{i}]");
            if u.name == "default" && cfg.password.is_some() {
                return Err((
                    format!("{at}.name"),
                    "give the default user's password either as auth.password or here, not both"
                        .into(),
                ));
            }
            if cfg.users[..i].iter().any(|o| o.name == u.name) {
                return Err((
                    format!("{at}.name"),
                    format!("user {:?} is named twice", u.name),
                ));
            }
            named.insert(u.name.as_bytes().to_vec(), Arc::new(user(&at, u)?));
        }
        Ok(Users {
            table: RwLock::new(named),
            epoch: AtomicU64::new(0),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Vec<u8>, Arc<User>>> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves on every change; a session compares it with the one it saw last.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Every user's name, sorted, as ACL USERS lists them.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .read()
            .keys()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        names.sort();
        names
    }

    /// A user by name, as it is now.
    pub fn get(&self, name: &[u8]) -> Option<Arc<User>> {
        self.read().get(name).cloned()
    }

    /// Every user, sorted by name (ACL LIST).
    pub fn all(&self) -> Vec<Arc<User>> {
        let t = self.read();
        let mut v: Vec<Arc<User>> = t.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The user a new connection is before any AUTH: None when it must log in (the
    /// default user is off or has a password).
    pub fn initial(&self) -> Option<Arc<User>> {
        self.get(b"default").filter(|d| d.enabled && d.nopass)
    }

    /// AUTH [user] pass. Without a user name, the default user.
    pub fn login(&self, user: Option<&[u8]>, pass: &[u8]) -> Result<Arc<User>, &'static str> {
        if user.is_none() && self.initial().is_some() {
            return Err(NO_PASSWORD);
        }
        match self.get(user.unwrap_or(b"default")) {
            Some(u) if u.enabled && u.password_is(pass) => Ok(u),
            _ => Err(WRONGPASS),
        }
    }

    /// ACL SETUSER: the rules applied, in order, to the user (a new one if none has that
    /// name); nothing changes if one fails. Err is (the rule, Redis's reason).
    pub fn set_user(&self, name: &[u8], rules: &[String]) -> Result<(), (String, String)> {
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        let mut u = match t.get(name) {
            Some(u) => User::clone(u),
            None => User::new(&String::from_utf8_lossy(name)),
        };
        for r in rules {
            u.apply(r).map_err(|e| (r.clone(), e.to_string()))?;
        }
        t.insert(name.to_vec(), Arc::new(u));
        self.epoch.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// ACL DELUSER: how many of these users there were. `default` stays.
    pub fn delete(&self, names: &[&[u8]]) -> usize {
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        let n = names.iter().filter(|n| t.remove(**n).is_some()).count();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        n
    }
}

/// A configured user, built with the same rules as ACL SETUSER.
fn user(at: &str, u: &UserConfig) -> Result<User, (String, String)> {
    if u.name.is_empty() || u.name.contains(char::is_whitespace) {
        return Err((format!("{at}.name"), "a user name is one word".into()));
    }
    let mut user = User::new(&u.name);
    user.enabled = u.enabled;
    for (j, h) in u.passwords_sha256.iter().enumerate() {
        let h = h.strip_prefix('#').unwrap_or(h);
        user.apply(&format!("#{}", h.to_ascii_lowercase()))
            .map_err(|_| {
                (
                format!("{at}.passwords_sha256[{j}]"),
                "must be 64 hex digits, the SHA-256 of the password (`saltshaker passwd` prints it)"
                    .into(),
            )
            })?;
    }
    for (j, k) in u.keys.iter().enumerate() {
        let rule = if k == "allkeys" || k.starts_with('~') || k.starts_with('%') {
            k.clone()
        } else {
            format!("~{k}")
        };
        user.apply(&rule)
            .map_err(|e| (format!("{at}.keys[{j}]"), format!("{k:?}: {e}")))?;
    }
    for (j, c) in u.channels.iter().enumerate() {
        let rule = if c.starts_with('&') || c == "allchannels" {
            c.clone()
        } else {
            format!("&{c}")
        };
        user.apply(&rule)
            .map_err(|e| (format!("{at}.channels[{j}]"), format!("{c:?}: {e}")))?;
    }
    for (j, rule) in u.commands.iter().enumerate() {
        let bad = |why: String| (format!("{at}.commands[{j}]"), format!("{rule:?}: {why}"));
        let ok = rule.starts_with('+')
            || rule.starts_with('-')
            || rule == "allcommands"
            || rule == "nocommands";
        if !ok {
            return Err(bad("starts with + or - (as +@read, -flushall)".into()));
        }
        user.root.apply(rule).map_err(|e| {
            if e == acl::UNKNOWN && rule.contains('@') {
                bad(format!(
                    "unknown category; Redis's are {}",
                    crate::command::cat::NAMES.join(", ")
                ))
            } else if e == acl::UNKNOWN {
                bad("unknown command".into())
            } else {
                bad(e.into())
            }
        })?;
    }
    Ok(user)
}

pub fn sha256(b: &[u8]) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Lower-case hex, as `saltshaker passwd` prints and `passwords_sha256` takes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.strip_prefix('#').unwrap_or(s);
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::classify;

    fn users(yaml: &str) -> Users {
        let cfg: AuthConfig = serde_yaml_ng::from_str(yaml).unwrap();
        Users::new(&cfg).unwrap()
    }

    fn run(u: &User, args: &[&str]) -> Result<(), Denied> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        let c = classify(a.as_slice()).unwrap();
        u.check(&c, a.as_slice())
    }

    #[test]
    fn rules_apply_in_order_and_keys_must_match() {
        let h = hex(&sha256(b"pw"));
        let us = users(&format!(
            "users:\n  - name: app\n    passwords_sha256: [\"{h}\"]\n    keys: [\"~app:*\"]\n    commands: [\"+@read\", \"+set\", \"-@dangerous\", \"+config|get\", \"+@pubsub\"]\n"
        ));
        assert!(us.initial().is_none(), "users configured: AUTH is required");
        assert_eq!(us.login(None, b"pw").unwrap_err(), WRONGPASS);
        assert_eq!(us.login(Some(b"app"), b"nope").unwrap_err(), WRONGPASS);
        let u = us.login(Some(b"app"), b"pw").unwrap();
        assert_eq!(run(&u, &["GET", "app:1"]), Ok(()));
        assert_eq!(run(&u, &["SET", "app:1", "x"]), Ok(()));
        assert_eq!(
            run(&u, &["GET", "other"]),
            Err(Denied::Key(b"other".to_vec()))
        );
        assert_eq!(
            run(&u, &["MGET", "app:1", "zzz"]),
            Err(Denied::Key(b"zzz".to_vec()))
        );
        assert_eq!(
            run(&u, &["DEL", "app:1"]),
            Err(Denied::Command("del".into()))
        );
        assert_eq!(run(&u, &["KEYS", "*"]), Err(Denied::Command("keys".into())));
        assert_eq!(run(&u, &["CONFIG", "GET", "x"]), Ok(()));
        assert_eq!(
            run(&u, &["CONFIG", "SET", "x", "y"]),
            Err(Denied::Command("config|set".into()))
        );
        // A subscribed connection is a pipe to the node: restricted users get none.
        assert_eq!(run(&u, &["SUBSCRIBE", "app:news"]), Err(Denied::Subscribe));
        // no_auth commands need no permission.
        assert_eq!(run(&u, &["AUTH", "x"]), Ok(()));
        assert_eq!(
            Denied::Command("set".into()).message(),
            "NOPERM this user has no permissions to run the 'set' command"
        );
    }

    #[test]
    fn unrestricted_follows_every_rule() {
        let us = users("{}");
        us.set_user(
            b"u",
            &[
                "on".into(),
                "nopass".into(),
                "+@all".into(),
                "~*".into(),
                "&*".into(),
            ],
        )
        .unwrap();
        assert!(us.get(b"u").unwrap().unrestricted());
        us.set_user(b"u", &["-get".into()]).unwrap();
        assert!(
            !us.get(b"u").unwrap().unrestricted(),
            "one command taken away"
        );
        us.set_user(b"u", &["+get".into()]).unwrap();
        assert!(us.get(b"u").unwrap().unrestricted(), "and given back");
        us.set_user(b"u", &["resetchannels".into()]).unwrap();
        assert!(!us.get(b"u").unwrap().unrestricted(), "no channels");
    }

    #[test]
    fn default_user_and_open_mode() {
        let open = users("{}");
        assert!(open.initial().unwrap().unrestricted());
        assert_eq!(open.login(None, b"x").unwrap_err(), NO_PASSWORD);
        let pw = users("password: secret\n");
        assert!(pw.initial().is_none());
        assert!(pw.login(None, b"secret").unwrap().unrestricted());
        assert!(pw.login(Some(b"default"), b"secret").is_ok());
        assert_eq!(pw.login(None, b"other").unwrap_err(), WRONGPASS);
    }

    #[test]
    fn bad_rules_are_located() {
        for (yaml, field) in [
            (
                "users:\n  - name: a\n    commands: [\"+@nope\"]\n",
                "auth.users[0].commands[0]",
            ),
            (
                "users:\n  - name: a\n    commands: [\"get\"]\n",
                "auth.users[0].commands[0]",
            ),
            (
                "users:\n  - name: a\n    commands: [\"+nosuch\"]\n",
                "auth.users[0].commands[0]",
            ),
            (
                "users:\n  - name: a\n    passwords_sha256: [\"abc\"]\n",
                "auth.users[0].passwords_sha256[0]",
            ),
            ("users:\n  - name: a\n  - name: a\n", "auth.users[1].name"),
            (
                "users:\n  - name: a\n    keys: [\"a[b\"]\n",
                "auth.users[0].keys[0]",
            ),
        ] {
            let cfg: AuthConfig = serde_yaml_ng::from_str(yaml).unwrap();
            assert_eq!(Users::new(&cfg).unwrap_err().0, field, "{yaml}");
        }
    }
}
