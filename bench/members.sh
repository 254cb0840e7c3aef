#!/usr/bin/env bash
# Sets, HyperLogLogs, sorted sets and hashes placed by field, salted by member over 4 shards
# on 4 redis-server nodes. Two parts, each in one run:
#
#  1. Writes on one hot key (SADD, PFADD, ZINCRBY, HINCRBY of random members), through
#     twemproxy and through saltshaker with the key salted: client throughput and the
#     backend commands per node (INFO commandstats), busiest node share and max/mean.
#  2. The read cost of every merged read next to the same command on an unsalted key of
#     the same size, through the same saltshaker (cache off): client ops/s, the ratio, and
#     backend commands per read.
#
# Results go between the members markers in bench/README.md.
#
#   bench/members.sh [--quick]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
writes_n=200000
reads=50000
[ "${1:-}" = "--quick" ] && writes_n=20000 && reads=5000

tag=members
# shellcheck source=bench/pool.sh
source "$root/bench/pool.sh"

# The salting proxy: every bench key salted over 4 shards, by field for the hash; the
# read cache off so every read reaches the nodes.
rules="$work/rules.yaml"
cat >"$rules" <<'YAML'
version: 1
epoch_ms: 1000
defaults:
  read: { cache: { enabled: false } }
rules:
  - match: "plain:*"
    write: { strategy: off }
  - match: "hot:*"
    write: { strategy: salt, salt: { shards: 4, families: [sets, hyperloglogs, sorted_sets, hashes], by: field } }
YAML
start_proxy --rules "$rules"
salt_p=$proxy_port; salt_a=$proxy_admin

cli() { redis-cli -p "$1" "${@:2}" >/dev/null; }
node_cmds() { # total commands served by each node since the last reset, space separated
    for x in "${nodes[@]}"; do
        redis-cli -h "${x%:*}" -p "${x#*:}" info commandstats |
            awk -F'[=,]' '/^cmdstat_/ { s += $2 } END { print s + 0 }'
    done | paste -sd' ' -
}
reset() { for x in "${nodes[@]}"; do redis-cli -h "${x%:*}" -p "${x#*:}" config resetstat >/dev/null; done; }

# Salts KEY: a first write makes its type known, the promotion is requested and awaited,
# then the first write is undone, so the base key is empty and merged reads take the path
# that asks each shard for its own part.
salt_key() { # key seed-write... ; undo-write...
    local key=$1 seed=$2 undo=$3
    # shellcheck disable=SC2086
    cli "$salt_p" $seed
    promote_key "$salt_a" "$key" 300
    # shellcheck disable=SC2086
    cli "$salt_p" $undo
    sleep 0.3
}

bench_rps() { # port args... -> requests per second
    redis-benchmark -p "$1" -c 50 -P 16 -n "$writes_n" --csv "${@:2}" 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'
}

# Part 1: writes on one hot key.
writes=$work/writes.txt
: >"$writes"
write_run() { # label port key seed undo command...
    local label=$1 port=$2 key=$3 seed=$4 undo=$5
    flush
    if [ "$port" = "$salt_p" ]; then salt_key "$key" "$seed" "$undo"; fi
    reset
    rps=$(bench_rps "$port" -r 1000000 "${@:6}")
    echo "$label|$rps|$(node_cmds)" >>"$writes"
}
for target in twemproxy saltshaker; do
    port=$np; [ $target = saltshaker ] && port=$salt_p
    write_run "SADD|$target" "$port" hot:likes "SADD hot:likes seed" "SREM hot:likes seed" SADD hot:likes __rand_int__
    write_run "PFADD|$target" "$port" hot:viewers "PFADD hot:viewers seed" "DEL hot:viewers" PFADD hot:viewers __rand_int__
    write_run "ZINCRBY|$target" "$port" hot:board "ZINCRBY hot:board 1 seed" "ZREM hot:board seed" ZINCRBY hot:board 1 __rand_int__
    write_run "HINCRBY|$target" "$port" hot:fields "HINCRBY hot:fields seed 1" "HDEL hot:fields seed" HINCRBY hot:fields __rand_int__ 1
done

# Part 2: merged reads next to the unsalted key. Each salted key and its plain twin
# (plain:*, not salted: no rule matches) hold the same members.
flush
salt_key hot:likes "SADD hot:likes seed" "SREM hot:likes seed"
salt_key hot:viewers "PFADD hot:viewers seed" "DEL hot:viewers"
salt_key hot:board "ZINCRBY hot:board 1 seed" "ZREM hot:board seed"
salt_key hot:fields "HINCRBY hot:fields seed 1" "HDEL hot:fields seed"
python3 - "$salt_p" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def cmd(*a):
    return b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in (x.encode() for x in a))
out = []
for k in ("hot", "plain"):
    for i in range(1000):
        out.append(cmd("SADD", f"{k}:likes", f"m{i}"))
        out.append(cmd("ZINCRBY", f"{k}:board", str(i % 97), f"m{i}"))
    for i in range(100):
        out.append(cmd("HINCRBY", f"{k}:fields", f"f{i}", str(i)))
    for i in range(0, 10000, 100):
        out.append(cmd("PFADD", f"{k}:viewers", *[f"u{j}" for j in range(i, i + 100)]))
