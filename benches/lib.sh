# Shared by the benchmark scripts: sourced from the repository root, after `set -euo pipefail`.

# need_packages CMD:PACKAGE ... installs from Debian the packages whose command is missing.
need_packages() {
  local need=() cp
  for cp in "$@"; do
    command -v "${cp%%:*}" >/dev/null || need+=("${cp#*:}")
  done
  if [ ${#need[@]} -gt 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >/dev/null
  fi
}

# bench_workdir makes the temporary directory $work and arranges that on exit (also on failure)
# the cluster (up_pid, from start_shoal) and MariaDB (mdb_pid, from start_mariadb) stop and the
# directory goes.
bench_workdir() {
  work=$(mktemp -d)
  up_pid=""
  mdb_pid=""
  trap bench_cleanup EXIT
}
bench_cleanup() {
  [ -n "${poll_pid:-}" ] && kill "$poll_pid" 2>/dev/null || true
  [ -n "$mdb_pid" ] && kill "$mdb_pid" 2>/dev/null && wait "$mdb_pid" 2>/dev/null || true
  [ -n "$up_pid" ] && kill -TERM "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true
  rm -rf "$work"
}

# machine_polls holds a CPU latency request of 0 µs (/dev/cpu_dma_latency) until the script
# ends (bench_cleanup, or the caller's own trap killing $poll_pid): every process on the machine
# then runs with idle CPUs that poll instead of halting, the peer included. The control for
# Shoal's `poll_idle_cpus` (ARCHITECTURE.md, "Worker threads"), which holds the same request only
# while a Shoal node is busy. Needs root.
machine_polls() {
  python3 -c 'import os, signal, struct
fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
os.write(fd, struct.pack("i", 0))
signal.pause()' &
  poll_pid=$!
  sleep 0.2
  kill -0 "$poll_pid" 2>/dev/null || { echo "cannot hold a CPU latency request (/dev/cpu_dma_latency)" >&2; exit 1; }
}

# peer_unpolled waits (at most 3 s) until no process holds a CPU latency request, so that a peer's
# run does not start on idle CPUs that a Shoal node, busy a moment ago, still keeps polling
# (it lets go after a quiet second): without it, Redis's 1-client runs ran 5 times as fast
# straight after Shoal's. A no-op under machine_polls. Where the device cannot be read (not
# root) it waits the 3 s.
peer_unpolled() {
  [ -n "${poll_pid:-}" ] && return 0
  python3 -c 'import struct, time
for _ in range(30):
    try:
        with open("/dev/cpu_dma_latency", "rb") as f:
            if struct.unpack("i", f.read(4))[0] > 0:
                break
    except OSError:
        pass
    time.sleep(0.1)'
}

# A TCP port nothing listens on now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_mariadb DIR PORT [mariadbd option ...] starts a fresh MariaDB with its data in DIR
# (socket DIR.sock, log DIR.log) on 127.0.0.1:PORT, with database sbtest and user sb (no
# password), and sets mdb_pid.
start_mariadb() {
  local dir=$1 port=$2
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir"
  mariadb-install-db --no-defaults --datadir="$dir" --user=root --auth-root-authentication-method=normal >/dev/null 2>&1
  mariadbd --no-defaults --datadir="$dir" --port="$port" --bind-address=127.0.0.1 --socket="$dir.sock" \
    --user=root "$@" >"$dir.log" 2>&1 &
  mdb_pid=$!
  for _ in $(seq 100); do mariadb --socket="$dir.sock" -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
  mariadb --socket="$dir.sock" -uroot -e "CREATE DATABASE sbtest; CREATE USER 'sb'@'127.0.0.1'; GRANT ALL ON *.* TO 'sb'@'127.0.0.1';"
}

# start_shoal SHOAL_BIN DIR [shoal up option ...] runs a local cluster in the background on a
# random base port (log DIR.log), sets up_pid, and waits up to 2 minutes for its `ready` line.
# The base port stays below Linux's ephemeral range (32768 and up): sysbench's closed client
# connections linger there in TIME_WAIT and made a node's bind fail now and then.
start_shoal() {
  local bin=$1 dir=$2
  shift 2
  "$bin" up --dir "$dir" --base-port "$(( 20000 + RANDOM % 12000 ))" "$@" >"$dir.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 600); do grep -q '^ready' "$dir.log" && break; sleep 0.2; done
  grep -q '^ready' "$dir.log" || { cat "$dir.log"; exit 1; }
}

# start_shoal_edited SHOAL_BIN DIR SED: start_shoal, then, with a non-empty sed script, the same
# cluster again with SED applied to its cluster.toml (its nodes read it when they start).
start_shoal_edited() {
  start_shoal "$1" "$2"
  if [ -n "$3" ]; then
    kill -TERM "$up_pid"
    wait "$up_pid" 2>/dev/null || true
    sed -i "$3" "$2/cluster.toml"
    start_shoal "$1" "$2"
  fi
}

# shoal_mysql_port DIR: the MySQL port of the first SQL node of the cluster start_shoal ran in DIR.
shoal_mysql_port() { sed -n 's/.*mysql -h 127.0.0.1 -P \([0-9]*\).*/\1/p' "$1.log" | head -1; }

# shoal_mysql_socket DIR: the Unix socket of that SQL node (empty if it has none).
shoal_mysql_socket() { sed -n 's/.*: mysql -S \([^ ]*\) -u root$/\1/p' "$1.log" | head -1; }

# shoal_sysbench_tables DIR: creates database sbtest on the cluster start_shoal ran in DIR, fills
# sysbench's 4 tables x 10,000 rows, and sets `port` (the SQL node's MySQL port) and `sb` (the
# sysbench options that reach those tables as root).
shoal_sysbench_tables() {
  port=$(shoal_mysql_port "$1")
  mariadb -h 127.0.0.1 -P "$port" -u root --skip-ssl -e "CREATE DATABASE sbtest"
  sb=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" --mysql-user=root --mysql-db=sbtest
    --tables=4 --table-size=10000)
  sysbench oltp_read_write "${sb[@]}" prepare >/dev/null
}

# cpu_jiffies prints "<steal> <total>": the machine's jiffies so far (/proc/stat, all CPUs), for
# the share the hypervisor took from this VM during a run (steal). On these shared VMs it moves
# between 5% and 40% within minutes, and a run's rate with it, more than most changes do.
cpu_jiffies() { awk '/^cpu / {t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t}' /proc/stat; }

# idle_of prints "<idle> <total>": the machine's idle (and I/O wait) jiffies so far and all of
# them (/proc/stat, all CPUs), for the idle share over a window.
idle_of() { awk '/^cpu / {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }

# steal_since "<steal> <total>" (from cpu_jiffies): the percentage of CPU time stolen since.
steal_since() { echo "$1 $(cpu_jiffies)" | awk '{d = $4 - $2; printf "%.0f", (d > 0 ? 100 * ($3 - $1) / d : 0)}'; }

# sysbench_steady WARM SECS WORKLOAD [sysbench option ...] runs WORKLOAD for WARM + SECS seconds
# with a report every second and prints "<rate> <p99 ms> <whole-run rate>": the events per
# second (queries for oltp_point_select, transactions otherwise) and the median of the
# per-second 99th percentiles over the last SECS seconds, then the rate over the whole run.
# Why the warm-up: every sysbench thread runs its own LuaJIT state, which interprets the
# workload script until its loops are hot. At 1024 threads each thread runs only a dozen or so
# events a second, so sysbench spends the first 15-25 s interpreting, at twice its warm CPU per
# query, whichever server it talks to (docs/benchmarks.md, thirteenth session).
sysbench_steady() {
  local warm=$1 secs=$2 wl=$3
  shift 3
  local out
  out=$(sysbench "$wl" "$@" --percentile=99 --report-interval=1 --time="$(( warm + secs ))" run 2>&1) || true
  echo "$out" | python3 -c '
import re, statistics, sys
warm, point = int(sys.argv[1]), sys.argv[2] == "oltp_point_select"
rates, p99s, whole = [], [], None
lines = sys.stdin.readlines()
for line in lines:
    m = re.match(r"\[ (\d+)s \].* tps: ([\d.]+) qps: ([\d.]+) .*lat \(ms,99%\): ([\d.]+)", line)
    if m and int(m[1]) > warm:
        rates.append(float(m[3] if point else m[2]))
        p99s.append(float(m[4]))
    m = re.match(r"\s*(queries|transactions):\s+\d+\s+\(([\d.]+) per sec", line)
    if m and (m[1] == "queries") == point:
        whole = float(m[2])
if not rates or whole is None:
    sys.exit("no per-second reports from sysbench; it said:\n" + "".join(lines[-20:]))
print(int(statistics.mean(rates)), f"{statistics.median(p99s):.2f}", int(whole))
' "$warm" "$wl"
}
