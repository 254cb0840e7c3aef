"""Helpers the Python bench drivers share: loopback ports, waiting for a listener, a node's
command count."""

import os
import random
import socket
import subprocess
import time


def _bindable(port):
    try:
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.close()
        return True
    except OSError:
        return False


def free_port(below=None):
    """A free loopback port; with `below`, one under it whose port + 10000 is free too (a
    cluster node's bus port must fit under 65536)."""
    if below is None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port
    while True:
        port = random.randrange(20000, below)
        if _bindable(port) and _bindable(port + 10000):
            return port


def wait_port(port, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def stop_all(procs):
    """Ends the processes a driver started: TERM, then KILL after 10 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def start_nodes(n, tmp, procs):
    """Starts `n` redis-servers without persistence on free loopback ports (added to
    `procs`); returns their ports."""
    ports = []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL))
        wait_port(port)
        ports.append(port)
    return ports


def start_nutcracker(rport, tmp, procs):
    """Starts nutcracker (one server connection) in front of the node on `rport` (added to
    `procs`); returns (its port, the process)."""
    nport = free_port()
    conf = os.path.join(tmp, "nc.yml")
    with open(conf, "w") as f:
        f.write(f"pool:\n  listen: 127.0.0.1:{nport}\n  redis: true\n"
                f"  server_connections: 1\n  servers:\n    - 127.0.0.1:{rport}:1\n")
    nc = subprocess.Popen(["nutcracker", "-c", conf, "-s", str(free_port())],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(nc)
    wait_port(nport)
    return nport, nc


def start_proxy(binary, ports, procs, *extra):
    """Starts saltshaker over the nodes `ports` (added to `procs`); returns its (listen,
    admin) ports."""
    pport, aport = free_port(), free_port()
    procs.append(subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{pport}", "--admin", f"127.0.0.1:{aport}",
         "--nodes", ",".join(f"127.0.0.1:{p}" for p in ports), "--log-level", "warn", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_port(pport)
    return pport, aport


def commands_processed(port):
    """A redis-server's `total_commands_processed` (INFO stats)."""
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "stats"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("total_commands_processed:"):
            return int(line.split(":")[1])
    return 0
