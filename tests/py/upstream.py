"""redis-py's own test suite (the tests shipped in redis 5.2.1's source distribution),
run directly against one redis-server, then through saltshaker over one node and over a
pool of 3 nodes.

A test that passes directly and fails through the proxy must be listed, with its reason,
in upstream_expected.txt for that mode; a listed test that passes fails the run too, so
the file stays true. Prints the pass counts of each mode (the figures the README and
the closing notes quote). Exit code 0 only if every mode matches the file."""

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = "5.2.1"
CACHE = os.path.join(HERE, ".upstream")
SRC = os.path.join(CACHE, f"redis-{VERSION}")
EXPECTED = os.path.join(HERE, "upstream_expected.txt")
# The synchronous standalone suites (no cluster, modules, TLS, sentinel or asyncio).
FILES = ["test_commands.py", "test_pipeline.py", "test_pubsub.py", "test_scripting.py",
         "test_lock.py", "test_connection.py", "test_connection_pool.py", "test_encoding.py",
         "test_monitor.py", "test_function.py", "test_retry.py", "test_multiprocessing.py"]
MARKS = "not onlycluster and not redismod and not ssl"
# As redis-py's own CI starts its server.
SERVER_ARGS = ("--enable-debug-command", "yes", "--enable-module-command", "yes")


def fetch():
    """The sdist's tests, downloaded once into tests/py/.upstream."""
    if os.path.isdir(os.path.join(SRC, "tests")):
        return
    os.makedirs(CACHE, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                    "--disable-pip-version-check", "--no-binary", ":all:", "--no-deps",
                    f"redis=={VERSION}", "-d", CACHE], check=True)
    with tarfile.open(os.path.join(CACHE, f"redis-{VERSION}.tar.gz")) as t:
        t.extractall(CACHE)


def run(label, port, logdir):
    """Runs the suite against 127.0.0.1:port; returns {test id: outcome}."""
    xml = os.path.join(logdir, f"{label}.xml")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-W", "ignore",
            "--timeout", "60", "-m", MARKS, "--redis-url", f"redis://127.0.0.1:{port}/0",
            f"--junitxml={xml}"] + [os.path.join("tests", f) for f in FILES]
    out = subprocess.run(argv, cwd=SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=900)
    tail = out.stdout.decode(errors="replace").strip().splitlines()[-1:]
    print(f"redis-py upstream {label}: pytest says {tail[0] if tail else '(nothing)'}")
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        # tests.test_commands.TestRedisCommands -> tests/test_commands.py::TestRedisCommands
        parts = case.get("classname", "").split(".")
        i = next((k for k, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        tid = "/".join(parts[:i + 1]) + ".py::" + "::".join(parts[i + 1:] + [case.get("name")])
        kinds = {c.tag for c in case}
        if kinds & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        if results.get(tid) != "failed":
            results[tid] = outcome
    return results


def expected():
    """{mode: {test id: reason}} from upstream_expected.txt."""
    out = {"one": {}, "pool": {}}
    with open(EXPECTED) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            modes, tid, reason = (line.split(None, 2) + ["", ""])[:3]
            if not reason:
                sys.exit(f"{EXPECTED}:{n}: every expected failure needs a reason")
            for m in modes.split(","):
                if m not in out:
                    sys.exit(f"{EXPECTED}:{n}: mode {m!r} is not one or pool")
                out[m][tid] = reason
    return out


def setup(c, nodes, proxy):
    for _ in range(nodes):
        c.start_redis(SERVER_ARGS)
    if proxy:
        c.start_proxy(harness.binary(), named=True)
        return c.proxy_port
    return c.nodes[0]


def main():
    fetch()
    want = expected()
    results = {}
    for label, nodes, proxy in [("direct", 1, False), ("one", 1, True), ("pool", 3, True)]:
        c = harness.Cluster()
        try:
            port = setup(c, nodes, proxy)
            results[label] = run(label, port, c.logdir)
        finally:
            c.close()
    direct_pass = {t for t, o in results["direct"].items() if o == "passed"}
    status = 0
    for mode in ["one", "pool"]:
        got = results[mode]
        passed = {t for t in direct_pass if got.get(t) == "passed"}
        failing = direct_pass - passed
        pct = 100.0 * len(passed) / max(1, len(direct_pass))
        print(f"redis-py upstream {mode}: {len(passed)} of the {len(direct_pass)} tests "
              f"that pass directly pass through the proxy ({pct:.1f}%); "
              f"{len(failing & set(want[mode]))} listed as expected failures")
        for t in sorted(failing - set(want[mode])):
            print(f"FAIL {mode} {t}: fails through the proxy and is not in upstream_expected.txt")
            status += 1
        for t in sorted(set(want[mode])):
            if got.get(t) == "passed":
                print(f"FAIL {mode} {t}: passes now; take it out of upstream_expected.txt")
                status += 1
            elif t not in got:
                print(f"FAIL {mode} {t}: listed in upstream_expected.txt but not run")
                status += 1
    passed_total = sum(1 for m in ["one", "pool"] for t in direct_pass
                       if results[m].get(t) == "passed")
    print(f"redis-py upstream: {passed_total} passed, {status} failed")
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
