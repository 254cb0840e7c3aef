//! What the proxy itself serves, as `COMMAND` through it tells it: a node's commands less
//! the ones the proxy refuses, plus the ones it answers that a node may not list
//! (`proxy::answer::command` writes the replies).

use super::{all, lookup, Route, Spec};

/// Whether the proxy refuses `name` (a command, or `parent|sub`), whatever its arguments:
/// its route is a refusal, and for a container, every one of its subcommands' is too.
pub fn refused(name: &[u8]) -> bool {
    let Some(spec) = lookup(&name.to_ascii_uppercase()) else {
        // A subcommand a newer node added to a container the proxy answers or refuses itself
        // (Valkey's CLUSTER SLOT-STATS): not learned, so answered `unknown subcommand`.
        let Some(cut) = name.iter().position(|&b| b == b'|' || b == b' ') else {
            return false;
        };
        return lookup(&name[..cut]).is_some_and(|p| {
            p.is_container() && matches!(p.route, Route::Local | Route::Unsupported(_))
        });
    };
    if !matches!(spec.route, Route::Unsupported(_)) {
        return false;
    }
    !spec.is_container() || subcommands(spec).all(|sub| matches!(sub.route, Route::Unsupported(_)))
}

/// The built-in subcommands of the container `spec`.
pub fn subcommands(spec: &'static Spec) -> impl Iterator<Item = &'static Spec> {
    let prefix_len = spec.name.len();
    all().iter().filter(move |s| {
        s.name.len() > prefix_len + 1
            && s.name.starts_with(spec.name)
            && s.name.as_bytes()[prefix_len] == b' '
    })
}

/// The commands the proxy answers itself, or implements over the nodes, that a node need
/// not know: `HOTKEYS` (answered from the proxy's sketches) and `SALTSHAKER.*`.
pub fn own() -> impl Iterator<Item = &'static Spec> {
    all().iter().filter(|s| {
        !s.name.contains(' ') && (s.name == "HOTKEYS" || s.name.starts_with("SALTSHAKER."))
    })
}

/// COMMAND DOCS's `summary` and `group` for one of the proxy's own commands (`own`).
pub fn own_doc(spec: &Spec) -> (&'static str, &'static str) {
    match spec.name {
        "HOTKEYS" => (
            "Lists the hot keys, answered by saltshaker from its detector's sketches.",
            "server",
        ),
        _ => (
            "Increments a counter through saltshaker, which may combine or salt it; replies as INCRBY.",
            "string",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_the_proxys_own_commands() {
        assert!(refused(b"save"));
        assert!(refused(b"SHUTDOWN"));
        assert!(refused(b"module"), "every MODULE subcommand is refused");
        assert!(refused(b"cluster|addslots"));
        assert!(!refused(b"cluster"), "CLUSTER SLOTS is answered");
        assert!(!refused(b"get"));
        assert!(!refused(b"no-such-command"));
        assert!(
            refused(b"cluster|slot-stats"),
            "a CLUSTER subcommand the proxy does not know"
        );
        assert!(refused(b"acl|newer-one"));
        assert!(
            !refused(b"client|capa"),
            "CLIENT's newer subcommands are learned and forwarded"
        );
        assert!(
            !refused(b"object|freq") && !refused(b"object|newer-one"),
            "OBJECT is forwarded"
        );
        let own: Vec<&str> = own().map(|s| s.name).collect();
        assert!(
            own.contains(&"HOTKEYS") && own.contains(&"SALTSHAKER.INCRBY"),
            "{own:?}"
        );
        assert_eq!(subcommands(lookup(b"HOTKEYS").unwrap()).count(), 4);
    }
}
