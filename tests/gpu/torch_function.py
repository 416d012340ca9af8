"""A PyTorch serverless function for `smore run` (the arbiter path on a real GPU).

    smore run --function torch-fn --memory 4GiB -- python3 tests/gpu/torch_function.py --seconds 20

Serves synchronous inference requests (an 8-layer 4096-wide fp16 MLP, batch 128) for
`--seconds`, and reports in one `RESULT {...}` line: what the grant looks like from inside
(SMORE_INSTANCE, CUDA_VISIBLE_DEVICES, torch.cuda.mem_get_info), whether one tensor above the
cap is refused with torch.OutOfMemoryError, and requests completed per second (a timeline, so an
arbiter restart in the middle shows up as a gap or not).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--cap", default="4GiB", help="the cap the grant is expected to carry")
    a = ap.parse_args()
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    cap = common.parse_size(a.cap)
    dev = torch.device("cuda:0")
    torch.zeros(1, device=dev)
    free0, total0 = torch.cuda.mem_get_info(0)
    r = {"instance": os.environ.get("SMORE_INSTANCE"),
         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
         "device_name": torch.cuda.get_device_name(0),
         "free_at_start": free0, "total_reported": total0}
    try:
        x = torch.empty(cap + (256 << 20), dtype=torch.uint8, device=dev)
        r["over_cap"] = "allocated"
        del x
    except oom:
        r["over_cap"] = "oom"
    torch.cuda.empty_cache()
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev, torch.float16).eval()
    x = torch.randn(128, 4096, device=dev, dtype=torch.float16)
    start = time.time()
    buckets = [0] * int(a.seconds + 1)
    errors = 0
    while time.time() - start < a.seconds:
        try:
            with torch.no_grad():
                model(x)
            torch.cuda.synchronize()
            buckets[min(len(buckets) - 1, int(time.time() - start))] += 1
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors += 1
            r["last_error"] = str(e)[:300]
    r["requests_per_second"] = buckets[: int(a.seconds)]
    r["errors"] = errors
    r["checks"] = {"info_total_is_cap": total0 == cap, "over_cap_refused": r["over_cap"] == "oom",
                   "no_errors": errors == 0,
                   "served_every_second": all(b > 0 for b in r["requests_per_second"])}
    r["pass"] = all(r["checks"].values())
    common.emit(r)


if __name__ == "__main__":
    main()
