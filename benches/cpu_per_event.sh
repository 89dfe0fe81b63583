#!/usr/bin/env bash
# Where the CPU goes, per sysbench event (issue 5): one workload on a fresh Shoal cluster and on
# MariaDB 10.11, one after the other, each with the machine to itself. For every process its
# user and system CPU in microseconds per event (from /proc/<pid>/stat over the middle of the
# run), the machine's idle share (/proc/stat), and the system calls and context switches per
# event of the process named by --trace (perf's syscall tracepoints). Earlier sessions rebuilt
# this by hand each time; the tables in benchmarks.md ("SQL node / server", "data nodes",
# "sysbench", "idle") come from it.
#
#   benches/cpu_per_event.sh [--bin DIR] [--trace sysbench|sqlnode|server] [--only shoal|mariadb]
#                            WORKLOAD THREADS SECONDS [sysbench option ...]
#
# --bin: a directory holding shoal, shoal-mgmd, shoal-datanode, shoal-sqlnode (default
# target/release). An event is a query for oltp_point_select, a transaction otherwise; 4 tables
# x 10,000 rows. The first and last two seconds are left out of the window. Example, BEGIN and
# COMMIT alone:
#   benches/cpu_per_event.sh oltp_read_write 16 12 --point_selects=0 --simple_ranges=0 \
#     --sum_ranges=0 --order_ranges=0 --distinct_ranges=0 --index_updates=0 \
#     --non_index_updates=0 --delete_inserts=0
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release TRACE="" ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --trace) TRACE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) break ;;
  esac
done
WL=$1 THREADS=$2 SECS=$3
shift 3
[ "$SECS" -ge 6 ] || { echo "SECONDS must be at least 6" >&2; exit 1; }
source benches/lib.sh
need_packages sysbench:sysbench mariadbd:mariadb-server mariadb:mariadb-client
[ -n "$TRACE" ] && need_packages perf:linux-perf
[ "$BIN" = target/release ] && cargo build --release -q
BIN=$(realpath "$BIN")

bench_workdir
window=$((SECS - 4))

# cpu_of PID: "<user ticks> <system ticks>" of the process, its threads included.
cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }

