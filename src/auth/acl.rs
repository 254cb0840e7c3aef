//! One user as Redis 7's ACL sees it, and the rule language that shapes it (`ACL SETUSER`
//! and the config's `commands:`/`keys:`): flags, passwords, a root selector and further
//! selectors, each with command rules, key patterns (`~`, `%R~`, `%W~`) and channel
//! patterns (`&`). A command is allowed when one selector allows the command and every
//! key (and channel) it names.
//!
//! Key access follows the command, not each key spec: a write command needs `W` on its
//! keys, a read command `R`, any other both. Redis 7 looks at each key's own flags, so a
//! `%R~` pattern lets a few mixed commands (LMOVE's source, COPY's source) through Redis
//! that the proxy refuses; never the other way round.

use crate::command::{self, cat, flags, Access, Args, Classified, Cmd, Spec};
use crate::glob::{stringmatch, Glob};

/// Why a SETUSER rule was refused: Redis's own texts.
pub const SYNTAX: &str = "Syntax error";
pub const UNKNOWN: &str = "Unknown command or category name in ACL";
pub const BAD_HASH: &str =
    "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters";
pub const NO_SUCH_PASS: &str = "The password you are trying to remove from the user does not exist";
pub const AFTER_ALL_KEYS: &str = "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns";
pub const AFTER_ALL_CHANNELS: &str = "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to start with an empty list of channels";

/// A key pattern and what it grants.
#[derive(Debug, Clone)]
struct KeyPattern {
    glob: Glob,
    read: bool,
    write: bool,
}

/// Commands, keys and channels: the root of a user, or one of its `(...)` selectors.
#[derive(Debug, Clone)]
pub struct Selector {
    /// One bit per command of `command::all()`.
    commands: Vec<u64>,
    /// Set by `+@all`: commands added later are allowed too (the description starts
    /// with `+@all`).
    future: bool,
    /// The command rules since the last `+@all`/`-@all`, lower case, each once, in order.
    rules: Vec<String>,
    keys: Vec<KeyPattern>,
    all_keys: bool,
    channels: Vec<String>,
    all_channels: bool,
    /// Every command's bit is set: kept by `apply`, as `unrestricted` is asked per command.
    all_cmds: bool,
}

impl Selector {
    /// Nothing allowed (a new user's root, `reset`).
    pub fn none() -> Selector {
        Selector {
            commands: vec![0; command::all().len().div_ceil(64)],
            future: false,
            rules: Vec::new(),
            keys: Vec::new(),
            all_keys: false,
            channels: Vec::new(),
            all_channels: false,
            all_cmds: false,
        }
    }

    /// Everything allowed: `+@all ~* &*`.
    pub fn everything() -> Selector {
        let mut s = Selector::none();
        s.set_all(true);
        s.all_keys = true;
        s.all_channels = true;
        s
    }

    /// Every command, key and channel: the session skips the checks (asked per command).
    pub fn unrestricted(&self) -> bool {
        self.all_cmds && self.all_keys && self.all_channels
    }

