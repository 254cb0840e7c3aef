//! Where a dotted field (`rules[1].write.salt.shards`) sits in a YAML text, for errors that
//! are found after parsing, when the parser's own positions are gone.
//!
//! serde gives values without spans, so this walks the text itself. It understands the
//! YAML that rules files use: block mappings and sequences, flow mappings and sequences
//! (also across lines), quoted keys, comments, and block scalars (skipped). Anything it
//! does not understand only costs precision: the caller falls back to the nearest parent.

/// Every key and sequence item in the text: (dotted path, 1-based line, 1-based column).
pub fn index(text: &str) -> Vec<(String, usize, usize)> {
    let mut w = Walker::default();
    for (n, line) in text.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        w.line(n + 1, &chars);
    }
    w.out
}

/// Position of `path`, if the text spells it out.
pub fn find(text: &str, path: &str) -> Option<(usize, usize)> {
    index(text)
        .into_iter()
        .find(|(p, _, _)| p == path)
        .map(|(_, l, c)| (l, c))
}

/// The first candidate the text spells out; else the nearest spelled-out parent of the
/// first candidate; else the top of the file. Returns the path it settled on.
pub fn best(text: &str, candidates: &[String]) -> (String, usize, usize) {
    let idx = index(text);
    let at = |path: &str| {
        idx.iter()
            .find(|(p, _, _)| p == path)
            .map(|&(_, l, c)| (l, c))
    };
    for c in candidates {
        if let Some((l, col)) = at(c) {
            return (c.clone(), l, col);
        }
    }
    let first = candidates.first().cloned().unwrap_or_default();
    let mut parent = first.as_str();
    while let Some(cut) = parent.rfind(['.', '[']) {
        parent = &parent[..cut];
        if let Some((l, col)) = at(parent) {
            return (first, l, col);
        }
    }
    (first, 1, 1)
}

/// The second spelling of a key that appears twice under `under` (serde reports duplicates
/// without a position).
pub fn duplicate(text: &str, under: &str, name: &str) -> Option<(String, usize, usize)> {
    let idx = index(text);
    idx.iter().enumerate().find_map(|(i, (p, l, c))| {
        let own = p.rsplit(['.', ']']).next() == Some(name);
        let inside = under.is_empty() || p.starts_with(under);
        (own && inside && idx[..i].iter().any(|(q, _, _)| q == p)).then(|| (p.clone(), *l, *c))
    })
}

#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

#[derive(Debug)]
struct Flow {
    seq: bool,
    seg: Option<Seg>,
    want_key: bool,
    item_open: bool,
}

#[derive(Default)]
struct Walker {
    block: Vec<(usize, Seg)>,
    flow: Vec<Flow>,
    /// Inside a `|` or `>` scalar: lines indented deeper than this belong to it.
    scalar_indent: Option<usize>,
    out: Vec<(String, usize, usize)>,
}

impl Walker {
    fn path(&self, last: Option<&Seg>) -> String {
        let mut s = String::new();
        let segs = self
            .block
            .iter()
            .map(|(_, s)| s)
            .chain(self.flow.iter().filter_map(|f| f.seg.as_ref()));
        for seg in segs.chain(last) {
            match seg {
                Seg::Key(k) if s.is_empty() => s.push_str(k),
                Seg::Key(k) => {
                    s.push('.');
                    s.push_str(k)
                }
                Seg::Index(i) => s.push_str(&format!("[{i}]")),
            }
        }
        s
    }

    fn record(&mut self, line: usize, col: usize) {
        let p = self.path(None);
        self.out.push((p, line, col + 1));
    }

