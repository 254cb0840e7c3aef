"""redis-py with ssl=True through saltshaker, with TLS on both sides: certificates made
here with openssl, a redis-server on a TLS port that requires a client certificate, the
proxy presenting its own certificate to clients and a client certificate to the node.
Also a named user (username/password) held to its key pattern.
Prints "redis-py tls: N passed, N failed" and exits 0 only if every test passed."""

import hashlib
import os
import subprocess
import sys

import redis

import harness


def openssl(d, *args):
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def make_certs(d):
    openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=py ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name in ("server", "client"):
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                    "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n")
        openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext")


def setup(c):
    binary = harness.binary()
    d = c.logdir
    make_certs(d)
    p = lambda n: os.path.join(d, n)
    node = harness.free_port()
    proc = c._spawn("redis-tls", [
        "redis-server", "--port", "0", "--tls-port", str(node), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--dir", d,
        "--tls-cert-file", p("server.crt"), "--tls-key-file", p("server.key"),
        "--tls-ca-cert-file", p("ca.crt")])
    harness.wait_for_port(node, proc, "redis-server --tls-port")
    proxy, admin = harness.free_port(), harness.free_port()
    app_hash = hashlib.sha256(b"app-pw").hexdigest()
    cfg = p("saltshaker.yaml")
    with open(cfg, "w") as f:
        f.write(f"listen: 127.0.0.1:{proxy}\nadmin: 127.0.0.1:{admin}\n"
                f"backend:\n  nodes: [\"127.0.0.1:{node}\"]\n"
                f"  tls: {{ ca: \"{p('ca.crt')}\", cert: \"{p('client.crt')}\", key: \"{p('client.key')}\" }}\n"
                f"tls: {{ cert: \"{p('server.crt')}\", key: \"{p('server.key')}\" }}\n"
                "auth:\n  password: shared-pw\n  users:\n    - name: app\n"
                f"      passwords_sha256: [\"{app_hash}\"]\n"
                "      keys: [\"app:*\"]\n      commands: [\"+@read\", \"+@write\", \"+@connection\"]\n")
    proc = c._spawn("proxy", [binary, "--config", cfg])
    c.proxy_log = os.path.join(d, "proxy.log")
    harness.wait_for_port(proxy, proc, "saltshaker")

    def tls_default_user():
        r = redis.Redis(port=proxy, ssl=True, ssl_ca_certs=p("ca.crt"), password="shared-pw",
                        socket_timeout=10)
        assert r.set("py:tls", "v") and r.get("py:tls") == b"v"
        pl = r.pipeline(transaction=False)
        for i in range(500):
            pl.incr("py:tls:ctr")
        assert pl.execute()[-1] == 500
        direct = redis.Redis(port=node, ssl=True, ssl_ca_certs=p("ca.crt"),
                             ssl_certfile=p("client.crt"), ssl_keyfile=p("client.key"))
        assert direct.get("py:tls:ctr") == b"500"

    def tls_resp3_named_user():
        r = redis.Redis(port=proxy, ssl=True, ssl_ca_certs=p("ca.crt"), protocol=3,
                        username="app", password="app-pw", socket_timeout=10)
        assert r.set("app:1", "x") and r.get("app:1") == b"x"
        try:
            r.get("other")
            raise AssertionError("a key outside app:* was served")
        except redis.exceptions.NoPermissionError as e:
            assert "no permissions to access one of the keys" in str(e), e

    def tls_refuses_untrusted_client_settings():
        try:
            redis.Redis(port=proxy, ssl=True, ssl_cert_reqs="required",
                        ssl_ca_certs=p("client.crt"), password="shared-pw",
                        socket_timeout=5).ping()
            raise AssertionError("a client trusting another CA connected")
        except redis.exceptions.ConnectionError:
            pass

    return (tls_default_user, tls_resp3_named_user, tls_refuses_untrusted_client_settings)


if __name__ == "__main__":
    sys.exit(harness.run_suite("tls", setup))
