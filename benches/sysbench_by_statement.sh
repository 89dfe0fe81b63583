#!/usr/bin/env bash
# Where oltp_read_write loses to MariaDB, one statement kind at a time (issue 5): sysbench's
# switches keep one kind per transaction (BEGIN, N statements, COMMIT) and zero the rest, on
# Shoal and on MariaDB 10.11 in one run, 16 threads. Prints TPS and the ratio per kind:
#   empty     BEGIN + COMMIT only
#   points10  10 point SELECTs          simple4   4 `id BETWEEN` SELECTs (100 rows)
#   sum4      4 SUM(k) over a range     order4    4 ranges ORDER BY c
#   distinct4 4 DISTINCT ranges         idxupd4   4 UPDATE of the indexed column k
#   nonidx4   4 UPDATE of c             delins2   2 DELETE + INSERT pairs
#   full      the default mix
#
#   benches/sysbench_by_statement.sh [seconds per run, default 8] [kind ...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-8}
shift $(( $# > 0 ? 1 : 0 ))
KINDS=("$@")
[ ${#KINDS[@]} -gt 0 ] || KINDS=(empty points10 simple4 sum4 order4 distinct4 idxupd4 nonidx4 delins2 full)

source benches/lib.sh
need_packages sysbench:sysbench mariadbd:mariadb-server mariadb:mariadb-client
cargo build --release -q

bench_workdir

start_shoal target/release/shoal "$work/shoal"
sport=$(shoal_mysql_port "$work/shoal")
mariadb -h 127.0.0.1 -P "$sport" -u root --skip-ssl -e "CREATE DATABASE sbtest"
mport=$(free_port)
start_mariadb "$work/mdb" "$mport" --innodb-flush-log-at-trx-commit=1 --innodb-buffer-pool-size=1G \
  --transaction-isolation=REPEATABLE-READ
S=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$sport" --mysql-user=root --mysql-db=sbtest
  --tables=4 --table-size=10000)
M=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$mport" --mysql-user=sb --mysql-db=sbtest
  --tables=4 --table-size=10000)
sysbench oltp_read_write "${S[@]}" prepare >/dev/null
sysbench oltp_read_write "${M[@]}" prepare >/dev/null

none=(--point_selects=0 --simple_ranges=0 --sum_ranges=0 --order_ranges=0 --distinct_ranges=0
  --index_updates=0 --non_index_updates=0 --delete_inserts=0)
opts() {
  case $1 in
    empty) echo "${none[@]}" ;;
    points10) echo "${none[@]} --point_selects=10" ;;
    simple4) echo "${none[@]} --simple_ranges=4" ;;
    sum4) echo "${none[@]} --sum_ranges=4" ;;
    order4) echo "${none[@]} --order_ranges=4" ;;
    distinct4) echo "${none[@]} --distinct_ranges=4" ;;
    idxupd4) echo "${none[@]} --index_updates=4" ;;
    nonidx4) echo "${none[@]} --non_index_updates=4" ;;
    delins2) echo "${none[@]} --delete_inserts=2" ;;
    full) echo "" ;;
    *) echo "unknown kind $1" >&2; exit 1 ;;
  esac
}
tps() { awk '$1 == "transactions:" {gsub(/\(/, "", $3); print int($3)}'; }

echo "| kind | Shoal TPS | MariaDB TPS | Shoal / MariaDB |"
echo "|---|---|---|---|"
for k in "${KINDS[@]}"; do
  read -r -a o <<<"$(opts "$k")"
  s=$(sysbench oltp_read_write "${S[@]}" "${o[@]}" --threads=16 --time="$SECS" run | tps)
  m=$(sysbench oltp_read_write "${M[@]}" "${o[@]}" --threads=16 --time="$SECS" run | tps)
  echo "| $k | $s | $m | $(python3 -c "print(f'{$s/max($m,1):.2f}')") |"
done