    fn bit(&self, i: usize) -> bool {
        self.commands[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: usize, on: bool) {
        if on {
            self.commands[i / 64] |= 1 << (i % 64);
        } else {
            self.commands[i / 64] &= !(1 << (i % 64));
        }
    }

    fn set_all(&mut self, on: bool) {
        let n = command::all().len();
        (0..n).for_each(|i| self.set(i, on));
        self.future = on;
        self.all_cmds = on;
        self.rules.clear();
    }

    /// One selector rule: `+get`, `-@write`, `~k*`, `%R~k*`, `&ch*`, `allkeys`, ...
    /// Err is Redis's reason text.
    pub fn apply(&mut self, rule: &str) -> Result<(), &'static str> {
        let lower = rule.to_ascii_lowercase();
        match lower.as_str() {
            "allcommands" | "+@all" => self.set_all(true),
            "nocommands" | "-@all" => self.set_all(false),
            // `~*` is `allkeys` itself, again or not: Redis 7.0 answers OK to `~* ~*` and
            // `allkeys ~*`. Any other pattern after either, `%RW~*` included, is an error.
            "allkeys" | "~*" => {
                self.keys.clear();
                self.all_keys = true;
            }
            "resetkeys" => {
                self.keys.clear();
                self.all_keys = false;
            }
            "allchannels" => {
                self.channels.clear();
                self.all_channels = true;
            }
            "resetchannels" => {
                self.channels.clear();
                self.all_channels = false;
            }
            _ => {
                if let Some(what) = rule.strip_prefix('&') {
                    // `&*` is `allchannels` itself, again or not (Redis 7.0 answers OK to
                    // `&* &*`); any other pattern after either is an error.
                    if what == "*" {
                        self.channels.clear();
                        self.all_channels = true;
                    } else if self.all_channels {
                        return Err(AFTER_ALL_CHANNELS);
                    } else if !self.channels.iter().any(|c| c == what) {
                        self.channels.push(what.to_string());
                    }
                    return Ok(());
                }
                if let Some((read, write, pattern)) = key_rule(rule)? {
                    return self.add_key(read, write, pattern);
                }
                let (on, what) = match lower.as_bytes().first() {
                    Some(b'+') => (true, &lower[1..]),
                    Some(b'-') => (false, &lower[1..]),
                    _ => return Err(SYNTAX),
                };
                for i in picked(what)? {
                    self.set(i, on);
                }
                self.all_cmds = (0..command::all().len()).all(|i| self.bit(i));
                self.rules.retain(|r| r[1..] != *what);
                self.rules.push(lower);
            }
        }
        Ok(())
    }

    fn add_key(&mut self, read: bool, write: bool, pattern: &str) -> Result<(), &'static str> {
        if self.all_keys {
            return Err(AFTER_ALL_KEYS);
        }
        if pattern == "*" && read && write {
            self.keys.clear();
            self.all_keys = true;
            return Ok(());
        }
        let glob = Glob::new(pattern).map_err(|_| SYNTAX)?;
        if let Some(k) = self.keys.iter_mut().find(|k| k.glob.as_str() == pattern) {
            k.read |= read;
            k.write |= write;
        } else {
            self.keys.push(KeyPattern { glob, read, write });
        }
        Ok(())
    }

    /// Whether the command rules allow `spec`. A command learned from the nodes has no
    /// bit: the rules are replayed over it in order (`@all`, its categories, its name).
    fn allows_command(&self, spec: &'static Spec) -> bool {
        if let Some(i) = index(spec) {
            return self.bit(i);
        }
        let name = spec.fullname();
        let names = |what: &str| {
            what == "@all"
                || what == name
                || (what.strip_prefix('@').and_then(cat::by_name))
                    .is_some_and(|b| spec.cats & b != 0)
        };
        let last = self.rules.iter().rev().find(|r| names(&r[1..]));
        last.map_or(self.all_cmds, |r| r.starts_with('+'))
    }

    /// Does this selector allow `c` with these arguments?
    fn allows<A: Args + ?Sized>(&self, c: &Classified, args: &A) -> Result<(), Denied> {
        if !c.spec.has(flags::NO_AUTH) && !self.allows_command(c.spec) {
            return Err(Denied::Command(c.spec.fullname()));
        }
        if c.route == command::Route::Subscribe && !self.unrestricted() {
            return Err(Denied::Subscribe);
        }
        if !self.all_keys {
            let (read, write) = match c.access {
                Access::Read => (true, false),
                Access::Write => (false, true),
                Access::Other => (true, true),
            };
            for n in 0..c.keys.len() {
                let key = c.key(args, n).unwrap_or_default();
                let ok = self
                    .keys
                    .iter()
                    .any(|k| (!read || k.read) && (!write || k.write) && k.glob.matches(key));
                if !ok {
                    return Err(Denied::Key(key.to_vec()));
                }
            }
        }
        let publish = matches!(c.spec.cmd, Cmd::Publish | Cmd::Spublish);
        if !self.all_channels && publish && args.argc() > 1 {
            let ch = args.arg(1);
            if !self.channels.iter().any(|p| stringmatch(p.as_bytes(), ch)) {
                return Err(Denied::Channel(ch.to_vec()));
            }
        }
        Ok(())
    }

    /// The command rules as ACL GETUSER and ACL LIST show them: `+@all` or `-@all`, then
    /// every rule since, in order.
    pub fn describe_commands(&self) -> String {
        let mut out = String::from(if self.future { "+@all" } else { "-@all" });
        for r in &self.rules {
            out.push(' ');
            out.push_str(r);
        }
        out
    }

    /// The key patterns: `~*`, or each as `~p`, `%R~p`, `%W~p`.
    pub fn describe_keys(&self) -> Vec<String> {
        if self.all_keys {
            return vec!["~*".into()];
        }
        self.keys
            .iter()
            .map(|k| {
                let p = k.glob.as_str();
                match (k.read, k.write) {
                    (true, true) => format!("~{p}"),
                    (true, false) => format!("%R~{p}"),
                    _ => format!("%W~{p}"),
                }
            })
            .collect()
    }

    /// The channel patterns: `&*`, or each as `&p`.
    pub fn describe_channels(&self) -> Vec<String> {
        if self.all_channels {
            return vec!["&*".into()];
        }
        self.channels.iter().map(|c| format!("&{c}")).collect()
    }

    /// As ACL LIST writes it: keys, channels (after `resetchannels` unless all), commands.
    pub fn describe(&self) -> String {
        let mut parts = self.describe_keys();
        if !self.all_channels {
            parts.push("resetchannels".into());
        }
        parts.extend(self.describe_channels());
        parts.push(self.describe_commands());
        parts.join(" ")
    }
}

