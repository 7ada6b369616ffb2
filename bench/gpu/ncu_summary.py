#!/usr/bin/env python3
"""Sums Nsight Compute's per-launch gpu__time_duration by kernel name (bench/gpu/profile.sh)."""
import collections, csv, sys

for path in sys.argv[1:]:
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    total = collections.Counter()
    count = collections.Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"]
        total[name] += float(r["Metric Value"].replace(",", ""))
        count[name] += 1
    all_ns = sum(total.values())
    print(f"## {path}: {sum(count.values())} launches, {all_ns / 1e6:.1f} ms of kernel time")
    for name, ns in total.most_common(int(sys.argv[0] and 40)):
        print(f"{ns / 1e6:10.2f} ms {100 * ns / all_ns:5.1f}% {count[name]:6d}x  {name[:150]}")
