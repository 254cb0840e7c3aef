#!/usr/bin/env python3
"""Generates table.rs, the command table, from a live redis-server's COMMAND INFO.

Usage: python3 src/command/gen_table.py [--port P] > src/command/table.rs
Without --port it starts its own redis-server on a free loopback port and stops it.
The table is `#[rustfmt::skip]`, one command a line, so rustfmt leaves it as generated.

Redis is the reference for arity, flags and key positions; this script adds what Redis
cannot say: how the proxy routes each command (ROUTES below) and the commands newer
than the installed server (EXTRAS). A keyless command without an explicit route is an
error, so a new backend version cannot slip a command into the table unrouted.
"""
import re
import socket
import subprocess
import sys
import time

FLAG_NAMES = {
    "write": "WRITE", "readonly": "READ", "denyoom": "DENYOOM", "admin": "ADMIN",
    "pubsub": "PUBSUB", "noscript": "NOSCRIPT", "blocking": "BLOCKING",
    "loading": "LOADING", "stale": "STALE", "skip_monitor": "SKIP_MONITOR",
    "skip_slowlog": "SKIP_SLOWLOG", "asking": "ASKING", "fast": "FAST",
    "no_auth": "NO_AUTH", "may_replicate": "MAY_REPLICATE",
    "no_mandatory_keys": "NO_MANDATORY_KEYS", "no_async_loading": "NO_ASYNC_LOADING",
    "no_multi": "NO_MULTI", "movablekeys": "MOVABLE_KEYS", "allow_busy": "ALLOW_BUSY",
}
# Redis's ACL categories (`ACL CAT`), in its order; a user's `+@read` is checked against them.
CATEGORIES = ["keyspace", "read", "write", "set", "sortedset", "list", "hash", "string",
              "bitmap", "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow",
              "blocking", "dangerous", "connection", "transaction", "scripting"]
COUNTERS = {"INCR", "INCRBY", "DECR", "DECRBY", "INCRBYFLOAT", "HINCRBY", "HINCRBYFLOAT"}

# Movable-key commands whose keys need code (see keys.rs): keyword searches, option parsing,
# or a destination key before a numkeys block.
CUSTOM = {"XREAD", "XREADGROUP", "SORT", "MIGRATE", "GEORADIUS", "GEORADIUSBYMEMBER",
          "ZUNIONSTORE", "ZINTERSTORE", "ZDIFFSTORE"}


def unsupported(why):
    return 'Route::Unsupported("%s")' % why


# Why each command the proxy refuses is refused, and what to do instead.
REFUSED = {
    "SHUTDOWN": "SHUTDOWN is refused through the proxy: it would stop one node. Stop the nodes directly, and saltshaker with SIGTERM",
    "DEBUG": "DEBUG is refused through the proxy: it acts on one node's internals. Run it on the node directly",
    "PFDEBUG": "PFDEBUG is refused through the proxy: it acts on one node's internals. Run it on the node directly",
    "SAVE": "SAVE is refused through the proxy: persistence is per node. Run it on each node directly",
    "MOVE": "MOVE is refused through the proxy: a key's databases live on its node only. Use DUMP and RESTORE, or COPY with DB on the node",
    "SWAPDB": "SWAPDB is refused through the proxy: it would swap databases on one node only. Run it on each node directly",
    "FAILOVER": "FAILOVER is refused through the proxy: run it on the node; saltshaker follows a cluster's failovers itself",
    "SCRIPT DEBUG": "SCRIPT DEBUG is refused through the proxy: debug scripts on a node directly (redis-cli --ldb)",
    "ACL SAVE": "ACL SAVE is refused through the proxy: its users come from its config file (auth.users); write changes made with ACL SETUSER there",
    "ACL LOAD": "ACL LOAD is refused through the proxy: its users come from its config file (auth.users); restart or upgrade saltshaker to load it",
    "MODULE": "MODULE is refused through the proxy: load modules on each node directly",
}


def not_through(name):
    return unsupported(REFUSED.get(name, "%s is not supported through the proxy" % name))


ROUTES = {}