/// `~p` (read and write), `%R~p`, `%W~p`, `%RW~p`; None when the rule is no key rule.
fn key_rule(rule: &str) -> Result<Option<(bool, bool, &str)>, &'static str> {
    if let Some(p) = rule.strip_prefix('~') {
        return Ok(Some((true, true, p)));
    }
    let Some(rest) = rule.strip_prefix('%') else {
        return Ok(None);
    };
    let Some((perm, p)) = rest.split_once('~') else {
        return Err(SYNTAX);
    };
    let (mut read, mut write) = (false, false);
    for ch in perm.chars() {
        match ch.to_ascii_uppercase() {
            'R' => read = true,
            'W' => write = true,
            _ => return Err(SYNTAX),
        }
    }
    if !read && !write {
        return Err(SYNTAX);
    }
    Ok(Some((read, write, p)))
}

/// The commands a rule's name picks: `@cat`, `@all`, `name` (a container with its
/// subcommands), `parent|sub`.
fn picked(what: &str) -> Result<Vec<usize>, &'static str> {
    let specs = command::all();
    if let Some(c) = what.strip_prefix('@') {
        if c == "all" {
            return Ok((0..specs.len()).collect());
        }
        let bit = cat::by_name(c).ok_or(UNKNOWN)?;
        return Ok((0..specs.len())
            .filter(|&i| specs[i].cats & bit != 0)
            .collect());
    }
    if what.is_empty() {
        return Err(UNKNOWN);
    }
    let spec = command::lookup(what.as_bytes()).ok_or(UNKNOWN)?;
    if what.contains('|') && spec.name.contains(' ') != what.contains('|') {
        return Err(UNKNOWN);
    }
    // A learned command has no bit: `allows_command` replays the rule that names it.
    let mut v: Vec<usize> = index(spec).into_iter().collect();
    if spec.is_container() {
        let prefix = format!("{} ", spec.name);
        v.extend((0..specs.len()).filter(|&i| specs[i].name.starts_with(&prefix)));
    }
    Ok(v)
}

