#!/usr/bin/env python3
"""Whose waits overlapped whose runs: reads the per-process sample traces of one node
(`SMORE_TRACE_SAMPLES=<dir>/samples-{pid}.txt`, docs/shim.md) and says how much of the functions'
measured collision time waited while another traced process's *sampled* kernel ran.

A shim sees that its kernel waited, not for whom. On a time-sliced GPU a wait behind another
function costs no training job, yet the shim charges it; this tells, from the traces alone, how
much of the charged collision time the samples themselves can attribute to other functions
(docs/harvest.md, "What perfect phase knowledge buys"). Only sampled kernels have a known run
interval (`submitted_ns + wait_ns` to that plus `ns`), so the figure is a lower bound; with
`--gpu-seconds` (the traced processes' total GPU time over the traces' common window) it also
prints the figure scaled by the samples' coverage of that time, an estimate that assumes samples
are spread evenly over each process's runs.

Works on traces from the simulated GPU and from a real one alike (same format, same clock:
CLOCK_MONOTONIC). Usage: trace_overlap.py DIR [--gpu-seconds S]
"""
import argparse
import bisect
import glob
import os
import sys

# Columns (shim/src/trace.rs, HEADER).
T, DEV, NS, D0, WAIT, COLLIDED, HANDOVER, SUBMITTED = range(8)
# How far back a run may have started and still overlap a wait, ns (longer than any sampled
# kernel of the demo's functions; a longer run is clipped, which only lowers the figure).
LOOKBACK_NS = 50_000_000


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            cols = [int(x) for x in line.split()]
            if len(cols) < 8:
                sys.exit(f"{path}: a line without submitted_ns (a trace from before it was added)")
            rows.append(cols)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="directory of samples-<pid>.txt traces of one node")
    ap.add_argument("--gpu-seconds", type=float, help="the traced processes' GPU time, s")
    a = ap.parse_args()
    traces = {os.path.basename(p): read(p) for p in sorted(glob.glob(os.path.join(a.dir, "*.txt")))}
    traces = {k: v for k, v in traces.items() if v}
    if len(traces) < 2:
        sys.exit(f"{a.dir}: need the traces of at least two processes")
    # The window every process traced.
    t0 = max(min(r[SUBMITTED] for r in v) for v in traces.values())
    t1 = min(max(r[SUBMITTED] for r in v) for v in traces.values())
    if t1 <= t0:
        sys.exit("the traces do not overlap in time")
    runs = {}
    sampled_run_ns = 0
    for name, rows in traces.items():
        spans = []
        for r in rows:
            if r[WAIT] < 0:
                continue
            start = r[SUBMITTED] + r[WAIT]
            spans.append((start, start + r[NS]))
            if t0 <= r[SUBMITTED] <= t1:
                sampled_run_ns += r[NS]
        spans.sort()
        runs[name] = spans

    def overlap(me, a0, a1):
        o = 0
        for name, spans in runs.items():
            if name == me:
                continue
            i = bisect.bisect_left(spans, (a0 - LOOKBACK_NS, 0))
            while i < len(spans) and spans[i][0] < a1:
                s, e = spans[i]
                o += max(0, min(a1, e) - max(a0, s))
                i += 1
        return o

    collided = behind_function = 0
    unknown_wait = 0
    for name, rows in traces.items():
        for r in rows:
            if not (t0 <= r[SUBMITTED] <= t1) or r[COLLIDED] <= 0:
                continue
            collided += r[COLLIDED]
            if r[WAIT] <= 0:
                unknown_wait += r[COLLIDED]
                continue
            frac = min(1.0, overlap(name, r[SUBMITTED], r[SUBMITTED] + r[WAIT]) / r[WAIT])
            behind_function += r[COLLIDED] * frac
    window_s = (t1 - t0) / 1e9
    print(f"processes {len(traces)}, common window {window_s:.1f} s")
    print(f"sampled run time {sampled_run_ns / 1e9:.3f} s, collision time {collided / 1e9:.3f} s "
          f"({unknown_wait / 1e9:.3f} s of it with no known wait)")
    if collided == 0:
        return
    share = behind_function / collided
    print(f"collision time that waited while another process's sampled kernel ran: {share:.1%}")
    if a.gpu_seconds:
        coverage = sampled_run_ns / 1e9 / a.gpu_seconds
        print(f"samples cover {coverage:.1%} of the GPU time; scaled by it: "
              f"{min(1.0, share / coverage) if coverage > 0 else float('nan'):.1%}")


if __name__ == "__main__":
    main()
