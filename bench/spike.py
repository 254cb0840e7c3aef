#!/usr/bin/env python3
"""A spike on one counter through a fleet of proxies: how soon, and how evenly, the nodes
are relieved.

Four redis-server nodes and N saltshaker proxies over them (`--threads 1` each). A
`saltshaker bench` client per proxy sends INCRs for `--duration-ms`, a third of them on one
key (`viral:counter:hot:0.3`) from the first instant. Every 100 ms the script reads each
node's `total_commands_processed`; it reports the busiest node's load over the mean, per
100 ms (median and max) and over the whole run, the first 100 ms interval from which the
busiest node stays within 1.25x the mean, and each proxy's
`saltshaker_time_to_mitigate_seconds` (median and p99 of the buckets over the fleet).
With `--bin-b` a second build runs the same rounds (rotating), for a before/after.

With `--cluster` the nodes are a 3-master Redis Cluster (no replicas) instead of a pool.

usage: bench/spike.py --saltshaker BIN [--bin-b BIN] [--proxies 2,8] [--rules default|salt]
                      [--duration-ms 10000] [--rounds 1] [--cluster] [--shards 4] [--baseline]
                      [--distribution ketama|modula]

`--baseline` adds a row "uniform": build a under the same load without the hot key, which
is what the placement of the uniform keys alone leaves on the busiest node (a 4-node ketama
pool on random ports: 1.075 at the median, over 1.10 for a quarter of port draws).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

from benchlib import commands_processed, free_port, stop_all, wait_port

SALT_RULES = """version: 1
epoch_ms: 2000
rules:
  - match: "counter:*"
    write: { strategy: salt, salt: { shards: SHARDS } }
"""


def histogram(admin):
    """(le, cumulative count) pairs of saltshaker_time_to_mitigate_seconds."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("saltshaker_time_to_mitigate_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return out


def quantile(buckets, q):
    """The upper bound of the bucket holding quantile q of the summed buckets."""
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return None
    for le, n in buckets:
        if n >= q * total:
            return le
    return None


