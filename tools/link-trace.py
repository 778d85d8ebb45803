#!/usr/bin/env python3
"""Draws a `longhaul-bench sweep --link-trace` file as text: for one job (cell and round), every
host's upload and download as a strip of bins, each bin's share of the link's rate as a digit
(0-9, '#' at 95% or more), '|' where a step was seen to end.

  tools/link-trace.py OUT/link-trace.csv.gz                      # the cells and rounds in the file
  tools/link-trace.py OUT/link-trace.csv.gz --cell "300 fp32" --from 19 --seconds 16 --bin-ms 100

The rate is the cell's (its first word, Mbit/s); times are seconds from the job's first sample.
Standard library only.
"""
import argparse
import collections
import csv
import gzip
import sys


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    jobs = collections.OrderedDict()  # (cell, round) -> {"steps": [t], "hosts": {name: [(t, up, down)]}}
    with opener(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            job = jobs.setdefault((r["cell"], r["round"]), {"steps": [], "hosts": collections.OrderedDict()})
            if r["kind"] == "step":
                job["steps"].append(float(r["unix_s"]))
            else:
                job["hosts"].setdefault(r["host"], []).append(
                    (float(r["unix_s"]), int(r["up_bytes"]), int(r["down_bytes"])))
    return jobs


def strip(samples, column, start, bins, bin_s, rate, marks):
    acc = [0.0] * bins
    for (ta, *va), (_, *vb) in zip(samples, samples[1:]):
        i = int((ta - start) / bin_s)
        if 0 <= i < bins:
            acc[i] += vb[column] - va[column]
    out = []
    for i, b in enumerate(acc):
        share = b / (rate * bin_s)
        out.append("|" if i in marks else "#" if share >= 0.95 else str(min(9, int(share * 10))))
    return "".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="the CSV (or .csv.gz) that --link-trace wrote")
    p.add_argument("--cell", help='the job\'s cell, e.g. "300 fp32" (default: list the cells)')
    p.add_argument("--round", default="1", help="the sweep round (default 1)")
    p.add_argument("--from", dest="start", type=float, default=0, help="seconds after the job's first sample")
    p.add_argument("--seconds", type=float, default=10, help="how much to draw (default 10)")
    p.add_argument("--bin-ms", type=float, default=50, help="bin width in ms (default 50; samples are 5 ms apart)")
    a = p.parse_args()
    jobs = read(a.trace)
    if a.cell is None:
        for (cell, rnd), job in jobs.items():
            first = min(s[0][0] for s in job["hosts"].values())
            print(f"{cell!r} round {rnd}: {len(job['hosts'])} hosts, steps seen ending at "
                  + ", ".join(f"{t - first:.2f}" for t in job["steps"]) + " s (--from counts from the first sample)")
        return 0
    job = jobs.get((a.cell, a.round))
    if job is None:
        sys.exit(f"no job {a.cell!r} round {a.round} in {a.trace}; run without --cell for the list")
    rate = float(a.cell.split()[0]) * 1e6 / 8
    first = min(s[0][0] for s in job["hosts"].values())
    start, bin_s = first + a.start, a.bin_ms / 1e3
    bins = int(a.seconds / bin_s)
    marks = {int((t - start) / bin_s) for t in job["steps"]}
    width = max(len(h) for h in job["hosts"])
    print(f"{a.cell}, round {a.round}: {a.start:g} s to {a.start + a.seconds:g} s, {a.bin_ms:g} ms a bin")
    for host, samples in job["hosts"].items():
        for column, direction in ((0, "up  "), (1, "down")):
            print(f"{host:<{width}} {direction} {strip(samples, column, start, bins, bin_s, rate, marks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
