#!/usr/bin/env python3
"""Latency at low concurrency: closed-loop clients (one command per round trip, 80% GET,
20% SET) at 1 and at 4 connections, against the node directly, through saltshaker (its
default threads) and through nutcracker, same node, targets rotating between rounds.
`saltshaker bench` is the client. Reports the median over rounds of p50, p99 and ops/s, and
saltshaker's p50 and p99 over nutcracker's from the same round.

usage: bench/latency.py --saltshaker BIN [--rounds 3] [--duration-ms 5000] [--conns 1,4]
"""

import argparse
import json
import statistics
import subprocess
import tempfile

from benchlib import free_port, start_nodes, start_nutcracker, stop_all, wait_port


def run(binary, port, conns, ms):
    out = subprocess.run(
        [binary, "bench", "--target", f"127.0.0.1:{port}", "-c", str(conns), "-P", "1",
         "--duration-ms", str(ms), "--mix", "get=80,set=20", "--json"],
        capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    if r["errors"]:
        raise SystemExit(f"port {port}: {r['errors']} errors: {r['failures']}")
    return r["p50_us"], r["p99_us"], r["ops_per_sec"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration-ms", type=int, default=5000)
    ap.add_argument("--conns", default="1,4")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="latency.")
    procs = []
    try:
        [rport] = start_nodes(1, tmp, procs)
        nport, _ = start_nutcracker(rport, tmp, procs)
        sport = free_port()
        procs.append(subprocess.Popen(
            [args.saltshaker, "--listen", f"127.0.0.1:{sport}", "--admin",
             f"127.0.0.1:{free_port()}", "--nodes", f"127.0.0.1:{rport}", "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(nport)
        wait_port(sport)
        targets = [("direct", rport), ("saltshaker", sport), ("nutcracker", nport)]
        cells = {}
        for rnd in range(args.rounds):
            order = targets[rnd % 3:] + targets[:rnd % 3]
            for conns in [int(c) for c in args.conns.split(",")]:
                for name, port in order:
                    cells.setdefault((conns, name), []).append(
                        run(args.saltshaker, port, conns, args.duration_ms))
        print(f"closed loop, P1, get=80,set=20, {args.duration_ms} ms x {args.rounds} rounds; "
              "median over rounds")
        print("| connections | target | p50 us | p99 us | ops/s |")
        print("|---|---|---|---|---|")
        for conns in [int(c) for c in args.conns.split(",")]:
            for name, _ in targets:
                v = cells[(conns, name)]
                p50 = statistics.median(x[0] for x in v)
                p99 = statistics.median(x[1] for x in v)
                ops = statistics.median(x[2] for x in v)
                print(f"| {conns} | {name} | {p50:.0f} | {p99:.0f} | {ops:,.0f} |")
            s, n = cells[(conns, "saltshaker")], cells[(conns, "nutcracker")]
            r50 = statistics.median(a[0] / b[0] for a, b in zip(s, n))
            r99 = statistics.median(a[1] / b[1] for a, b in zip(s, n))
            print(f"| {conns} | saltshaker / nutcracker | {r50:.2f} | {r99:.2f} | |")
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
