"""(a) The shim's memory cap under PyTorch's caching allocator, on a real GPU.

Driver (no torch in this process):
    python3 tests/gpu/mem_cap.py --shim /path/libsmore_shim.so --cap 4GiB
runs three torch workers and prints one `RESULT {...}` line with all of them:

- `control`: no shim. The same allocation loop must pass the cap (proves the test can fail).
- `shim-default`: LD_PRELOAD shim, SMORE_MEMORY_LIMIT=cap, PyTorch's default allocator
  (cudaMalloc -> cuMemAlloc_v2 through cuGetProcAddress).
- `shim-expandable`: the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch's
  VMM path: cuMemCreate / cuMemMap).

Each worker checks, and reports pass/fail per check:
- torch.cuda.mem_get_info() reports total == cap, free <= cap;
- one tensor larger than the cap raises torch.OutOfMemoryError at once;
- 256 MiB tensors allocated until OOM: the sum stays <= cap and reaches at least the free memory
  reported at start minus two chunks (the cap is usable, not just enforced);
- torch.cuda.memory_reserved() <= cap;
- after the OOM the process goes on: a matmul runs, and after freeing, half the cap is
  allocatable again.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CHUNK = 256 << 20


def worker(cap, control):
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    dev = torch.device("cuda:0")
    torch.zeros(1, device=dev)  # creates the context (the shim charges its footprint)
    free0, total0 = torch.cuda.mem_get_info(0)
    r = {"free_at_start": free0, "total_reported": total0, "cap": cap}
    # One allocation above the cap.
    t0 = time.perf_counter()
    try:
        x = torch.empty(cap + CHUNK, dtype=torch.uint8, device=dev)
        r["over_cap_single"] = "allocated"
        del x
    except oom as e:
        r["over_cap_single"] = "oom"
        r["over_cap_message"] = str(e).splitlines()[0][:300]
    r["over_cap_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    torch.cuda.empty_cache()
    held = []
    limit = 2 * cap if control else 4 * cap  # the loop's own stop if nothing refuses
    stopped_by = "limit"
    while len(held) * CHUNK < limit:
        try:
            held.append(torch.empty(CHUNK, dtype=torch.uint8, device=dev))
        except oom:
            stopped_by = "oom"
            break
    r["allocated_until_stop"] = len(held) * CHUNK
    r["stopped_by"] = stopped_by
    r["reserved_at_stop"] = torch.cuda.memory_reserved(0)
    r["free_reported_at_stop"] = torch.cuda.mem_get_info(0)[0]
    # Still working at the cap: free one chunk, compute.
    if held:
        held.pop()
    torch.cuda.empty_cache()
    try:
        a = torch.randn(1024, 1024, device=dev)
        b = a @ a
        torch.cuda.synchronize()
        r["matmul_after_oom"] = bool(torch.isfinite(b).all().item())
        del a, b
    except Exception as e:  # noqa: BLE001 - reported
        r["matmul_after_oom"] = f"error: {e}"
    held.clear()
    torch.cuda.empty_cache()
    try:
        again = torch.empty(cap // 2, dtype=torch.uint8, device=dev)
        r["half_cap_after_free"] = "allocated"
        del again
    except oom:
        r["half_cap_after_free"] = "oom"
    checks = {}
    if control:
        checks["control_passes_the_cap"] = r["allocated_until_stop"] > cap
    else:
        checks["info_total_is_cap"] = total0 == cap
        checks["info_free_within_cap"] = free0 <= cap
        checks["over_cap_single_refused"] = r["over_cap_single"] == "oom"
        checks["stopped_by_oom"] = stopped_by == "oom"
        checks["allocated_within_cap"] = r["allocated_until_stop"] <= cap
        checks["cap_usable"] = r["allocated_until_stop"] >= free0 - 2 * CHUNK
        checks["reserved_within_cap"] = r["reserved_at_stop"] <= cap
        checks["matmul_after_oom"] = r["matmul_after_oom"] is True
        checks["half_cap_after_free"] = r["half_cap_after_free"] == "allocated"
    r["checks"] = checks
    r["pass"] = all(checks.values())
    r["torch"] = torch.__version__
    common.emit(r)


def driver(a):
    cap = common.parse_size(a.cap)
    me = os.path.abspath(__file__)
    cases = [
        ("control", common.plain_env(), True),
        ("shim-default", common.shimmed_env(a.shim, SMORE_MEMORY_LIMIT=a.cap), False),
        ("shim-expandable", common.shimmed_env(
            a.shim, SMORE_MEMORY_LIMIT=a.cap,
            PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"), False),
    ]
    out = {"test": "mem_cap", "cap": cap, "cases": {}}
    for name, env, control in cases:
        cmd = [sys.executable, me, "--worker", "--cap", a.cap] + (["--control"] if control else [])
        rc, so, se = common.run_capture(cmd, env=env, timeout=a.timeout)
        r = common.result_of(so) or {"pass": False, "error": "no result line"}
        r["exit_code"] = rc
        r["command"] = ("" if control else f"LD_PRELOAD={a.shim} SMORE_MEMORY_LIMIT={a.cap} "
                        + ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                           if "expandable" in name else "")) + " ".join(cmd)
        r["stderr_tail"] = se[-1500:]
        r["pass"] = bool(r.get("pass")) and rc == 0
        out["cases"][name] = r
        common.log(f"mem_cap {name}: pass={r['pass']} checks={r.get('checks')}")
    out["pass"] = all(c["pass"] for c in out["cases"].values())
    common.emit(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", help="path of libsmore_shim.so (driver)")
    ap.add_argument("--cap", default="4GiB")
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--control", action="store_true")
    a = ap.parse_args()
    if a.worker:
        worker(common.parse_size(a.cap), a.control)
    else:
        if not a.shim:
            ap.error("--shim is required")
        driver(a)


if __name__ == "__main__":
    main()
