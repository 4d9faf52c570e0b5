#!/usr/bin/env python3
"""Where a `bench sandbox` start's child spends its time, from clone to its first system call
after execve, by mode (docs/benchmarks.md, "Agent sandbox start", 2026-11-26 fifth session).

Record (root), scheduler events system-wide and the bench's own system calls, same clock:

    perf record -q -k mono -a -e sched:sched_switch,sched:sched_wakeup,sched:sched_wakeup_new,\
sched:sched_process_exec,sched:sched_process_fork -o sched.data &
    perf record -q -k mono -e raw_syscalls:sys_enter,raw_syscalls:sys_exit -o sys.data -- \
        target/release/xtask bench sandbox --runs 100 --no-bwrap --no-systemd
    kill -INT %1
    for f in sched sys; do perf script -i $f.data -F comm,pid,cpu,time,event,trace > $f.txt; done
    python3 xtask/scripts/start_trace.py sched.txt sys.txt

A child's mode is told by its calls: no setsid = fork+exec, no prctl = the floor
(clone3+cgroup), sendmsg = agentos+net (the broker's hand-over), else agentos. Run-queue
waits are charged to the task that ran instead.
"""
import collections
import re
import sys

LINE = re.compile(r'^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$')
NAMES = {308: 'setns', 157: 'prctl', 112: 'setsid', 33: 'dup2', 436: 'close_range',
         80: 'chdir', 59: 'execve', 14: 'rt_sigprocmask', 13: 'rt_sigaction', 116: 'setgroups',
         119: 'setresgid', 117: 'setresuid', 126: 'capset', 446: 'landlock_restrict_self',
         317: 'seccomp', 46: 'sendmsg', 3: 'close', 160: 'setrlimit', 302: 'prlimit64'}


def events(paths):
    rows = []
    for n, path in enumerate(paths):
        for i, line in enumerate(open(path, errors='replace')):
            m = LINE.match(line)
            if m:
                rows.append((float(m.group(4)), n, i, m.groups()))
    rows.sort()
    return [r[3] for r in rows]


def follow(evs):
    kids = {}
    for comm, pid, _cpu, t, name, rest in evs:
        pid, t = int(pid), float(t) * 1e6
        if name == 'sched:sched_process_fork':
            c = int(re.search(r'child_pid=(\d+)', rest).group(1))
            kids[c] = dict(fork=t, sys=[], open=None, waits=[], ready=None, by=collections.Counter())
            continue
        if name == 'sched:sched_wakeup_new' or name == 'sched:sched_wakeup':
            c = int(re.search(r'pid=(\d+)', rest).group(1))
            if c in kids and 'done' not in kids[c]:
                kids[c]['ready'] = t
        elif name == 'sched:sched_switch':
            m = re.search(r'prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=.* next_pid=(\d+)', rest)
            prev, state, nxt = int(m.group(1)), m.group(2), int(m.group(3))
            if prev in kids and 'done' not in kids[prev]:
                kids[prev]['ready'] = t if state.startswith('R') else None
            if nxt in kids and 'done' not in kids[nxt]:
                k = kids[nxt]
                k.setdefault('first_run', t)
                if k['ready'] is not None:
                    k['waits'].append(t - k['ready'])
                    k['by'][comm] += t - k['ready']
                k['ready'] = None
        elif name == 'sched:sched_process_exec' and pid in kids:
            kids[pid]['file'] = rest
        elif pid in kids and 'done' not in kids[pid] and name.startswith('raw_syscalls:'):
            k, nr = kids[pid], int(re.search(r'NR (\d+)', rest).group(1))
            if name.endswith('sys_enter'):
                if 'exec_exit' in k:
                    k['done'] = t
                else:
                    k['open'] = (nr, t)
            elif k['open'] and k['open'][0] == nr:
                k['sys'].append((nr, k['open'][1], t))
                k['open'] = None
                if nr == 59:
                    k['exec_exit'] = t
    return kids


def mode(k):
    nrs = {s[0] for s in k['sys']}
    if 'stamp' not in k.get('file', '') or 'done' not in k or 'first_run' not in k:
        return None
    if 112 not in nrs:
        return 'fork+exec'
    if 157 not in nrs:
        return 'floor'
    return 'agentos+net' if 46 in nrs else 'agentos'


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int((len(v) - 1) * q))] if v else 0.0


def main():
    by = collections.defaultdict(list)
    for k in follow(events(sys.argv[1:])).values():
        m = mode(k)
        if m:
            by[m].append(k)
    for m, ks in sorted(by.items()):
        print(f'== {m}: {len(ks)} starts (µs, p50 / p90)')
        rows = [
            ('fork → first system call after execve', [k['done'] - k['fork'] for k in ks]),
            ('fork → first run', [k['first_run'] - k['fork'] for k in ks]),
            ('first run → execve', [k['sys'][-1][1] - k['first_run'] for k in ks]),
            ('execve', [k['exec_exit'] - k['sys'][-1][1] for k in ks]),
            ('execve → first system call', [k['done'] - k['exec_exit'] for k in ks]),
            ('run-queue wait', [sum(k['waits']) for k in ks]),
        ]
        for name, v in rows:
            print(f'  {name:40s} {pct(v, .5):8.0f} {pct(v, .9):8.0f}')
        per = collections.defaultdict(list)
        for k in ks:
            d = collections.Counter()
            for nr, a, b in k['sys']:
                d[NAMES.get(nr, str(nr))] += b - a
            for n, v in d.items():
                per[n].append(v)
        top = sorted(per.items(), key=lambda x: -pct(x[1], .5))
        print('  system calls per start, p50:', ', '.join(f'{n} {pct(v, .5):.0f}' for n, v in top))
        ran = collections.Counter()
        for k in ks:
            ran.update(k['by'])
        print('  run-queue wait by the task that ran instead, µs per start:',
              ', '.join(f'{c} {v / len(ks):.0f}' for c, v in ran.most_common(6)))
        pool = [k['by']['agentos-nspool'] for k in ks if k['by']['agentos-nspool'] > 0]
        print(f'  waited behind agentos-nspool: {len(pool)} of {len(ks)}, p50 {pct(pool, .5):.0f} µs')


if __name__ == '__main__':
    main()
