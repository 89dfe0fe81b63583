#!/usr/bin/env bash
# sysbench against the SQL node and MariaDB 10.11 (Debian) on this machine, in one run (issue 5):
#   oltp_point_select at 1/16/64/256/1024 threads (QPS), oltp_read_write at 1/16/64 (TPS),
#   4 tables x 10,000 rows. Shoal: `shoal up` defaults (1 node group x 2 replicas, 1 SQL node,
#   release build). MariaDB: InnoDB, REPEATABLE READ, innodb_flush_log_at_trx_commit=1.
# Prints a markdown table with ratios (Shoal / MariaDB) and Shoal's 1024-thread QPS as a share
# of its own peak.
#
#   benches/sysbench_vs_mariadb.sh [seconds per run, default 10]
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

# run_all HOST PORT USER -> lines "point <threads> <qps> <p99>" and "rw <threads> <tps> <p99>"
run_all() {
  local sb=(--db-driver=mysql --mysql-host="$1" --mysql-port="$2" --mysql-user="$3" --mysql-db=sbtest
    --tables=4 --table-size=10000 --percentile=99)
  sysbench oltp_read_write "${sb[@]}" prepare >/dev/null
  local out
  for t in "${POINT_THREADS[@]}"; do
    out=$(sysbench oltp_point_select "${sb[@]}" --threads="$t" --time="$SECS" run)
    echo "point $t $(echo "$out" | awk '/queries:/ {gsub(/\(/,"",$3); print int($3)}') $(echo "$out" | awk '/99th percentile:/ {print $3}')"
  done
  for t in "${RW_THREADS[@]}"; do
    out=$(sysbench oltp_read_write "${sb[@]}" --threads="$t" --time="$SECS" run)
    echo "rw $t $(echo "$out" | awk '/transactions:/ {gsub(/\(/,"",$3); print int($3)}') $(echo "$out" | awk '/99th percentile:/ {print $3}')"
  done
}

start_shoal "$SHOAL" "$work/shoal"
sport=$(shoal_mysql_port "$work/shoal")
mariadb -h 127.0.0.1 -P "$sport" -u root --skip-ssl -e "CREATE DATABASE sbtest"
run_all 127.0.0.1 "$sport" root >"$work/shoal.txt"
kill -TERM "$up_pid"; wait "$up_pid" 2>/dev/null || true; up_pid=""

mport=$(free_port)
start_mariadb "$work/mdb" "$mport" --innodb-flush-log-at-trx-commit=1 --innodb-buffer-pool-size=1G \
  --max-connections=2000 --transaction-isolation=REPEATABLE-READ
run_all 127.0.0.1 "$mport" sb >"$work/mariadb.txt"

peak=$(awk '$1=="point" && $3>m {m=$3} END {print m+0}' "$work/shoal.txt")
echo "| workload | threads | Shoal (p99 ms) | MariaDB (p99 ms) | Shoal / MariaDB |"
echo "|---|---|---|---|---|"
while read -r kind t v p; do
  read -r _ _ mv mp < <(awk -v k="$kind" -v t="$t" '$1==k && $2==t' "$work/mariadb.txt")
  unit=$([ "$kind" = point ] && echo "QPS" || echo "TPS")
  name=$([ "$kind" = point ] && echo "oltp_point_select" || echo "oltp_read_write")
  ratio=$(python3 -c "print(f'{$v/max($mv,1):.2f}')")
  echo "| $name ($unit) | $t | $v ($p) | $mv ($mp) | $ratio |"
done <"$work/shoal.txt"
last=$(awk '$1=="point" && $2==1024 {print $3}' "$work/shoal.txt")
echo
echo "Shoal oltp_point_select at 1024 threads: $(python3 -c "print(f'{100*$last/max($peak,1):.0f}')")% of its peak ($peak QPS)."