def route(names, r):
    for n in names.split(","):
        ROUTES[n.strip()] = r


route("MGET", "Route::Split(Split::Mget)")
route("MSET", "Route::Split(Split::Mset)")
route("DEL, UNLINK, EXISTS, TOUCH", "Route::Split(Split::SumInt)")
route("DBSIZE, SLOWLOG LEN, LATENCY RESET", "Route::AllNodes(Agg::SumInt)")
route("FLUSHALL, FLUSHDB, SCRIPT FLUSH, SCRIPT LOAD, FUNCTION LOAD, FUNCTION FLUSH, "
      "FUNCTION DELETE, FUNCTION RESTORE, CONFIG SET, CONFIG RESETSTAT, CONFIG REWRITE, "
      "MEMORY PURGE, SLOWLOG RESET", "Route::AllNodes(Agg::AllOk)")
# Every node starts its own background save or rewrite; the reply is the first node's
# once none failed.
route("BGSAVE, BGREWRITEAOF", "Route::AllNodes(Agg::AllOk)")
route("KEYS", "Route::AllNodes(Agg::ConcatArrays)")
route("SLOWLOG GET", "Route::AllNodes(Agg::Slowlog)")
route("SCRIPT EXISTS", "Route::AllNodes(Agg::AndArrays)")
route("WAIT, WAITAOF", "Route::AllNodes(Agg::MinInt)")
route("CONFIG GET, FUNCTION LIST, FUNCTION DUMP, FUNCTION STATS, LASTSAVE",
      "Route::AllNodes(Agg::First)")
route("TIME, LOLWUT, ROLE, PUBLISH, SPUBLISH, PFSELFTEST, MEMORY STATS, MEMORY DOCTOR, "
      "MEMORY MALLOC-STATS, LATENCY DOCTOR, LATENCY GRAPH, LATENCY HISTORY, LATENCY LATEST, "
      "LATENCY HISTOGRAM", "Route::AnyNode")
route("PING, ECHO, QUIT, HELLO, AUTH, SELECT, RESET, READONLY, READWRITE, INFO, "
      "CLIENT SETNAME, CLIENT GETNAME, CLIENT ID, CLIENT INFO, CLIENT LIST, CLIENT NO-EVICT, "
      "CLIENT NO-TOUCH, CLIENT SETINFO, CLIENT REPLY, CLIENT KILL, CLIENT PAUSE, CLIENT UNPAUSE, "
      "CLIENT UNBLOCK, MONITOR", "Route::Local")
# DEBUG ERROR is answered by the proxy (clients test their error handling with it); the
# other DEBUG subcommands are refused there (`proxy::answer::local`).
route("DEBUG", "Route::Local")
# The proxy's own users (`auth`): ACL acts on them, not on the nodes'.
route("ACL WHOAMI, ACL USERS, ACL SETUSER, ACL DELUSER, ACL GETUSER, ACL LIST, ACL DRYRUN, "
      "ACL GENPASS, ACL LOG, ACL HELP", "Route::Local")
route("ACL CAT", "Route::AnyNode")
for n in ["ACL SAVE", "ACL LOAD"]:
    route(n, not_through(n))
route("SCAN", "Route::Scan")
route("SCRIPT KILL, FUNCTION KILL", "Route::Kill")
route("RANDOMKEY", "Route::RandomKey")
route("MULTI, EXEC, DISCARD, WATCH, UNWATCH", "Route::Transaction")
route("SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE, UNSUBSCRIBE, PUNSUBSCRIBE, SUNSUBSCRIBE",
      "Route::Subscribe")
for n in ["SHUTDOWN", "MOVE", "SWAPDB", "FAILOVER", "PFDEBUG",
          "SAVE", "SCRIPT DEBUG"]:
    route(n, not_through(n))
route("SYNC, PSYNC, REPLCONF, REPLICAOF, SLAVEOF",
      unsupported("replication commands are not supported through the proxy"))
route("RESTORE-ASKING",
      unsupported("cluster commands are not supported through the proxy"))
