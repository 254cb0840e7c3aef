#!/usr/bin/env python3
"""Eviction by cost saved: a full cache holding costly and cheap replies, two builds in turn.

For each build (alternating, --rounds times): two redis-servers, the proxy with a small
cache (`cache.max_bytes`, --cache-mb) and rules that make every key read a few times a
second read-hot, so that all of it competes for the cache:

- costly: --boards sorted sets of --members members each, read whole (`ZRANGE b 0 -1`)
  --board-rate times a second each (paced Python readers, every reply timed);
- cheap: --pages values of --page-kb KB, read uniformly at --page-rate GETs a second in
  all (`saltshaker bench`), together more bytes than the cache holds.

Per build it reports, summed over both nodes from INFO commandstats before and after the
run: the node's microseconds spent in ZRANGE and in GET per second of run, ZRANGE and GET
calls per second, the nodes' CPU (used_cpu_user + used_cpu_sys, % of one core), and the
board readers' p50 and p99.

usage: bench/cache_cost.py --saltshaker BIN --before BIN [--rounds 2] [--seconds 10]
"""

import argparse
import statistics
import subprocess
import tempfile
import threading
import time

from benchlib import start_nodes, start_proxy, stop_all
from hot_by_cost import call, encode, info, readers


def commandstats(port):
    text = call(port, "INFO", "commandstats").decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            f = dict(kv.split("=") for kv in rest.split(","))
            out[name] = (int(f["calls"]), int(f["usec"]))
    return out


def metrics(port):
    """The proxy's unlabelled series, by name."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, v = line.rpartition(" ")
            try:
                out[name] = float(v)
            except ValueError:
                pass
    return out


def one_round(binary, args, tmp):
    procs = []
    try:
        ports = start_nodes(2, tmp, procs)
        cfg = f"{tmp}/cfg.yaml"
        with open(cfg, "w") as f:
            # The nodes given on the command line replace the file's.
            f.write('backend:\n  nodes: ["127.0.0.1:1"]\n'
                    f"cache:\n  max_bytes: {args.cache_mb * 1024 * 1024}\n")
        rules = f"{tmp}/rules.yaml"
        with open(rules, "w") as f:
            f.write("version: 1\ndefaults:\n  read: { hot_at_per_sec: 2, cool_below_per_sec: 1 }\n")
        pport, aport = start_proxy(binary, ports, procs, "--config", cfg, "--rules", rules)
        value = b"c" * (args.page_kb * 1000)
        for i in range(args.pages):
            call(pport, "SET", f"page:{i}", value)
        boards = [f"board:{b}" for b in range(args.boards)]
        for b in boards:
            for chunk in range(0, args.members, 1000):
                zargs = ["ZADD", b]
                for i in range(chunk, min(chunk + 1000, args.members)):
                    zargs += [i, f"player:{i}"]
                call(pport, *zargs)
        expect = len(call(pport, "ZRANGE", boards[0], "0", "-1"))
        pages = subprocess.Popen(
            [binary, "bench", "--target", f"127.0.0.1:{pport}", "-c", "4", "--rate",
             str(args.page_rate), "--mix", "get=100", "--keyspace", str(args.pages),
             "--key-prefix", "page:", "--duration-ms", "0", "-n", "1000000000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(pages)
        # The board readers run from the start; the nodes are measured after a warm-up
        # in which every key turns read-hot and the cache fills.
        warm = 3.0
        lat = []
        ts = []
        for b in boards:
            def run(b=b):
                lat.extend(readers(pport, ["ZRANGE", b, "0", "-1"], expect, 1,
                                   args.board_rate, warm + args.seconds + 0.5))
            ts.append(threading.Thread(target=run))
        for t in ts:
            t.start()
        time.sleep(warm)
        before = [(commandstats(p), info(p)) for p in ports]
        m0 = metrics(aport)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        secs = time.monotonic() - t0
        m1 = metrics(aport)
        after = [(commandstats(p), info(p)) for p in ports]
        for t in ts:
            t.join()
        row = {"zrange_us": 0.0, "get_us": 0.0, "zrange_calls": 0.0, "get_calls": 0.0, "cpu": 0.0}
        for (cb, ib), (ca, ia) in zip(before, after):
            for cmd in ("zrange", "get"):
                c0, u0 = cb.get(cmd, (0, 0))
                c1, u1 = ca.get(cmd, (0, 0))
                row[f"{cmd}_calls"] += (c1 - c0) / secs
                row[f"{cmd}_us"] += (u1 - u0) / secs
            row["cpu"] += sum(float(ia[k]) - float(ib[k])
                              for k in ("used_cpu_user", "used_cpu_sys")) / secs * 100
        hits = m1.get("saltshaker_cache_hits_total", 0) - m0.get("saltshaker_cache_hits_total", 0)
        misses = (m1.get("saltshaker_cache_misses_total", 0)
                  - m0.get("saltshaker_cache_misses_total", 0))
        row["hit_pct"] = 100 * hits / max(hits + misses, 1)
        row["cache_mb"] = m1.get("saltshaker_cache_bytes", 0) / 1e6
        lat.sort()
        row["reads"] = len(lat) / (warm + args.seconds + 0.5)
        row["p50"] = lat[len(lat) // 2] * 1e3
        row["p99"] = lat[int(len(lat) * 0.99)] * 1e3
        return row
    finally:
        stop_all(procs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--before", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--cache-mb", type=int, default=4)
    ap.add_argument("--boards", type=int, default=4)
    ap.add_argument("--members", type=int, default=10000)
    ap.add_argument("--board-rate", type=int, default=10)
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--page-kb", type=int, default=24)
    ap.add_argument("--page-rate", type=int, default=2000)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cache-cost.")
    results = {}
    for r in range(args.rounds):
        order = [("now", args.saltshaker), ("before", args.before)]
        if r % 2:
            order.reverse()
        for label, binary in order:
            results.setdefault(label, []).append(one_round(binary, args, tmp))
    print(f"cache {args.cache_mb} MiB; {args.boards} x ZRANGE of {args.members} members at "
          f"{args.board_rate}/s each; {args.pages} x {args.page_kb} KB values at "
          f"{args.page_rate} GET/s in all; {args.seconds:.0f} s, {args.rounds} rounds "
          "alternating, median; nodes summed")
    print("| build | node us/s in ZRANGE | ZRANGE calls/s | node us/s in GET | GET calls/s "
          "| nodes' CPU % | cache hits % | cache MB | board reads/s | board p50 ms "
          "| board p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label in ("before", "now"):
        rows = results[label]
        m = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {label} | {m['zrange_us']:.0f} | {m['zrange_calls']:.1f} | {m['get_us']:.0f} "
              f"| {m['get_calls']:.0f} | {m['cpu']:.1f} | {m['hit_pct']:.1f} | {m['cache_mb']:.2f} "
              f"| {m['reads']:.1f} | {m['p50']:.2f} "
              f"| {m['p99']:.2f} |")


if __name__ == "__main__":
    main()
