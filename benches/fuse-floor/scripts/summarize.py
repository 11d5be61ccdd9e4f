#!/usr/bin/env python3
# Summarize RESULT lines: median (min-max) ops/s per label+phase, ratio of medians to each native (same pin),
# and median CPU per op (caller = the benchmark process incl. its kernel time; daemon = all daemon threads).
import sys, re, statistics as st
from collections import defaultdict
d = defaultdict(list); cpu = defaultdict(list)
for f in sys.argv[1:]:
    for line in open(f):
        m = re.match(r"RESULT (\S+) (\S+) ops/s=(\d+) caller_cpu_us/op=([\d.]+) daemon_cpu_us/op=([\d.]+) vcsw/op=([\d.]+)", line)
        if m:
            lab, ph = m.group(1), m.group(2)
            d[(lab, ph)].append(int(m.group(3)))
            cpu[(lab, ph)].append((float(m.group(4)), float(m.group(5)), float(m.group(6))))
labels = sorted({k[0] for k in d}, key=lambda l: (l.split('/')[-1], l))
nats = ["native-ext4img", "native-tmpfs", "native-rootfs"]
print(f"{'label':24} {'phase':7} {'n':>2} {'median':>8} {'min':>8} {'max':>8} {'%ext4img':>8} {'%tmpfs':>7} {'%rootfs':>8} {'callerus':>8} {'daemonus':>8} {'vcsw':>5}")
for lab in labels:
    pin = lab.split('/')[-1]
    for ph in ("create", "stat", "unlink"):
        v = d.get((lab, ph))
        if not v: continue
        rs = []
        for n in nats:
            nat = d.get((n + "/" + pin, ph))
            rs.append(f"{100*st.median(v)/st.median(nat):.0f}%" if nat else "-")
        c = cpu[(lab, ph)]
        print(f"{lab:24} {ph:7} {len(v):2} {st.median(v):8.0f} {min(v):8} {max(v):8} {rs[0]:>8} {rs[1]:>7} {rs[2]:>8} {st.median(x[0] for x in c):8.2f} {st.median(x[1] for x in c):8.2f} {st.median(x[2] for x in c):5.2f}")