# The proxy presents itself as a one-node cluster (`proxy::answer::as_cluster`).
route("ASKING, CLUSTER INFO, CLUSTER KEYSLOT, CLUSTER MYID, CLUSTER NODES, CLUSTER SHARDS, "
      "CLUSTER SLOTS", "Route::Local")
# OBJECT FREQ is answered from the proxy's own sketches, whatever the nodes' eviction
# policy, so that `redis-cli --hotkeys` works through the proxy (`proxy::answer::local`).
route("OBJECT FREQ", "Route::Local")
# HOTKEYS, answered from the proxy's own sketches (`proxy::registry::hotkeys`).
route("HOTKEYS, HOTKEYS START, HOTKEYS STOP, HOTKEYS GET, HOTKEYS RESET", "Route::Local")
# What the proxy serves, from a node's reply less its refusals plus its own commands
# (`proxy::answer::command`).
route("COMMAND, COMMAND COUNT, COMMAND DOCS, COMMAND INFO, COMMAND LIST", "Route::Local")
# Client-side caching, answered by the proxy for its own clients (`proxy::answer::client_cache`).
route("CLIENT TRACKING, CLIENT CACHING, CLIENT GETREDIR, CLIENT TRACKINGINFO", "Route::Local")
# Whole families, by container name.
FAMILY_ROUTES = {
    "ACL": "Route::Local",
    "CLUSTER": unsupported("cluster commands are not supported through the proxy"),
    "MODULE": not_through("MODULE"),
    "COMMAND": "Route::AnyNode",
    "PUBSUB": "Route::AnyNode",
}

# Commands newer than Redis 7.0: (name, arity, flags, (first, last, step) or None, since).
EXTRAS = [
    ("CLIENT NO-TOUCH", 3, "noscript loading stale", None, "7.2", "slow connection"),
    ("CLIENT SETINFO", 4, "noscript loading stale", None, "7.2", "slow connection"),
    ("WAITAOF", 4, "noscript", None, "7.2", "slow"),
    ("CLUSTER MYSHARDID", 2, "stale", None, "7.2", "slow"),
    ("HEXPIRE", -6, "write denyoom fast", (1, 1, 1), "7.4", "write hash fast"),
    ("HPEXPIRE", -6, "write denyoom fast", (1, 1, 1), "7.4", "write hash fast"),
    ("HEXPIREAT", -6, "write denyoom fast", (1, 1, 1), "7.4", "write hash fast"),
    ("HPEXPIREAT", -6, "write denyoom fast", (1, 1, 1), "7.4", "write hash fast"),
    ("HTTL", -5, "readonly fast", (1, 1, 1), "7.4", "read hash fast"),
    ("HPTTL", -5, "readonly fast", (1, 1, 1), "7.4", "read hash fast"),
    ("HEXPIRETIME", -5, "readonly fast", (1, 1, 1), "7.4", "read hash fast"),
    ("HPEXPIRETIME", -5, "readonly fast", (1, 1, 1), "7.4", "read hash fast"),
    ("HPERSIST", -5, "write fast", (1, 1, 1), "7.4", "write hash fast"),
    ("HGETDEL", -5, "write fast", (1, 1, 1), "8.0", "write hash fast"),
    ("HGETEX", -5, "write fast", (1, 1, 1), "8.0", "write hash fast"),
    ("HSETEX", -6, "write denyoom fast", (1, 1, 1), "8.0", "write hash fast"),
    # HOTKEYS (8.6) is answered from the proxy's own sketches (`proxy::registry::hotkeys`).
    ("HOTKEYS", -2, "container", None, "8.6", "slow"),
    ("HOTKEYS GET", 2, "admin noscript", None, "8.6", "admin slow dangerous"),
    ("HOTKEYS RESET", 2, "admin noscript", None, "8.6", "admin slow dangerous"),
    ("HOTKEYS START", -4, "admin noscript", None, "8.6", "admin slow dangerous"),
    ("HOTKEYS STOP", 2, "admin noscript", None, "8.6", "admin slow dangerous"),
    # saltshaker's own: an increment applied once per increment ID (`salt::idem`).
    ("SALTSHAKER.INCRBY", 4, "write denyoom fast", (1, 1, 1), "saltshaker", "write string fast"),
]


