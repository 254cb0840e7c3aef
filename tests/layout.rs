//! The shape of the code, checked: no file in `src/` over 600 lines, the leaves import
//! nothing of the crate, no import cycle between the folders of `src/` nor between any
//! two files (a folder's `mod.rs` may name its own children), imports inside `salt/` and
//! `proxy/` go one way, a salt kind imports no other kind, no code outside
//! `salt/kinds/` matches on a salt kind, and at most 10 `Result<_, String>` are left in
//! the code.
//!
//! Imports are read from the source text: `crate::a::b`, `super::x` (also in `{...}`
//! groups), and a parent module naming its own children (`child::f`). Test code
//! (`#[cfg(test)]` onwards, `*tests.rs` files) is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `dir`, by its module path (`salt/kinds/set.rs` is
/// `[salt, kinds, set]`, a `mod.rs` names its folder).
fn modules(dir: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(dir).unwrap().with_extension("");
                let mut m: Module = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                // `lib.rs` is the crate root; `main.rs` is a crate of its own and keeps
                // its name, so both are checked.
                if matches!(m.last().map(String::as_str), Some("mod"))
                    || m.as_slice() == ["lib".to_string()]
                {
                    m.pop();
                }
                out.insert(m, p);
            }
        }
    }
    out
}

fn is_test_file(p: &Path) -> bool {
    p.file_stem()
        .is_some_and(|s| s.to_string_lossy().ends_with("tests"))
}

