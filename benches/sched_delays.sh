#!/usr/bin/env bash
# Where the machine waits (issues 2 and 5): on a fresh local cluster under one load, one second
# of the kernel's scheduler events (`perf sched record -a`, plus the wake-ups), summed per task
# name: the CPU time it ran, in how many slices, and how long it waited for a CPU after being
# woken ("sched delay"), with the CPUs' idle time as the task `<idle>`. Throughput tables say
# how much is lost; this says whether the work waits for a CPU (a long sched delay) or the CPUs
# wait for work (idle). Then the same recording's idle periods (`benches/idle_periods.py`):
# each by the task that left the CPU, the one that took it next and what the other CPUs ran
# meanwhile (whether the CPUs wait for work that one stage of the pipeline holds), and the
# wake-ups that put a task on a busy CPU while another idled. Earlier sessions rebuilt both by
# hand.
#
#   benches/sched_delays.sh [--bin DIR] [--edit SED] sysbench WORKLOAD THREADS
#   benches/sched_delays.sh [--bin DIR] [--edit SED] kv CLIENTS WRITE_RATIO
#
# --bin: a directory holding shoal, shoal-mgmd, shoal-datanode, shoal-sqlnode (default
# target/release). --edit: a sed script applied to the cluster's cluster.toml before its nodes
# start again. sysbench: 4 tables x 10,000 rows; kv: single keys, 64-byte values, over TCP as in
# kv_vs_redis.sh. The second recorded starts after 4 s of load. `perf sched timehist -i
# FILE -w` on the kept recording (the path is printed) shows the events one by one.
# Example, the SQL node at point selects with 16 threads:
#   benches/sched_delays.sh sysbench oltp_point_select 16
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release EDIT=""
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --edit) EDIT=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 3 ] && { [ "$1" = sysbench ] || [ "$1" = kv ]; } || { sed -n '13,14p' "$0" >&2; exit 1; }
KIND=$1
source benches/lib.sh
need_packages perf:linux-perf
[ "$KIND" = sysbench ] && need_packages sysbench:sysbench mariadb:mariadb-client
[ "$BIN" = target/release ] && cargo build --release -q
BIN=$(realpath "$BIN")

bench_workdir
start_shoal_edited "$BIN/shoal" "$work/shoal" "$EDIT"
if [ "$KIND" = sysbench ]; then
  shoal_sysbench_tables "$work/shoal"
  sysbench "$2" "${sb[@]}" --threads="$3" --time=8 run >"$work/load.out" &
else
  kv() {
    "$BIN/shoal" bench kv --dir "$work/shoal" --tcp --keys 10000 --value-size 64 --threads "$2" --batch 1 \
      --write-ratio "$3" --duration "$1"
  }
  kv 3 "$2" "$3" >/dev/null
  kv 8 "$2" "$3" >"$work/load.out" &
fi
load=$!
sleep 4
data=$(mktemp --suffix=.perf-sched)
perf sched record -a -e sched:sched_wakeup -o "$data" -- sleep 1 >/dev/null 2>&1
wait "$load"
grep -E 'queries:|transactions:|^ops ' "$work/load.out" || true
echo "| task | ran (ms, summed over the CPUs) | slices | µs per slice | sched delay µs per slice |"
echo "|---|---|---|---|---|"
perf sched timehist -i "$data" 2>/dev/null | awk 'NR > 3 {
    split($3, n, "["); t = n[1]; ran[t] += $NF; slices[t]++; delay[t] += $(NF - 1) }
  END { for (t in ran) if (ran[t] >= 5)
    printf "| %s | %.0f | %d | %.1f | %.1f |\n", t, ran[t], slices[t], 1000 * ran[t] / slices[t], 1000 * delay[t] / slices[t] }' |
  sort -t'|' -k3 -rn
perf script -i "$data" -F cpu,time,event,trace 2>/dev/null | python3 benches/idle_periods.py
echo "recording: $data"
