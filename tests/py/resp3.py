"""A minimal RESP3 reader over a raw socket, so the suite can check the wire type the
proxy sends (a map '%', a double ',', a null '_'), which redis-py hides behind Python
types."""

import socket


class Raw:
    def __init__(self, port, timeout=5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by peer")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self):
        """Returns (type byte, value); aggregates hold a list of (type, value)."""
        line = self._line()
        kind, rest = chr(line[0]), line[1:]
        if kind in "+-:,(#":
            return kind, rest
        if kind == "_":
            return kind, None
        if kind in "$=!":
            n = int(rest)
            return (kind, None) if n < 0 else (kind, self._exact(n))
        if kind in "*~>":
            n = int(rest)
            return (kind, None) if n < 0 else (kind, [self.read() for _ in range(n)])
        if kind in "%|":
            n = int(rest)
            return kind, [(self.read(), self.read()) for _ in range(n)]
        raise ValueError(f"unknown RESP3 type {kind!r} in {line!r}")

    def call(self, *args):
        self.send(*args)
        return self.read()


def plain(reply):
    """A reply from `Raw.read` as plain Python: text, int, float, bool, None, a list, a
    dict, or a RuntimeError holding an error's text."""
    kind, v = reply
    if v is None or kind == "_":
        return None
    if kind in "-!":
        return RuntimeError(v.decode(errors="replace"))
    if kind in ":(":
        return int(v)
    if kind == ",":
        return float(v)
    if kind == "#":
        return v == b"t"
    if kind in "*~>":
        return [plain(x) for x in v]
    if kind in "%|":
        return {plain(k): plain(x) for k, x in v}
    return v.decode(errors="replace")
