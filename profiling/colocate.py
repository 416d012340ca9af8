#!/usr/bin/env python3
"""Measure pair-wise co-location degradation on one GPU → the predictor's CSV (source=measured).

    python3 colocate.py --gpu-type h100 --seconds 20 --out colo_h100.csv [--pairs 200 --seed 1]

For each (training config, function config[, concurrency c]) the harness runs the trainer alone
and the function alone (solo; cached per config), then both concurrently (the trainer and c
function processes, started together with a shared --start-at so the windows overlap), and writes
δ = (P_colo − P_solo)/P_solo: mean iteration time for the trainer, P99 latency for the function
(the worst P99 of the c processes). Device name and driver come from nvidia-smi.
"""
import argparse
import csv
import datetime
import itertools
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from smore_profiling import gpuinfo, models  # noqa: E402
from make_catalog import TRAIN_BATCHES, INFER_BATCHES  # noqa: E402

HEADER = ["train_model", "train_batch", "fn_model", "fn_batch", "concurrency", "deg_train", "deg_fn",
          "device", "driver", "date", "source"]


def spawn(role, model, batch, seconds, start_at, gpu):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
    cmd = [sys.executable, "-m", "smore_profiling.worker", "--role", role, "--model", model, "--batch", str(batch),
           "--seconds", str(seconds), "--start-at", str(start_at)]
    return subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(p):
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
    return json.loads(out.strip().splitlines()[-1])["metric_ms"]


def run_together(jobs, seconds, gpu, settle=20.0):
    """jobs: [(role, model, batch)]; `settle` seconds let every process load and warm up first."""
    start = time.time() + settle
    procs = [spawn(r, m, b, seconds, start, gpu) for r, m, b in jobs]
    return [collect(p) for p in procs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-type", required=True, help="name written to the device column, e.g. h100")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--pairs", type=int, default=0, help="random subset of pairs (0 = all)")
    ap.add_argument("--concurrency", default="1", help="comma list, e.g. 1,2,4")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    name, driver = gpuinfo.device_and_driver(a.gpu)
    trains = list(itertools.product(models.BUILDERS, TRAIN_BATCHES))
    fns = list(itertools.product(models.BUILDERS, INFER_BATCHES))
    combos = [(t, f, int(c)) for t in trains for f in fns for c in a.concurrency.split(",")]
    random.Random(a.seed).shuffle(combos)
    if a.pairs:
        combos = combos[: a.pairs]
    solo = {}

    def solo_ms(role, m, b):
        if (role, m, b) not in solo:
            solo[(role, m, b)] = run_together([(role, m, b)], a.seconds, a.gpu)[0]
        return solo[(role, m, b)]

    new = not os.path.exists(a.out)
    with open(a.out, "a", newline="") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(HEADER)
        for (tm, tb), (fm, fb), c in combos:
            try:
                st, sf = solo_ms("training", tm, tb), solo_ms("inference", fm, fb)
                res = run_together([("training", tm, tb)] + [("inference", fm, fb)] * c, a.seconds, a.gpu)
            except Exception as e:
                print(f"skip {tm}:{tb} + {c}x {fm}:{fb}: {e}", file=sys.stderr)
                continue
            dt, df = (res[0] - st) / st, (max(res[1:]) - sf) / sf
            w.writerow([tm, tb, fm, fb, c, f"{dt:.6f}", f"{df:.6f}", f"{a.gpu_type} ({name})", driver,
                        datetime.date.today().isoformat(), "measured"])
            fh.flush()
            print(f"{tm}:{tb} + {c}x {fm}:{fb}: train {dt:+.3f} fn {df:+.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
