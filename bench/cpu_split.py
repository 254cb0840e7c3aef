#!/usr/bin/env python3
"""Where each proxy's CPU goes: the kernel's share against its own code and libc.

One redis-server; nutcracker and saltshaker (`--threads 1`) in front of it. For each
pipeline depth, `perf record` samples each proxy for a few seconds while
`redis-benchmark -c 50 -r 100000 -t get -P P` runs through it, and the samples are split
by where they fell (`perf report --sort dso`). With the CPU per request of the same build
(cpu_per_request.py), the split says how much of a request the proxy's own code costs and
how much is the kernel's socket work, which any proxy making the same system calls pays.

usage: bench/cpu_split.py --saltshaker BIN [--pipelines 1,16] [--seconds 4]
"""

import argparse
import os
import re
import subprocess
import tempfile
import time

from benchlib import free_port, start_nodes, start_nutcracker, stop_all, wait_port


def shares(data, own):
    out = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--sort", "dso", "-g", "none",
         "--stdio"], capture_output=True, text=True, check=True).stdout
    split = {"kernel": 0.0, "own code": 0.0, "libc and other": 0.0}
    for line in out.splitlines():
        parts = line.split()
        if not parts or line.startswith("#") or not parts[0].endswith("%"):
            continue
        pct, dso = float(parts[0].rstrip("%")), " ".join(parts[1:])
        if "kernel" in dso:
            split["kernel"] += pct
        elif dso in own:
            split["own code"] += pct
        else:
            split["libc and other"] += pct
    return split


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--pipelines", default="1,16")
    ap.add_argument("--seconds", type=int, default=4)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cpu-split.")
    procs = []
    try:
        [rport] = start_nodes(1, tmp, procs)
        nport, nc = start_nutcracker(rport, tmp, procs)
        sport = free_port()
        ss = subprocess.Popen(
            [args.saltshaker, "--listen", f"127.0.0.1:{sport}", "--admin",
             f"127.0.0.1:{free_port()}", "--nodes", f"127.0.0.1:{rport}", "--threads", "1",
             "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(ss)
        wait_port(sport)
        subprocess.run(["redis-benchmark", "-p", str(rport), "-t", "set", "-r", "100000",
                        "-n", "100000", "-c", "50", "-q"], stdout=subprocess.DEVNULL,
                       check=True)
        print(f"perf record -F 4999 -g -p PID for {args.seconds} s during "
              "redis-benchmark -c 50 -r 100000 -t get -P P; share of each proxy's samples")
        print("| pipeline | proxy | kernel | own code | libc and other | samples |")
        print("|---|---|---|---|---|---|")
        for pipe in args.pipelines.split(","):
            for name, port, pid in (("nutcracker", nport, nc.pid),
                                    ("saltshaker", sport, ss.pid)):
                load = subprocess.Popen(
                    ["redis-benchmark", "-p", str(port), "-t", "get", "-r", "100000",
                     "-n", "100000000", "-c", "50", "-P", pipe, "-q"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)
                data = os.path.join(tmp, f"{name}-{pipe}.data")
                rec = subprocess.run(
                    ["perf", "record", "-F", "4999", "-g", "-p", str(pid), "-o", data, "--",
                     "sleep", str(args.seconds)], capture_output=True, text=True)
                load.kill()
                load.wait()
                if rec.returncode != 0:
                    raise SystemExit(f"perf record failed: {rec.stderr.strip()}")
                s = shares(data, {"nutcracker", os.path.basename(args.saltshaker)})
                found = re.search(r"\((\d+) samples\)", rec.stderr)
                samples = found.group(1) if found else "-"
                print(f"| P{pipe} | {name} | {s['kernel']:.1f}% | {s['own code']:.1f}% | "
                      f"{s['libc and other']:.1f}% | {samples} |")
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