/// The position of a spec in `command::all()`; None for one learned from the nodes.
fn index(spec: &'static Spec) -> Option<usize> {
    if command::is_learned(spec) {
        return None;
    }
    let base = command::all().as_ptr() as usize;
    let i = (spec as *const Spec as usize - base) / std::mem::size_of::<Spec>();
    debug_assert!(std::ptr::eq(&command::all()[i], spec));
    Some(i)
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// Redis's full name of the command: `get`, `config|get`.
    Command(String),
    /// The first key refused.
    Key(Vec<u8>),
    Channel(Vec<u8>),
    /// (P|S)SUBSCRIBE by a restricted user: a subscribed connection is a pipe to the node
    /// (`proxy::conn::tunnel`), whose commands the proxy does not see, so none could be checked.
    Subscribe,
}

impl Denied {
    /// Redis's own error text (7.0).
    pub fn message(&self) -> String {
        match self {
            Denied::Command(name) => {
                format!("NOPERM this user has no permissions to run the '{name}' command")
            }
            Denied::Key(_) => {
                "NOPERM this user has no permissions to access one of the keys used as arguments"
                    .into()
            }
            Denied::Channel(_) => {
                "NOPERM this user has no permissions to access one of the channels used as arguments".into()
            }
            Denied::Subscribe => "NOPERM saltshaker: only users with every command, key and channel (+@all ~* &*) may subscribe through the proxy".into(),
        }
    }

    /// ACL DRYRUN's text.
    pub fn dryrun(&self) -> String {
        match self {
            Denied::Command(name) => {
                format!("This user has no permissions to run the '{name}' command")
            }
            Denied::Key(k) => format!(
                "This user has no permissions to access the '{}' key",
                String::from_utf8_lossy(k)
            ),
            Denied::Channel(c) => format!(
                "This user has no permissions to access the '{}' channel",
                String::from_utf8_lossy(c)
            ),
            Denied::Subscribe => self.message(),
        }
    }

    /// The metric label, and ACL LOG's `reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::Command(_) => "command",
            Denied::Key(_) => "key",
            Denied::Channel(_) => "channel",
            Denied::Subscribe => "subscribe",
        }
    }

    /// ACL LOG's `object`: the command, key or channel.
    pub fn object(&self, c: &Classified) -> String {
        match self {
            Denied::Command(name) => name.clone(),
            Denied::Key(k) | Denied::Channel(k) => String::from_utf8_lossy(k).into_owned(),
            Denied::Subscribe => c.spec.fullname(),
        }
    }
}

/// A user a connection is logged in as.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub enabled: bool,
    pub nopass: bool,
    /// Shown in ACL LIST and GETUSER after `reset`, as Redis shows it; nothing else.
    sanitize_payload: bool,
    hashes: Vec<[u8; 32]>,
    pub root: Selector,
    pub selectors: Vec<Selector>,
}

impl User {
    /// A new user, as ACL SETUSER makes one: off, no password, nothing allowed.
    pub fn new(name: &str) -> User {
        User {
            name: name.into(),
            enabled: false,
            nopass: false,
            sanitize_payload: false,
            hashes: Vec::new(),
            root: Selector::none(),
            selectors: Vec::new(),
        }
    }

    /// On, with these password hashes (none: `nopass`), every command, key and channel.
    pub fn everything(name: &str, hashes: Vec<[u8; 32]>) -> User {
        User {
            enabled: true,
            nopass: hashes.is_empty(),
            hashes,
            root: Selector::everything(),
            ..User::new(name)
        }
    }

    /// True when the user may run every command on every key and channel.
    pub fn unrestricted(&self) -> bool {
        self.root.unrestricted()
    }

    /// May this user run `c` with these arguments? The root's refusal when no selector
    /// allows it, as Redis reports.
    pub fn check<A: Args + ?Sized>(&self, c: &Classified, args: &A) -> Result<(), Denied> {
        let first = self.root.allows(c, args);
        if first.is_ok() || self.selectors.iter().any(|s| s.allows(c, args).is_ok()) {
            return Ok(());
        }
        first
    }

