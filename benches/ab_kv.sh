#!/usr/bin/env bash
# A/B of two Shoal clusters on one `bench kv` load (issue 2): both run side by side, each from
# its own binaries and with its own edit of cluster.toml, and the load alternates between them
# (A B A B ...) so the machine's drift hits both alike. Prints every run (ops/s, p99 ms) and
# each side's median. For one change at a time: a build against another, or a setting against
# its default (the same binaries twice, one side with an edit). The idle cluster costs its
# heartbeats only; its nodes do not spin without work.
#
#   benches/ab_kv.sh BIN_A EDIT_A BIN_B EDIT_B "BENCH_KV_OPTIONS" SECONDS ROUNDS
#
# BIN_A/BIN_B: directories holding shoal, shoal-mgmd, shoal-datanode, shoal-sqlnode. EDIT_A/B:
# a sed script applied to that cluster's cluster.toml before its nodes start again ("" for
# none). Keys 10,000, values 64 B, the load generator on TCP as in kv_vs_redis.sh. Example,
# data nodes without spinning after their work, 16 clients writing:
#   benches/ab_kv.sh target/release "" target/release 's/^spin_us = .*/spin_us = 0/' \
#     "--threads 16 --batch 1 --write-ratio 1" 5 3
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 7 ] || { sed -n '9,16p' "$0" >&2; exit 1; }
A=$(realpath "$1") EDIT_A=$2 B=$(realpath "$3") EDIT_B=$4 LOAD=$5 SECS=$6 ROUNDS=$7
source benches/lib.sh

work=$(mktemp -d)
ups=()
up_pid=""
cleanup() {
  # up_pid: a cluster still starting (start_shoal exits on a failed start).
  for p in "${ups[@]}" $up_pid; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${ups[@]}" $up_pid; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# cluster BIN DIR EDIT: a local cluster in DIR, restarted once with EDIT applied to its config.
cluster() {
  start_shoal_edited "$1/shoal" "$2" "$3"
  ups+=("$up_pid")
  up_pid=""
}
cluster "$A" "$work/a" "$EDIT_A"
cluster "$B" "$work/b" "$EDIT_B"

# kv BIN DIR SECONDS [--json]
kv() {
  # shellcheck disable=SC2086 # LOAD holds several options
  "$1/shoal" bench kv --dir "$2" --tcp --keys 10000 --value-size 64 $LOAD --duration "$3" "${@:4}"
}
kv "$A" "$work/a" 3 >/dev/null
kv "$B" "$work/b" 3 >/dev/null
for r in $(seq "$ROUNDS"); do
  for side in a b; do
    bin=$A
    [ $side = b ] && bin=$B
    kv "$bin" "$work/$side" "$SECS" --json |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(round(j["ops_per_s"]), j["p99_ms"])' |
      sed "s/^/round $r $side /" | tee -a "$work/runs"
  done
done
for side in a b; do
  awk -v s=$side '$3 == s {print $4}' "$work/runs" | sort -n |
    awk -v s=$side '{v[NR] = $1} END {printf "median %s: %d ops/s\n", s, (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
done
