#!/usr/bin/env bash
# sysbench against the SQL node and MariaDB 10.11 (Debian) on this machine, in one run (issue 5):
#   oltp_point_select at 1/16/64/256/1024 threads (QPS), oltp_read_write at 1/16/64 (TPS),
#   4 tables x 10,000 rows. Shoal: `shoal up` defaults (1 node group x 2 replicas, 1 SQL node,
#   release build). MariaDB: InnoDB, REPEATABLE READ, innodb_flush_log_at_trx_commit=1.
# Each run measures the steady state: the mean of sysbench's per-second rates after a warm-up
# that grows with the thread count (sysbench_steady in lib.sh: every sysbench thread warms its
# own LuaJIT state, which takes 15-25 s at 1024 threads); the whole run's rate is printed too.
# Prints a markdown table with ratios (Shoal / MariaDB), the share of CPU the hypervisor stole
# during each run, and Shoal's 1024-thread QPS as a share of its own peak.
#
#   benches/sysbench_vs_mariadb.sh [seconds measured per run, default 10]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
POINT_THREADS=(1 16 64 256 1024)
RW_THREADS=(1 16 64)

source benches/lib.sh
need_packages sysbench:sysbench mariadbd:mariadb-server mariadb:mariadb-client
cargo build --release -q
SHOAL=target/release/shoal

bench_workdir
# 1024 client threads need as many file descriptors on both sides.
ulimit -n 65536 2>/dev/null || true

# Warm-up seconds before the measured ones, by thread count.
warmup() {
  case $1 in 1) echo 2 ;; 16) echo 3 ;; 64) echo 5 ;; 256) echo 10 ;; *) echo 25 ;; esac
}

# one KIND THREADS NAME HOST PORT USER appends "<point|rw> <threads> <steady rate> <p99 ms>
# <whole-run rate> <steal %>" to $work/NAME.txt.
one() {
  local kind=$1 t=$2 name=$3 sb r before
  before=$(cpu_jiffies)
  sb=(--db-driver=mysql --mysql-host="$4" --mysql-port="$5" --mysql-user="$6" --mysql-db=sbtest
    --tables=4 --table-size=10000 --threads="$t")
  if [ "$kind" = point ]; then
    r=$(sysbench_steady "$(warmup "$t")" "$SECS" oltp_point_select "${sb[@]}")
  else
    r=$(sysbench_steady "$(( $(warmup "$t") * 2 ))" "$SECS" oltp_read_write "${sb[@]}")
  fi
  echo "$kind $t $r $(steal_since "$before")" >>"$work/$name.txt"
}

# Both servers run side by side, and each point is measured on Shoal and then at once on
# MariaDB: the machine's drift over the run moves both alike (measured one server after the
# other, a ratio moved by a third between runs). The idle server costs the other little: an
# idle cluster takes ~2% of a 2-core machine (heartbeats, global checkpoints, Raft timers).
start_shoal "$SHOAL" "$work/shoal"
sport=$(shoal_mysql_port "$work/shoal")
mariadb -h 127.0.0.1 -P "$sport" -u root --skip-ssl -e "CREATE DATABASE sbtest"
mport=$(free_port)
start_mariadb "$work/mdb" "$mport" --innodb-flush-log-at-trx-commit=1 --innodb-buffer-pool-size=1G \
  --max-connections=2000 --transaction-isolation=REPEATABLE-READ
S=(shoal 127.0.0.1 "$sport" root)
M=(mariadb 127.0.0.1 "$mport" sb)
for srv in S M; do
  declare -n server=$srv
  sysbench oltp_read_write --db-driver=mysql --mysql-host="${server[1]}" --mysql-port="${server[2]}" \
    --mysql-user="${server[3]}" --mysql-db=sbtest --tables=4 --table-size=10000 prepare >/dev/null
  unset -n server
done
for t in "${POINT_THREADS[@]}"; do one point "$t" "${S[@]}"; one point "$t" "${M[@]}"; done
for t in "${RW_THREADS[@]}"; do one rw "$t" "${S[@]}"; one rw "$t" "${M[@]}"; done

share_of_peak() { # COLUMN FILE: point selects at 1024 threads as a share of the best thread count
  awk -v c="$1" '$1=="point" {if ($c>m) m=$c; if ($2==1024) l=$c} END {printf "%.0f%% of its peak (%d QPS)", 100*l/(m?m:1), m}' "$2"
}
echo "| workload | threads | Shoal (p99 ms) | MariaDB (p99 ms) | Shoal / MariaDB | whole run: Shoal / MariaDB | steal %: Shoal / MariaDB |"
echo "|---|---|---|---|---|---|---|"
while read -r kind t v p w s; do
  read -r _ _ mv mp mw ms < <(awk -v k="$kind" -v t="$t" '$1==k && $2==t' "$work/mariadb.txt")
  unit=$([ "$kind" = point ] && echo "QPS" || echo "TPS")
  name=$([ "$kind" = point ] && echo "oltp_point_select" || echo "oltp_read_write")
  ratio=$(python3 -c "print(f'{$v/max($mv,1):.2f}')")
  echo "| $name ($unit) | $t | $v ($p) | $mv ($mp) | $ratio | $w / $mw | $s / $ms |"
done <"$work/shoal.txt"
echo
echo "Shoal oltp_point_select at 1024 threads, steady: $(share_of_peak 3 "$work/shoal.txt"); whole run: $(share_of_peak 5 "$work/shoal.txt")."
echo "MariaDB oltp_point_select at 1024 threads, steady: $(share_of_peak 3 "$work/mariadb.txt"); whole run: $(share_of_peak 5 "$work/mariadb.txt")."
