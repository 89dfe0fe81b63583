#!/usr/bin/env bash
# Instructions the SQL node executes per sysbench event, for two builds: counted by valgrind's
# callgrind, so the figure does not move with the machine's load or steal time (a CPU time
# A/B on these shared VMs moves by 20-40% between runs; this one repeats to within 0.5%).
# Counts user-space instructions only: system calls, and the kernel work they cause, are not in
# it. One cluster of BIN_A's binaries; its SQL node is stopped and each build's SQL node runs in
# its place under callgrind, counting from after a warm-up to the end of a fixed number of
# events (4 sysbench threads).
#
#   benches/sqlnode_instructions.sh BIN_A BIN_B [workload] [events] [sysbench option ...]
#
# BIN_A/BIN_B: directories holding shoal, shoal-mgmd, shoal-datanode, shoal-sqlnode (copy
# target/release/shoal* aside before rebuilding). Defaults: oltp_point_select, 2000 events;
# 4 tables x 10,000 rows. Example, four 100-row ranges per transaction:
#   benches/sqlnode_instructions.sh /tmp/a /tmp/b oltp_read_write 200 --point_selects=0 \
#     --simple_ranges=4 --sum_ranges=0 --order_ranges=0 --distinct_ranges=0 --index_updates=0 \
#     --non_index_updates=0 --delete_inserts=0
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "$1") B=$(realpath "$2")
WL=${3:-oltp_point_select} EVENTS=${4:-2000}
shift $(( $# < 4 ? $# : 4 ))
source benches/lib.sh
need_packages sysbench:sysbench mariadb:mariadb-client valgrind:valgrind

bench_workdir
vg_pid=""
trap '[ -n "$vg_pid" ] && kill "$vg_pid" 2>/dev/null; bench_cleanup' EXIT
start_shoal "$A/shoal" "$work/c"
sql_id=$(sed -n '/^\[\[sqlnode\]\]/,/^id/ s/^id = \([0-9]*\)/\1/p' "$work/c/cluster.toml" | head -1)
shoal_sysbench_tables "$work/c"
"$A/shoal" node stop "$sql_id" --dir "$work/c" >/dev/null

# instructions BIN [sysbench option ...]: sets `per_event`.
instructions() {
  local bin=$1
  shift
  rm -f "$work"/cg.out*
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/cg.out" \
    "$bin/shoal-sqlnode" --id "$sql_id" --config "$work/c/cluster.toml" >"$work/vg.log" 2>&1 &
  vg_pid=$!
  for _ in $(seq 600); do
    mariadb -h 127.0.0.1 -P "$port" -u root --skip-ssl -e "select 1" >/dev/null 2>&1 && break
    sleep 0.5
  done
  # Warm-up: prepared statements, table references, connections to the data nodes.
  sysbench "$WL" "${sb[@]}" --threads=4 --events=40 --time=0 "$@" run >/dev/null
  callgrind_control -i on "$vg_pid" >/dev/null 2>&1
  sysbench "$WL" "${sb[@]}" --threads=4 --events="$EVENTS" --time=0 "$@" run >"$work/sb.out"
  callgrind_control -d "$vg_pid" >/dev/null 2>&1
  kill "$vg_pid"; wait "$vg_pid" 2>/dev/null || true; vg_pid=""
  grep -q "ignored errors: *0 " "$work/sb.out" || { cat "$work/sb.out"; exit 1; }
  per_event=$(cat "$work"/cg.out* | awk -v n="$EVENTS" '/^totals:/ {s += $2} END {printf "%d", s / n}')
}

ia=() ib=()
for r in 1 2; do
  instructions "$A" "$@"; ia+=("$per_event")
  instructions "$B" "$@"; ib+=("$per_event")
  echo "round $r: A ${ia[-1]}  B ${ib[-1]} instructions per event"
done
echo "B/A $(python3 -c "print(f'{(${ib[0]}+${ib[1]})/(${ia[0]}+${ia[1]}):.3f}')")"