# measure NAME:PID ... -- SYSBENCH_ARGS: runs sysbench, samples every named process (plus
# sysbench itself) over the window, and prints a table row per process.
measure() {
  local procs=() a
  while [ "$1" != -- ]; do procs+=("$1"); shift; done
  shift
  sysbench "$WL" "$@" --threads="$THREADS" --time="$SECS" --report-interval=1 run >"$work/sb.out" &
  local sbp=$!
  procs+=("sysbench:$sbp")
  sleep 2
  local before=() idle0 t0 t1 perf_pid=""
  if [ -n "$TRACE" ]; then
    local traced=""
    for a in "${procs[@]}"; do [ "${a%%:*}" = "$TRACE" ] && traced=${a#*:}; done
    [ -n "$traced" ] || { echo "no process named $TRACE here" >&2; exit 1; }
    local ev=context-switches
    for s in recvfrom sendto recvmsg sendmsg read write readv writev poll ppoll epoll_wait futex; do
      ev+=",syscalls:sys_enter_$s"
    done
    # perf counts while its command runs, which starts once perf has attached to every thread
    # (that takes a while with a thousand of them): the command says when, and the window
    # starts then. The processes are sampled when the window ends, without waiting for perf to
    # detach, while sysbench still runs. Opened read-write, the pipe does not block the open,
    # and the read gives up if perf never starts its command.
    rm -f "$work/attached"
    mkfifo "$work/attached"
    perf stat -x, -e "$ev" -p "$traced" -o "$work/perf.out" -- \
      sh -c "echo >'$work/attached'; sleep $window" &
    perf_pid=$!
    read -r -t 30 _ <>"$work/attached" || { echo "perf did not attach to $TRACE" >&2; exit 1; }
  fi
  for a in "${procs[@]}"; do before+=("$(cpu_of "${a#*:}")"); done
  idle0=$(idle_of) t0=$(date +%s.%N)
  sleep "$window"
  t1=$(date +%s.%N)
  local after=()
  for a in "${procs[@]}"; do after+=("$(cpu_of "${a#*:}")"); done
  local idle1
  idle1=$(idle_of)
  [ -z "$perf_pid" ] || wait "$perf_pid" || true
  wait "$sbp" || { cat "$work/sb.out" >&2; exit 1; }
  # Events in the window: the per-second reports of the seconds it spans (tps, or qps for
  # point selects), not the whole run's average, which the warm-up and perf's own cost skew.
  local rate events hz i
  read -r rate events < <(python3 - "$work/sb.out" "$WL" 3 $((SECS - 2)) "$t0" "$t1" <<'EOF'
import re, sys
path, wl, first, last, t0, t1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
rates = []
for line in open(path):
    m = re.match(r"\[ (\d+)s \].* tps: ([\d.]+) qps: ([\d.]+)", line)
    if m and first <= int(m[1]) <= last:
        rates.append(float(m[3] if wl == "oltp_point_select" else m[2]))
if not rates:
    sys.exit("no per-second reports from sysbench")
rate = sum(rates) / len(rates)
print(int(rate), rate * (t1 - t0))
EOF
  )
  hz=$(getconf CLK_TCK)
  for i in "${!procs[@]}"; do
    read -r u0 s0 <<<"${before[$i]}"
    read -r u1 s1 <<<"${after[$i]}"
    python3 -c "
u, s = ($u1 - $u0) / $hz * 1e6 / $events, ($s1 - $s0) / $hz * 1e6 / $events
print(f'| $label | ${procs[$i]%%:*} | {int($rate)} | {u:.1f} | {s:.1f} | {u + s:.1f} |')"
  done
  read -r i0 a0 <<<"$idle0"
  read -r i1 a1 <<<"$idle1"
  python3 -c "print(f'| $label | (machine idle) | | | | {100 * ($i1 - $i0) / max($a1 - $a0, 1):.0f}% |')"
  if [ -n "$TRACE" ]; then
    awk -F, -v n="$events" -v l="$label" -v t="$TRACE" '$1 ~ /^[0-9]+$/ && $1 > 0 {
      e = $3; sub(/^syscalls:sys_enter_/, "", e); printf "| %s | %s: %s | | | | %.2f |\n", l, t, e, $1 / n }' "$work/perf.out"
  fi
}

echo "$WL, $THREADS threads, ${window} s window; CPU in µs per event"
echo
echo "| server | process | rate | user | system | total |"
echo "|---|---|---|---|---|---|"
if [ "$ONLY" != mariadb ]; then
  start_shoal "$BIN/shoal" "$work/c"
  shoal_sysbench_tables "$work/c"
  nodes=()
  for f in "$work"/c/run/*.pid; do
    id=$(basename "$f" .pid)
    case $id in 1 | 2 | 3) name=mgmd-$id ;; 5*) name=sqlnode ;; *) name=datanode-$id ;; esac
    [ "$id" -ge 50 ] && [ "$id" != 51 ] && name=sqlnode-$id
    nodes+=("$name:$(cat "$f")")
  done
  label=Shoal
  [ "$TRACE" = server ] && TRACE=sqlnode
  measure "${nodes[@]}" -- "${sb[@]}" "$@"
  kill -TERM "$up_pid"; wait "$up_pid" 2>/dev/null || true; up_pid=""
fi
if [ "$ONLY" != shoal ]; then
  mport=$(free_port)
  start_mariadb "$work/mdb" "$mport" --innodb-flush-log-at-trx-commit=1 --innodb-buffer-pool-size=1G \
    --max-connections=2000 --transaction-isolation=REPEATABLE-READ
  sb=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$mport" --mysql-user=sb --mysql-db=sbtest
    --tables=4 --table-size=10000)
  sysbench oltp_read_write "${sb[@]}" prepare >/dev/null
  label=MariaDB
  [ "$TRACE" = sqlnode ] && TRACE=server
  measure "server:$mdb_pid" -- "${sb[@]}" "$@"
fi
