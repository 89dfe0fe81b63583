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
# With ROUNDS > 1 the whole series runs that many times on the same two servers and the table
# gives each point's median, with the range of the rounds' ratios: on a noisy host one run's
# rate moves by a quarter or more, and "its own peak" taken as the best of five single runs is
# biased upwards (the best of five noisy draws), which a median per thread count is not.
# With --socket sysbench reaches both servers through their Unix sockets instead of loopback
# TCP (MySQL clients' default for `localhost`); as root on both, since a socket client logs in
# from localhost.
# With --machine-polls the whole run, MariaDB's included, holds the CPU latency request that
# Shoal's nodes hold only while they are busy (`machine_polls` in lib.sh): the control that
# shows how much of Shoal's lead that request alone is worth.
#
#   benches/sysbench_vs_mariadb.sh [--socket] [--machine-polls] [seconds measured per run, default 10] [ROUNDS, default 1]
set -euo pipefail
cd "$(dirname "$0")/.."
SOCKET="" POLLS=""
[ "${1:-}" = --socket ] && { SOCKET=1; shift; }
[ "${1:-}" = --machine-polls ] && { POLLS=1; shift; }
SECS=${1:-10}
ROUNDS=${2:-1}
POINT_THREADS=(1 16 64 256 1024)
RW_THREADS=(1 16 64)

source benches/lib.sh
need_packages sysbench:sysbench mariadbd:mariadb-server mariadb:mariadb-client
cargo build --release -q
SHOAL=target/release/shoal

bench_workdir
[ -n "$POLLS" ] && machine_polls
# 1024 client threads need as many file descriptors on both sides.
ulimit -n 65536 2>/dev/null || true

# Warm-up seconds before the measured ones, by thread count.
warmup() {
  case $1 in 1) echo 2 ;; 16) echo 3 ;; 64) echo 5 ;; 256) echo 10 ;; *) echo 25 ;; esac
}

# one KIND THREADS NAME CONNECTION_OPTION... appends "<point|rw> <threads> <steady rate> <p99 ms>
# <whole-run rate> <steal %>" to $work/NAME.txt.
one() {
  local kind=$1 t=$2 name=$3 sb r before
  shift 3
  before=$(cpu_jiffies)
  [ "$name" = mariadb ] && peer_unpolled
  sb=(--db-driver=mysql "$@" --mysql-db=sbtest --tables=4 --table-size=10000 --threads="$t")
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
if [ -n "$SOCKET" ]; then
  S=(shoal --mysql-socket="$(shoal_mysql_socket "$work/shoal")" --mysql-user=root)
  M=(mariadb --mysql-socket="$work/mdb.sock" --mysql-user=root)
else
  S=(shoal --mysql-host=127.0.0.1 --mysql-port="$sport" --mysql-user=root)
  M=(mariadb --mysql-host=127.0.0.1 --mysql-port="$mport" --mysql-user=sb)
fi
for srv in S M; do
  declare -n server=$srv
  sysbench oltp_read_write --db-driver=mysql "${server[@]:1}" --mysql-db=sbtest --tables=4 --table-size=10000 \
    prepare >/dev/null
  unset -n server
done
for _ in $(seq "$ROUNDS"); do
  for t in "${POINT_THREADS[@]}"; do one point "$t" "${S[@]}"; one point "$t" "${M[@]}"; done
  for t in "${RW_THREADS[@]}"; do one rw "$t" "${S[@]}"; one rw "$t" "${M[@]}"; done
done

# The table: per point, the medians over the rounds (a single round: its numbers).
python3 - "$work/shoal.txt" "$work/mariadb.txt" "$SOCKET" "$POLLS" <<'PY'
import statistics, sys
def load(path):
    points = {}
    for line in open(path):
        kind, t, rate, p99, whole, steal = line.split()
        points.setdefault((kind, int(t)), []).append((float(rate), float(p99), float(whole), float(steal)))
    return points
shoal, maria = load(sys.argv[1]), load(sys.argv[2])
rounds = len(next(iter(shoal.values())))
med = lambda runs, i: statistics.median(r[i] for r in runs)
print("Transport: " + ("Unix sockets" if sys.argv[3] else "loopback TCP") + "."
      + (" Idle CPUs polled for the whole run, MariaDB's included (--machine-polls)." if sys.argv[4] else "") + "\n")
print("| workload | threads | Shoal (p99 ms) | MariaDB (p99 ms) | Shoal / MariaDB |"
      + (" rounds' ratios |" if rounds > 1 else "") + " whole run: Shoal / MariaDB | steal %: Shoal / MariaDB |")
print("|---|---|---|---|---|" + ("---|" if rounds > 1 else "") + "---|---|")
for (kind, t), s in shoal.items():
    m = maria[(kind, t)]
    name, unit = ("oltp_point_select", "QPS") if kind == "point" else ("oltp_read_write", "TPS")
    ratio = med(s, 0) / max(med(m, 0), 1)
    spread = ""
    if rounds > 1:
        each = sorted(a[0] / max(b[0], 1) for a, b in zip(s, m))
        spread = f" {each[0]:.2f}-{each[-1]:.2f} |"
    print(f"| {name} ({unit}) | {t} | {med(s, 0):.0f} ({med(s, 1):g}) | {med(m, 0):.0f} ({med(m, 1):g}) | {ratio:.2f} |"
          f"{spread} {med(s, 2):.0f} / {med(m, 2):.0f} | {med(s, 3):.0f} / {med(m, 3):.0f} |")
print()
for label, points in (("Shoal", shoal), ("MariaDB", maria)):
    for col, what in ((0, "steady"), (2, "whole run")):
        rates = {t: med(runs, col) for (kind, t), runs in points.items() if kind == "point"}
        peak_t = max(rates, key=rates.get)
        print(f"{label} oltp_point_select at 1024 threads, {what}: {100 * rates[1024] / rates[peak_t]:.0f}% of its peak"
              f" ({rates[peak_t]:.0f} QPS at {peak_t} threads)" + (", medians of the rounds." if rounds > 1 else "."))
PY
