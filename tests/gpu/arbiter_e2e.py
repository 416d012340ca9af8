"""(c) The arbiter path on a real GPU: `smore arbiter` with the real NVML, an unshimmed PyTorch
training loop, and a PyTorch function under `smore run`; the arbiter is SIGKILLed and restarted
while the function runs.

    python3 tests/gpu/arbiter_e2e.py --smore /path/smore --workdir /tmp/smore-gpu

(`smore run` finds libsmore_shim.so next to the `smore` binary, or pass --shim.) Prints one
`RESULT {...}` line with every status snapshot summary it took and these checks:

- discovery: `smore status --json` lists the GPU nvidia-smi shows (by UUID);
- training: the unshimmed training process is listed as training on GPU 0;
- admission: the function is admitted with the requested cap; its share is < 100 % while
  training runs (fit policy, θ_train = 0.10);
- from inside: torch sees total memory == cap and an over-cap tensor raises OutOfMemoryError;
- metrics: GET /metrics answers with smore_ series;
- restart: after SIGKILL + restart the function is listed once, same id, re-attached;
- the function served requests every second through the restart and exited 0;
- release: after it exits the arbiter lists no function.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def status(smore, sock):
    p = subprocess.run([smore, "status", "--json", "--socket", sock], capture_output=True,
                       text=True, timeout=20)
    if p.returncode != 0:
        raise RuntimeError(f"smore status failed ({p.returncode}): {p.stderr[-1000:]}")
    return json.loads(p.stdout)


def functions(snap):
    return [f for g in snap.get("gpus", []) for f in g.get("functions", [])]


def wait_for(what, f, limit=20.0):
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            v = f()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - retried until the limit
            last = e
        time.sleep(0.2)
    common.log(f"timed out waiting for {what}")
    return None


def start_arbiter(smore, cfg, sock, log_path):
    log = open(log_path, "a")
    log.write(f"\n==== start {time.strftime('%H:%M:%S')} ====\n")
    log.flush()
    p = subprocess.Popen([smore, "arbiter", "--config", cfg], stdout=log, stderr=log,
                         env=common.plain_env(RUST_LOG="info"))

    def up():
        if p.poll() is not None:
            raise SystemExit(f"arbiter exited with {p.returncode}")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
            return True
        finally:
            s.close()
    try:
        ok = wait_for("the arbiter socket", up)
    except SystemExit as e:
        ok = False
        common.log(str(e))
    if not ok:
        if p.poll() is None:
            p.kill()
        tail = open(log_path).read()[-1500:]
        raise RuntimeError(f"arbiter did not start; log tail: {tail}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smore", required=True)
    ap.add_argument("--shim", help="libsmore_shim.so (default: next to smore)")
    ap.add_argument("--workdir", default="/tmp/smore-gpu")
    ap.add_argument("--memory", default="4GiB")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--watchdog-action", choices=["log", "sigterm", "sigkill"],
                    help="[watchdog] action for this run (default: the arbiter's, sigterm); "
                         "log keeps a function the watchdog would stop running, to see why")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    sock = os.path.join(a.workdir, "arbiter.sock")
    cfg = os.path.join(a.workdir, "node.toml")
    arb_log = os.path.join(a.workdir, "arbiter.log")
    with open(cfg, "w") as f:
        f.write(f'[arbiter]\nsocket = "{sock}"\nstate_dir = "{a.workdir}/state"\n'
                'metrics_addr = "127.0.0.1:9464"\nreconcile_ms = 250\n'
                '[policy]\nname = "fit"\n')
        if a.watchdog_action:
            f.write(f'[watchdog]\naction = "{a.watchdog_action}"\n')
    r = {"test": "arbiter_e2e", "config": open(cfg).read(), "checks": {}, "snapshots": {}}
    checks = r["checks"]
    smi = common.nvidia_smi()
    arb = train = fn = None
    try:
        arb = start_arbiter(a.smore, cfg, sock, arb_log)
        snap = status(a.smore, sock)
        gpus = [(g.get("index"), g.get("uuid"), g.get("name")) for g in snap.get("gpus", [])]
        r["snapshots"]["start"] = {"gpus": gpus}
        checks["discovers_the_gpu"] = any(u == smi.get("uuid") for _, u, _ in gpus)

        train_cmd = [sys.executable, os.path.join(HERE, "sm_share.py"), "--worker", "train"]
        train = subprocess.Popen(train_cmd, env=common.plain_env(), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if train.stdout.readline().strip() != "READY":
            raise RuntimeError("the training loop did not start")
        train.stdin.write(f"{time.time()} {a.seconds + 40}\n")
        train.stdin.flush()
        seen = wait_for("training on GPU 0", lambda: [
            t for g in status(a.smore, sock)["gpus"] for t in g.get("training", [])])
        r["snapshots"]["training"] = seen
        checks["training_detected"] = bool(seen)

        fn_cmd = [a.smore, "run", "--function", "torch-fn", "--memory", a.memory, "--slo", "100",
                  "--socket", sock]
        if a.shim:
            fn_cmd += ["--shim", a.shim]
        fn_cmd += ["--", sys.executable, os.path.join(HERE, "torch_function.py"),
                   "--seconds", str(a.seconds), "--cap", a.memory]
        r["function_command"] = " ".join(fn_cmd)
        common.log("$ " + r["function_command"])
        fn = subprocess.Popen(fn_cmd, env=common.plain_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        t_fn = time.time()
        listed = wait_for("the function admitted", lambda: functions(status(a.smore, sock)))
        f0 = listed[0] if listed else {}
        r["snapshots"]["admitted"] = f0
        checks["admitted_with_the_cap"] = f0.get("cap") == common.parse_size(a.memory)
        # Beside training a function is held either by a share below 100 % or, in harvest mode
        # (the default), by a collision budget below the whole GPU with the share left at 100 %
        # (docs/harvest.md). The budget is set at the first reconcile that knows the training
        # job's use: wait for it, up to 5 s.
        def limited(f):
            return (f.get("share") or 100) < 100 or 0 < (f.get("contention_ppm") or 0) < 1_000_000
        held = wait_for("the function held beside training", lambda: [
            f for f in functions(status(a.smore, sock)) if limited(f)], 5.0)
        checks["limited_beside_training"] = bool(held)
        if held:
            r["snapshots"]["limited"] = {k: held[0].get(k) for k in ("share", "contention_ppm")}
        timeline = r["timeline"] = []
        stop_sampling = threading.Event()

        def sample():
            # What the arbiter sees twice a second: the function's share, its NVML SM use and
            # the GPU time its shim reports, beside the training job's NVML use.
            while not stop_sampling.is_set():
                try:
                    snap = status(a.smore, sock)
                    g = (snap.get("gpus") or [{}])[0]
                    timeline.append({"t": round(time.time() - t_fn, 2),
                                     "gpu": {k: v for k, v in g.items() if k != "functions"},
                                     "functions": functions(snap)})
                except Exception as e:  # noqa: BLE001 - the arbiter is down (restart)
                    timeline.append({"t": round(time.time() - t_fn, 2), "error": repr(e)[:200]})
                stop_sampling.wait(0.5)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            body = urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=5).read()
            lines = [l for l in body.decode().splitlines() if l.startswith("smore_")]
            r["metrics_sample"] = lines[:40]
            checks["metrics_served"] = bool(lines)
        except Exception as e:  # noqa: BLE001 - a failed check
            r["metrics_error"] = str(e)
            checks["metrics_served"] = False

        time.sleep(max(0.0, 8.0 - (time.time() - t_fn)))
        arb.send_signal(signal.SIGKILL)
        arb.wait()
        r["killed_at_s"] = round(time.time() - t_fn, 2)
        time.sleep(1.0)
        arb = start_arbiter(a.smore, cfg, sock, arb_log)
        back = wait_for("the function re-attached", lambda: [
            f for f in functions(status(a.smore, sock)) if f.get("attached")])
        after = functions(status(a.smore, sock))
        r["snapshots"]["after_restart"] = after
        r["reattached_at_s"] = round(time.time() - t_fn, 2)
        checks["reattached_same_id_once"] = (bool(back) and len(after) == 1
                                             and after[0].get("id") == f0.get("id"))

        out, err = fn.communicate(timeout=a.seconds + 120)
        fr = common.result_of(out) or {"error": "no result line"}
        fr["exit_code"] = fn.returncode
        fr["stderr_tail"] = err[-3000:]
        r["function"] = fr
        stop_sampling.set()
        checks["function_exit_0"] = fn.returncode == 0
        for k, v in (fr.get("checks") or {}).items():
            checks["function_" + k] = v
        gone = wait_for("the grant released", lambda: not functions(status(a.smore, sock)) or None)
        checks["released_at_exit"] = bool(gone)
    except Exception as e:  # noqa: BLE001 - the result says what broke
        r["error"] = repr(e)
    finally:
        for p in (fn, train):
            if p and p.poll() is None:
                p.kill()
        if arb is not None and arb.poll() is None:
            arb.send_signal(signal.SIGTERM)
            try:
                arb.wait(timeout=10)
            except subprocess.TimeoutExpired:
                arb.kill()
    r["arbiter_log"] = arb_log
    r["pass"] = "error" not in r and bool(checks) and all(checks.values())
    common.emit(r)


if __name__ == "__main__":
    main()
