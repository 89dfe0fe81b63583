#!/usr/bin/env bash
# A/B of two Shoal builds on one sysbench workload, runs alternated (A B A B ...) so the
# machine's drift hits both alike; prints every run and each build's median. For measuring one
# change at a time on a shared, noisy machine (benchmarks.md's A/B tables).
#
#   benches/ab_sysbench.sh BIN_A BIN_B [workload] [threads] [seconds] [rounds] [sysbench option ...]
#
# BIN_A/BIN_B: directories holding shoal, shoal-mgmd, shoal-datanode, shoal-sqlnode (copy
# target/release/shoal* aside before rebuilding). Defaults: oltp_read_write, 16 threads, 10 s,
# 3 rounds; 4 tables x 10,000 rows. Extra options go to sysbench's run, e.g. to isolate one
# statement kind of oltp_read_write: --point_selects=0 --simple_ranges=4 ...
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "$1") B=$(realpath "$2")
WL=${3:-oltp_read_write} THREADS=${4:-16} SECS=${5:-10} ROUNDS=${6:-3}
shift $(( $# < 6 ? $# : 6 ))
source benches/lib.sh
need_packages sysbench:sysbench mariadb:mariadb-client

bench_workdir

# one BIN [sysbench option ...] sets `rate`: the workload's TPS (QPS for oltp_point_select) on a
# fresh cluster. Not run in a subshell, so the EXIT trap stops the cluster if anything fails.
one() {
  local bin=$1
  shift
  rm -rf "$work/c"
  start_shoal "$bin/shoal" "$work/c"
  local port sb out
  shoal_sysbench_tables "$work/c"
  out=$(sysbench "$WL" "${sb[@]}" "$@" --threads="$THREADS" --time="$SECS" run)
  kill -TERM "$up_pid"; wait "$up_pid" 2>/dev/null || true; up_pid=""
  local what=transactions:
  [ "$WL" = oltp_point_select ] && what=queries:
  rate=$(echo "$out" | awk -v w="$what" '$1 == w {gsub(/\(/,"",$3); print int($3)}')
  [ -n "$rate" ] || { echo "no result from sysbench:" >&2; echo "$out" >&2; exit 1; }
}

ra=() rb=()
for r in $(seq "$ROUNDS"); do
  one "$A" "$@"; a=$rate
  one "$B" "$@"; b=$rate
  ra+=("$a"); rb+=("$b")
  echo "round $r: A $a  B $b"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
ma=$(median "${ra[@]}") mb=$(median "${rb[@]}")
echo "median: A $ma  B $mb  B/A $(python3 -c "print(f'{$mb/max($ma,1):.2f}')")"
