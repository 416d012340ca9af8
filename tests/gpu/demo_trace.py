"""`smore demo --gpu` with every function's sample trace, and whose waits overlapped whose runs.

The real-GPU question of docs/real-gpu.md, section 9, point 1: on an H200 the functions'
collision time per request read 0.89-0.95 of their GPU time beside a trainer busy 8-11 %. This
step runs the demo's `harvest` scenario on the real GPU with `SMORE_TRACE_SAMPLES` set (each
function's shim appends one line per settled sample: its submission time, wait, run time and
collision; docs/shim.md), keeps the traces, and lays them side by side with
`trace_overlap.analyse`: how much of the collision time waited, or ran stretched, while another
function's sampled kernel ran (docs/harvest.md, "What perfect phase knowledge buys").

Prints the demo's figures and one `RESULT {json}` line (tests/gpu/run_all.sh convention). Passes
when the demo ran and at least two functions left traces. `--sim` runs the same on the simulated
GPU (no `--gpu`), to check the script where there is no GPU.

    python3 tests/gpu/demo_trace.py --smore target-gpu/release/smore --workdir /tmp/w --out /tmp/res
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, log  # noqa: E402
from trace_overlap import analyse  # noqa: E402

# Beyond the replay: the trainer alone (5 s), each function alone, and on a GPU the warm-up of
# every instance (up to 180 s, `smore demo`'s WARMUP_TIMEOUT) and the trainer's start (up to
# 120 s): s.
OVERHEAD_S = 420


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smore", required=True, help="the smore binary")
    ap.add_argument("--workdir", required=True, help="scratch directory (created)")
    ap.add_argument("--out", help="where to copy the traces and summary.json (default: none)")
    ap.add_argument("--scenario", default="harvest")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--sim", action="store_true", help="the simulated GPU instead of --gpu")
    a = ap.parse_args()
    traces = os.path.join(a.workdir, "traces")
    demo_out = os.path.join(a.workdir, "demo")
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(traces)
    env = dict(os.environ, SMORE_TRACE_SAMPLES=os.path.join(traces, "samples-{pid}.txt"))
    cmd = [a.smore, "demo", "--scenario", a.scenario, "--seconds", str(a.seconds),
           "--out", demo_out] + ([] if a.sim else ["--gpu"])
    log(" ".join(cmd))
    result = {"test": "demo_trace", "pass": False, "command": " ".join(cmd),
              "simulated": a.sim}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=a.seconds + OVERHEAD_S)
    except subprocess.TimeoutExpired:
        result["error"] = f"smore demo ran past {a.seconds + OVERHEAD_S} s"
        emit(result)
        return
    sys.stderr.write(p.stderr[-4000:])
    print(p.stdout)
    if p.returncode != 0:
        result["error"] = f"smore demo exited {p.returncode}: {p.stderr.strip()[-500:]}"
        emit(result)
        return
    with open(os.path.join(demo_out, "summary.json")) as f:
        s = json.load(f)
    result["demo"] = {k: s.get(k) for k in ("sfd", "sfd_estimate", "dsr", "dsr_admitted",
                                            "gui_exclusive_pct", "gui_colocated_pct",
                                            "gui_gain_pp", "offered_load_pct")}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        shutil.copytree(traces, os.path.join(a.out, "traces"), dirs_exist_ok=True)
        shutil.copy(os.path.join(demo_out, "summary.json"),
                    os.path.join(a.out, "demo_trace_summary.json"))
    try:
        result["overlap"] = analyse(traces)
        result["pass"] = True
    except (ValueError, SystemExit) as e:
        result["error"] = f"traces: {e}"
    emit(result)


if __name__ == "__main__":
    main()
