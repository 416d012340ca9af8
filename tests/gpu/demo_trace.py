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

Beside the demo it polls `smore status --json` of the demo's arbiter every 0.5 s (docs/cli.md):
what holds the functions on that GPU (docs/harvest.md, "Timing noise"). The RESULT's `status`
says, per function, the requests its shims reported, request admission's paced refusals, the
time it waited for turns and was held by its shim (share, collision budget, backlog), its
timing-noise allowance, and its collision time per request against its GPU
time per request (the last figures seen); and how often the arbiter read the trainer's phase,
with the busy and idle lengths it read. The timeline goes to `--out` as `status.jsonl.gz`.

`--mps` runs the demo under an MPS control daemon this script starts (its pipe and log folders
in the workdir) and quits afterwards: the first real-GPU check of what the simulated MPS model
says (docs/harvest.md). The RESULT then says how the arbiter read the GPU's sharing (`sharing`
in status, from NVML's MPS client list) and whether it found the trainer. `--demo-arg` passes
one more argument to `smore demo` (repeat it: `--demo-arg=--defer --demo-arg=off`); `--label`
prefixes the files written to `--out`, so that two runs can share one folder.

    python3 tests/gpu/demo_trace.py --smore target-gpu/release/smore --workdir /tmp/w --out /tmp/res
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, log  # noqa: E402
from trace_overlap import analyse  # noqa: E402

# How often the status is polled: s.
POLL_S = 0.5


def poll_status(smore, root, stop, timeline):
    """Appends `(seconds since start, status json)` of every arbiter socket under `root` to
    `timeline` every POLL_S until `stop` is set."""
    t0 = time.time()
    while not stop.wait(POLL_S):
        for sock in glob.glob(os.path.join(root, "**", "arbiter.sock"), recursive=True):
            env = dict(os.environ, SMORE_ARBITER_SOCKET=sock)
            try:
                r = subprocess.run([smore, "status", "--json"], env=env, capture_output=True,
                                   text=True, timeout=2)
                timeline.append((round(time.time() - t0, 2), json.loads(r.stdout)))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass  # the arbiter is not up yet, or gone


def summarise_status(timeline):
    """What the timeline says of GPU 0: per function (by instance id) its last figures, and the
    trainer phase the arbiter read."""
    fns, phases, sharing, trainers = {}, [], {}, 0
    for _, st in timeline:
        gpus = st.get("gpus") or []
        if not gpus:
            continue
        g = gpus[0]
        if g.get("sharing"):
            sharing[g["sharing"]] = sharing.get(g["sharing"], 0) + 1
        trainers = max(trainers, len(g.get("training") or []))
        phases.append((g.get("harvest") or {}).get("trainer_phase"))
        for f in g.get("functions") or []:
            rec = fns.setdefault(str(f.get("id")), {"function": f.get("function")})
            for k in ("requests", "paced_refusals", "refusals", "timing_noise"):
                if f.get(k) is not None:
                    rec[k] = f[k]
            for k, out in (("turn_waited_ns", "turn_waited_ms"),
                           ("throttled_ns", "held_ms"),
                           ("collision_per_request_ns", "collision_per_request_ms"),
                           ("gpu_per_request_ns", "gpu_per_request_ms")):
                if f.get(k) is not None:
                    rec[out] = round(f[k] / 1e6, 3)
    read = [p for p in phases if p]
    span = lambda key: [min(p[key] for p in read), max(p[key] for p in read)] if read else None
    return {"polls": len(phases), "sharing": sharing, "training_seen": trainers,
            "phase": {"predicted": len(read),
                      "busy": sum(1 for p in read if p.get("now") == "busy"),
                      "idle": sum(1 for p in read if p.get("now") == "idle"),
                      "busy_ms": span("busy_ms"), "idle_ms": span("idle_ms")},
            "functions": fns}


def start_mps(workdir, env):
    """Starts an MPS control daemon whose pipe and log folders are under `workdir`, and points
    `env` (the demo's environment) at it. Returns an error message, or None."""
    pipe, logs = os.path.join(workdir, "mps-pipe"), os.path.join(workdir, "mps-log")
    os.makedirs(pipe, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"] = pipe, logs
    try:
        r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True,
                           text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"could not start nvidia-cuda-mps-control: {e}"
    if r.returncode != 0:
        return f"nvidia-cuda-mps-control -d exited {r.returncode}: {r.stderr.strip()[-300:]}"
    log(f"MPS control daemon started (pipe {pipe})")
    return None


def stop_mps(env):
    """Quits the MPS control daemon `start_mps` started, and prints the tail of its log."""
    try:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True,
                       capture_output=True, timeout=30)
        with open(os.path.join(env["CUDA_MPS_LOG_DIRECTORY"], "control.log")) as f:
            log("MPS control log (tail): " + " | ".join(f.read().splitlines()[-8:]))
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"MPS quit: {e}")


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
    ap.add_argument("--mps", action="store_true",
                    help="run the demo under an MPS control daemon started (and quit) here")
    ap.add_argument("--demo-arg", action="append", default=[],
                    help="one more argument for `smore demo` (repeatable)")
    ap.add_argument("--label", default="", help="prefix of the files written to --out")
    a = ap.parse_args()
    traces = os.path.join(a.workdir, "traces")
    demo_out = os.path.join(a.workdir, "demo")
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(traces)
    env = dict(os.environ, SMORE_TRACE_SAMPLES=os.path.join(traces, "samples-{pid}.txt"))
    cmd = [a.smore, "demo", "--scenario", a.scenario, "--seconds", str(a.seconds),
           "--out", demo_out] + ([] if a.sim else ["--gpu"]) + a.demo_arg
    log(" ".join(cmd))
    result = {"test": "demo_trace", "label": a.label, "pass": False,
              "command": " ".join(cmd), "simulated": a.sim, "mps": a.mps}
    errors = []
    if a.mps:
        err = start_mps(a.workdir, env)
        if err:
            errors.append(err)
            result["error"] = err
            emit(result)
            return
    # Its own process group: on a timeout the trainer, the arbiter and the instances the demo
    # started go too.
    stop, timeline = threading.Event(), []
    # The MPS daemon is quit whatever happens here: left running, it would make every later
    # CUDA process on the machine an MPS client.
    try:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        poller = threading.Thread(target=poll_status, args=(a.smore, demo_out, stop, timeline),
                                  daemon=True)
        poller.start()
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
        stop.set()
        poller.join(timeout=5)
    except OSError as e:
        errors.append(f"could not run smore demo: {e}")
    finally:
        stop.set()
        if a.mps:
            stop_mps(env)
    result["status"] = summarise_status(timeline)
    # Whatever happened, keep what there is: the traces help most when the run failed.
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        pre = f"{a.label}_" if a.label else ""
        shutil.make_archive(os.path.join(a.out, pre + "traces"), "gztar", traces)
        with gzip.open(os.path.join(a.out, pre + "status.jsonl.gz"), "wt") as f:
            for t, st in timeline:
                f.write(json.dumps({"t": t, "status": st}) + "\n")
        if os.path.exists(os.path.join(demo_out, "summary.json")):
            shutil.copy(os.path.join(demo_out, "summary.json"),
                        os.path.join(a.out, pre + "demo_trace_summary.json"))
    try:
        with open(os.path.join(demo_out, "summary.json")) as f:
            s = json.load(f)
        result["demo"] = {k: s.get(k) for k in ("sfd", "sfd_estimate", "dsr", "dsr_admitted",
                                                "sfd_against_after", "trainer_iter_alone_ms",
                                                "trainer_iter_alone_after_ms",
                                                "trainer_iter_colocated_ms",
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
