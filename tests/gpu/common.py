"""Helpers shared by the real-GPU scripts: sizes, result lines, timing, nvidia-smi facts.

Every script prints its result as one line `RESULT <json>` on stdout (anything else it prints is
log). Nothing here imports torch: the drivers run without it and start torch workers as
subprocesses, each with its own environment (shimmed or not).
"""

import json
import os
import re
import subprocess
import sys
import time

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text):
    """`4GiB`, `512MiB`, `1.5GB` or bytes -> bytes (the smore_protocol::size syntax)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"bad size {text!r}: expected e.g. 512MiB or 4GiB")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def pct(xs, q):
    """The `q` quantile (0..1) of `xs` by rank (None when empty)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def stats_us(durs_ns):
    """n, p50/p90/p99 and mean of durations in ns, as µs."""
    us = [d / 1e3 for d in durs_ns]
    if not us:
        return {"n": 0}
    return {"n": len(us), "p50_us": round(pct(us, 0.5), 1), "p90_us": round(pct(us, 0.9), 1),
            "p99_us": round(pct(us, 0.99), 1), "mean_us": round(sum(us) / len(us), 1)}


def emit(obj):
    """Prints the result line the drivers parse."""
    sys.stdout.write("RESULT " + json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def log(msg):
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def result_of(text):
    """The last `RESULT {...}` line of a process's output, parsed (None if there is none)."""
    found = None
    for line in text.splitlines():
        if line.startswith("RESULT "):
            found = json.loads(line[len("RESULT "):])
    return found


def run_capture(cmd, env=None, timeout=300, stdin_text=None):
    """Runs `cmd`; returns (exit code, stdout, stderr). A timeout is exit code 124."""
    log("$ " + " ".join(cmd))
    try:
        p = subprocess.run(cmd, env=env, input=stdin_text, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err


def nvidia_smi():
    """GPU name, driver version, memory of GPU 0 as nvidia-smi reports them."""
    q = "name,driver_version,memory.total,uuid"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        name, driver, mem, uuid = [x.strip() for x in out.splitlines()[0].split(",")]
        return {"gpu": name, "driver": driver, "memory": mem, "uuid": uuid}
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return {"gpu": "unknown", "driver": "unknown", "error": str(e)}


def shimmed_env(shim, **extra):
    """The environment of a process under the shim (standalone contract), plus `extra`."""
    env = dict(os.environ)
    old = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = shim + (":" + old if old else "")
    env.setdefault("SMORE_LOG", "info")
    env["PYTHONUNBUFFERED"] = "1"
    for k, v in extra.items():
        env[k] = str(v)
    return env


def plain_env(**extra):
    """The environment of an unshimmed process (LD_PRELOAD and SMORE_* removed)."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("SMORE_")}
    env["PYTHONUNBUFFERED"] = "1"
    for k, v in extra.items():
        env[k] = str(v)
    return env
