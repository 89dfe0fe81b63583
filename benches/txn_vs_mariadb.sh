#!/usr/bin/env bash
# Bank transfers (issue 4), in one run on this machine: `shoal bench txn` (2 node groups x 2
# replicas, multi-partition and single-partition) side by side with MariaDB running the same
# transfer through sysbench (benches/transfer.lua; InnoDB, REPEATABLE READ,
# innodb_flush_log_at_trx_commit=1), at 1/16/64 clients. Prints a markdown table.
#
#   benches/txn_vs_mariadb.sh [seconds per run, default 10] [accounts, default 10000]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ACCOUNTS=${2:-10000}

source benches/lib.sh
need_packages sysbench:sysbench mariadbd:mariadb-server
cargo build --release -q
SHOAL=target/release/shoal

bench_workdir

start_shoal "$SHOAL" "$work/shoal" --node-groups 2
shoal_run() { # clients extra -> "tps p99"
  $SHOAL bench txn --dir "$work/shoal" --threads "$1" --accounts "$ACCOUNTS" --duration "$SECS" --json $2 |
    python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(round(d["tps"]), d["p99_ms"], d["total_ok"])'
}
declare -A multi single
for c in 1 16 64; do
  multi[$c]=$(shoal_run "$c" "")
  single[$c]=$(shoal_run "$c" "--single-partition")
done
kill -TERM "$up_pid"; wait "$up_pid" 2>/dev/null || true; up_pid=""

mport=$(free_port)
start_mariadb "$work/mdb" "$mport" --innodb-flush-log-at-trx-commit=1 --innodb-buffer-pool-size=512M \
  --max-connections=500 --transaction-isolation=REPEATABLE-READ
sb=(benches/transfer.lua --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$mport" --mysql-user=sb --mysql-db=sbtest --accounts="$ACCOUNTS")
sysbench "${sb[@]}" prepare >/dev/null
mdb_run() { # clients extra -> "tps p99"
  local out
  out=$(sysbench "${sb[@]}" $2 --threads="$1" --time="$SECS" --percentile=99 run)
  echo "$(echo "$out" | awk '/transactions:/ {gsub(/\(/,"",$3); print int($3)}') $(echo "$out" | awk '/99th percentile:/ {print $3}')"
}
declare -A mmulti msingle
for c in 1 16 64; do
  mmulti[$c]=$(mdb_run "$c" "")
  msingle[$c]=$(mdb_run "$c" "--single-partition=on")
done

echo "| clients | Shoal multi-partition tps (p99 ms) | MariaDB tps (p99 ms) | ratio | Shoal single-partition tps (p99 ms) | MariaDB adjacent ids tps (p99 ms) | ratio |"
echo "|---|---|---|---|---|---|---|"
for c in 1 16 64; do
  read -r sm smp sok <<<"${multi[$c]}"
  read -r ss ssp sok2 <<<"${single[$c]}"
  read -r mm mmp <<<"${mmulti[$c]}"
  read -r ms msp <<<"${msingle[$c]}"
  r1=$(python3 -c "print(f'{$sm/max($mm,1):.2f}')")
  r2=$(python3 -c "print(f'{$ss/max($ms,1):.2f}')")
  echo "| $c | $sm ($smp) | $mm ($mmp) | $r1 | $ss ($ssp) | $ms ($msp) | $r2 |"
  [ "$sok$sok2" = "TrueTrue" ] || echo "(shoal: total of balances changed!)"
done
