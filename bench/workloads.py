#!/usr/bin/env python3
"""Production-shaped workloads: what the nodes pay behind saltshaker and behind twemproxy.

Four redis-servers (no persistence) form one pool. nutcracker (ketama, fnv1a_64, one
server connection per node) and saltshaker (the same pool settings, the shipped rules
`rules/default.yaml`) stand in front of the same four nodes. Each shape below runs through
every target once per round, the order rotating between rounds (a saltshaker target is
started for its run alone, after two seconds of the same load, so that no idle proxy of the
same fleet sways its decisions), with `saltshaker bench`
as the client: 32 connections, one command per round trip (P1), the shape's key
popularity, command mix and value size.

Measured per run, from /proc/PID/stat (utime + stime) before and after:
- every node's CPU, in ms per 1,000 client operations: all nodes together, and the
  busiest node (the one that spent most in that run);
- the proxy's CPU per 1,000 client operations;
- client throughput, p50 and p99 (from the client's own histogram).

Reported per shape and target: the median over rounds, and for each saltshaker target
its ratio to nutcracker within each round (median, min-max). Ratios within a round are
the figures to trust on a shared machine: both targets met the same noise.

Targets: `nc` (nutcracker), `ss1` (saltshaker --threads 1), `ss2` (--threads 2), and
`ssD` (the default, one worker per core) when the machine has more than two cores.
Extra saltshaker builds to compare: --bin-b BIN adds `b1`/`b2` with that binary;
--rules-b FILE runs the `b` targets with that rules file (with no --bin-b, the same
binary: what one rule costs or saves the nodes).

usage: bench/workloads.py --saltshaker BIN [--bin-b BIN] [--rules-b FILE] [--rounds 3]
       [--seconds 5]
       [--shapes read-hot,big-writes,counters,...] [--markdown]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import free_port, start_nodes, stop_all, wait_port

TICK = os.sysconf("SC_CLK_TCK")
HERE = os.path.dirname(os.path.abspath(__file__))

# name: (distribution, mix, value bytes, keyspace)
SHAPES = {
    # A celebrity profile: one key takes most reads (zipf 2.7: key 0 ~80% of reads).
    "read-hot": ("zipf:2.7", "get=99,set=1", 267, 100_000),
    # Sessions or carts written half the time, big values, a skew a cache sees often.
    "big-writes": ("zipf:1.7", "get=50,set=50", 9728, 20_000),
    # Counters among plain writes, nothing hot.
    "counters-flat": ("zipf:0.3", "get=39,set=31,incr=30", 16, 100_000),
    # Like counters on a few viral posts: hot increments, reads of them.
    "counters-hot": ("zipf:1.2", "get=70,incr=30", 16, 100_000),
    # Large values read mostly, a medium skew.
    "large-values": ("zipf:1.0", "get=95,set=5", 65536, 2_000),
    # A read-mostly cache, low skew, 1% writes.
    "read-flat": ("zipf:0.6", "get=99,set=1", 512, 100_000),
}


def cpu_ms(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000.0 / TICK


def syscalls(pid):
    """(read, write) system calls so far, from /proc/PID/io: how many pieces the node
    received its commands in and sent its replies in."""
    with open(f"/proc/{pid}/io") as f:
        io = dict(line.split(":") for line in f.read().splitlines())
    return int(io["syscr"]), int(io["syscw"])


def start_nutcracker_pool(ports, tmp, procs):
    nport = free_port()
    conf = os.path.join(tmp, "nc-pool.yml")
    servers = "".join(f"    - 127.0.0.1:{p}:1\n" for p in ports)
    with open(conf, "w") as f:
        f.write(f"pool:\n  listen: 127.0.0.1:{nport}\n  redis: true\n  hash: fnv1a_64\n"
                f"  distribution: ketama\n  server_connections: 1\n  servers:\n{servers}")
    nc = subprocess.Popen(["nutcracker", "-c", conf, "-s", str(free_port())],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(nc)
    wait_port(nport)
    return nport, nc


def start_saltshaker(binary, ports, threads, procs, rules=None):
    pport, aport = free_port(), free_port()
    rules = rules or os.path.join(HERE, "..", "rules", "default.yaml")
    p = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{pport}", "--admin", f"127.0.0.1:{aport}",
         "--nodes", ",".join(f"127.0.0.1:{q}" for q in ports), "--threads", str(threads),
         "--rules", rules, "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(p)
    wait_port(pport)
    return pport, p


def forget_fleet(ports):
    """Deletes what a proxy left in the nodes (the salt registry, shard keys): the next
    target starts from the nodes as nutcracker sees them."""
    for p in ports:
        keys = subprocess.run(["redis-cli", "-p", str(p), "--scan", "--pattern", "saltshaker:*"],
                              capture_output=True, text=True).stdout.split()
        for i in range(0, len(keys), 500):
            subprocess.run(["redis-cli", "-p", str(p), "DEL", *keys[i:i + 500]],
                           capture_output=True)


def run_load(client, port, shape, seconds, seed):
    dist, mix, size, keys = SHAPES[shape]
    out = subprocess.run(
        [client, "bench", "--target", f"127.0.0.1:{port}", "-c", "32", "-P", "1",
         "--duration-ms", str(int(seconds * 1000)), "--keyspace", str(keys),
         "--workload", dist, "--mix", mix, "--value-size", str(size),
         "--key-prefix", f"{shape}:", "--seed", str(seed), "--json"],
        capture_output=True, text=True, timeout=seconds * 10 + 60)
    if out.returncode != 0:
        sys.exit(f"saltshaker bench failed on {shape} (exit {out.returncode}): "
                 f"{out.stderr.strip()} {out.stdout.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(client, target, nodes, shape, seconds, seed):
    port, proc = target
    before = [cpu_ms(n.pid) for n in nodes]
    pb = cpu_ms(proc.pid)
    sb = [syscalls(n.pid) for n in nodes]
    r = run_load(client, port, shape, seconds, seed)
    after = [cpu_ms(n.pid) for n in nodes]
    pa = cpu_ms(proc.pid)
    sa = [syscalls(n.pid) for n in nodes]
    ops = max(r["ops"], 1)
    per_node = [(a - b) * 1000.0 / ops for a, b in zip(after, before)]
    return {
        "nodes": sum(per_node),
        "busiest": max(per_node),
        "proxy": (pa - pb) * 1000.0 / ops,
        # Node reads and writes per client operation, all nodes: below 1 when the
        # commands arrive batched.
        "node_reads": sum(a[0] - b[0] for a, b in zip(sa, sb)) / ops,
        "node_writes": sum(a[1] - b[1] for a, b in zip(sa, sb)) / ops,
        "ops_s": r["ops_per_sec"],
        "p50": r["p50_us"],
        "p99": r["p99_us"],
        "errors": r["errors"],
    }


def fmt_ratio(xs):
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def report(results, names):
    """The table: medians per shape and target, and ratios to nutcracker per round."""
    print("| shape | target | all nodes ms/kop | busiest node ms/kop | proxy ms/kop | "
          "node reads/op | node writes/op | "
          "ops/s | p50 us | p99 us | ÷ nc: all nodes | busiest | ops/s | p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in results:
        base = results[shape]["nc"]
        for n in names:
            rs = results[shape][n]
            if not rs:
                continue
            med = lambda k: statistics.median(r[k] for r in rs)
            ratios = {k: [r[k] / b[k] for r, b in zip(rs, base) if b[k]]
                      for k in ("nodes", "busiest", "ops_s", "p99")}
            cells = ["-"] * 4 if n == "nc" else [fmt_ratio(ratios[k]) for k in
                                                 ("nodes", "busiest", "ops_s", "p99")]
            print(f"| {shape} | {n} | {med('nodes'):.3f} | {med('busiest'):.3f} | "
                  f"{med('proxy'):.3f} | {med('node_reads'):.3f} | {med('node_writes'):.3f} | "
                  f"{med('ops_s'):.0f} | {med('p50'):.0f} | "
                  f"{med('p99'):.0f} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--bin-b")
    ap.add_argument("--rules-b", help="rules file of the b targets")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--threads", default="1,2", help="saltshaker thread counts to run")
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            sys.exit(f"unknown shape {s}; known: {', '.join(SHAPES)}")
    threads = [int(t) for t in args.threads.split(",")]
    if os.cpu_count() > 2 and 0 not in threads:
        threads.append(0)
    tmp = tempfile.mkdtemp(prefix="workloads.")
    procs, results, names = [], {}, []
    try:
        node_procs_start = len(procs)
        ports = start_nodes(4, tmp, procs)
        nodes = procs[node_procs_start:]
        nc = start_nutcracker_pool(ports, tmp, procs)
        # Each saltshaker target is started for its run alone: proxies on the same nodes
        # form one fleet (they share the salt registry), and an idle one would change
        # what the measured one decides.
        targets = {"nc": lambda: nc}
        for t in threads:
            tag = t if t else "D"
            targets[f"ss{tag}"] = (lambda t=t: start_saltshaker(args.saltshaker, ports, t, procs))
            if args.bin_b or args.rules_b:
                targets[f"b{tag}"] = (lambda t=t: start_saltshaker(
                    args.bin_b or args.saltshaker, ports, t, procs, args.rules_b))
        names = list(targets)
        results.update({s: {n: [] for n in names} for s in shapes})
        for shape in shapes:
            # Fill the keys once (through nutcracker, so every target reads the same data).
            run_load(args.saltshaker, nc[0], shape, min(args.seconds, 3), 99)
            for rnd in range(args.rounds):
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for n in order:
                    target = targets[n]()
                    # Two seconds of the same load first: the detector's windows fill and
                    # the mitigations start, as on a proxy that has been serving.
                    run_load(args.saltshaker, target[0], shape, 2, 1000 + rnd)
                    m = measure(args.saltshaker, target, nodes, shape, args.seconds, rnd + 1)
                    if n != "nc":
                        target[1].terminate()
                        target[1].wait(timeout=30)
                        procs.remove(target[1])
                        forget_fleet(ports)
                    results[shape][n].append(m)
                    print(f"# {shape} round {rnd} {n}: nodes {m['nodes']:.1f} busiest "
                          f"{m['busiest']:.1f} proxy {m['proxy']:.1f} ms/kop, node reads "
                          f"{m['node_reads']:.3f} writes {m['node_writes']:.3f} per op, "
                          f"{m['ops_s']:.0f} ops/s, p50 {m['p50']} p99 {m['p99']} us, "
                          f"errors {m['errors']}", file=sys.stderr, flush=True)
    finally:
        stop_all(procs)
        if results:
            report(results, names)


if __name__ == "__main__":
    main()