/// The source without test code and line comments.
fn code(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap();
    let s = match s.find("#[cfg(test)]") {
        Some(i) => &s[..i],
        None => &s[..],
    };
    s.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths named after each occurrence of `prefix` (`crate::` or `super::`): `a::b::C`
/// as `[a, b, C]`, and each first-level name of a `{...}` group.
fn paths_after(src: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = src[at..].find(prefix) {
        let start = at + i;
        at = start + prefix.len();
        if src[..start].chars().next_back().is_some_and(ident) || src[..start].ends_with("(in ") {
            // `pub(in crate::proxy)` is a visibility, not an import.
            continue;
        }
        let rest = &src[at..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first name of each item at the group's first level: `{a::B, c}` names
            // `a` and `c`.
            let (mut depth, mut word, mut first) = (0, String::new(), true);
            for c in group.chars() {
                if depth == 0 && ident(c) {
                    word.push(c);
                    continue;
                }
                if !word.is_empty() && first {
                    out.push(vec![std::mem::take(&mut word)]);
                    first = false;
                }
                word.clear();
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => first = true,
                    _ => {}
                }
            }
            continue;
        }
        let mut path = Vec::new();
        let mut s = rest;
        loop {
            let n = s.find(|c: char| !ident(c)).unwrap_or(s.len());
            if n == 0 {
                break;
            }
            path.push(s[..n].to_string());
            match s[n..].strip_prefix("::") {
                Some(r) if r.starts_with(|c: char| ident(c)) => s = r,
                _ => break,
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    out
}

/// Which modules each module's code names (the deepest file module of each path).
fn imports(mods: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let owner = |p: &[String]| -> Option<Module> {
        (1..=p.len())
            .rev()
            .map(|n| p[..n].to_vec())
            .find(|m| mods.contains_key(m))
    };
    let mut out = BTreeMap::new();
    for (m, p) in mods {
        if is_test_file(p) || m.is_empty() {
            continue;
        }
        let src = code(p);
        let mut named = Vec::new();
        named.extend(paths_after(&src, "crate::"));
        let parent = &m[..m.len() - 1];
        for p in paths_after(&src, "super::") {
            named.push(parent.iter().cloned().chain(p).collect());
        }
        // A module naming its own child modules: `child::f`, `use child::X`.
        for child in mods
            .keys()
            .filter(|k| k.len() == m.len() + 1 && k[..m.len()] == m[..])
        {
            let name = format!("{}::", child.last().unwrap());
            let found = src.match_indices(&name).any(|(i, _)| {
                !src[..i].ends_with("::") && !src[..i].chars().next_back().is_some_and(ident)
            });
            if found {
                named.push(child.clone());
            }
        }
        let set: BTreeSet<Module> = named
            .iter()
            .filter_map(|p| owner(p))
            .filter(|o| o != m && !o.is_empty())
            .collect();
        out.insert(m.clone(), set);
    }
    out
}

/// A cycle in `graph`, if there is one.
fn cycle<T: Ord + Clone>(graph: &BTreeMap<T, BTreeSet<T>>) -> Option<Vec<T>> {
    fn visit<T: Ord + Clone>(
        n: &T,
        g: &BTreeMap<T, BTreeSet<T>>,
        state: &mut BTreeMap<T, u8>,
        path: &mut Vec<T>,
    ) -> Option<Vec<T>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let i = path.iter().position(|x| x == n).unwrap();
                let mut c = path[i..].to_vec();
                c.push(n.clone());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.clone(), 1);
        path.push(n.clone());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// Most `Result<_, String>` the code may hold.
const MAX_STRING_RESULTS: usize = 10;

/// How many `Result<..., String>` the source names (the error type last, at the
/// `Result`'s own depth).
fn string_results(src: &str) -> usize {
    let mut n = 0;
    for (i, _) in src.match_indices("Result<") {
        let rest = &src[i + "Result<".len()..];
        let (mut depth, mut last_comma) = (0i32, None);
        for (j, c) in rest.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth > 0 => depth -= 1,
                '>' => {
                    if last_comma.is_some_and(|k: usize| rest[k + 1..j].trim() == "String") {
                        n += 1;
                    }
                    break;
                }
                ',' if depth == 0 => last_comma = Some(j),
                _ => {}
            }
        }
    }
    n
}

/// The salt kinds' names (`salt::record::Kind`).
const SALT_KINDS: [&str; 6] = ["String", "Hash", "Set", "Hll", "ZSet", "Fields"];

/// Where the source names a salt kind's variant (`Kind::Set`): to match on it, compare
/// with it or build it. Only `salt/kinds/` may; everything else asks the kind's trait.
fn salt_kind_uses(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in src.match_indices("Kind::") {
        let before_ok = i == 0 || !src[..i].chars().next_back().is_some_and(ident);
        let rest = &src[i + "Kind::".len()..];
        let name: String = rest.chars().take_while(|&c| ident(c)).collect();
        if before_ok && SALT_KINDS.contains(&name.as_str()) {
            out.push(format!("Kind::{name}"));
        }
    }
    out
}

/// Everything wrong with the layout of the tree at `dir`.
fn problems(dir: &Path) -> Vec<String> {
    let mods = modules(dir);
    let imp = imports(&mods);
    let mut out = Vec::new();
    for p in mods.values() {
        let n = std::fs::read_to_string(p).unwrap().lines().count();
        if n > 600 {
            out.push(format!("{} has {n} lines (at most 600)", p.display()));
        }
    }
    // Errors are typed: a `Result<_, String>` says nothing a caller can act on, nor who
    // failed. A few remain where the message is all there is (the process's start-up).
    let stringly: usize = mods
        .values()
        .filter(|p| !is_test_file(p))
        .map(|p| string_results(&code(p)))
        .sum();
    if stringly > MAX_STRING_RESULTS {
        out.push(format!(
            "{stringly} `Result<_, String>` in the code (at most {MAX_STRING_RESULTS})"
        ));
    }
    let show = |m: &Module| m.join("/");
    // A salt kind is one place: nothing outside `salt/kinds/` matches on it.
    for (m, p) in &mods {
        if m.len() >= 2 && m[..2] == ["salt", "kinds"] || is_test_file(p) {
            continue;
        }
        for u in salt_kind_uses(&code(p)) {
            out.push(format!(
                "{} names the salt kind {u} (ask `kinds::of`)",
                show(m)
            ));
        }
    }
    // Leaves.
    let leaves: &[(&str, &[&str])] = &[
        ("resp", &[]),
        ("hotkey", &[]),
        ("metrics", &[]),
        ("command", &["resp"]),
        ("net", &[]),
        ("glob", &[]),
    ];
    for (m, to) in &imp {
        for (leaf, allowed) in leaves {
            if m[0] == *leaf {
                for t in to
                    .iter()
                    .filter(|t| t[0] != *leaf && !allowed.contains(&t[0].as_str()))
                {
                    out.push(format!("the leaf {} imports {}", show(m), show(t)));
                }
            }
        }
    }
    // Folders of src/.
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, to) in &imp {
        for t in to.iter().filter(|t| t[0] != m[0]) {
            top.entry(m[0].clone()).or_default().insert(t[0].clone());
        }
    }
    if let Some(c) = cycle(&top) {
        out.push(format!("import cycle between folders: {}", c.join(" -> ")));
    }
    // Between files: imports go one way everywhere.
    // A folder's `mod.rs` is its facade: it declares its children and re-exports them, and
    // they name their parent's types. Those edges (parent to its own child) are left out;
    // every other import, a child's of its parent's and a sibling's of a sibling's, must
    // go one way.
    let mut g: BTreeMap<Module, BTreeSet<Module>> = imp
        .iter()
        .map(|(m, to)| {
            let deps = to
                .iter()
                .filter(|t| !(t.len() == m.len() + 1 && t[..m.len()] == m[..]))
                .cloned()
                .collect();
            (m.clone(), deps)
        })
        .collect();
    while let Some(c) = cycle(&g) {
        g.get_mut(&c[c.len() - 2]).unwrap().remove(&c[c.len() - 1]);
        let c: Vec<String> = c.iter().map(show).collect();
        out.push(format!("import cycle between files: {}", c.join(" -> ")));
    }
    // Inside salt/ and proxy/: files import one way.
    for folder in ["salt", "proxy"] {
        let inner: BTreeMap<Module, BTreeSet<Module>> = imp
            .iter()
            .filter(|(m, _)| m[0] == folder)
            .map(|(m, to)| {
                (
                    m.clone(),
                    to.iter().filter(|t| t[0] == folder).cloned().collect(),
                )
            })
            .collect();
        if let Some(c) = cycle(&inner) {
            let c: Vec<String> = c.iter().map(show).collect();
            out.push(format!("import cycle in {folder}/: {}", c.join(" -> ")));
        }
    }
    // proxy/'s rooms (its folders) import one way too: a file's imports of another
    // room's files make an arrow between the rooms.
    let mut rooms: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let in_room = |m: &Module| m[0] == "proxy" && (m.len() >= 3 || mods[m].ends_with("mod.rs"));
    for (m, to) in imp.iter().filter(|(m, _)| m.len() >= 2 && in_room(m)) {
        let deps = rooms.entry(m[1].clone()).or_default();
        for t in to {
            if t.len() >= 2 && in_room(t) && t[1] != m[1] {
                deps.insert(t[1].clone());
            }
        }
    }
    for (m, p) in &mods {
        if m.len() == 2 && m[0] == "proxy" && !p.ends_with("mod.rs") {
            out.push(format!(
                "{} lies in proxy/ outside its rooms (a folder each)",
                show(m)
            ));
        }
    }
    if let Some(c) = cycle(&rooms) {
        out.push(format!(
            "import cycle between proxy/'s rooms: {}",
            c.join(" -> ")
        ));
    }
    // A salt kind imports no other kind; the engine imports no kind.
    let kind_of = |m: &Module| (m.len() >= 3 && m[..2] == ["salt", "kinds"]).then(|| m[2].clone());
    let engine = [
        "salt",
        "salt/record",
        "salt/names",
        "salt/registry",
        "salt/journal",
        "salt/merge",
        "salt/kind",
    ];
    for (m, to) in &imp {
        for t in to {
            let into_kinds = t.len() >= 2 && t[..2] == ["salt", "kinds"];
            match kind_of(m) {
                Some(k) if into_kinds && kind_of(t).as_ref() != Some(&k) => {
                    out.push(format!("the salt kind {} imports {}", show(m), show(t)))
                }
                _ => {}
            }
            let top_of_salt = ["salt/ops", "salt/fold", "salt/relocate", "salt/coordinator"]
                .contains(&show(t).as_str());
            if engine.contains(&show(m).as_str()) && (into_kinds || top_of_salt) {
                out.push(format!(
                    "the salt engine file {} imports {}",
                    show(m),
                    show(t)
                ));
            }
        }
    }
    out
}

