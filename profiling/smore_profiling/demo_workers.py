"""PyTorch stand-ins for `sim-trainer` and `sim-function`, used by `smore demo --gpu` on a real GPU.

They print exactly the lines the simulated clients print, so the demo reads both the same way:

    python3 -m smore_profiling.demo_workers trainer --model resnet50 --batch 32 --seconds 60
        -> `iter=<i> gpu_us=<y> ms=<x>` per iteration (unless --quiet), then
           `trainer iters=<n> mean_ms=<x> p50_ms=<x> p99_ms=<x> iters_per_s=<x>`
    python3 -m smore_profiling.demo_workers function --model mobilenet_v2 --batch 1 --seconds 2
        -> `function requests=<n> p50_ms=<x> p99_ms=<x> mean_ms=<x> requests_per_s=<x>`
    python3 -m smore_profiling.demo_workers function --serve --model resnet50 --batch 8
        -> loads the model, prints `ready`, then serves one request per stdin line (`<id>`),
           printing `done id=<id> service_ms=<x> admitted=<0|1>`; EOF unloads it.

Under `smore run` (SMORE_INSTANCE and SMORE_ARBITER_SOCKET set) each served request first asks
the arbiter for admission over its own connection (protocol `attach`, then `admit`; the wire
format is docs/protocol.md: 4-byte little-endian length + JSON), retrying a deferred request
every --retry-ms until --give-up-ms, and reports latencies in batches of 32.
Random weights: timing does not depend on trained weights.
"""
import argparse
import json
import os
import socket
import struct
import sys
import time

import torch

from . import models


class Arbiter:
    """Request-level admission through the arbiter (None-safe: no arbiter = always admitted)."""

    def __init__(self):
        self.sock = None
        inst, path = os.environ.get("SMORE_INSTANCE"), os.environ.get("SMORE_ARBITER_SOCKET")
        if not inst or not path:
            return
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            self.sock = s
            r = self.call({"op": "attach", "instance": int(inst)})
            if r.get("reply") != "granted":
                print(f"demo_workers: cannot attach to instance {inst}: {r}", file=sys.stderr)
                self.sock = None
        except OSError as e:
            print(f"demo_workers: arbiter unreachable ({e}); serving without admission", file=sys.stderr)
            self.sock = None

    def call(self, req):
        body = json.dumps(dict(v=1, **req)).encode()
        self.sock.sendall(struct.pack("<I", len(body)) + body)
        head = self._read(4)
        (n,) = struct.unpack("<I", head)
        return json.loads(self._read(n))

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise OSError("arbiter closed the connection")
            buf += chunk
        return buf

    def admitted(self):
        if self.sock is None:
            return True
        try:
            return bool(self.call({"op": "admit"}).get("admitted", True))
        except OSError:
            self.sock = None  # fail open
            return True

    def report(self, latencies):
        if self.sock is not None and latencies:
            try:
                self.call({"op": "report", "latencies_ms": latencies})
            except OSError:
                self.sock = None


def percentile(sorted_v, q):
    if not sorted_v:
        return float("nan")
    return sorted_v[min(len(sorted_v) - 1, int(round((len(sorted_v) - 1) * q / 100.0)))]


def build(a, training):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    m = models.build(a.model).to(dev)
    x = models.example_input(a.model, a.batch, dev)
    if training:
        m.train()
        opt = torch.optim.Adam(m.parameters(), lr=1e-4)
        loss = models.loss_fn(a.model)

        def step():
            opt.zero_grad(set_to_none=True)
            out = m(x)
            loss(out, models.example_target(a.model, out)).backward()
            opt.step()
            torch.cuda.synchronize()
    else:
        m.eval()

        @torch.no_grad()
        def step():
            m(x)
            torch.cuda.synchronize()
    for _ in range(a.warmup):
        step()
    return step


def trainer(a):
    step = build(a, training=True)
    times, start, i = [], time.perf_counter(), 0
    # An event pair around the step: its span on the GPU's timeline, from the first kernel's
    # start to the last one's end, is the busy phase `smore demo` splits requests by (the
    # simulated trainer prints the same field; docs/demo.md). The step synchronises, so the
    # pair has ended when it returns.
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while time.perf_counter() - start < a.seconds:
        t = time.perf_counter()
        begin.record()
        step()
        end.record()
        end.synchronize()
        gpu_us = begin.elapsed_time(end) * 1e3
        if a.host_ms > 0:
            time.sleep(a.host_ms / 1e3)
        ms = (time.perf_counter() - t) * 1e3
        if not a.quiet:
            print(f"iter={i} gpu_us={gpu_us:.1f} ms={ms:.3f}", flush=True)
        times.append(ms)
        i += 1
    total = time.perf_counter() - start
    s = sorted(times)
    print(f"trainer iters={len(times)} mean_ms={sum(times) / max(1, len(times)):.3f} "
          f"p50_ms={percentile(s, 50):.3f} p99_ms={percentile(s, 99):.3f} iters_per_s={len(times) / total:.3f}",
          flush=True)


def function(a):
    step = build(a, training=False)
    if a.serve:
        arb = Arbiter()
        print("ready", flush=True)
        done = []
        for line in sys.stdin:
            rid = line.strip()
            if not rid:
                continue
            t = time.perf_counter()
            ok = arb.admitted()
            while not ok and (time.perf_counter() - t) * 1e3 < a.give_up_ms:
                time.sleep(a.retry_ms / 1e3)
                ok = arb.admitted()
            if ok:
                step()
            ms = (time.perf_counter() - t) * 1e3
            print(f"done id={rid} service_ms={ms:.3f} admitted={int(ok)}", flush=True)
            if ok:
                done.append(ms)
            if len(done) >= 32:
                arb.report(done)
                done = []
        arb.report(done)
        return
    lat, start, i = [], time.perf_counter(), 0
    while time.perf_counter() - start < a.seconds:
        due = start + i * a.interval_ms / 1e3
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        t = time.perf_counter()
        step()
        lat.append((time.perf_counter() - t) * 1e3)
        i += 1
    total = time.perf_counter() - start
    s = sorted(lat)
    print(f"function requests={len(lat)} p50_ms={percentile(s, 50):.3f} p99_ms={percentile(s, 99):.3f} "
          f"mean_ms={sum(lat) / max(1, len(lat)):.3f} requests_per_s={len(lat) / total:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["trainer", "function"])
    ap.add_argument("--model", required=True, choices=sorted(models.BUILDERS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--host-ms", type=float, default=0.0, help="trainer: host time per iteration")
    ap.add_argument("--interval-ms", type=float, default=10.0, help="function: time between requests")
    ap.add_argument("--serve", action="store_true", help="function: serve requests from stdin")
    ap.add_argument("--retry-ms", type=float, default=5.0)
    ap.add_argument("--give-up-ms", type=float, default=1000.0)
    a = ap.parse_args()
    (trainer if a.role == "trainer" else function)(a)


if __name__ == "__main__":
    main()
