#!/usr/bin/env python3
"""Memory per client connection: saltshaker against twemproxy (nutcracker), same node.

Opens N client connections to each proxy, sends one PING on each and reads its PONG,
then reads the proxy's RSS (from /proc). Reports the RSS per idle connection over the
RSS before any client connected. Then opens and closes M connections R times and reads
the RSS 5 s after each round's connections are all closed, to see whether memory is given
back.

usage: bench/conn_memory.py --saltshaker BIN [--conns 8000] [--churn 4000] [--rounds 7]

Needs redis-server and nutcracker on PATH. Every process listens on loopback only.
"""

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

from benchlib import free_port, stop_all, wait_port


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_conns(port, n):
    conns = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        conns.append(s)
    # One PING each, all sent first, then every PONG read.
    for s in conns:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
    for s in conns:
        got = b""
        while not got.endswith(b"\r\n"):
            chunk = s.recv(64)
            if not chunk:
                raise SystemExit("a proxy closed a connection")
            got += chunk
        if got != b"+PONG\r\n":
            raise SystemExit(f"unexpected reply {got!r}")
    return conns


def measure(name, pid, port, args):
    idle = rss_kb(pid)
    conns = open_conns(port, args.conns)
    time.sleep(1)
    full = rss_kb(pid)
    for s in conns:
        s.close()
    per_conn = (full - idle) * 1024 / args.conns
    print(f"{name}: idle RSS {idle} kB, with {args.conns} connections {full} kB: "
          f"{per_conn / 1024:.1f} kB per connection", flush=True)
    time.sleep(2)
    after = []
    for _ in range(args.rounds):
        conns = open_conns(port, args.churn)
        for s in conns:
            s.close()
        time.sleep(5)
        after.append(rss_kb(pid))
    print(f"{name}: RSS 5 s after {args.churn} connections open and close, rounds 1-{args.rounds}: "
          f"{', '.join(str(a // 1024) for a in after)} MB (idle was {idle // 1024} MB, "
          f"last/idle {after[-1] / max(idle, 1):.1f}x)", flush=True)
    return per_conn, idle, after


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saltshaker", required=True)
    ap.add_argument("--conns", type=int, default=8000)
    ap.add_argument("--churn", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--only", default="saltshaker,nutcracker")
    args = ap.parse_args()
    want = args.conns + 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, soft), max(want, hard)))
    tmp = tempfile.mkdtemp(prefix="conn-memory.")
    procs = []
    limit = f"ulimit -n {want + 1000};"
    try:
        rport = free_port()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL))
        wait_port(rport)
        results = {}
        if "saltshaker" in args.only:
            port, admin = free_port(), free_port()
            p = subprocess.Popen(
                ["bash", "-c", limit + " exec " + " ".join([
                    args.saltshaker, "--listen", f"127.0.0.1:{port}", "--admin",
                    f"127.0.0.1:{admin}", "--nodes", f"127.0.0.1:{rport}",
                    "--threads", args.threads, "--log-level", "warn"])],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "ss.log"), "w"))
            procs.append(p)
            wait_port(port)
            results["saltshaker"] = measure("saltshaker", p.pid, port, args)
        if "nutcracker" in args.only:
            port = free_port()
            conf = os.path.join(tmp, "nc.yml")
            with open(conf, "w") as f:
                f.write(f"pool:\n  listen: 127.0.0.1:{port}\n  redis: true\n"
                        f"  servers:\n    - 127.0.0.1:{rport}:1\n")
            p = subprocess.Popen(["bash", "-c", limit + f" exec nutcracker -c {conf} -s {free_port()}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            wait_port(port)
            results["nutcracker"] = measure("nutcracker", p.pid, port, args)
        if len(results) == 2:
            s, n = results["saltshaker"][0], results["nutcracker"][0]
            print(f"per idle connection: saltshaker/nutcracker {s / n:.2f}x")
    finally:
        stop_all(procs)


if __name__ == "__main__":
    sys.exit(main())