class Resp:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.f = self.sock.makefile("rb")

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a.encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self.read()

    def read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode()
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError(line)


def pairs(flat):
    return dict(zip(flat[::2], flat[1::2]))


def keyspec(name, info):
    """KeySpec expression from COMMAND INFO (legacy range unless keys move)."""
    flags, first, last, step, specs = info[2], info[3], info[4], info[5], info[8]
    real = [pairs(s) for s in specs if "not_key" not in pairs(s)["flags"]]
    if not real:
        return "KeySpec::None"
    if name in CUSTOM:
        return "KeySpec::Custom"
    if "movablekeys" not in flags or name == "SORT_RO":
        assert first > 0, name
        return "KeySpec::Range { first: %d, last: %d, step: %d }" % (first, last, step)
    assert len(real) == 1, name
    bs, fk = pairs(real[0]["begin_search"]), pairs(real[0]["find_keys"])
    assert bs["type"] == "index" and fk["type"] == "keynum", name
    at = pairs(bs["spec"])["index"]
    kn = pairs(fk["spec"])
    assert kn["keynumidx"] == 0, name
    return "KeySpec::NumKeys { at: %d, first: %d, step: %d }" % (at, kn["firstkey"], kn["keystep"])


def route_of(name, flags, keys):
    family = name.split(" ")[0]
    if name in ROUTES:
        return ROUTES[name]
    if family in FAMILY_ROUTES:
        return FAMILY_ROUTES[family]
    if name.endswith(" HELP"):
        return "Route::AnyNode"
    if keys != "KeySpec::None":
        if "blocking" in flags and family not in ("XREAD", "XREADGROUP"):
            return "Route::Blocking"
        return "Route::Keyed"
    raise SystemExit("no route for keyless command %s: add it to ROUTES" % name)


def flag_expr(name, flags, extra=()):
    names = [FLAG_NAMES[f] for f in flags] + list(extra)
    if name in COUNTERS:
        names.append("COUNTER")
    return " | ".join(names) if names else "0"


def cat_expr(cats):
    names = [c.lstrip("@").upper() for c in cats]
    for n in names:
        assert n.lower() in CATEGORIES, n
    return " | ".join("cat::" + n for n in names) if names else "0"


def camel(name):
    """The `Cmd` variant of a command: "CLIENT NO-EVICT" -> ClientNoEvict, "SORT_RO" ->
    SortRo, "SALTSHAKER.INCRBY" -> SaltshakerIncrby."""
    return "".join(w.capitalize() for w in re.split(r"[^A-Za-z0-9]+", name) if w)


def row(name, arity, flags, cats, keys, route, extra=()):
    return '    s("%s", %d, %s, %s, %s, %s, Cmd::%s),' % (
        name, arity, flag_expr(name, flags, extra), cat_expr(cats), keys, route, camel(name))


def print_cmd_enum(rows):
    """`Cmd`: one variant per command of the table, and `Learned`; and `family`, a
    subcommand's container. Code outside `command` names commands by it, never by string."""
    names = [r[0] for r in rows]
    variants = [camel(n) for n in names]
    assert len(set(variants)) == len(variants), "two commands share a Cmd variant"
    print("/// A command of the table, by name: what the proxy's code matches on (a command's name")
    print("/// is never compared as a string outside `command`). `Learned`: a command learned")
    print("/// from the nodes, which the proxy treats by its flags and key specs alone.")
    print("#[rustfmt::skip]")
    print("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]")
    print("pub enum Cmd {")
    line = "   "
    for v in variants + ["Learned"]:
        if len(line) + len(v) + 2 > 96:
            print(line)
            line = "   "
        line += " %s," % v
    print(line)
    print("}")
    print("")
    families = {}
    for n in names:
        if " " in n:
            families.setdefault(n.split(" ")[0], []).append(camel(n))
    print("impl Cmd {")
    print("    /// The container of a subcommand (`ClientSetname` -> `Client`); the command itself")
    print("    /// otherwise.")
    print("    #[rustfmt::skip]")
    print("    pub const fn family(self) -> Cmd {")
    print("        match self {")
    for fam in sorted(families):
        subs = ["Cmd::" + v for v in families[fam]]
        line = "           "
        for i, sub in enumerate(subs):
            sep = " |" if i < len(subs) - 1 else ""
            if len(line) + len(sub) + len(sep) + 1 > 96:
                print(line)
                line = "           "
            line += " " + sub + sep
        print(line + " => Cmd::%s," % camel(fam))
    print("            other => other,")
    print("        }")
    print("    }")
    print("}")


