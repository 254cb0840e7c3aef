"""Starts real redis-server processes (and the proxy over them) on free loopback ports,
and runs test functions registered with @test, printing one line per test and a
closing "redis-py: N passed, N failed, N skipped" line.

No pytest: the suite is plain functions with asserts, so it runs with only redis-py."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

TESTS = []


def test(fn=None, *, pool_only=False):
    """Registers a test. pool_only tests need the proxy over several nodes and are
    skipped in direct mode (one plain redis-server, no proxy)."""

    def register(f):
        TESTS.append((f, pool_only))
        return f

    return register(fn) if fn else register


class Skip(Exception):
    pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


class Cluster:
    """The processes of one run: node servers, optionally the proxy, optionally
    nutcracker (as the placement oracle). Everything is killed by close()."""

    def __init__(self):
        self.procs = []
        self.logdir = tempfile.mkdtemp(prefix="saltshaker-py-")
        self.nodes = []  # ports of the redis-servers
        self.proxy_port = None
        self.admin_port = None
        self.nutcracker_port = None
        self.proxy_log = None

    def _spawn(self, name, argv):
        log = open(os.path.join(self.logdir, name + ".log"), "wb")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "NO_COLOR": "1"},
        )
        self.procs.append(proc)
        return proc

    def start_redis(self, extra=(), server="redis-server"):
        port = free_port()
        proc = self._spawn(f"redis-{port}", [
            server, "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", self.logdir, "--dbfilename", f"dump-{port}.rdb", *extra,
        ])
        wait_for_port(port, proc, f"redis-server on {port}")
        self.nodes.append(port)
        return proc

    def start_proxy(self, binary, hash_tag="{}", named=False):
        """named: the nodes get names (node0, node1, ...), so that keys are placed by the
        names, the same on every run, not by the ports, which change."""
        self.proxy_port = free_port()
        self.admin_port = free_port()
        nodes = ",".join(f"127.0.0.1:{p}:1" + (f" node{i}" if named else "")
                         for i, p in enumerate(self.nodes))
        argv = [binary, "--listen", f"127.0.0.1:{self.proxy_port}", "--nodes", nodes,
                "--admin", f"127.0.0.1:{self.admin_port}", "--hash-tag", hash_tag]
        self.proxy_log = os.path.join(self.logdir, "proxy.log")
        proc = self._spawn("proxy", argv)
        wait_for_port(self.proxy_port, proc, "saltshaker")
        return proc

    def start_nutcracker(self, hash_tag="{}"):
        if not shutil.which("nutcracker"):
            return None
        self.nutcracker_port = free_port()
        conf = os.path.join(self.logdir, "nutcracker.yml")
        with open(conf, "w") as f:
            f.write("pool:\n")
            f.write(f"  listen: 127.0.0.1:{self.nutcracker_port}\n")
            f.write("  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n")
            f.write(f"  hash_tag: \"{hash_tag}\"\n  servers:\n")
            for p in self.nodes:
                f.write(f"    - 127.0.0.1:{p}:1\n")
        stats = free_port()
        proc = self._spawn("nutcracker", ["nutcracker", "-c", conf, "-s", str(stats),
                                          "-a", "127.0.0.1", "-o",
                                          os.path.join(self.logdir, "nutcracker.log")])
        wait_for_port(self.nutcracker_port, proc, "nutcracker")
        return proc

    def kill_node(self, index):
        """Kills one node server (for the node-down test)."""
        port = self.nodes[index]
        for proc in self.procs:
            if proc.args[:3] == ["redis-server", "--port", str(port)]:
                proc.kill()
                proc.wait()

    def close(self, keep=False):
        """Kills every process; removes the run's directory unless `keep` (a failed run
        keeps its logs)."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    proc.kill()
            proc.wait()
        self.procs = []
        if not keep:
            shutil.rmtree(self.logdir, ignore_errors=True)

    def tail_proxy_log(self, lines=30):
        if not self.proxy_log or not os.path.exists(self.proxy_log):
            return ""
        with open(self.proxy_log, "rb") as f:
            text = f.read().decode(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def binary():
    """The saltshaker binary the suites run: $SALTSHAKER_BIN, else the debug build."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.environ.get("SALTSHAKER_BIN", os.path.join(root, "target", "debug", "saltshaker"))


def run_suite(label, setup):
    """Runs the test functions that `setup(c)` returns once it has started what they need
    in `c` (a Cluster of processes), one by one; prints "redis-py LABEL: N passed, N
    failed" and returns the exit status (a failing setup is one failure)."""
    c = Cluster()
    passed = failed = 0
    try:
        for t in setup(c):
            try:
                t()
                passed += 1
                print(f"ok   {t.__name__}")
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}\n{traceback.format_exc()}")
        if failed:
            print(c.tail_proxy_log())
    except Exception:
        failed += 1
        print(f"FAIL setup\n{traceback.format_exc()}")
    finally:
        c.close(keep=failed > 0)
        if failed:
            print(f"logs kept in {c.logdir}")
    print(f"redis-py {label}: {passed} passed, {failed} failed")
    return 1 if failed else 0


def run_all(ctx, direct):
    passed = failed = skipped = 0
    for fn, pool_only in TESTS:
        name = fn.__name__
        if pool_only and direct:
            print(f"SKIP {name} (needs the proxy over a pool)")
            skipped += 1
            continue
        start = time.monotonic()
        try:
            fn(ctx)
        except Skip as e:
            print(f"SKIP {name} ({e})")
            skipped += 1
            continue
        except Exception:  # a failing test must not stop the others
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc(file=sys.stdout)
            continue
        passed += 1
        print(f"ok   {name} ({(time.monotonic() - start) * 1000:.0f} ms)")
    sys.stdout.flush()
    return passed, failed, skipped
