#!/usr/bin/env bash
# Where the CPU goes per `shoal bench kv` operation (issue 2): on a fresh local cluster (1 node
# group x 2 replicas), after a 3-second write warm-up, one `bench kv --tcp` run; over its middle
# (the first 1.5 s and the last 1.5 s left out) each node's and the load generator's CPU in µs
# per operation (from /proc/<pid>/stat), the machine's idle share (/proc/stat), and the share of
# time some task waited for a CPU (/proc/pressure/cpu, "some": what the data nodes' await spin
# looks at, ARCHITECTURE.md "Worker threads"). Earlier sessions rebuilt this by hand.
#
#   benches/kv_cpu_per_op.sh [--bin DIR] CLIENTS BATCH WRITE_RATIO SECONDS
#
# --bin: a directory holding shoal, shoal-mgmd, shoal-datanode, shoal-sqlnode (default
# target/release). Example, single-key writes with 16 clients: benches/kv_cpu_per_op.sh 16 1 1 6
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
if [ "${1:-}" = --bin ]; then BIN=$2; shift 2; fi
[ $# -eq 4 ] || { sed -n '9,12p' "$0" >&2; exit 1; }
CLIENTS=$1 BATCH=$2 WRITES=$3 SECS=$4
[ "$SECS" -ge 5 ] || { echo "SECONDS must be at least 5" >&2; exit 1; }
source benches/lib.sh
[ "$BIN" = target/release ] && cargo build --release -q
BIN=$(realpath "$BIN")

bench_workdir
start_shoal "$BIN/shoal" "$work/shoal"
kv() { "$BIN/shoal" bench kv --dir "$work/shoal" --tcp --keys 10000 --value-size 64 "$@"; }
kv --threads 16 --batch 1 --write-ratio 1 --duration 3 >/dev/null

# "name:pid" of every node of the cluster.
mapfile -t procs < <("$BIN/shoal" status --dir "$work/shoal" --json | python3 -c '
import json, sys
for n in json.load(sys.stdin)["nodes"]:
    if n.get("pid"):
        print("%s-%s:%s" % (n["kind"], n["id"], n["pid"]))')
# Not through kv(): a function in the background is a subshell, and $! would be its pid.
"$BIN/shoal" bench kv --dir "$work/shoal" --tcp --keys 10000 --value-size 64 --threads "$CLIENTS" \
  --batch "$BATCH" --write-ratio "$WRITES" --duration "$SECS" --json >"$work/out.json" &
bench=$!
procs+=("bench:$bench")

cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }
pressure_of() { awk '/^some/ {sub("total=", "", $5); print $5}' /proc/pressure/cpu 2>/dev/null || echo 0; }

sleep 1.5
window=$(python3 -c "print($SECS - 3)")
before=()
for a in "${procs[@]}"; do before+=("$(cpu_of "${a#*:}")"); done
idle0=$(idle_of) psi0=$(pressure_of) t0=$(date +%s.%N)
sleep "$window"
after=()
for a in "${procs[@]}"; do after+=("$(cpu_of "${a#*:}")"); done
idle1=$(idle_of) psi1=$(pressure_of) t1=$(date +%s.%N)
wait "$bench"

ops=$(python3 -c "import json; print(json.load(open('$work/out.json'))['ops_per_s'])")
echo "bench kv: $CLIENTS clients, batch $BATCH, write ratio $WRITES: $(printf '%.0f' "$ops") ops/s"
echo "| process | CPU µs per operation |"
echo "|---|---|"
ticks=$(getconf CLK_TCK)
for i in "${!procs[@]}"; do
  python3 -c "print('| ${procs[$i]%%:*} |', round((${after[$i]} - ${before[$i]}) / $ticks * 1e6 / ($ops * ($t1 - $t0)), 2), '|')"
done
echo "$idle0 $idle1" | awk '{printf "| (machine idle) | %.0f%% |\n", 100 * ($3 - $1) / ($4 - $2)}'
python3 -c "print('| (some task waiting for a CPU) | %.0f%% |' % (100 * ($psi1 - $psi0) / 1e6 / ($t1 - $t0)))"