def one_run(binary, nodes, proxies, rules, duration_ms, cluster, workload="viral:counter:hot:0.3",
            distribution="ketama"):
    procs, admins, ports = [], [], []
    node_list = ",".join(f"127.0.0.1:{p}" for p in nodes)
    backend = (["--cluster", f"127.0.0.1:{nodes[0]}"] if cluster
               else ["--nodes", node_list, "--distribution", distribution])
    for p in nodes:
        subprocess.run(["redis-cli", "-p", str(p), "FLUSHALL"], capture_output=True)
    time.sleep(0.5)
    try:
        for _ in range(proxies):
            port, admin = free_port(), free_port()
            args = [binary, "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
                    *backend, "--threads", "1", "--log-level", "warn"]
            if rules:
                args += ["--rules", rules]
            procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_port(port)
            ports.append(port)
            admins.append(admin)
        time.sleep(1.0)  # every proxy connected and subscribed to the registry's channel
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append((time.time(), [commands_processed(p) for p in nodes]))
                time.sleep(0.1)

        t = threading.Thread(target=sample)
        t.start()
        loads = [subprocess.Popen(
            [binary, "bench", "--target", f"127.0.0.1:{port}", "-c", "8", "-P", "16",
             "--duration-ms", str(duration_ms), "--keyspace", "100000",
             "--workload", workload, "--mix", "incr=100", "--json"],
            stdout=subprocess.PIPE, text=True) for port in ports]
        reports = [json.loads(l.communicate()[0]) for l in loads]
        stop.set()
        t.join()
        errors = sum(r["errors"] for r in reports)
        if errors:
            raise SystemExit(f"{errors} errors from the load")
        buckets = {}
        for a in admins:
            for le, n in histogram(a):
                buckets[le] = buckets.get(le, 0) + n
        merged = sorted(buckets.items())
        # Whether the key was salted by the end (under `auto` it may stay combined).
        hot = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{admins[0]}/hotkeys", timeout=5).read().decode())
        salted = any(e.get("key") == "counter:hot" for e in hot.get("salted") or [])
    finally:
        stop_all(procs)
    per, first = [], None
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        d = [y - x for x, y in zip(a, b)]
        if sum(d) > 0:
            per.append(max(d) / (sum(d) / len(d)))
    start = samples[0][1]
    end = samples[-1][1]
    whole = [y - x for x, y in zip(start, end)]
    # The first interval from which the busiest node stays within 1.25x the mean.
    for i in range(len(per)):
        if all(r <= 1.25 for r in per[i:]):
            first = i * 100
            break
    return {
        "whole": max(whole) / (sum(whole) / len(whole)),
        "p50_100ms": statistics.median(per),
        "max_100ms": max(per),
        "even_from_ms": first,
        "ops_per_sec": sum(r["ops_per_sec"] for r in reports),
        "ttm_p50": quantile(merged, 0.5),
        "ttm_p99": quantile(merged, 0.99),
        "timed": merged[-1][1] if merged else 0,
        "salted": salted,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--bin-b")
    ap.add_argument("--proxies", default="2,8")
    ap.add_argument("--rules", default="default", choices=["default", "salt"])
    ap.add_argument("--duration-ms", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--distribution", default="ketama", choices=["ketama", "modula"],
                    help="the pool's distribution: modula spreads 100k keys within 1%% of even")
    ap.add_argument("--baseline", action="store_true",
                    help="also run a uniform load (no hot key) through build a, as 'uniform'")
    ap.add_argument("--cluster", action="store_true")
    ap.add_argument("--shards", type=int, default=4, help="with --rules salt")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="spike.")
    rules = None
    if args.rules == "salt":
        rules = os.path.join(tmp, "rules.yaml")
        with open(rules, "w") as f:
            f.write(SALT_RULES.replace("SHARDS", str(args.shards)))
    nodes, procs = [], []
    try:
        for i in range(3 if args.cluster else 4):
            p = free_port(below=55536) if args.cluster else free_port()
            d = os.path.join(tmp, f"n{i}")
            os.makedirs(d)
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"] if args.cluster else []
            procs.append(subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", d, *extra], stdout=subprocess.DEVNULL))
            wait_port(p)
            nodes.append(p)
        if args.cluster:
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in nodes],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True)
            for _ in range(100):
                info = subprocess.run(["redis-cli", "-p", str(nodes[0]), "CLUSTER", "INFO"],
                                      capture_output=True, text=True).stdout
                if "cluster_state:ok" in info:
                    break
                time.sleep(0.1)
        builds = [("a", args.saltshaker)] + ([("b", args.bin_b)] if args.bin_b else [])
        if args.baseline:
            # The same nodes and proxies under a uniform load: what the placement of the
            # keys alone leaves on the busiest node, for the spike's figures to be read against.
            builds.append(("uniform", args.saltshaker))
        rows = []
        for n in [int(x) for x in args.proxies.split(",")]:
            for r in range(args.rounds):
                order = builds if r % 2 == 0 else builds[::-1]
                for name, binary in order:
                    wl = "uniform" if name == "uniform" else "viral:counter:hot:0.3"
                    res = one_run(binary, nodes, n, rules, args.duration_ms, args.cluster, wl,
                                  args.distribution)
                    rows.append((n, name, res))
                    print(n, name, json.dumps(res), flush=True)
    finally:
        stop_all(procs)
    print(f"\n{'3-master cluster' if args.cluster else '4-node pool, ' + args.distribution}; rules: {args.rules}; {args.duration_ms} ms of INCR, 30% on one key, 8 clients x P16 per proxy")
    print("| proxies | build | busiest/mean, whole run | per 100 ms, median | per 100 ms, max "
          "| within 1.25x from | time to mitigate p50 / p99 (keys timed) | salted at the end | client ops/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, name, r in rows:
        ttm = "-" if r["ttm_p50"] is None else f"≤{r['ttm_p50']} s / ≤{r['ttm_p99']} s ({r['timed']:.0f})"
        even = "never" if r["even_from_ms"] is None else f"{r['even_from_ms']} ms"
        print(f"| {n} | {name} | {r['whole']:.2f} | {r['p50_100ms']:.2f} | {r['max_100ms']:.2f} "
              f"| {even} | {ttm} | {'yes' if r['salted'] else 'no'} | {r['ops_per_sec']:.0f} |")


if __name__ == "__main__":
    main()
