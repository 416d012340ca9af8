"""`smore demo --gpu` with every function's sample trace, and whose waits overlapped whose runs.

The real-GPU question of docs/real-gpu.md, section 9, point 1: on an H200 the functions'
collision time per request read 0.89-0.95 of their GPU time beside a trainer busy 8-11 %. This
step runs the demo's `harvest` scenario on the real GPU with `SMORE_TRACE_SAMPLES` set (each
function's shim appends one line per settled sample: its submission time, wait, run time and
collision; docs/shim.md), keeps the traces, and lays them side by side with
`trace_overlap.analyse`: how much of the collision time waited, or ran stretched, while another
function's sampled kernel ran (docs/harvest.md, "What perfect phase knowledge buys").

Prints the demo's figures and one `RESULT {json}` line (tests/gpu/run_all.sh convention). Passes
when the demo ran and at least two functions left traces. The traces go to `--out` as one
archive, `traces.tar.gz` (the device tool brings back a few files, not one per process), with
the demo's summary.json, whether or not the demo succeeded. `--sim` runs the same on the
simulated GPU (no `--gpu`), to check the script where there is no GPU.

    python3 tests/gpu/demo_trace.py --smore target-gpu/release/smore --workdir /tmp/w --out /tmp/res
"""
import argparse
import json
import os
import shutil
import signal
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
    errors = []
    # Its own process group: on a timeout the trainer, the arbiter and the instances the demo
    # started go too.
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=a.seconds + OVERHEAD_S)
        sys.stderr.write(stderr[-4000:])
        print(stdout)
        if p.returncode != 0:
            errors.append(f"smore demo exited {p.returncode}: {stderr.strip()[-500:]}")
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        errors.append(f"smore demo ran past {a.seconds + OVERHEAD_S} s")
    # Whatever happened, keep what there is: the traces help most when the run failed.
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        shutil.make_archive(os.path.join(a.out, "traces"), "gztar", traces)
        if os.path.exists(os.path.join(demo_out, "summary.json")):
            shutil.copy(os.path.join(demo_out, "summary.json"),
                        os.path.join(a.out, "demo_trace_summary.json"))
    try:
        with open(os.path.join(demo_out, "summary.json")) as f:
            s = json.load(f)
        result["demo"] = {k: s.get(k) for k in ("sfd", "sfd_estimate", "dsr", "dsr_admitted",
                                                "gui_exclusive_pct", "gui_colocated_pct",
                                                "gui_gain_pp", "offered_load_pct")}
    except (OSError, ValueError) as e:
        errors.append(f"summary.json: {e}")
    try:
        result["overlap"] = analyse(traces)
    except (ValueError, SystemExit) as e:
        errors.append(f"traces: {e}")
    if errors:
        result["error"] = "; ".join(errors)
    else:
        result["pass"] = True
    emit(result)


if __name__ == "__main__":
    main()
