#!/usr/bin/env python3
"""Measure solo profiles (iteration time / P99, SM utilization, memory) on one GPU → JSONL.

    python3 profile_solo.py --gpu-type h100 --seconds 20 --out solo_h100.jsonl
    python3 make_catalog.py --measured solo_h100.jsonl > ../predictor/data/catalog.toml

Memory need = peak allocated by PyTorch + the CUDA context (measured as the nvidia-smi used
memory of the process minus torch's reservation is driver-specific, so the constant 400 MiB of
make_catalog.py is used). Configurations that run out of memory are skipped with a message.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smore_profiling import gpuinfo, models  # noqa: E402
from make_catalog import TRAIN_BATCHES, INFER_BATCHES, CONTEXT_B  # noqa: E402


def run_worker(role, model, batch, seconds, gpu):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
    cmd = [sys.executable, "-m", "smore_profiling.worker", "--role", role, "--model", model,
           "--batch", str(batch), "--seconds", str(seconds)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-type", required=True, help="catalog [[gpu]] name, e.g. h100")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--models", default=",".join(models.BUILDERS))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.out, "w") as fh:
        for name in a.models.split(","):
            for role, batches in [("training", TRAIN_BATCHES), ("inference", INFER_BATCHES)]:
                for b in batches:
                    try:
                        with gpuinfo.UtilSampler(a.gpu) as s:
                            r = run_worker(role, name, b, a.seconds, a.gpu)
                    except Exception as e:  # OOM or similar: skip, say so
                        print(f"skip {name} {role} b{b}: {e}", file=sys.stderr)
                        continue
                    rec = dict(model=name, gpu=a.gpu_type, role=role, batch=b, latency_ms=r["metric_ms"],
                               sm_util=min(1.0, s.mean()), memory_bytes=r["peak_memory_bytes"] + CONTEXT_B)
                    fh.write(json.dumps(rec) + "\n")
                    fh.flush()
                    print(rec, file=sys.stderr)


if __name__ == "__main__":
    main()
