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

use std::collections::HashMap;
use std::sync::Arc;

use ring::digest;
use serde::{Deserialize, Serialize};

use crate::command::{self, cat, flags, Args, Classified, Spec};
use crate::glob::Glob;

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
    /// Key patterns (Redis glob, an optional leading `~`); `*` is every key. Default none.
    #[serde(default)]
    pub keys: Vec<String>,
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

/// A user a connection is logged in as.
#[derive(Debug)]
pub struct User {
    pub name: String,
    hashes: Vec<[u8; 32]>,
    enabled: bool,
    /// One bit per command of `command::all()`.
    commands: Vec<u64>,
    all_commands: bool,
    keys: Vec<Glob>,
    all_keys: bool,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// Redis's full name of the command: `get`, `config|get`.
    Command(String),
    Key,
    /// (P|S)SUBSCRIBE by a restricted user: a subscribed connection is a pipe to the node
    /// (`proxy::tunnel`), whose commands the proxy does not see, so none could be checked.
    Subscribe,
}

impl Denied {
    /// Redis's own error text (7.0).
    pub fn message(&self) -> String {
        match self {
            Denied::Command(name) => {
                format!("NOPERM this user has no permissions to run the '{name}' command")
            }
            Denied::Key => {
                "NOPERM this user has no permissions to access one of the keys used as arguments"
                    .into()
            }
            Denied::Subscribe => "NOPERM saltshaker: only users with every command and key (+@all, ~*) may subscribe through the proxy".into(),
        }
    }

    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::Command(_) => "command",
            Denied::Key => "key",
            Denied::Subscribe => "subscribe",
        }
    }
}

/// Why a login failed: Redis's error texts.
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
pub const NO_PASSWORD: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";

impl User {
    fn everything(name: &str, hashes: Vec<[u8; 32]>) -> User {
        User {
            name: name.into(),
            hashes,
            enabled: true,
            commands: Vec::new(),
            all_commands: true,
            keys: Vec::new(),
            all_keys: true,
        }
    }

    /// True when the user may run every command on every key.
    pub fn unrestricted(&self) -> bool {
        self.all_commands && self.all_keys
    }

    /// May this user run `c` with these arguments?
    pub fn check<A: Args + ?Sized>(&self, c: &Classified, args: &A) -> Result<(), Denied> {
        if !self.all_commands && !c.spec.has(flags::NO_AUTH) {
            let i = index(c.spec);
            if self.commands[i / 64] & (1 << (i % 64)) == 0 {
                return Err(Denied::Command(c.spec.fullname()));
            }
        }
        if c.route == command::Route::Subscribe && !self.unrestricted() {
            return Err(Denied::Subscribe);
        }
        if !self.all_keys {
            for n in 0..c.keys.len() {
                let key = c.key(args, n).unwrap_or_default();
                if !self.keys.iter().any(|g| g.matches(key)) {
                    return Err(Denied::Key);
                }
            }
        }
        Ok(())
    }

    fn password_is(&self, pass: &[u8]) -> bool {
        let h = sha256(pass);
        // Compare every byte of every hash, so the time says nothing of where they differ.
        self.hashes.iter().fold(false, |ok, k| {
            ok | (k.iter().zip(h.iter()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0)
        })
    }
}

/// The users of one config.
#[derive(Debug)]
pub struct Users {
    /// None: the default user is off (users configured, no password).
    default: Option<Arc<User>>,
    /// True when nobody needs to log in.
    open: bool,
    named: HashMap<Vec<u8>, Arc<User>>,
}

impl Users {
    /// Builds the users; an error is (field, problem) for a located message.
    pub fn new(cfg: &AuthConfig) -> Result<Users, (String, String)> {
        let mut named = HashMap::new();
        let mut default = cfg
            .password
            .as_ref()
            .map(|p| Arc::new(User::everything("default", vec![sha256(p.as_bytes())])));
        for (i, u) in cfg.users.iter().enumerate() {
            let at = format!("auth.users[{i}]");
            let user = Arc::new(user(&at, u)?);
            if u.name == "default" {
                if cfg.password.is_some() {
                    return Err((
                        format!("{at}.name"),
                        "give the default user's password either as auth.password or here, not both".into(),
                    ));
                }
                default = Some(user.clone());
            }
            if named.insert(u.name.as_bytes().to_vec(), user).is_some() {
                return Err((
                    format!("{at}.name"),
                    format!("user {:?} is named twice", u.name),
                ));
            }
        }
        let open = cfg.password.is_none() && cfg.users.is_empty();
        if open {
            default = Some(Arc::new(User::everything("default", Vec::new())));
        }
        Ok(Users {
            default,
            open,
            named,
        })
    }

