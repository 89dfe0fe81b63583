#!/usr/bin/env python3
"""Idle periods and misplaced wake-ups in a scheduler recording (benches/sched_delays.sh).

Reads `perf script -F cpu,time,event,trace` of a recording with sched:sched_switch and
sched:sched_wakeup on stdin. Each idle period of a CPU is classified by the task that left the
CPU, the one that took it next, and what the other CPUs ran meanwhile: whether the CPUs wait
for work that one stage of a pipeline holds. A wake-up that puts a task on a busy CPU while
another CPU idles is counted, with how long such tasks waited to run.
"""
import collections
import re
import sys

switch = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch: prev_comm=(.*?) prev_pid=\d+ .*"
                    r"==> next_comm=(.*?) next_pid=(\d+)")
wakeup = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_wakeup: comm=(.*?) pid=(\d+) .*target_cpu=(\d+)")


def main():
    running = {}        # cpu -> what it runs now ("idle" for the idle task)
    idle_since = {}     # cpu -> (time, task that left it, what the other CPUs ran then)
    periods = collections.Counter()
    count = collections.Counter()
    beside = collections.Counter()
    misplaced = collections.Counter()
    waiting = {}        # pid -> when it was woken onto a busy CPU while another idled
    waited = 0.0
    first = last = None
    for line in sys.stdin:
        m = switch.search(line)
        if m:
            cpu, t, prev, nxt, pid = int(m[1]), float(m[2]), m[3], m[4], m[5]
            first, last = first or t, t
            if nxt.startswith("swapper"):
                others = sorted(v for c, v in running.items() if c != cpu)
                idle_since[cpu] = (t, prev, ", ".join(others) or "?")
                running[cpu] = "idle"
                continue
            if cpu in idle_since:
                t0, left, others = idle_since.pop(cpu)
                periods[(left, nxt)] += t - t0
                count[(left, nxt)] += 1
                beside[(left, nxt, others)] += t - t0
            running[cpu] = nxt
            if pid in waiting:
                waited += t - waiting.pop(pid)
            continue
        m = wakeup.search(line)
        if m:
            t, comm, pid, target = float(m[2]), m[3], m[4], int(m[5])
            if running.get(target, "idle") != "idle" and any(
                    v == "idle" for c, v in running.items() if c != target):
                misplaced[comm] += 1
                waiting[pid] = t
    cpus = max(len(running), 1)
    span = (last - first) * cpus if first is not None and last > first else 1.0
    total = sum(periods.values())
    print(f"\n{cpus} CPUs over {(last - first) if first else 0:.2f} s: idle {100 * total / span:.1f}% of CPU time")
    print("\n| idle % | periods | mean µs | left by | taken by |\n|---|---|---|---|---|")
    for (left, took), d in periods.most_common(8):
        n = count[(left, took)]
        print(f"| {100 * d / span:.2f} | {n} | {1e6 * d / n:.1f} | {left} | {took} |")
    print("\n| idle % | left by | taken by | the other CPUs ran |\n|---|---|---|---|")
    for (left, took, others), d in beside.most_common(8):
        print(f"| {100 * d / span:.2f} | {left} | {took} | {others} |")
    print(f"\nWoken onto a busy CPU while another idled: {dict(misplaced.most_common(6))};"
          f" they waited {100 * waited / span:.2f}% of CPU time to run")


if __name__ == "__main__":
    main()
