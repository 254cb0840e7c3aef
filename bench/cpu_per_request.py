#!/usr/bin/env python3
"""CPU per request: saltshaker, twemproxy (nutcracker) and the node hit directly.

One redis-server; nutcracker and saltshaker (`--threads 1`) in front of it. For each
round, in an order that rotates between rounds, each target gets
`redis-benchmark -c 50 -r 100000 -n N -t get|set -P 1|16`, and the CPU time each process
spent (utime + stime from /proc/PID/stat) is divided by the requests served, and the user
time (utime) alone beside it: the part a proxy's own code decides. This is
the steadiest figure on a shared, noisy machine: it does not depend on how much CPU the
machine had left, only on how much each process needed.

Reported per cell (median over rounds): the proxy's microseconds per request, the node's
microseconds per request behind it, and the ratios saltshaker/nutcracker and
saltshaker/node-behind-saltshaker. With --bin-b a second saltshaker build runs as a
fourth target in the same rounds (before/after a change).

With --rules-b FILE the second build runs with that rules file: the same binary with
`detection: { enabled: false }` measures what detection costs. With --threads-b T it runs
with T threads: the same binary at `--threads-b 2` shows whether CPU per request grows with
threads. The per-round ratio of saltshaker to saltshaker-b is printed last (median,
min-max).

usage: bench/cpu_per_request.py --saltshaker BIN [--bin-b BIN [--rules-b FILE]
       [--threads-b T]] [-n 400000] [--rounds 3]
"""

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import time

from benchlib import commands_processed, free_port, start_nutcracker, stop_all, wait_port

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid, user_only=False):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; after the ")" they are 12 and 13.
    if user_only:
        return int(fields[11]) / TICK
    return (int(fields[11]) + int(fields[12])) / TICK


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--bin-b")
    ap.add_argument("--rules-b")
    ap.add_argument("-n", type=int, default=400000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tests", default="get,set")
    ap.add_argument("--pipelines", default="1,16")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--threads-b", help="threads of the saltshaker-b target (default: --threads)")
    ap.add_argument("-d", "--data-size", type=int, default=3,
                    help="SET value size in bytes (redis-benchmark -d); GET reads them back")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cpu-per-request.")
    procs = []
    try:
        rport = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        procs.append(redis)
        wait_port(rport)
        targets = {"direct": (rport, None)}
        nport, nc = start_nutcracker(rport, tmp, procs)
        targets["nutcracker"] = (nport, nc.pid)
        bins = [("saltshaker", args.saltshaker)]
        if args.bin_b:
            bins.append(("saltshaker-b", args.bin_b))
        for name, binary in bins:
            port = free_port()
            rules = ["--rules", args.rules_b] if name == "saltshaker-b" and args.rules_b else []
            threads = args.threads_b if name == "saltshaker-b" and args.threads_b else args.threads
            p = subprocess.Popen(
                [binary, "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{free_port()}",
                 "--nodes", f"127.0.0.1:{rport}", "--threads", threads,
                 "--log-level", "warn", *rules],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, name + ".log"), "w"))
            procs.append(p)
            wait_port(port)
            targets[name] = (port, p.pid)
        names = list(targets)
        cells = {}
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for test in args.tests.split(","):
                for pipe in args.pipelines.split(","):
                    for name in order:
                        port, pid = targets[name]
                        node_before = cpu_seconds(redis.pid)
                        proxy_before = cpu_seconds(pid) if pid else 0
                        user_before = cpu_seconds(pid, True) if pid else 0
                        served_before = commands_processed(rport)
                        subprocess.run(
                            ["redis-benchmark", "-p", str(port), "-c", "50", "-r", "100000",
                             "-n", str(args.n), "-t", test, "-P", pipe, "-d", str(args.data_size),
                             "-q"],
                            stdout=subprocess.DEVNULL, check=True)
                        node = cpu_seconds(redis.pid) - node_before
                        proxy = (cpu_seconds(pid) - proxy_before) if pid else 0
                        user = (cpu_seconds(pid, True) - user_before) if pid else 0
                        # INFO itself is one command.
                        served = commands_processed(rport) - served_before - 1
                        if served < args.n:
                            raise SystemExit(f"{name}: the node served {served} of {args.n}")
                        cell = cells.setdefault((test, pipe, name), [])
                        cell.append((proxy * 1e6 / args.n, node * 1e6 / args.n,
                                     user * 1e6 / args.n))
        print(f"redis-benchmark -c 50 -r 100000 -n {args.n} -d {args.data_size} -t T -P P, "
              f"{args.rounds} rounds, "
              f"saltshaker --threads {args.threads}"
              + (f", saltshaker-b --threads {args.threads_b}" if args.threads_b else "")
              + "; microseconds of CPU per request, "
              "median over rounds (min-max)")
        print("| test | target | proxy us/req | node us/req | proxy/nutcracker | proxy/node | "
              "proxy user us/req | user/nutcracker's |")
        print("|---|---|---|---|---|---|---|---|")
        for test in args.tests.split(","):
            for pipe in args.pipelines.split(","):
                nc_med = statistics.median(v[0] for v in cells[(test, pipe, "nutcracker")])
                nc_user = statistics.median(v[2] for v in cells[(test, pipe, "nutcracker")])
                for name in names:
                    vals = cells[(test, pipe, name)]
                    p = statistics.median(v[0] for v in vals)
                    n = statistics.median(v[1] for v in vals)
                    u = statistics.median(v[2] for v in vals)
                    lo, hi = min(v[0] for v in vals), max(v[0] for v in vals)
                    if name == "direct":
                        print(f"| P{pipe} {test.upper()} | direct | - | {n:.2f} | - | - |")
                        continue
                    ratio_nc = f"{p / nc_med:.2f}" if name != "nutcracker" else "1.00"
                    print(f"| P{pipe} {test.upper()} | {name} | {p:.2f} ({lo:.2f}-{hi:.2f}) | "
                          f"{n:.2f} | {ratio_nc} | {p / n:.2f} | {u:.2f} | "
                          f"{u / nc_user if nc_user else 0:.2f} |")
        if args.bin_b:
            print()
            print("| test | saltshaker / saltshaker-b, proxy CPU per request (median, min-max) |")
            print("|---|---|")
            for test in args.tests.split(","):
                for pipe in args.pipelines.split(","):
                    a = cells[(test, pipe, "saltshaker")]
                    b = cells[(test, pipe, "saltshaker-b")]
                    r = [x[0] / y[0] for x, y in zip(a, b)]
                    print(f"| P{pipe} {test.upper()} | {statistics.median(r):.3f} "
                          f"({min(r):.3f}-{max(r):.3f}) |")
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
