#!/usr/bin/env bash
# Durability benchmarks (issue 3), in one run on this machine:
#  1. write throughput: `shoal bench kv --write-ratio 1` with durability memory and sync
#     (1 node group x 2 replicas), side by side with MariaDB `sysbench oltp_insert`
#     (innodb_flush_log_at_trx_commit=1 and =2), at 1/16/64 clients;
#  2. system restart time with ROWS rows (kill -9 of every process, then `shoal up`);
#  3. catch-up time of a node that missed UPDATES updates.
# Prints markdown tables.
#
#   benches/durability.sh [seconds per run, default 10] [rows, default 1000000]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROWS=${2:-1000000}
VALUE=64

source benches/lib.sh
need_packages sysbench:sysbench mariadbd:mariadb-server
cargo build --release -q
SHOAL=target/release/shoal

work=$(mktemp -d)
mdb_pid=""
up_pid=""
cleanup() {
  [ -n "$mdb_pid" ] && kill "$mdb_pid" 2>/dev/null && wait "$mdb_pid" 2>/dev/null || true
  stop_shoal
  rm -rf "$work"
}
stop_shoal() {
  if [ -n "$up_pid" ]; then kill -TERM "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true; fi
  up_pid=""
  for f in "$work"/shoal/run/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
}
trap cleanup EXIT
now_ms() { date +%s%3N; }

base=$(( 20000 + RANDOM % 12000 ))  # below the ephemeral ports (lib.sh, start_shoal)
start_ms=0
start_shoal() { # waits for ready; sets start_ms (not in a subshell: up_pid must stick)
  local t0; t0=$(now_ms)
  $SHOAL up --dir "$work/shoal" --base-port "$base" >"$work/up.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 3000); do grep -q '^ready' "$work/up.log" && break; sleep 0.1; done
  grep -q '^ready' "$work/up.log" || { cat "$work/up.log"; exit 1; }
  start_ms=$(( $(now_ms) - t0 ))
}
kv() { # extra args... -> "ops/s p99_ms errors writes"
  $SHOAL bench kv --dir "$work/shoal" --value-size "$VALUE" --json "$@" |
    python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(round(d["ops_per_s"]), d["p99_ms"], d["errors"], d["ops"])'
}

# ---------- 1. write throughput ----------
start_shoal
declare -A shoal_mem shoal_sync
for c in 1 16 64; do
  read -r ops p99 err _ < <(kv --threads "$c" --write-ratio 1 --keys 100000 --duration "$SECS" --durability memory)
  shoal_mem[$c]="$ops $p99 $err"
  read -r ops p99 err _ < <(kv --threads "$c" --write-ratio 1 --keys 100000 --duration "$SECS" --durability sync)
  shoal_sync[$c]="$ops $p99 $err"
done
stop_shoal

mport=$(free_port)
mariadb_run() { # flush_setting -> fills mdb[$c]
  local flush=$1
  start_mariadb "$work/mdb" "$mport" --innodb-flush-log-at-trx-commit="$flush" --innodb-buffer-pool-size=512M \
    --max-connections=500
  local sb=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$mport" --mysql-user=sb --mysql-db=sbtest --tables=1)
  for c in 1 16 64; do
    sysbench oltp_insert "${sb[@]}" --table-size=0 prepare >/dev/null
    local out
    out=$(sysbench oltp_insert "${sb[@]}" --threads="$c" --time="$SECS" --percentile=99 run)
    sysbench oltp_insert "${sb[@]}" cleanup >/dev/null
    local tps p99
    tps=$(echo "$out" | awk '/transactions:/ {gsub(/\(/,"",$3); print $3}')
    p99=$(echo "$out" | awk '/99th percentile:/ {print $3}')
    mdb[$c]="${tps%.*} $p99"
  done
  kill "$mdb_pid"; wait "$mdb_pid" 2>/dev/null || true; mdb_pid=""
}
declare -A mdb
mariadb_run 1; declare -A mdb1; for c in 1 16 64; do mdb1[$c]=${mdb[$c]}; done
mariadb_run 2; declare -A mdb2; for c in 1 16 64; do mdb2[$c]=${mdb[$c]}; done

echo "### Single-row writes per second (p99 ms), 1 node group x 2 replicas vs MariaDB oltp_insert"
echo
echo "| clients | Shoal memory | Shoal sync | MariaDB flush=1 | MariaDB flush=2 | sync / flush=1 | memory / flush=2 |"
echo "|---|---|---|---|---|---|---|"
for c in 1 16 64; do
  read -r m mp me <<<"${shoal_mem[$c]}"
  read -r s sp se <<<"${shoal_sync[$c]}"
  read -r f1 f1p <<<"${mdb1[$c]}"
  read -r f2 f2p <<<"${mdb2[$c]}"
  r1=$(python3 -c "print(f'{$s/max($f1,1):.2f}')")
  r2=$(python3 -c "print(f'{$m/max($f2,1):.2f}')")
  echo "| $c | $m ($mp) | $s ($sp) | $f1 ($f1p) | $f2 ($f2p) | $r1 | $r2 |"
  [ "$me$se" = "00" ] || echo "(shoal errors: memory $me, sync $se)"
done
echo

# ---------- 2. system restart with ROWS rows ----------
rm -rf "$work/shoal"
start_shoal
kv --threads 16 --write-ratio 0 --keys "$ROWS" --duration 1 >/dev/null
# Everything loaded is in a complete global checkpoint after two intervals.
sleep 2
du_mb=$(du -sm "$work/shoal/datanode-11" | cut -f1)
for f in "$work"/shoal/run/*.pid; do kill -9 "$(cat "$f")" 2>/dev/null || true; done
kill -9 "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; up_pid=""
start_shoal
restart_ms=$start_ms
restored=$(grep -h "restored own files" "$work"/shoal/logs/datanode-11.log | tail -1 | sed -E 's/.*rows=([0-9]+).*ms=([0-9]+).*/\1 rows in \2 ms/')
echo "### System restart (kill -9 of every process, then shoal up)"
echo
echo "| rows | data dir per node | shoal up until ready | node 11 restore |"
echo "|---|---|---|---|"
echo "| $ROWS | ${du_mb} MB | ${restart_ms} ms | $restored |"
echo

# ---------- 3. catch-up of a node that missed updates ----------
$SHOAL node kill 12 --dir "$work/shoal" >/dev/null
t0=$(now_ms)
read -r _ _ _ updates < <(kv --threads 64 --batch 16 --write-ratio 1 --keys "$ROWS" --duration "$SECS")
$SHOAL node start 12 --dir "$work/shoal" >/dev/null
t1=$(now_ms)
for _ in $(seq 6000); do
  $SHOAL status --dir "$work/shoal" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if [n for n in d["nodes"] if n["id"]==12][0]["state"]=="up" else 1)' && break
  sleep 0.1
done
t2=$(now_ms)
echo "### Node restart catch-up"
echo
echo "| rows | updates missed | start until up (copy included) |"
echo "|---|---|---|"
echo "| $ROWS | $updates | $(( t2 - t1 )) ms |"