def rows_from_server(port):
    infos = Resp(port).cmd("COMMAND", "INFO")
    out = []
    for info in sorted(infos, key=lambda i: i[0]):
        name = info[0].upper()
        subs = sorted(info[9], key=lambda i: i[0])
        keys = keyspec(name, info)
        sub_rows = []
        sub_routes = set()
        for sub in subs:
            sname = sub[0].upper().replace("|", " ")
            skeys = keyspec(sname, sub)
            r = route_of(sname, sub[2], skeys)
            sub_routes.add(r)
            sub_rows.append((sname, sub[1], sub[2], sub[6], skeys, r))
        if subs:
            # A container alone runs only if its arity allows it (COMMAND does).
            r = ROUTES.get(name) or FAMILY_ROUTES.get(name) or (
                sub_routes.pop() if len(sub_routes) == 1 else "Route::AnyNode")
            out.append((name, info[1], info[2], info[6], keys, r, ["CONTAINER"]))
            out.extend((n, a, f, c, k, rr, []) for (n, a, f, c, k, rr) in sub_rows)
        else:
            out.append((name, info[1], info[2], info[6], keys,
                        route_of(name, info[2], keys), []))
    known = {r[0] for r in out}
    for name, arity, flags, rng, since, cats in EXTRAS:
        if name in known:
            continue
        keys = "KeySpec::None" if rng is None else (
            "KeySpec::Range { first: %d, last: %d, step: %d }" % rng)
        flags = flags.split()
        extra = ["CONTAINER"] if "container" in flags else []
        flags = [f for f in flags if f != "container"]
        out.append((name, arity, flags, cats.split(), keys,
                    route_of(name, flags, keys), extra))
    return sorted(out, key=lambda r: r[0])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    proc = None
    if "--port" in sys.argv:
        port = int(sys.argv[sys.argv.index("--port") + 1])
    else:
        port = free_port()
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.05)
    try:
        version = [l for l in Resp(port).cmd("INFO", "server").splitlines()
                   if l.startswith("redis_version:")][0].split(":")[1]
        rows = rows_from_server(port)
    finally:
        if proc:
            proc.kill()
            proc.wait()
    print("//! The command table, generated by gen_table.py from redis-server %s's COMMAND INFO" % version)
    print("//! plus the routes and newer commands that script lists. Do not edit by hand.")
    print("")
    print("use super::cat;")
    print("use super::flags::*;")
    print("use super::{Agg, KeySpec, Route, Spec, Split};")
    print("")
    print_cmd_enum(rows)
    print("")
    print("const fn s(")
    print("    name: &'static str,")
    print("    arity: i32,")
    print("    flags: u32,")
    print("    cats: u32,")
    print("    keys: KeySpec,")
    print("    route: Route,")
    print("    cmd: Cmd,")
    print(") -> Spec {")
    print("    Spec {")
    for f in ["name", "cmd", "arity", "flags", "cats", "keys", "route"]:
        print("        %s," % f)
    print("    }")
    print("}")
    print("")
    print("/// Every command and subcommand, sorted by name; subcommands are \"PARENT SUB\".")
    print("/// A const, not a static, so lookup.rs can build its indexes at compile time;")
    print("/// lookup.rs keeps the one static copy.")
    print("#[rustfmt::skip]")
    print("#[allow(clippy::large_const_arrays)]")
    print("pub(super) const SPECS: [Spec; %d] = [" % len(rows))
    for r in rows:
        print(row(r[0], r[1], r[2], r[3], r[4], r[5], r[6]))
    print("];")


if __name__ == "__main__":
    main()