    fn line(&mut self, n: usize, l: &[char]) {
        if !self.flow.is_empty() {
            self.flow_from(n, l, 0);
            return;
        }
        let indent = l.iter().take_while(|&&c| c == ' ').count();
        let blank = indent == l.len() || l[indent] == '#';
        if let Some(si) = self.scalar_indent {
            if blank || indent > si {
                return;
            }
            self.scalar_indent = None;
        }
        if blank {
            return;
        }
        if indent == 0 && (l.starts_with(&['-', '-', '-']) || l.starts_with(&['.', '.', '.'])) {
            self.block.clear();
            return;
        }
        let mut c = indent;
        while l[c] == '-' && end_or(l, c + 1, |x| x == ' ') {
            while self.block.last().is_some_and(|(i, _)| *i > c) {
                self.block.pop();
            }
            match self.block.last_mut() {
                Some((i, Seg::Index(k))) if *i == c => *k += 1,
                _ => self.block.push((c, Seg::Index(0))),
            }
            self.record(n, c);
            c += 1;
            while c < l.len() && l[c] == ' ' {
                c += 1;
            }
            if c == l.len() {
                return;
            }
        }
        if l[c] == '{' || l[c] == '[' {
            self.flow_from(n, l, c);
            return;
        }
        let Some((key, after)) = block_key(l, c) else {
            return;
        };
        while self.block.last().is_some_and(|(i, _)| *i >= c) {
            self.block.pop();
        }
        self.block.push((c, Seg::Key(key)));
        self.record(n, c);
        let v = skip_spaces(l, after);
        match l.get(v) {
            Some('{') | Some('[') => self.flow_from(n, l, v),
            Some('|') | Some('>') => self.scalar_indent = Some(c),
            _ => {}
        }
    }

    fn flow_from(&mut self, n: usize, l: &[char], mut i: usize) {
        while i < l.len() {
            let c = l[i];
            if c == ' ' || c == '\t' {
                i += 1;
                continue;
            }
            if c == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t') {
                return;
            }
            match c {
                '{' | '[' => {
                    self.open_item(n, i);
                    self.flow.push(Flow {
                        seq: c == '[',
                        seg: None,
                        want_key: c == '{',
                        item_open: false,
                    });
                    if c == '[' {
                        if let Some(f) = self.flow.last_mut() {
                            f.seg = Some(Seg::Index(0));
                        }
                    }
                    i += 1;
                }
                '}' | ']' => {
                    self.flow.pop();
                    i += 1;
                    if self.flow.is_empty() {
                        return;
                    }
                }
                ',' => {
                    if let Some(f) = self.flow.last_mut() {
                        if f.seq {
                            let next = match f.seg {
                                Some(Seg::Index(k)) => k + 1,
                                _ => 0,
                            };
                            f.seg = Some(Seg::Index(next));
                            f.item_open = false;
                        } else {
                            f.want_key = true;
                        }
                    }
                    i += 1;
                }
                _ => {
                    let (tok, end) = scalar(l, i);
                    let next = skip_spaces(l, end);
                    let is_key = l.get(next) == Some(&':');
                    let want_key = self.flow.last().is_some_and(|f| !f.seq && f.want_key);
                    if is_key && want_key {
                        if let Some(f) = self.flow.last_mut() {
                            f.seg = Some(Seg::Key(tok));
                            f.want_key = false;
                        }
                        self.record(n, i);
                        i = next + 1;
                    } else {
                        self.open_item(n, i);
                        i = if is_key { next + 1 } else { end };
                    }
                }
            }
        }
    }

    /// The first token of a flow sequence item marks where the item is.
    fn open_item(&mut self, n: usize, i: usize) {
        if self.flow.last().is_some_and(|f| f.seq && !f.item_open) {
            if let Some(f) = self.flow.last_mut() {
                f.item_open = true;
            }
            self.record(n, i);
        }
    }
}

/// True at the end of the line or where `f` holds.
fn end_or(l: &[char], i: usize, f: impl Fn(char) -> bool) -> bool {
    l.get(i).is_none_or(|&x| f(x))
}

fn skip_spaces(l: &[char], mut i: usize) -> usize {
    while i < l.len() && (l[i] == ' ' || l[i] == '\t') {
        i += 1;
    }
    i
}

/// A scalar token at `i` (quoted or plain, as far as a flow context allows): its text and end.
fn scalar(l: &[char], i: usize) -> (String, usize) {
    let q = l[i];
    if q == '"' || q == '\'' {
        let mut s = String::new();
        let mut j = i + 1;
        while j < l.len() {
            if q == '"' && l[j] == '\\' && j + 1 < l.len() {
                s.push(l[j + 1]);
                j += 2;
                continue;
            }
            if l[j] == q {
                if q == '\'' && l.get(j + 1) == Some(&'\'') {
                    s.push('\'');
                    j += 2;
                    continue;
                }
                return (s, j + 1);
            }
            s.push(l[j]);
            j += 1;
        }
        return (s, j);
    }
    let mut j = i;
    while j < l.len() {
        let c = l[j];
        let ends_key = c == ':' && end_or(l, j + 1, |x| matches!(x, ' ' | '\t' | ',' | '}' | ']'));
        if ends_key
            || matches!(c, ',' | '{' | '}' | '[' | ']')
            || (c == '#' && j > i && l[j - 1] == ' ')
        {
            break;
        }
        j += 1;
    }
    (l[i..j].iter().collect::<String>().trim_end().to_string(), j)
}