#[test]
fn the_source_tree_keeps_its_shape() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let p = problems(&src);
    assert!(
        p.is_empty(),
        "the layout rules are broken:\n  {}",
        p.join("\n  ")
    );
}

/// The checks can fail: a small tree that breaks each rule is caught.
#[test]
fn a_tree_that_breaks_the_rules_is_caught() {
    let dir = std::env::temp_dir().join(format!("saltshaker-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod resp;\npub mod salt;\npub mod proxy;\npub mod rules;\npub mod glob;\n",
    );
    write("rules/mod.rs", "mod a;\nmod b;\npub use a::A;\n");
    write("rules/a.rs", "use super::b::B;\npub struct A;\n");
    write("rules/b.rs", "use super::a::A;\npub struct B;\n");
    write(
        "glob.rs",
        &"fn f() -> Result<Vec<(u8, u8)>, String> { todo!() }\n".repeat(11),
    );
    write("resp.rs", "use crate::salt::Salt;\n");
    write(
        "salt/mod.rs",
        "pub mod kinds;\npub struct Salt;\nuse crate::proxy::Thing;\n",
    );
    write("salt/kinds/mod.rs", "pub mod set;\npub mod hll;\n");
    write("salt/kinds/set.rs", "use crate::salt::kinds::hll::X;\n");
    write(
        "salt/kinds/hll.rs",
        "pub struct X;\nfn f(k: Kind) -> bool { k == Kind::Hll }\n",
    );
    write(
        "salt/fold.rs",
        "fn f(k: Kind) -> bool { k == Kind::Set }\nfn g(k: ErrorKind) -> bool { k == ErrorKind::String }\n",
    );
    write(
        "proxy/mod.rs",
        "mod a;\nmod b;\npub struct Thing;\nuse crate::salt::Salt;\n",
    );
    write("proxy/a.rs", "use super::b::B;\npub struct A;\n");
    write(
        "proxy/b.rs",
        &format!(
            "use super::{{a::A, Thing}};\npub struct B;\n{}",
            "//\n".repeat(601)
        ),
    );
    // Two rooms of proxy/ whose files import each other's (no file cycle).
    write("proxy/x/mod.rs", "pub mod one;\npub mod two;\n");
    write("proxy/x/one.rs", "pub struct One;\n");
    write("proxy/x/two.rs", "use crate::proxy::y::four::Four;\n");
    write("proxy/y/mod.rs", "pub mod three;\npub mod four;\n");
    write("proxy/y/three.rs", "use crate::proxy::x::one::One;\n");
    write("proxy/y/four.rs", "pub(in crate::proxy) struct Four;\n");
    // main.rs is checked as well as lib.rs.
    write("main.rs", &"//\n".repeat(601));
    let p = problems(&dir).join("\n");
    let _ = std::fs::remove_dir_all(&dir);
    for want in [
        "b.rs has 603 lines",
        "the leaf resp imports salt",
        "import cycle between folders",
        "import cycle in proxy/",
        "import cycle between proxy/'s rooms: x -> y -> x",
        "main.rs has 601 lines",
        "proxy/a lies in proxy/ outside its rooms",
        "import cycle between files: rules/a -> rules/b -> rules/a",
        "11 `Result<_, String>` in the code (at most 10)",
        "the salt kind salt/kinds/set imports salt/kinds/hll",
        "salt/fold names the salt kind Kind::Set",
    ] {
        assert!(p.contains(want), "not caught: {want}\nfound:\n{p}");
    }
    for not in ["salt/kinds/hll names", "ErrorKind", "proxy/y/four -> proxy"] {
        assert!(!p.contains(not), "wrongly caught: {not}\nfound:\n{p}");
    }
}
