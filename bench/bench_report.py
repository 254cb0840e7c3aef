"""Turns proxy_bench.sh's raw rows into the markdown table of bench/README.md.

Input: a TSV with one row per redis-benchmark test: round, target, pipeline, test, rps,
p50_ms, p99_ms. Each cell of the table is the median over rounds; the ratios compare
medians taken in the same run, which is the only comparison the README allows."""

import argparse
import statistics
import sys
from collections import defaultdict

BEGIN = "<!-- proxy-bench:begin -->"
END = "<!-- proxy-bench:end -->"
TARGET_ORDER = ["direct", "nutcracker", "saltshaker"]
TEST_ORDER = ["SET", "GET", "INCR"]


def load(path):
    cells = defaultdict(lambda: {"rps": [], "p50": [], "p99": []})
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 7 or parts[0] == "round":
                continue
            _, target, pipeline, test, rps, p50, p99 = parts
            cell = cells[(target, int(pipeline), test.upper())]
            cell["rps"].append(float(rps))
            cell["p50"].append(float(p50))
            cell["p99"].append(float(p99))
    return {k: {m: statistics.median(v) for m, v in c.items()} for k, c in cells.items()}


def ratio(cells, key, other_target):
    other = cells.get((other_target,) + key[1:])
    if not other or not other["rps"]:
        return "-"
    return f"{cells[key]['rps'] / other['rps']:.2f}"


def table(cells):
    order = lambda k: (k[1], TARGET_ORDER.index(k[0]) if k[0] in TARGET_ORDER else 9,
                       TEST_ORDER.index(k[2]) if k[2] in TEST_ORDER else 9)
    rows = ["| target | pipeline | test | rps | p50 ms | p99 ms | vs direct | vs nutcracker |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for key in sorted(cells, key=order):
        c = cells[key]
        rows.append(f"| {key[0]} | {key[1]} | {key[2]} | {c['rps']:,.0f} | {c['p50']:.3f} "
                    f"| {c['p99']:.3f} | {ratio(cells, key, 'direct')} "
                    f"| {ratio(cells, key, 'nutcracker')} |")
    return "\n".join(rows)


def update_readme(path, block):
    with open(path) as f:
        text = f.read()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = f"{head}{BEGIN}\n{block}\n{END}{tail}"
    else:
        text = f"{text.rstrip()}\n\n{BEGIN}\n{block}\n{END}\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("rows")
    ap.add_argument("--readme", help="write the table between the markers of this file")
    ap.add_argument("--meta", action="append", default=[], help="a line printed above the table")
    args = ap.parse_args()
    cells = load(args.rows)
    if not cells:
        print("bench_report: no rows", file=sys.stderr)
        return 1
    block = "\n".join([*args.meta, "", table(cells)])
    print(block)
    if args.readme:
        update_readme(args.readme, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
