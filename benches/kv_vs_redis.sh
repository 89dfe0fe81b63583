#!/usr/bin/env bash
# Shoal `bench kv` (2 replicas, synchronous replication) side by side with Redis
# (`redis-benchmark`, one server, no persistence) on this machine, in one run.
# Prints a markdown table of ops/s, p99 and the Shoal/Redis ratio.
# Both load generators reach their server over loopback TCP (`bench kv --tcp`): the data nodes
# talk to each other over their local sockets, as nodes of one host do, but the application's
# hop costs what redis-benchmark's does (ARCHITECTURE.md, "Local sockets").
# Reads go as `bench kv` makes them by default: to one replica per call, which answers as the
# primary would (`ClientOptions::read_any_replica`); one row set reads every key at its
# primary instead (`--primary-reads`), one with read-backup (a backup may show a write early).
#
# With ROUNDS > 1 every cell runs that many times, Shoal and Redis in turns, and the table gives
# the medians with the range of the rounds' ratios: on a noisy host one run moves by a quarter
# or more, enough to turn a ratio's verdict.
#
# With --machine-polls the whole run, Redis's included, holds the CPU latency request that
# Shoal's nodes hold only while they are busy (`machine_polls` in lib.sh).
#
#   benches/kv_vs_redis.sh [--machine-polls] [seconds per shoal run, default 10] [ROUNDS, default 1]
set -euo pipefail
cd "$(dirname "$0")/.."
POLLS=""
[ "${1:-}" = --machine-polls ] && { POLLS=1; shift; }
SECS=${1:-10}
ROUNDS=${2:-1}
KEYS=10000
VALUE=64

source benches/lib.sh
need_packages redis-server:redis-server redis-benchmark:redis-tools
cargo build --release -q
SHOAL=target/release/shoal

work=$(mktemp -d)
redis_pid=""
cleanup() {
  [ -n "${poll_pid:-}" ] && kill "$poll_pid" 2>/dev/null || true
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
  [ -n "${up_pid:-}" ] && kill -TERM "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
[ -n "$POLLS" ] && machine_polls

# --- Redis ---
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis_run() { # clients pipeline test -> "rps p99"
  # Requests: 20,000 per client (50,000 to 400,000), times the pipeline depth, so that a
  # pipelined run lasts seconds too: at 1 client and -P 16, 50,000 requests took 0.06-0.25 s,
  # and such bursts ran 240,000-820,000 GETs/s against a steady 195,000-200,000.
  local n=$(( $1 * 20000 )); [ "$n" -gt 400000 ] && n=400000; [ "$n" -lt 50000 ] && n=50000
  n=$(( n * $2 )); [ "$n" -gt 2000000 ] && n=2000000
  redis-benchmark -p "$rport" -c "$1" -P "$2" -t "$3" -n "$n" -r "$KEYS" -d "$VALUE" --csv 2>/dev/null |
    awk -F',' 'NR==2 {gsub(/"/,"",$2); gsub(/"/,"",$7); print $2, $7}'
}

# --- Shoal: 1 node group x 2 replicas ---
start_shoal "$SHOAL" "$work/shoal"
shoal_run() { # threads batch write_ratio [bench option] -> "ops/s p99_ms"
  $SHOAL bench kv --dir "$work/shoal" --tcp --threads "$1" --batch "$2" --write-ratio "$3" ${4:-} \
    --keys "$KEYS" --value-size "$VALUE" --duration "$SECS" --json |
    python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(round(d["ops_per_s"]), d["p99_ms"], d["errors"])'
}

# Warm-up, both sides: every key written once, so GETs find values on both, and a fresh cluster's
# first seconds (its processes' first page faults and allocations: a 1-client GET ran ~40%
# slower over the first 4 s) are not measured.
$SHOAL bench kv --dir "$work/shoal" --threads 16 --batch 1 --write-ratio 1 --tcp \
  --keys "$KEYS" --value-size "$VALUE" --duration 4 >/dev/null
redis-benchmark -p "$rport" -c 16 -t set -n 200000 -r "$KEYS" -d "$VALUE" -q >/dev/null 2>&1

spread=("" "")
[ "$ROUNDS" -gt 1 ] && spread=(" rounds' ratios |" "---|")
echo "| workload | clients | Shoal ops/s | Shoal p99 ms | Redis ops/s | Redis p99 ms | Shoal / Redis |${spread[0]}"
echo "|---|---|---|---|---|---|---|${spread[1]}"
row() { # label clients shoal_args redis_args: one table row, medians over the rounds
  local runs="" errors=0 s_ops s_p99 s_err r_ops r_p99
  for _ in $(seq "$ROUNDS"); do
    read -r s_ops s_p99 s_err < <(shoal_run $3)
    peer_unpolled
    read -r r_ops r_p99 < <(redis_run $4)
    runs+="$s_ops $s_p99 $r_ops $r_p99;"
    errors=$(( errors + s_err ))
  done
  python3 - "$1" "$2" "$runs" <<'PY'
import statistics, sys
label, clients, runs = sys.argv[1:4]
runs = [[float(x) for x in r.split()] for r in runs.split(";") if r.strip()]
med = [statistics.median(r[i] for r in runs) for i in range(4)]
row = f"| {label} | {clients} | {med[0]:.0f} | {med[1]:g} | {med[2]:.0f} | {med[3]:g} | {med[0] / med[2]:.2f} |"
if len(runs) > 1:
    each = sorted(r[0] / r[2] for r in runs)
    row += f" {each[0]:.2f}-{each[-1]:.2f} |"
print(row)
PY
  [ "$errors" = "0" ] || echo "(shoal reported $errors errors)"
}
for c in 1 16 64; do
  row "read 1 key (GET)" "$c" "$c 1 0" "$c 1 get"
  row "write 1 key (SET)" "$c" "$c 1 1" "$c 1 set"
done
for c in 1 16 64; do
  row "read 16 keys per call (GET -P 16)" "$c" "$c 16 0" "$c 16 get"
done
# Every key read at its primary: a call's keys go to both data nodes.
for c in 1 16 64; do
  row "read 16 keys per call, primary reads (GET -P 16)" "$c" "$c 16 0 --primary-reads" "$c 16 get"
done
# Reads from any replica (as NDB 8.0.19+ and RonDB tables do by default, READ_BACKUP=1): a
# call's keys go to one replica, one request instead of one per primary.
for c in 1 16 64; do
  row "read 16 keys per call, read-backup (GET -P 16)" "$c" "$c 16 0 --read-backup" "$c 16 get"
done
echo
echo "Shoal: 1 node group x 2 replicas, every write on both replicas before the ack; keys $KEYS, values $VALUE B."
echo "Redis: one server, no persistence, no replica. Machine: $(nproc) cores, all processes on it."
if [ -n "$POLLS" ]; then echo "Idle CPUs polled for the whole run, Redis's included (--machine-polls)."; fi
