#!/usr/bin/env python3
"""Summarises a LibTorch (Kineto) Chrome trace, as `longhaul-bench stage --trace` writes it.

  tools/torch-trace-summary.py TRACE.json[.gz] [--top N] [--timeline N]

Prints the traced span, how much of it the GPU was busy (the union of its kernels' intervals), the
kernels by total time, the CUDA runtime calls by total time (launches, and the synchronisations
where the host waited for the GPU), and the host's operators by count. Times in milliseconds.
--timeline N (as `longhaul-bench codec --device=cuda:0 --trace` writes, where a call's kernels
overlap through dependent launches) adds, in microseconds, the first N kernels and copies in the
order they started: each one's start from the first one's, its duration, its gap after the latest
end of those before it (negative: it started before that one ended) and the time from its call on
the host (the launch, or the copy's call) to its start; then those figures' means for each name
over the whole trace.
"""
import argparse
import collections
import gzip
import json
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def union_ms(intervals):
    busy, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy / 1000.0


def table(title, rows, top):
    print(f"\n{title}")
    print(f"  {'ms':>9} {'count':>7} {'mean us':>9}  name")
    for name, (ms, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {ms:9.2f} {n:7d} {1000 * ms / n:9.1f}  {name[:110]}")


def timeline(kernels, copies, runtime, n):
    """The kernels (and copies, marked) in start order: start, duration, gap after the latest end
    so far, time from the host's call to the start."""
    called_at = {}
    for e in runtime:
        c = e.get("args", {}).get("correlation")
        if c is not None:
            called_at[c] = e["ts"]
    ks = sorted([(e, "") for e in kernels] + [(e, "[copy] ") for e in copies], key=lambda p: p[0]["ts"])
    t0 = ks[0][0]["ts"]
    rows, prev_end = [], None
    for e, mark in ks:
        c = e.get("args", {}).get("correlation")
        rows.append((mark + e["name"], e["ts"] - t0, e["dur"], None if prev_end is None else e["ts"] - prev_end,
                     e["ts"] - called_at[c] if c in called_at else None))
        end = e["ts"] + e["dur"]
        prev_end = end if prev_end is None else max(prev_end, end)
    fmt = lambda v: f"{v:9.1f}" if v is not None else f"{'-':>9}"
    print(f"\ntimeline (us): the first {min(n, len(rows))} of {len(rows)} kernels and copies")
    print(f"  {'start':>9} {'dur':>9} {'gap':>9} {'call->':>9}  name")
    for name, start, dur, gap, lat in rows[:n]:
        print(f"  {start:9.1f} {dur:9.1f} {fmt(gap)} {fmt(lat)}  {name[:100]}")
    # Each name's figures, names in the order they first started (rows are in start order).
    per = {}
    for name, _, dur, gap, lat in rows:
        per.setdefault(name, ([], [], []))
        for figures, v in zip(per[name], (dur, gap, lat)):
            if v is not None:
                figures.append(v)
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    print("\nper kernel name, means (us):")
    print(f"  {'count':>9} {'dur':>9} {'gap':>9} {'call->':>9}  name")
    for name, (durs, gaps, lats) in per.items():
        print(f"  {len(durs):9d} {mean(durs):9.1f} {fmt(mean(gaps))} {fmt(mean(lats))}  {name[:100]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=15, help="rows per table (default 15)")
    ap.add_argument("--timeline", type=int, default=0, metavar="N",
                    help="the first N kernels in start order, with gaps and overlaps (see above)")
    a = ap.parse_args()
    try:
        events = [e for e in load(a.trace) if e.get("ph") == "X" and "dur" in e]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"torch-trace-summary: cannot read {a.trace}: {e}")
    if not events:
        sys.exit(f"torch-trace-summary: {a.trace} has no complete events")
    by_cat = collections.defaultdict(list)
    for e in events:
        by_cat[e.get("cat", "")].append(e)
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    kernels = by_cat.get("kernel", [])
    span = (end - start) / 1000.0
    print(f"{a.trace}: {span:.2f} ms traced")
    if kernels:
        busy = union_ms([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
        total = sum(e["dur"] for e in kernels) / 1000.0
        print(f"GPU kernels: {len(kernels)}, busy {busy:.2f} ms ({100 * busy / span:.0f}% of the span), "
              f"kernel time {total:.2f} ms, mean {1000 * total / len(kernels):.1f} us a kernel")
        mem = by_cat.get("gpu_memcpy", []) + by_cat.get("gpu_memset", [])
        if mem:
            print(f"GPU copies and sets: {len(mem)}, {sum(e['dur'] for e in mem) / 1000.0:.2f} ms")

        def sums(evs):
            rows = collections.defaultdict(lambda: [0.0, 0])
            for e in evs:
                rows[e["name"]][0] += e["dur"] / 1000.0
                rows[e["name"]][1] += 1
            return rows

        table("kernels by total time:", sums(kernels), a.top)
        runtime = by_cat.get("cuda_runtime", []) + by_cat.get("cuda_driver", [])
        table("CUDA runtime calls by total time (the host's side):", sums(runtime), a.top)
        if a.timeline > 0:
            timeline(kernels, mem, runtime, a.timeline)
    elif a.timeline > 0:
        print("no GPU kernels in the trace: no timeline")
    ops = by_cat.get("cpu_op", [])
    if ops:
        # Top-level operators only (not nested in another operator on the same thread).
        ops.sort(key=lambda e: (e.get("tid"), e["ts"], -e["dur"]))
        top_level, open_end = [], {}
        for e in ops:
            tid = e.get("tid")
            if tid in open_end and e["ts"] < open_end[tid]:
                continue
            top_level.append(e)
            open_end[tid] = e["ts"] + e["dur"]
        rows = collections.defaultdict(lambda: [0.0, 0])
        for e in top_level:
            rows[e["name"]][0] += e["dur"] / 1000.0
            rows[e["name"]][1] += 1
        host = sum(e["dur"] for e in top_level) / 1000.0
        print(f"\nhost operators: {len(ops)} in all, {len(top_level)} top-level taking {host:.2f} ms "
              f"({1000 * host / max(1, len(top_level)):.1f} us each, profiler overhead included)")
        table("top-level host operators by total time:", rows, a.top)


if __name__ == "__main__":
    main()
