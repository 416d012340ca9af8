"""(d) What NVML's per-process SM utilization says about a shimmed process on a real GPU.

Driver (no torch in this process; needs pynvml, i.e. the nvidia-ml-py package):
    python3 tests/gpu/nvml_view.py --shim /path/libsmore_shim.so --shares 10,50 --seconds 6

The arbiter's watchdog and the shim's calibration both read nvmlDeviceGetProcessUtilization and
compare a function's `smUtil` with its share. This script puts numbers on that comparison: it
runs sm_share.py's workers (inference: 8 × 8192 fp16 MLP, batch 256, one synchronised request at
a time; training: 8 × 8192 bf16 MLP, AdamW) and samples NVML every 250 ms, as the arbiter does,
keeping every per-process sample inside the measured window. Runs: inference unshimmed; shimmed
at each share alone; shimmed at the first share beside the training loop; training alone.
Per run and process it reports the requests or steps per second, the mean and maximum NVML
`smUtil`, the number of samples, and the device utilization. It asserts nothing (`pass` only says
every run completed): these are measurements to read beside the share.
"""

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def sampler(stop, samples, device_util):
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    last = 0
    while not stop.is_set():
        try:
            for s in pynvml.nvmlDeviceGetProcessUtilization(h, last):
                samples.append((s.pid, s.timeStamp, s.smUtil))
                last = max(last, s.timeStamp)
        except pynvml.NVMLError as e:  # NOT_FOUND: no sample since `last`
            if "Not Found" not in str(e):
                samples.append((-1, 0, str(e)))
        try:
            device_util.append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except pynvml.NVMLError:
            pass
        stop.wait(0.25)
    pynvml.nvmlShutdown()


def run(specs, seconds, timeout):
    procs = {}
    for name, cmd, env in specs:
        procs[name] = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    for name, p in procs.items():
        if p.stdout.readline().strip() != "READY":
            for q in procs.values():
                q.kill()
            return {"error": f"{name} did not get ready: {p.stderr.read()[-1500:]}"}
    start = time.time() + 1.0
    for p in procs.values():
        p.stdin.write(f"{start} {seconds}\n")
        p.stdin.flush()
    samples, device_util, stop = [], [], threading.Event()
    time.sleep(max(0.0, start - time.time()))
    t = threading.Thread(target=sampler, args=(stop, samples, device_util), daemon=True)
    t.start()
    out = {}
    for name, p in procs.items():
        try:
            o, e = p.communicate(timeout=seconds + timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        r = common.result_of(o) or {"error": "no result line", "stderr": e[-1500:]}
        r["exit_code"] = p.returncode
        out[name] = r
    stop.set()
    t.join(timeout=5)
    lo, hi = start * 1e6, (start + seconds) * 1e6  # NVML timestamps are µs since the epoch
    for name, p in procs.items():
        mine = [u for pid, ts, u in samples if pid == p.pid and lo <= ts <= hi]
        out[name]["nvml_sm_samples"] = len(mine)
        out[name]["nvml_sm_mean"] = round(sum(mine) / len(mine), 1) if mine else None
        out[name]["nvml_sm_max"] = max(mine) if mine else None
    errors = [u for pid, _, u in samples if pid == -1]
    if errors:
        out["nvml_errors"] = errors[:5]
    out["device_util_mean"] = (round(sum(device_util) / len(device_util), 1)
                               if device_util else None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", required=True)
    ap.add_argument("--shares", default="10,50")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--timeout", type=float, default=90.0)
    a = ap.parse_args()
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sm_share.py")
    infer = [sys.executable, worker, "--worker", "infer"]
    train = [sys.executable, worker, "--worker", "train"]
    plain = common.plain_env()
    shares = [int(s) for s in a.shares.split(",")]
    shimmed = lambda s: common.shimmed_env(a.shim, SMORE_SM_SHARE=s, SMORE_LOG="warn")  # noqa: E731
    plan = [("infer_plain", [("infer", infer, plain)])]
    plan += [(f"infer_{s}", [("infer", infer, shimmed(s))]) for s in shares]
    plan += [(f"together_{shares[0]}", [("infer", infer, shimmed(shares[0])),
                                        ("train", train, plain)])]
    plan += [("train_alone", [("train", train, plain)])]
    r = {"test": "nvml_view", "seconds": a.seconds, "shares": shares, "runs": {}}
    ok = True
    for key, specs in plan:
        res = run(specs, a.seconds, a.timeout)
        r["runs"][key] = res
        ok = ok and "error" not in res and all(
            v.get("exit_code") == 0 for k, v in res.items() if isinstance(v, dict))
        common.log(f"{key}: " + ", ".join(
            f"{n} rate {v.get('rate', 0):.1f}/s NVML sm mean {v.get('nvml_sm_mean')} max "
            f"{v.get('nvml_sm_max')} ({v.get('nvml_sm_samples')} samples)"
            for n, v in res.items() if isinstance(v, dict))
            + f"; device util {res.get('device_util_mean')} %")
    r["pass"] = ok
    common.emit(r)


if __name__ == "__main__":
    main()
