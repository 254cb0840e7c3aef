"""Runs the redis-py suite against saltshaker over a pool of 4 redis-servers, or with
--direct against one plain redis-server (checks the tests themselves; pool-only tests
are skipped). Exit code 0 only if every test passed."""

import argparse
import logging
import os
import signal
import sys

import redis

import harness
import test_types  # noqa: F401  (registers tests; order = import order)
import test_proxy  # noqa: F401


class Ctx:
    def __init__(self, cluster, port, direct):
        self.cluster = cluster
        self.port = port
        self.direct = direct
        self.r = self.client()
        self.nodes = [redis.Redis(port=p, socket_timeout=10) for p in cluster.nodes]

    def client(self, protocol=2):
        # redis-py sends CLIENT SETINFO on connect; twemproxy closes the connection on
        # it, so SALTSHAKER_PY_NO_CLIENT_INFO=1 lets the suite run against nutcracker.
        quiet = os.environ.get("SALTSHAKER_PY_NO_CLIENT_INFO") == "1"
        extra = {"lib_name": None, "lib_version": None} if quiet else {}
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=protocol,
                           socket_timeout=10, socket_connect_timeout=5, **extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--direct", action="store_true",
                    default=os.environ.get("SALTSHAKER_PY_DIRECT") == "1",
                    help="no proxy: run against one plain redis-server")
    ap.add_argument("--bin", default=harness.binary())
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()
    # redis-py logs every RESP3 push frame at INFO; the pub/sub tests check them instead.
    logging.getLogger("push_response").setLevel(logging.WARNING)

    # A timeout's SIGTERM must still run the finally below, which kills the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = harness.Cluster()
    passed = failed = skipped = 0
    ok = False
    try:
        if args.direct:
            cluster.start_redis()
            port = cluster.nodes[0]
            print(f"redis-py {redis.__version__}: direct mode, redis-server on {port}")
        else:
            if not os.access(args.bin, os.X_OK):
                print(f"redis-py: proxy binary {args.bin} not found (cargo build first)")
                print("redis-py: 0 passed, 1 failed")
                return 1
            for _ in range(args.nodes):
                cluster.start_redis()
            try:
                cluster.start_proxy(args.bin, hash_tag="{}")
            except RuntimeError as e:
                print(f"redis-py: {e}\n--- proxy log ---\n{cluster.tail_proxy_log()}")
                print("redis-py: 0 passed, 1 failed")
                return 1
            port = cluster.proxy_port
            print(f"redis-py {redis.__version__}: saltshaker on {port} over nodes "
                  f"{cluster.nodes}, admin on {cluster.admin_port}")
        sys.stdout.flush()
        passed, failed, skipped = harness.run_all(Ctx(cluster, port, args.direct), args.direct)
        ok = failed == 0
        if failed and not args.direct:
            print("--- last lines of the proxy log ---")
            print(cluster.tail_proxy_log())
    finally:
        cluster.close(keep=not ok)
    print(f"redis-py: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