    pub fn password_is(&self, pass: &[u8]) -> bool {
        if self.nopass {
            return true;
        }
        let h = super::sha256(pass);
        // Compare every byte of every hash, so the time says nothing of where they differ.
        self.hashes.iter().fold(false, |ok, k| {
            ok | (k.iter().zip(h.iter()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0)
        })
    }

    pub fn hashes(&self) -> &[[u8; 32]] {
        &self.hashes
    }

    /// One ACL SETUSER rule. Err is Redis's reason text.
    pub fn apply(&mut self, rule: &str) -> Result<(), &'static str> {
        if let Some(inner) = rule.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
            let mut s = Selector::none();
            for r in inner.split_ascii_whitespace() {
                s.apply(r)?;
            }
            self.selectors.push(s);
            return Ok(());
        }
        match rule.to_ascii_lowercase().as_str() {
            "on" => self.enabled = true,
            "off" => self.enabled = false,
            "nopass" => {
                self.nopass = true;
                self.hashes.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.hashes.clear();
            }
            "clearselectors" => self.selectors.clear(),
            "sanitize-payload" => self.sanitize_payload = true,
            "skip-sanitize-payload" => self.sanitize_payload = false,
            "reset" => {
                let name = std::mem::take(&mut self.name);
                *self = User::new(&name);
                self.sanitize_payload = true;
            }
            _ => {
                if let Some(p) = rule.strip_prefix('>') {
                    self.add_hash(super::sha256(p.as_bytes()));
                } else if let Some(p) = rule.strip_prefix('<') {
                    self.remove_hash(super::sha256(p.as_bytes()))?;
                } else if let Some(h) = rule.strip_prefix('#') {
                    self.add_hash(hash_rule(h)?);
                } else if let Some(h) = rule.strip_prefix('!') {
                    self.remove_hash(hash_rule(h)?)?;
                } else {
                    self.root.apply(rule)?;
                }
            }
        }
        Ok(())
    }

    fn add_hash(&mut self, h: [u8; 32]) {
        self.nopass = false;
        if !self.hashes.contains(&h) {
            self.hashes.push(h);
        }
    }

    fn remove_hash(&mut self, h: [u8; 32]) -> Result<(), &'static str> {
        let before = self.hashes.len();
        self.hashes.retain(|k| *k != h);
        if before == self.hashes.len() {
            return Err(NO_SUCH_PASS);
        }
        Ok(())
    }

    /// ACL GETUSER's `flags`.
    pub fn flags(&self) -> Vec<&'static str> {
        let mut f = vec![if self.enabled { "on" } else { "off" }];
        if self.nopass {
            f.push("nopass");
        }
        if self.sanitize_payload {
            f.push("sanitize-payload");
        }
        f
    }

    /// The user as an ACL LIST line.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("user {}", self.name)];
        parts.extend(self.flags().iter().map(|f| f.to_string()));
        parts.extend(self.hashes.iter().map(|h| format!("#{}", super::hex(h))));
        parts.push(self.root.describe());
        for s in &self.selectors {
            parts.push(format!("({})", s.describe()));
        }
        parts.join(" ")
    }
}

/// `#<hash>`: 64 lower-case hex digits.
fn hash_rule(h: &str) -> Result<[u8; 32], &'static str> {
    if h.len() != 64
        || !h
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(BAD_HASH);
    }
    super::unhex(h).ok_or(BAD_HASH)
}

/// Splits SETUSER's arguments into rules, a `(...)` selector being one rule even when its
/// parts came as several arguments. Err is the argument an unmatched `(` starts at.
pub fn split_rules(args: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut open: Option<String> = None;
    for a in args {
        match open.as_mut() {
            Some(acc) => {
                acc.push(' ');
                acc.push_str(a);
                if a.ends_with(')') {
                    out.push(open.take().unwrap_or_default());
                }
            }
            None if a.starts_with('(') && !a.ends_with(')') => open = Some(a.clone()),
            None => out.push(a.clone()),
        }
    }
    match open {
        Some(acc) => Err(acc),
        None => Ok(out),
    }
}
