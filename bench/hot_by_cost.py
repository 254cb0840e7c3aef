#!/usr/bin/env python3
"""Hot by cost, before and after: a big value and a big sorted set read often, on a
2-node pool under an even background load, through two saltshaker builds in turn.

For each build (alternating, --rounds times): two redis-servers, the proxy with its
default rules, `page:home` (512 KiB) and `board` (a sorted set of 100,000 members). A
background of small GETs (`saltshaker bench`, uniform over 100,000 keys, --background
ops/s) keeps the two nodes' command counts even, as a real mix does, so a node is not
"busier" by commands. Then, one after the other for --seconds each:

- big value: 4 readers x 100 GET page:home a second (200 MiB/s);
- big zset: 2 readers x 100 ZRANGE board 0 -1 a second.

Per workload it reports, from the node that owns the key (INFO before and after): bytes
sent per second (total_net_output_bytes), CPU (used_cpu_user + used_cpu_sys) as a
percentage of one core, at most what share of the readers' reads the node served (its
bytes out over the reply's size),
and the readers' reads and p50 and p99 latency (milliseconds, every read timed).

"before" is the same build with the cost thresholds out of reach (a rules file with
`hot_at_bytes_per_sec` and `hot_at_node_ms_per_sec` at 1e15), so that only detection by
cost differs; --before BIN runs another build instead.

usage: bench/hot_by_cost.py --saltshaker BIN [--before BIN] [--rounds 2] [--seconds 8]
       [--background 4000]
"""

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time

from benchlib import start_nodes, start_proxy, stop_all


def encode(args):
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(f"${len(a)}\r\n".encode() + a + b"\r\n")
    return b"".join(out)


def read_reply(f):
    """One RESP2 reply's raw bytes."""
    line = f.readline()
    out = [line]
    kind, n = line[:1], int(line[1:-2] or 0) if line[:1] in (b"*", b"$") else 0
    if kind == b"*":
        for _ in range(max(n, 0)):
            out.append(read_reply(f))
    elif kind == b"$" and n >= 0:
        out.append(f.read(n + 2))
    return b"".join(out)


def call(port, *args):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(encode(args))
        return read_reply(s.makefile("rb"))


def info(port):
    text = call(port, "INFO", "all").split(b"\r\n", 1)[1].decode()
    fields = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            fields[k] = v
    return fields


def readers(port, args, expect_len, threads, per_sec, seconds):
    """Paced readers; returns every read's latency in seconds."""
    wire = encode(args)
    lat = []
    lock = threading.Lock()

    def run():
        s = socket.create_connection(("127.0.0.1", port))
        mine = []
        every = 1.0 / per_sec
        start = time.monotonic()
        nxt = start
        while time.monotonic() - start < seconds:
            t0 = time.monotonic()
            s.sendall(wire)
            got = 0
            while got < expect_len:
                chunk = s.recv(min(1 << 20, expect_len - got))
                if not chunk:
                    raise SystemExit("the proxy closed a reader")
                got += len(chunk)
            mine.append(time.monotonic() - t0)
            nxt += every
            pause = nxt - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        s.close()
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return lat


def one_round(binary, rules, tmp, seconds, background):
    procs = []
    try:
        ports = start_nodes(2, tmp, procs)
        pport, _ = start_proxy(binary, ports, procs, *(["--rules", rules] if rules else []))
        call(pport, "SET", "page:home", b"v" * (512 * 1024))
        for chunk in range(100):
            args = ["ZADD", "board"]
            for i in range(chunk * 1000, (chunk + 1) * 1000):
                args += [i, f"player:{i}"]
            call(pport, *args)
        bg = subprocess.Popen(
            [binary, "bench", "--target", f"127.0.0.1:{pport}", "-c", "8", "--rate",
             str(background), "--mix", "get=100", "--keyspace", "100000",
             "--duration-ms", "0", "-n", "1000000000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(bg)
        time.sleep(1)
        rows = {}
        for name, args, threads in [
            ("big value (GET 512 KiB, 400/s)", ["GET", "page:home"], 4),
            ("big zset (ZRANGE 100,000 members, 200/s)", ["ZRANGE", "board", "0", "-1"], 2),
        ]:
            owner = next(p for p in ports if call(p, "EXISTS", args[1]) == b":1\r\n")
            expect = len(call(owner, *args))
            before = info(owner)
            t0 = time.monotonic()
            lat = readers(pport, args, expect, threads, 100, seconds)
            secs = time.monotonic() - t0
            after = info(owner)
            out = int(after["total_net_output_bytes"]) - int(before["total_net_output_bytes"])
            cpu = sum(float(after[k]) - float(before[k]) for k in ("used_cpu_user", "used_cpu_sys"))
            lat.sort()
            rows[name] = {
                "mb_s": out / secs / 1e6,
                "cpu_pct": cpu / secs * 100,
                # Bytes sent over the reply's size: an upper bound on the readers' reads
                # the node served (the background's small replies count in it too).
                "served": out / expect / max(len(lat), 1),
                "p50": lat[len(lat) // 2] * 1e3,
                "p99": lat[int(len(lat) * 0.99)] * 1e3,
                "reads": len(lat),
            }
        return rows
    finally:
        stop_all(procs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--before")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--background", type=int, default=4000)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hot-by-cost.")
    before_rules = None
    if not args.before:
        before_rules = os.path.join(tmp, "no-cost.yaml")
        with open(before_rules, "w") as f:
            f.write("version: 1\ndefaults:\n  read: { hot_at_bytes_per_sec: 1e15, "
                    "cool_below_bytes_per_sec: 1e14, hot_at_node_ms_per_sec: 1e15, "
                    "cool_below_node_ms_per_sec: 1e14 }\n")
    results = {}
    for r in range(args.rounds):
        order = [("after", args.saltshaker, None),
                 ("before", args.before or args.saltshaker, before_rules)]
        if r % 2:
            order.reverse()
        for label, binary, rules in order:
            rows = one_round(binary, rules, tmp, args.seconds, args.background)
            for name, row in rows.items():
                results.setdefault((name, label), []).append(row)
    print(f"2-node pool, default rules, background {args.background} GET/s uniform; "
          f"{args.seconds:.0f} s per workload, {args.rounds} rounds alternating; "
          "median over rounds. Node: the key's owner.")
    print("| workload | build | node MB/s out | node CPU % | node served (at most) | reads | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, label), rows in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1] != "before")):
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {name} | {label} | {med['mb_s']:.1f} | {med['cpu_pct']:.0f} | "
              f"{med['served'] * 100:.1f}% | {med['reads']:.0f} | {med['p50']:.2f} | "
              f"{med['p99']:.2f} |")


if __name__ == "__main__":
    main()
