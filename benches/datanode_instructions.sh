#!/usr/bin/env bash
# Instructions each data node executes per sysbench event, counted by valgrind's callgrind (see
# sqlnode_instructions.sh for why instructions instead of CPU time on these VMs). The cluster
# starts with both data nodes under callgrind, counting off; after a warm-up, counting runs over
# a fixed number of events (4 sysbench threads). The profiles stay in OUT for
# `callgrind_annotate` (`--inclusive=yes` for the call tree's totals).
#
#   benches/datanode_instructions.sh BIN OUT [workload] [events] [sysbench option ...]
#
# BIN: a directory holding shoal, shoal-mgmd, shoal-datanode, shoal-sqlnode. OUT: a directory
# for the profiles (dn.<pid>.1, one per data node). Defaults: oltp_read_write, 400 events;
# 4 tables x 10,000 rows. Example, four UPDATEs of c per transaction:
#   benches/datanode_instructions.sh target/release /tmp/dn oltp_read_write 400 \
#     --point_selects=0 --simple_ranges=0 --sum_ranges=0 --order_ranges=0 --distinct_ranges=0 \
#     --index_updates=0 --non_index_updates=4 --delete_inserts=0
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "$1")
mkdir -p "$2"
OUT=$(realpath "$2")
WL=${3:-oltp_read_write} EVENTS=${4:-400}
shift $(( $# < 4 ? $# : 4 ))
source benches/lib.sh
need_packages sysbench:sysbench mariadb:mariadb-client valgrind:valgrind

bench_workdir
rm -f "$OUT"/dn.*
# `shoal up` starts the binaries next to its own: the same ones, with the data node wrapped.
mkdir "$work/bin"
cp "$BIN"/shoal "$BIN"/shoal-mgmd "$BIN"/shoal-sqlnode "$work/bin/"
cat >"$work/bin/shoal-datanode" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$OUT/dn.%p "$BIN/shoal-datanode" "\$@" 2>>$OUT/valgrind.log
EOF
chmod +x "$work/bin/shoal-datanode"
start_shoal "$work/bin/shoal" "$work/c"
shoal_sysbench_tables "$work/c"
# Warm-up: prepared statements, connections between the nodes.
sysbench "$WL" "${sb[@]}" --threads=4 --events=40 --time=0 "$@" run >/dev/null
pids=()
for f in "$work"/c/run/1[0-9].pid; do pids+=("$(cat "$f")"); done
for p in "${pids[@]}"; do callgrind_control -i on "$p" >/dev/null 2>&1; done
sysbench "$WL" "${sb[@]}" --threads=4 --events="$EVENTS" --time=0 "$@" run >"$work/sb.out"
for p in "${pids[@]}"; do callgrind_control -d "$p" >/dev/null 2>&1; done
grep -q "ignored errors: *0 " "$work/sb.out" || { cat "$work/sb.out"; exit 1; }
for p in "${pids[@]}"; do
  awk -v n="$EVENTS" -v p="$p" '/^totals:/ {s += $2} END {printf "data node pid %s: %d instructions per event\n", p, s / n}' \
    "$OUT/dn.$p".*
done
