#!/usr/bin/env python3
"""Where a polite agent's tool calls wait, from the kernel's scheduler events.

Record a `bench isolation` run and split its calls (docs/benchmarks.md, "The returning
agent's credit"):

    perf sched record -a -o /tmp/s.data -- sleep 40 &
    cargo xtask bench isolation --secs 8 --attacks calls --dir /dev/shm/X
    perf script -i /tmp/s.data -F comm,tid,cpu,time,event,trace > /tmp/s.txt
    python3 xtask/scripts/sched_calls.py /tmp/s.txt POLITE_PID TOOL_PID SPLIT

POLITE_PID is the `bench mcp-client` process (forked by a `tokio-rt-worker` of agentosd),
TOOL_PID its tool server (forked by `agentos-agents`): `grep sched_process_fork /tmp/s.txt`.
SPLIT is the time (perf's clock) between the quiet and the attack window. A call is cut at the
tool server's wake-up and at its reply: in (the agent's send -> the tool woken), tool, out (the
tool's reply -> the agent woken).
"""
import bisect
import re
import sys

SWITCH = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch: prev_comm=.*? prev_pid=(\d+) "
                    r"prev_prio=\d+ prev_state=(\S+) ==> next_comm=.*? next_pid=(\d+)")
WAKING = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_waking: comm=.*? pid=(\d+) ")


def main(path, polite, tool, split):
    polite_sleeps, polite_wakes, tool_wakes, tool_sleeps = [], [], [], []
    for line in open(path):
        m = SWITCH.search(line)
        if m:
            t, prev, state = float(m.group(2)), int(m.group(3)), m.group(4)
            if state.startswith("S"):
                if prev == polite:
                    polite_sleeps.append(t)
                elif prev == tool:
                    tool_sleeps.append(t)
            continue
        m = WAKING.search(line)
        if m:
            t, pid = float(m.group(2)), int(m.group(3))
            if pid == polite:
                polite_wakes.append(t)
            elif pid == tool:
                tool_wakes.append(t)
    calls = []
    for woken in tool_wakes:
        i = bisect.bisect_right(polite_sleeps, woken) - 1
        j = bisect.bisect_left(tool_sleeps, woken)
        if i < 0 or j >= len(tool_sleeps):
            continue
        sent, done = polite_sleeps[i], tool_sleeps[j]
        k = bisect.bisect_left(polite_wakes, done)
        if k >= len(polite_wakes) or polite_wakes[k] - sent > 0.015:
            continue
        calls.append((sent, woken - sent, done - woken, polite_wakes[k] - done, polite_wakes[k] - sent))
    for name, sel in (("quiet", [c for c in calls if c[0] < split]),
                      ("attack", [c for c in calls if c[0] >= split])):
        if not sel:
            continue
        sel.sort(key=lambda c: c[4])
        n = len(sel)
        print(f"{name}: {n} calls (ms: total = in + tool + out)")
        for q in (0.5, 0.9, 0.99):
            c = sel[int((n - 1) * q)]
            print(f"  p{int(q * 100)} {c[4] * 1e3:.2f} = {c[1] * 1e3:.2f} + {c[2] * 1e3:.2f} + {c[3] * 1e3:.2f}")
        slow = sel[int(n * 0.9):]
        mean = [sum(c[x] for c in slow) / len(slow) * 1e3 for x in (1, 2, 3)]
        print("  slowest tenth, mean: in {:.2f} tool {:.2f} out {:.2f}".format(*mean))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
