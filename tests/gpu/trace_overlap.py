#!/usr/bin/env python3
"""Whose waits overlapped whose runs: reads the per-process sample traces of one node
(`SMORE_TRACE_SAMPLES=<dir>/samples-{pid}.txt`, docs/shim.md) and says how much of the functions'
measured collision time waited, or ran stretched, while another traced process's *sampled* kernel
ran.

A shim sees that its kernel waited, not for whom. On a time-sliced GPU a wait behind another
function costs no training job, yet the shim charges it; this tells, from the traces alone, how
much of the charged collision time the samples themselves can attribute to other functions
(docs/harvest.md, "What perfect phase knowledge buys"). Only sampled kernels have a known run
interval (`submitted_ns + wait_ns` to that plus `ns`), so the figure is a lower bound; with
`--gpu-seconds` (the traced processes' total GPU time over the traces' span) it also
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
    """The rows of one trace; exits on a trace from before `submitted_ns` was added, skips a
    line cut short (the last one of a process killed mid-write)."""
    rows, skipped = [], 0
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                if "submitted_ns" not in line:
                    sys.exit(f"{path}: a trace from before submitted_ns was added (2026-11-27)")
                continue
            try:
                cols = [int(x) for x in line.split()]
            except ValueError:
                cols = []
            if len(cols) < 8:
                skipped += 1
                continue
            rows.append(cols)
    if skipped:
        print(f"{path}: {skipped} incomplete line(s) skipped", file=sys.stderr)
    return rows


def analyse(directory, gpu_seconds=None):
    """The figures of one node's traces in `directory`, as a dict (raises ValueError when there
    are fewer than two processes' traces)."""
    traces = {os.path.basename(p): read(p)
              for p in sorted(glob.glob(os.path.join(directory, "*.txt")))}
    traces = {k: v for k, v in traces.items() if v}
    if len(traces) < 2:
        raise ValueError(f"{directory}: need the traces of at least two processes")
    # Each sampled kernel's run on the shared clock (a known wait places it; an unknown one
    # does not). A process not traced at some time (not yet started, exited) ran nothing
    # traced then, so every sample is judged against whatever the others posted.
    runs = {}
    sampled_run_ns = 0
    for name, rows in traces.items():
        spans = []
        for r in rows:
            sampled_run_ns += r[NS]
            if r[WAIT] < 0:
                continue
            start = r[SUBMITTED] + r[WAIT]
            spans.append((start, start + r[NS]))
        spans.sort()
        runs[name] = spans

    def overlap(me, a0, a1):
        """ns of [a0, a1) during which another process's sampled kernel ran (summed over the
        processes: two others at once count twice, capped by the caller)."""
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

    collided = behind_function = unknown_wait = 0
    for name, rows in traces.items():
        for r in rows:
            if r[COLLIDED] <= 0 or r[D0] <= 0:
                continue
            collided += r[COLLIDED]
            if r[WAIT] < 0:
                unknown_wait += r[COLLIDED]
                continue
            # A collision is the wait plus the run's stretch beyond its solo cost, each at most
            # the solo cost (shim/src/harvest.rs, `Collision::observe`): the wait is judged by
            # what ran while it waited, the stretch by what ran beside (MPS) or instead of
            # (a preemption, time-sliced) its own run.
            waited = min(r[D0], r[WAIT])
            stretched = max(0, r[COLLIDED] - waited)
            start = r[SUBMITTED] + r[WAIT]
            if waited > 0:
                behind_function += waited * min(1.0, overlap(name, r[SUBMITTED], start) / r[WAIT])
            if stretched > 0 and r[NS] > 0:
                behind_function += stretched * min(1.0, overlap(name, start, start + r[NS]) / r[NS])
    first = min(r[SUBMITTED] for v in traces.values() for r in v)
    last = max(r[SUBMITTED] for v in traces.values() for r in v)
    out = {"processes": len(traces), "traced_s": round((last - first) / 1e9, 3),
           "sampled_run_s": round(sampled_run_ns / 1e9, 3),
           "collision_s": round(collided / 1e9, 3),
           "collision_unknown_wait_s": round(unknown_wait / 1e9, 3),
           "overlapping_share": round(behind_function / collided, 4) if collided else None}
    if gpu_seconds and collided:
        coverage = sampled_run_ns / 1e9 / gpu_seconds
        out["coverage"] = round(coverage, 4)
        out["overlapping_share_scaled"] = (round(min(1.0, out["overlapping_share"] / coverage), 4)
                                           if coverage > 0 else None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="directory of samples-<pid>.txt traces of one node")
    ap.add_argument("--gpu-seconds", type=float,
                    help="the traced processes' GPU time over the traces' span, s")
    a = ap.parse_args()
    try:
        r = analyse(a.dir, a.gpu_seconds)
    except ValueError as e:
        sys.exit(str(e))
    print(f"processes {r['processes']}, traced over {r['traced_s']:.1f} s")
    print(f"sampled run time {r['sampled_run_s']:.3f} s, collision time {r['collision_s']:.3f} s "
          f"({r['collision_unknown_wait_s']:.3f} s of it with no known wait, not attributed)")
    if r["overlapping_share"] is None:
        return
    print(f"collision time that overlapped another process's sampled kernel: "
          f"{r['overlapping_share']:.1%}")
    if "coverage" in r:
        print(f"samples cover {r['coverage']:.1%} of the GPU time; scaled by it: "
              f"{r['overlapping_share_scaled']:.1%}")


if __name__ == "__main__":
    main()
