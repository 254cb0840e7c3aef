#!/usr/bin/env python3
"""How many of a Zipf key space's hottest keys must a read cache hold before what is left
reaches the nodes as evenly as uniform load does?

Places the names the load generator uses (key:0 .. key:N-1, key:0 the hottest) the way
saltshaker and twemproxy do by default (ketama, fnv1a_64, 160 points per node named
host:port), over random port sets, and prints, for each number of cached top keys, the
busiest node's load over the mean divided by the same figure under uniform load.

    bench/zipf_placement.py [--keys 100000] [--nodes 4] [--sets 40]
    bench/zipf_placement.py --greedy [--rate 300000] [--floor 20]

--greedy instead caches only the busy node's keys, the way `balance` does: while the
busiest node carries more than 1.05x the mean, cache its hottest key read at least --floor
times per second (at --rate reads per second in all). It prints how many keys that took,
the rank of the coolest one, and the busiest node over uniform's figure.

Sequential names matter: fnv1a changes little for a change in the last bytes, so names that
differ only in their last two digits land on neighbouring points of the continuum and share
a node.
"""
import argparse
import bisect
import hashlib
import random
import struct


def fnv1a_64(key):
    h = 0xCBF29CE484222325 & 0xFFFFFFFF
    for b in key:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFF
    return h


def ketama(names):
    pairs = []
    for idx, name in enumerate(names):
        for p in range(40):
            d = hashlib.md5(f"{name}-{p}".encode()).digest()
            pairs += [(struct.unpack("<I", d[w * 4:w * 4 + 4])[0], idx) for w in range(4)]
    pairs.sort(key=lambda x: x[0])
    points = [v for v, _ in pairs]
    owners = [o for _, o in pairs]

    def node(h):
        i = bisect.bisect_left(points, h)
        return owners[i if i < len(points) else 0]

    return node


def greedy(a, hashes):
    rng = random.Random(11)
    print("| Zipf | port sets within 5% of uniform | keys cached: median (max) | coolest key's rank: max | busiest/mean over uniform's: median (max) |")
    print("|---|---|---|---|---|")
    for s in (1.1, 1.3):
        w = [(i + 1) ** -s for i in range(a.keys)]
        total = sum(w)
        p = [x / total * a.rate for x in w]
        rows = []
        for _ in range(a.sets):
            ports = rng.sample(range(20000, 60000), a.nodes)
            node = ketama([f"127.0.0.1:{q}" for q in ports])
            owner = [node(h) for h in hashes]
            uniform = max(owner.count(n) for n in range(a.nodes)) / (a.keys / a.nodes)
            load = [0.0] * a.nodes
            per = [[] for _ in range(a.nodes)]
            for i in range(a.keys):
                load[owner[i]] += p[i]
                per[owner[i]].append(i)
            ptr = [0] * a.nodes
            cached = rank = 0
            while True:
                b = max(range(a.nodes), key=lambda n: load[n])
                if load[b] / (sum(load) / a.nodes) <= 1.05 or ptr[b] >= len(per[b]):
                    break
                i = per[b][ptr[b]]
                if p[i] < a.floor:
                    break
                ptr[b] += 1
                load[b] -= p[i]
                cached += 1
                rank = max(rank, i)
            rows.append((max(load) / (sum(load) / a.nodes) / uniform, cached, rank))
        ratios = sorted(r[0] for r in rows)
        counts = sorted(r[1] for r in rows)
        within = sum(1 for r in ratios if r <= 1.05) / len(ratios)
        print(f"| {s} | {within:.2f} | {counts[len(counts) // 2]} ({counts[-1]}) | {max(r[2] for r in rows)} | {ratios[len(ratios) // 2]:.3f} ({ratios[-1]:.3f}) |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--sets", type=int, default=40)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--rate", type=float, default=300_000)
    ap.add_argument("--floor", type=float, default=20)
    a = ap.parse_args()
    hashes = [fnv1a_64(f"key:{i}".encode()) for i in range(a.keys)]
    if a.greedy:
        greedy(a, hashes)
        return
    tops = [t for t in (0, 20, 100, 200, 500, 1000, 2000, 5000, 10000) if t < a.keys]
    exps = (1.1, 1.3)
    probs = {}
    for s in exps:
        w = [(i + 1) ** -s for i in range(a.keys)]
        total = sum(w)
        probs[s] = [x / total for x in w]
    rng = random.Random(7)
    ratios = {(s, t): [] for s in exps for t in tops}
    for _ in range(a.sets):
        ports = rng.sample(range(20000, 60000), a.nodes)
        node = ketama([f"127.0.0.1:{p}" for p in ports])
        owner = [node(h) for h in hashes]
        count = [owner.count(n) for n in range(a.nodes)]
        uniform = max(count) / (sum(count) / a.nodes)
        for s in exps:
            for t in tops:
                load = [0.0] * a.nodes
                for i in range(t, a.keys):
                    load[owner[i]] += probs[s][i]
                ratios[(s, t)].append(max(load) / (sum(load) / a.nodes) / uniform)
    print("| Zipf | top keys cached | busiest/mean over uniform's: median | p90 | share of port sets within 5% |")
    print("|---|---|---|---|---|")
    for s in exps:
        for t in tops:
            r = sorted(ratios[(s, t)])
            within = sum(1 for x in r if x <= 1.05) / len(r)
            print(f"| {s} | {t} | {r[len(r) // 2]:.3f} | {r[int(len(r) * 0.9)]:.3f} | {within:.2f} |")


if __name__ == "__main__":
    main()