/// `key:` at `c` in block context: the key and the index just past the colon.
fn block_key(l: &[char], c: usize) -> Option<(String, usize)> {
    let (key, end) = scalar(l, c);
    let colon = skip_spaces(l, end);
    let ok = l.get(colon) == Some(&':') && end_or(l, colon + 1, |x| x == ' ' || x == '\t');
    ok.then_some((key, colon + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"version: 1
detection: { window_ms: 1000, top_k: 64 }
defaults:
  read:  { hot_at_per_sec: 2000, cool_below_per_sec: 500,
           cache: { enabled: true, ttl_ms: 1000 } }
rules:            # first match wins
  - match: "likes:*"
    write: { strategy: salt, salt: { shards: 8 } }
  - match: 'lock:*'
    write:
      strategy: off   # never
    note: |
      fake: key
  - { match: "vote:final", pin: true }
list: [a, {x: 1}, [b]]
"#;

    #[test]
    fn block_and_flow_keys_are_found_across_lines() {
        assert_eq!(find(DOC, "version"), Some((1, 1)));
        assert_eq!(find(DOC, "detection.top_k"), Some((2, 31)));
        assert_eq!(find(DOC, "defaults.read.cool_below_per_sec"), Some((4, 34)));
        assert_eq!(find(DOC, "defaults.read.cache.ttl_ms"), Some((5, 36)));
        assert_eq!(find(DOC, "rules[0].write.salt.shards"), Some((8, 38)));
        assert_eq!(find(DOC, "rules[1]"), Some((9, 3)));
        assert_eq!(find(DOC, "rules[1].match"), Some((9, 5)));
        assert_eq!(find(DOC, "rules[1].write.strategy"), Some((11, 7)));
        assert_eq!(find(DOC, "rules[2].match"), Some((14, 7)));
        assert_eq!(find(DOC, "rules[2].pin"), Some((14, 28)));
        assert_eq!(find(DOC, "list[1].x"), Some((15, 12)));
        assert_eq!(find(DOC, "list[2][0]"), Some((15, 20)));
    }

    #[test]
    fn block_scalar_content_is_not_taken_for_keys() {
        assert_eq!(find(DOC, "rules[1].note.fake"), None);
        assert_eq!(find(DOC, "rules[1].note"), Some((12, 5)));
        assert_eq!(find(DOC, "rules[2]"), Some((14, 3)));
    }

    #[test]
    fn best_falls_back_to_the_nearest_parent() {
        let c = vec![
            "rules[0].write.cool_below_per_sec".to_string(),
            "rules[0].write.strategy".to_string(),
        ];
        assert_eq!(
            best(DOC, &c),
            ("rules[0].write.strategy".to_string(), 8, 14)
        );
        let c = vec!["rules[1].read.cache.ttl_ms".to_string()];
        assert_eq!(
            best(DOC, &c),
            ("rules[1].read.cache.ttl_ms".to_string(), 9, 3)
        );
        assert_eq!(best(DOC, &["nowhere".to_string()]).1, 1);
    }

    #[test]
    fn a_key_given_twice_is_found_at_its_second_spelling() {
        let t = "version: 1\nrules:\n  - match: a\n    pin: true\n    pin: false\n";
        assert_eq!(duplicate(t, "", "pin"), Some(("rules[0].pin".into(), 5, 5)));
        assert_eq!(duplicate("a: 1\nb: 2\n", "", "a"), None);
    }

    #[test]
    fn never_panics_on_arbitrary_text() {
        let alphabet: Vec<char> = "ab: -{}[],#'\"\n|>\t\\é".chars().collect();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..20_000 {
            let mut t = String::new();
            for _ in 0..(seed % 60) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                t.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            let idx = index(&t);
            let _ = best(&t, &["a.b[0]".to_string()]);
            let _ = duplicate(&t, "", "a");
            let _ = crate::rules::Rules::parse(&t, "fuzz.yaml");
            assert!(idx.iter().all(|(_, l, c)| *l >= 1 && *c >= 1));
        }
    }
}
