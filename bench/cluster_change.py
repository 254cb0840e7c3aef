"""The cost of a change in a Redis Cluster behind saltshaker: how long the keys of a slot
are unavailable through the proxy when their master is killed, when a replica takes over
with CLUSTER FAILOVER, and when the slot is migrated to another master under load.

Run by bench/cluster_change.sh with the proxy's port and the cluster's ports. A probe
client sends INCR on one key through the proxy in a loop (one command in flight, 1 s
timeout) and records each reply's time and outcome; the script changes the cluster and
reads off: the time from the change to the first error, to the last error, to the cluster
announcing the new owner (a replica flagged master in another node's CLUSTER NODES), and
to the proxy answering again; errors seen; and acknowledged increments against the value
the key holds afterwards. Prints one Markdown row per change."""

import os
import sys
import threading
import time

# The RESP reader of the redis-py suite: the benchmarks run with the system's python3 alone.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
from resp3 import Raw, plain  # noqa: E402


class Conn(Raw):
    """One connection; `cmd` returns the reply as plain Python (an error as RuntimeError)."""

    def __init__(self, port, timeout=1.0):
        super().__init__(port, timeout)

    def cmd(self, *args):
        return plain(self.call(*args))


def nodes(port):
    """CLUSTER NODES of one node: {id: (port, flags, master_id, slots)}."""
    out = {}
    for line in Conn(port).cmd("CLUSTER", "NODES").splitlines():
        f = line.split()
        out[f[0]] = (int(f[1].split(":")[1].split("@")[0]), f[2], f[3], f[8:])
    return out


def owner(port, slot):
    for nid, (p, flags, _, slots) in nodes(port).items():
        if "master" not in flags or "fail" in flags:
            continue
        for r in slots:
            if r.startswith("["):
                continue
            a, _, b = r.partition("-")
            if int(a) <= slot <= int(b or a):
                return nid, p
    return None, None


class Probe(threading.Thread):
    def __init__(self, proxy, key):
        super().__init__(daemon=True)
        self.proxy, self.key = proxy, key
        self.log = []  # (time, ok)
        self.acked = 0
        self.stop = False
        self.lock = threading.Lock()

    def run(self):
        c = None
        while not self.stop:
            t = time.monotonic()
            try:
                c = c or Conn(self.proxy)
                r = c.cmd("INCR", self.key)
                ok = isinstance(r, int)
                if ok:
                    self.acked += 1
            except (OSError, ConnectionError, ValueError):
                ok, c = False, None
            with self.lock:
                self.log.append((time.monotonic(), ok))
            if not ok:
                time.sleep(0.01)

    def since(self, t0):
        with self.lock:
            return [x for x in self.log if x[0] >= t0]


def measure(name, proxy, any_port, key, change, announced):
    probe = Probe(proxy, key)
    probe.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    change()
    t_ann = None
    deadline = t0 + 30
    while time.monotonic() < deadline:
        if t_ann is None and announced():
            t_ann = time.monotonic()
        # Served again: the cluster announced, and only answers for the last 300 ms.
        if t_ann:
            recent = [ok for t, ok in probe.since(time.monotonic() - 0.3)]
            if recent and all(recent):
                break
        time.sleep(0.01)
    time.sleep(0.3)
    probe.stop = True
    probe.join()
    after = probe.since(t0)
    errs = [t for t, ok in after if not ok]
    first_ok_after = next((t for t, ok in after if ok and (not errs or t > errs[-1])), None)
    value = int(Conn(proxy, timeout=5).cmd("GET", key) or 0)
    ms = lambda t: "-" if t is None else "%.0f" % ((t - t0) * 1000)
    lag = "-" if (t_ann is None or first_ok_after is None) else "%.0f" % (
        max(0.0, first_ok_after - t_ann) * 1000)
    print("| %s | %s | %s | %s | %s | %s | %d | %d | %d |" % (
        name, ms(errs[0]) if errs else "-", ms(errs[-1]) if errs else "-", ms(t_ann),
        ms(first_ok_after), lag, len(errs), probe.acked, value))
    sys.stdout.flush()
    return value


def main():
    proxy = int(sys.argv[1])
    ports = [int(p) for p in sys.argv[2:]]
    print("| change | first error ms | last error ms | cluster announced ms | proxy serving ms "
          "| proxy after announce ms | errors | acked INCRs | key holds |")
    print("|---|---|---|---|---|---|---|---|---|")
    seed = ports[0]

    def key_on(pred):
        for i in range(10000):
            k = "change:%d" % i
            slot = Conn(seed).cmd("CLUSTER", "KEYSLOT", k)
            nid, p = owner(seed, slot)
            if pred(p):
                return k, slot, nid, p
        raise RuntimeError("no key found")

    # 1. Manual failover: a replica of the key's master takes over.
    key, slot, nid, mport = key_on(lambda p: True)
    replica = next(p for i, (p, flags, m, _) in nodes(seed).items() if m == nid)
    Conn(proxy).cmd("DEL", key)
    measure("CLUSTER FAILOVER", proxy, seed, key,
            lambda: Conn(replica).cmd("CLUSTER", "FAILOVER"),
            lambda: owner(seed if seed != mport else replica, slot)[1] == replica)

    # 2. Slot migration to another master (MIGRATE key by key, then SETSLOT NODE).
    key, slot, nid, src = key_on(lambda p: True)
    masters = [p for i, (p, flags, m, s) in nodes(seed).items() if "master" in flags and s]
    dst = next(p for p in masters if p != src)
    dst_id = next(i for i, (p, _, _, _) in nodes(seed).items() if p == dst)
    Conn(proxy).cmd("DEL", key)

    def migrate():
        Conn(dst).cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", nid)
        Conn(src).cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while True:
            ks = Conn(src).cmd("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not ks:
                break
            Conn(src).cmd("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *ks)
        for p in masters:
            Conn(p).cmd("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

    measure("slot migration", proxy, seed, key, migrate,
            lambda: owner(dst, slot)[1] == dst)

    # 3. A master killed: its replica is promoted after cluster-node-timeout.
    key, slot, nid, mport = key_on(lambda p: True)
    replica = next(p for i, (p, flags, m, _) in nodes(seed).items() if m == nid)
    other = next(p for p in ports if p not in (mport, replica))
    Conn(proxy).cmd("DEL", key)
    pid = int(next(l.split(":")[1] for l in Conn(mport).cmd("INFO", "server").splitlines()
                   if l.startswith("process_id:")))

    def kill():
        import os
        import signal
        os.kill(pid, signal.SIGKILL)

    measure("master killed", proxy, other, key, kill,
            lambda: owner(other, slot)[1] == replica)


if __name__ == "__main__":
    main()