out.append(cmd("PING"))
s.sendall(b"".join(out))
buf = b""
while not buf.endswith(b"+PONG\r\n"):
    buf += s.recv(1 << 20)
if b"-ERR" in buf or b"-WRONGTYPE" in buf:
    sys.exit("prefill failed")
PY
reads_out=$work/reads.txt
: >"$reads_out"
read_run() { # label command-with-KEY...
    local label=$1; shift
    local r=()
    for kind in plain hot; do
        local args=()
        for a in "$@"; do args+=("${a//KEY/$kind}"); done
        reset
        rps=$(redis-benchmark -p "$salt_p" -c 50 -P 16 -n "$reads" --csv "${args[@]}" 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"')
        total=$(node_cmds | awk '{ for (i = 1; i <= NF; i++) s += $i } END { print s + 0 }')
        r+=("$rps" "$total")
    done
    echo "$label|${r[*]}" >>"$reads_out"
}
read_run "SISMEMBER" SISMEMBER KEY:likes m5
read_run "SCARD" SCARD KEY:likes
read_run "SMEMBERS (1000 members)" SMEMBERS KEY:likes
read_run "PFCOUNT" PFCOUNT KEY:viewers
read_run "ZSCORE" ZSCORE KEY:board m5
read_run "ZCARD" ZCARD KEY:board
read_run "ZREVRANGE 0 9 WITHSCORES" ZREVRANGE KEY:board 0 9 WITHSCORES
read_run "ZREVRANK" ZREVRANK KEY:board m5
read_run "HGET" HGET KEY:fields f5
read_run "HLEN" HLEN KEY:fields
read_run "HGETALL (100 fields)" HGETALL KEY:fields

pf_plain=$(redis-cli -p "$salt_p" pfcount plain:viewers)
pf_salted=$(redis-cli -p "$salt_p" pfcount hot:viewers)

table=$(python3 - "$writes" "$reads_out" "$reads" <<'EOF'
import sys
writes, reads, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("| write on one hot key | target | client ops/s | busiest node share | max/mean over nodes | backend cmds per node |")
print("|---|---|---|---|---|---|")
for line in open(writes):
    cmd, target, rps, per = line.strip().split("|")
    per = [int(x) for x in per.split()]
    total = sum(per) or 1
    label = "twemproxy" if target == "twemproxy" else "saltshaker, salted over 4 shards"
    print(f"| {cmd} | {label} | {float(rps):.0f} | {max(per)/total:.3f} | {max(per)/(total/len(per)):.2f} | {' / '.join(map(str, per))} |")
print()
print("| read (through saltshaker, cache off) | unsalted ops/s | salted ops/s | salted / unsalted | backend cmds per read, unsalted | salted |")
print("|---|---|---|---|---|---|")
for line in open(reads):
    label, rest = line.strip().split("|")
    p_rps, p_cmds, s_rps, s_cmds = rest.split()
    p, s = float(p_rps), float(s_rps)
    print(f"| {label} | {p:.0f} | {s:.0f} | {s/p:.2f} | {int(p_cmds)/n:.2f} | {int(s_cmds)/n:.2f} |")
EOF
)
echo "$table"
hll="PFCOUNT of the 10000 distinct elements: unsalted key ${pf_plain}, salted key ${pf_salted} (the sum of its 4 shards' counts), errors $(python3 -c "print(f'{abs($pf_plain-10000)/100:.2f}% and {abs($pf_salted-10000)/100:.2f}%')") (HyperLogLog standard error 0.81%)."
block=$(printf '%s\n\n%s\n\n%s\n\n%s\n' \
    "Measured $(date -u +%Y-%m-%d) on $(nproc) cores with \`bench/members.sh\` (4 redis-server nodes; \`redis-benchmark -c 50 -P 16\`, ${writes_n} writes per write run with random members from 1M, ${reads} requests per read run; $(redis-server --version | cut -d' ' -f3 | tr -d 'v='))." \
    "$table" \
    "Writes: one key takes every write, members drawn at random; through twemproxy it is one key on one node, through saltshaker it is salted over 4 shards on 4 nodes by member (promoted by an admin request before the run). Reads: the salted key and an unsalted twin hold the same 1000 set members, 1000 sorted-set members, 100 hash fields (placed by field) and 10000 HyperLogLog elements, and the base key of the salted one is empty, as it is once a key has been salted for a while; backend commands per read count every command the nodes served during the run. Sizes, SMEMBERS and one-round ranges join the session's round; ZRANK/ZREVRANK (the member's score, then a count on every shard) and reads while the base key holds members are answered by a task, one request at a time per connection. On 2 cores the nodes, the proxy and redis-benchmark share the CPU, so a merged read that costs every node a command (4 or 5 where the unsalted read costs one) is bounded by the nodes' CPU as much as by the proxy: the heavier the command on the node (ZRANGE WITHSCORES, HGETALL), the lower the ratio." \
    "$hll")
write_readme_block members "Sets, HyperLogLogs, sorted sets and hashes by field" "$block"
