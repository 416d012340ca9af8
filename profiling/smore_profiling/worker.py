"""One measured workload process: a training loop or an inference request loop on one GPU.

    python3 -m smore_profiling.worker --role training --model resnet50 --batch 32 --seconds 60
    python3 -m smore_profiling.worker --role inference --model mobilenet_v2 --batch 1 --seconds 60

Warms up, then (optionally) waits for --start-at (a UNIX time shared by co-located workers so the
measured windows overlap), runs for --seconds and prints one JSON line: training → mean iteration
time (ms); inference → P99 request latency (ms); plus peak memory. Each iteration/request is
synchronised (torch.cuda.synchronize) so times are GPU completion times.
"""
import argparse
import json
import time

import torch

from . import models


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["training", "inference"], required=True)
    ap.add_argument("--model", required=True, choices=sorted(models.BUILDERS))
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--start-at", type=float, default=0.0)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    m = models.build(a.model).to(dev)
    x = models.example_input(a.model, a.batch, dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if a.role == "training":
        m.train()
        opt = torch.optim.Adam(m.parameters(), lr=1e-4)
        loss = models.loss_fn(a.model)

        def step():
            opt.zero_grad(set_to_none=True)
            out = m(x)
            loss(out, models.example_target(a.model, out)).backward()
            opt.step()
    else:
        m.eval()

        @torch.no_grad()
        def step():
            m(x)
    for _ in range(a.warmup):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    while time.time() < a.start_at:
        time.sleep(0.001)
    times, end = [], time.time() + a.seconds
    while time.time() < end:
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    print(json.dumps(dict(role=a.role, model=a.model, batch=a.batch, samples=len(times),
                          metric_ms=mean if a.role == "training" else p99, mean_ms=mean, p99_ms=p99,
                          peak_memory_bytes=peak)), flush=True)


if __name__ == "__main__":
    main()
