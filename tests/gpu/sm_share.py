"""(b) SM share on a real GPU: a shimmed PyTorch inference loop beside an unshimmed PyTorch
training loop.

Driver (no torch in this process):
    python3 tests/gpu/sm_share.py --shim /path/libsmore_shim.so --shares 10,25,50,75 --seconds 10
prints one `RESULT {...}` line. Runs, each a fresh set of processes measured over the same
window (workers warm up, say READY, and all start at one wall-clock instant the driver sends):

1. training alone (unshimmed)                      -> train_solo (steps/s)
2. inference alone, unshimmed                      -> infer_solo (requests/s)
3. for each share s: inference alone, shimmed with SMORE_SM_SHARE=s -> infer_alone[s]
4. for each share s: shimmed inference (s) + unshimmed training at once
                                                   -> infer_with_train[s], train_with[s]

Figures: inference fraction = infer / infer_solo (the share delivered, since the inference loop
alone keeps the GPU busy); training slowdown = train_solo / train_with - 1. The script asserts
nothing about the numbers (they are measurements); `pass` only says every run completed.

Inference: an 8-layer 8192-wide fp16 MLP, batch 256, one synchronised request at a time
(latency p50/p99 reported). Training: an 8-layer 8192-wide bf16 MLP, batch 1024, AdamW,
synchronised every step (so the count in the window is exact).
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WIDTH = 8192
LAYERS = 8


def worker(role):
    import torch

    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    if role == "infer":
        dtype, batch = torch.float16, 256
    else:
        dtype, batch = torch.bfloat16, 1024
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev, dtype)
    x = torch.randn(batch, WIDTH, device=dev, dtype=dtype)
    if role == "infer":
        model.eval()

        def step():
            with torch.no_grad():
                model(x)
            torch.cuda.synchronize()
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        target = torch.randn(batch, WIDTH, device=dev, dtype=dtype)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
    for _ in range(5):
        step()
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    start, seconds = sys.stdin.readline().split()
    start, seconds = float(start), float(seconds)
    while time.time() < start:
        time.sleep(min(0.01, max(0.0, start - time.time())))
    end = start + seconds
    lat = []
    n = 0
    while True:
        t0 = time.perf_counter()
        step()
        now = time.time()
        if now > end:
            break
        lat.append(time.perf_counter() - t0)
        n += 1
    lat.sort()
    pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3, 3) if lat else None  # noqa: E731
    common.emit({"role": role, "count": n, "seconds": seconds, "rate": n / seconds,
                 "p50_ms": pick(0.5), "p99_ms": pick(0.99),
                 "shim": "LD_PRELOAD" in os.environ and "smore" in os.environ["LD_PRELOAD"],
                 "share_env": os.environ.get("SMORE_SM_SHARE")})


def run_together(specs, seconds, timeout):
    """Starts every (name, cmd, env) worker, waits for all READY, starts them at one instant,
    returns {name: result}."""
    procs = {}
    for name, cmd, env in specs:
        common.log(f"start {name}: {' '.join(cmd)} (SMORE_SM_SHARE={env.get('SMORE_SM_SHARE')},"
                   f" shim={'LD_PRELOAD' in env})")
        procs[name] = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    for name, p in procs.items():
        line = p.stdout.readline()
        if line.strip() != "READY":
            for q in procs.values():
                q.kill()
            err = p.stderr.read()[-2000:]
            return {n: {"error": f"{name} did not get ready: {line!r} {err}", "exit_code": -1}
                    for n in procs}
    start = time.time() + 1.0
    for p in procs.values():
        p.stdin.write(f"{start} {seconds}\n")
        p.stdin.flush()
    results = {}
    for name, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(5, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        r = common.result_of(out) or {"error": "no result line", "stderr": err[-2000:]}
        r["exit_code"] = p.returncode
        results[name] = r
    return results


def driver(a):
    me = os.path.abspath(__file__)
    infer = [sys.executable, me, "--worker", "infer"]
    train = [sys.executable, me, "--worker", "train"]
    plain = common.plain_env()
    shares = [int(s) for s in a.shares.split(",")]
    shim_cmd = lambda s: (f"LD_PRELOAD={a.shim} SMORE_SM_SHARE={s} "  # noqa: E731
                          + " ".join(infer))
    out = {"test": "sm_share", "seconds": a.seconds, "shares": shares,
           "commands": {"train": " ".join(train), "infer_plain": " ".join(infer),
                        "infer_shimmed": shim_cmd("<share>")},
           "runs": {}}
    ok = True

    def record(key, res):
        nonlocal ok
        out["runs"][key] = res
        for r in res.values():
            ok = ok and r.get("exit_code") == 0 and "rate" in r
        common.log(f"{key}: " + json.dumps({k: round(v.get('rate', -1), 2)
                                           for k, v in res.items()}))

    record("train_solo", run_together([("train", train, plain)], a.seconds, a.timeout))
    record("infer_solo", run_together([("infer", infer, plain)], a.seconds, a.timeout))
    for s in shares:
        env = common.shimmed_env(a.shim, SMORE_SM_SHARE=s, SMORE_LOG="warn")
        record(f"infer_alone_{s}", run_together([("infer", infer, env)], a.seconds, a.timeout))
        record(f"together_{s}", run_together(
            [("infer", infer, env), ("train", train, plain)], a.seconds, a.timeout))
    rows = []
    try:
        t_solo = out["runs"]["train_solo"]["train"]["rate"]
        i_solo = out["runs"]["infer_solo"]["infer"]["rate"]
        for s in shares:
            alone = out["runs"][f"infer_alone_{s}"]["infer"]
            tog = out["runs"][f"together_{s}"]
            rows.append({
                "share": s,
                "infer_alone_rps": round(alone["rate"], 2),
                "infer_alone_fraction": round(alone["rate"] / i_solo, 4),
                "infer_with_train_rps": round(tog["infer"]["rate"], 2),
                "infer_with_train_fraction": round(tog["infer"]["rate"] / i_solo, 4),
                "infer_with_train_p99_ms": tog["infer"].get("p99_ms"),
                "train_with_sps": round(tog["train"]["rate"], 3),
                "train_slowdown": round(t_solo / tog["train"]["rate"] - 1, 4),
            })
        out["train_solo_sps"] = round(t_solo, 3)
        out["infer_solo_rps"] = round(i_solo, 2)
    except (KeyError, ZeroDivisionError) as e:
        ok = False
        out["error"] = f"incomplete runs: {e!r}"
    out["table"] = rows
    out["pass"] = ok
    common.emit(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", help="path of libsmore_shim.so (driver)")
    ap.add_argument("--shares", default="10,25,50,75")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--timeout", type=int, default=120, help="per run, seconds")
    ap.add_argument("--worker", choices=["infer", "train"])
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
    else:
        if not a.shim:
            ap.error("--shim is required")
        driver(a)


if __name__ == "__main__":
    main()