    /// Every user's name, sorted, as ACL USERS lists them: `default` always (as in Redis,
    /// where it exists even when it is off).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .named
            .keys()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .chain(std::iter::once("default".to_string()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The user a new connection is before any AUTH: None when it must log in.
    pub fn initial(&self) -> Option<Arc<User>> {
        if self.open {
            self.default.clone()
        } else {
            None
        }
    }

    /// AUTH [user] pass. Without a user name, the default user.
    pub fn login(&self, user: Option<&[u8]>, pass: &[u8]) -> Result<Arc<User>, &'static str> {
        if self.open && user.is_none_or(|u| u == b"default") {
            return Err(NO_PASSWORD);
        }
        let u = match user {
            None | Some(b"default") => self.default.as_ref(),
            Some(name) => self.named.get(name),
        };
        match u {
            Some(u) if u.enabled && u.password_is(pass) => Ok(u.clone()),
            _ => Err(WRONGPASS),
        }
    }
}

fn user(at: &str, u: &UserConfig) -> Result<User, (String, String)> {
    if u.name.is_empty() || u.name.contains(char::is_whitespace) {
        return Err((format!("{at}.name"), "a user name is one word".into()));
    }
    let mut hashes = Vec::new();
    for (j, h) in u.passwords_sha256.iter().enumerate() {
        hashes.push(unhex(h).ok_or_else(|| {
            (
                format!("{at}.passwords_sha256[{j}]"),
                "must be 64 hex digits, the SHA-256 of the password (`saltshaker passwd` prints it)"
                    .into(),
            )
        })?);
    }
    let mut keys = Vec::new();
    let mut all_keys = false;
    for (j, k) in u.keys.iter().enumerate() {
        let k = k.strip_prefix('~').unwrap_or(k);
        if k == "*" || k == "allkeys" {
            all_keys = true;
            continue;
        }
        keys.push(Glob::new(k).map_err(|e| (format!("{at}.keys[{j}]"), format!("{k:?}: {e}")))?);
    }
    let specs = command::all();
    let mut commands = vec![0u64; specs.len().div_ceil(64)];
    for (j, rule) in u.commands.iter().enumerate() {
        let bad = |why: String| (format!("{at}.commands[{j}]"), format!("{rule:?}: {why}"));
        let (on, what) = match rule.as_bytes().first() {
            Some(b'+') => (true, &rule[1..]),
            Some(b'-') => (false, &rule[1..]),
            _ if rule == "allcommands" => (true, "@all"),
            _ if rule == "nocommands" => (false, "@all"),
            _ => return Err(bad("starts with + or - (as +@read, -flushall)".into())),
        };
        let picked: Vec<usize> = if let Some(c) = what.strip_prefix('@') {
            if c.eq_ignore_ascii_case("all") {
                (0..specs.len()).collect()
            } else {
                let bit = cat::by_name(c).ok_or_else(|| {
                    bad(format!(
                        "unknown category; Redis's are {}",
                        cat::NAMES.join(", ")
                    ))
                })?;
                (0..specs.len())
                    .filter(|&i| specs[i].cats & bit != 0)
                    .collect()
            }
        } else {
            let spec =
                command::lookup(what.as_bytes()).ok_or_else(|| bad("unknown command".into()))?;
            let mut v = vec![index(spec)];
            if spec.is_container() {
                let prefix = format!("{} ", spec.name);
                v.extend((0..specs.len()).filter(|&i| specs[i].name.starts_with(&prefix)));
            }
            v
        };
        for i in picked {
            if on {
                commands[i / 64] |= 1 << (i % 64);
            } else {
                commands[i / 64] &= !(1 << (i % 64));
            }
        }
    }
    let all_commands = (0..specs.len()).all(|i| commands[i / 64] & (1 << (i % 64)) != 0);
    Ok(User {
        name: u.name.clone(),
        hashes,
        enabled: u.enabled,
        commands,
        all_commands,
        keys,
        all_keys,
    })
}

/// The position of a spec in `command::all()`.
fn index(spec: &'static Spec) -> usize {
    let base = command::all().as_ptr() as usize;
    let i = (spec as *const Spec as usize - base) / std::mem::size_of::<Spec>();
    debug_assert!(std::ptr::eq(&command::all()[i], spec));
    i
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
        assert_eq!(run(&u, &["GET", "other"]), Err(Denied::Key));
        assert_eq!(run(&u, &["MGET", "app:1", "zzz"]), Err(Denied::Key));
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
