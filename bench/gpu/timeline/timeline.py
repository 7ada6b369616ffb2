#!/usr/bin/env python3
"""Where a step's device time goes, from cupti_trace.so's records.

    python3 timeline.py TRACE METRICS_JSONL [--json OUT]

The steps are placed from the end of the trace back, by the step times the
trainer wrote to METRICS_JSONL (`train --metrics`): the last step ends with
the last kernel (the trainer reads the loss), and each boundary is the
longest stretch with no kernel running within 50 ms of where the step times
put it, so nothing may run on the device after the last step (run.sh passes
`--sample-tokens 0`). The start of the trace (autotuning, module loads) is
left out. For each step after the first two: wall span, time with at least
one kernel running, idle time split by gap length, the longest gaps with what
the host was blocked in meanwhile, and kernel time by kernel.
"""
import collections
import json
import sys


def load(path):
    kernels, copies, api = [], [], []
    for line in open(path, errors="replace"):
        f = line.rstrip("\n").split(" ", 4)
        if f[0] == "K" and len(f) >= 5:
            kernels.append((int(f[1]), int(f[2]), int(f[3]), f[4]))
        elif f[0] == "M" and len(f) >= 5:
            rest = f[4].split(" ")
            copies.append((int(f[1]), int(f[2]), int(f[3]), int(rest[0]), int(rest[1])))
        elif f[0] == "A" and len(f) >= 5:
            api.append((int(f[1]), int(f[2]), int(f[3]), f[4]))
    kernels.sort()
    copies.sort()
    api.sort()
    return kernels, copies, api


def busy_intervals(kernels):
    merged = []
    for s, e, *_ in kernels:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def short(name, n=70):
    name = name.split("(")[0]
    return name if len(name) <= n else name[: n - 3] + "..."


def main():
    path = sys.argv[1]
    step_s = [json.loads(l)["step_s"] for l in open(sys.argv[2]) if l.strip()]
    steps = len(step_s)
    kernels, copies, api = load(path)
    if not kernels:
        print("no kernels recorded")
        return
    merged = busy_intervals(kernels)
    gaps = [(merged[i + 1][0] - merged[i][1], merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)]
    # Boundaries from the end: the gap nearest where the step times put each.
    bounds, t = [], merged[-1][1]
    for s_ in reversed(step_s):
        t -= int(s_ * 1e9)
        near = [g for g in gaps if abs(g[2] - t) < 5e7]
        if near:
            t = max(near)[2]
        bounds.append(t)
    bounds.reverse()
    starts = bounds
    ends = bounds[1:] + [merged[-1][1]]
    report = []
    for n, (t0, t1) in enumerate(zip(starts, ends)):
        if n < 2 and steps > 3:
            continue
        inside = [m for m in merged if m[0] >= t0 and m[1] <= t1]
        busy = sum(e - s for s, e in inside)
        step_gaps = [(inside[i + 1][0] - inside[i][1], inside[i][1], inside[i + 1][0]) for i in range(len(inside) - 1)]
        # The boundary gap after this step's last kernel is this step's (the
        # trainer reads the loss, the next step waits for its first group).
        trail = [g for g in gaps if g[2] == t1]
        all_gaps = step_gaps + trail
        span = t1 - t0
        buckets = collections.OrderedDict((k, 0) for k in ("<20us", "20-200us", "0.2-2ms", ">2ms"))
        for g, _, _ in all_gaps:
            key = "<20us" if g < 2e4 else "20-200us" if g < 2e5 else "0.2-2ms" if g < 2e6 else ">2ms"
            buckets[key] += g
        by_kernel = collections.Counter()
        count = collections.Counter()
        for s, e, _, name in kernels:
            if s >= t0 and e <= t1:
                by_kernel[short(name)] += e - s
                count[short(name)] += 1
        longest = []
        for g, a, b in sorted(all_gaps, reverse=True)[:12]:
            before = [k for k in kernels if k[1] <= a][-1:] if a > merged[0][0] else []
            after = [k for k in kernels if k[0] >= b][:1]
            blocked = collections.Counter()
            for s, e, tid, name in api:
                overlap = min(e, b) - max(s, a)
                if overlap > 0.2 * g:
                    blocked[f"{name}@{tid}"] += overlap
            longest.append({
                "gap_ms": g / 1e6, "at_ms": (a - t0) / 1e6,
                "after": short(before[0][3]) if before else None,
                "before": short(after[0][3]) if after else None,
                "host_blocked_in": {k: round(v / 1e6, 3) for k, v in blocked.most_common(4)},
            })
        h2d = [(s, e, b) for s, e, _, kind, b in copies if kind == 1 and t0 <= s < t1]
        d2h = [(s, e, b) for s, e, _, kind, b in copies if kind == 2 and t0 <= s < t1]
        sync_by_thread = collections.Counter()
        for s, e, tid, name in api:
            if t0 <= s < t1 and ("Synchronize" in name or "WaitEvent" in name):
                sync_by_thread[f"{name}@{tid}"] += e - s
        report.append({
            "step": n + 1,
            "span_ms": span / 1e6,
            "kernel_busy_ms": busy / 1e6,
            "busy_pct": 100 * busy / span,
            "kernels": sum(count.values()),
            "idle_ms_by_gap": {k: round(v / 1e6, 2) for k, v in buckets.items()},
            "h2d": {"copies": len(h2d), "gb": sum(b for *_, b in h2d) / 1e9,
                    "copy_ms": sum(e - s for s, e, _ in h2d) / 1e6},
            "d2h": {"copies": len(d2h), "gb": sum(b for *_, b in d2h) / 1e9,
                    "copy_ms": sum(e - s for s, e, _ in d2h) / 1e6},
            "host_sync_ms": {k: round(v / 1e6, 2) for k, v in sync_by_thread.most_common(8)},
            "longest_gaps": longest,
            "kernel_ms": [{"kernel": k, "ms": round(v / 1e6, 2), "launches": count[k]}
                          for k, v in by_kernel.most_common(25)],
        })
    for r in report:
        print(f"step {r['step']}: span {r['span_ms']:.1f} ms, kernels busy {r['kernel_busy_ms']:.1f} ms "
              f"({r['busy_pct']:.1f}%), {r['kernels']} kernels; idle by gap {r['idle_ms_by_gap']}")
        print(f"  h2d {r['h2d']}  d2h {r['d2h']}")
        print(f"  host syncs {r['host_sync_ms']}")
        for g in r["longest_gaps"][:8]:
            print(f"  gap {g['gap_ms']:.2f} ms at {g['at_ms']:.1f}: {g['after']} -> {g['before']}; host in {g['host_blocked_in']}")
        for k in r["kernel_ms"][:14]:
            print(f"    {k['ms']:8.2f} ms {k['launches']:5d}x {k['kernel']}")
    if "--json" in sys.argv:
        json.dump(report, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
