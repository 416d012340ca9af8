#!/usr/bin/env bash
# Runs the real-GPU checks of smore and writes results.json, results.md and run.log to $OUT.
#
#   tests/gpu/run_all.sh [all|mem|share|nvml|switch|jitter|arbiter ...] [trace] [mps]
# (`trace`, the demo with every function's sample trace, and `mps`, the same under an MPS control
# daemon, run only when named.)
#
# Needs: an NVIDIA GPU with its driver, nvidia-smi, python3 with torch (CUDA), and the release
# binaries built elsewhere (no cargo needed here): $SMORE_BIN_DIR/smore and
# $SMORE_BIN_DIR/libsmore_shim.so (default: target-gpu/release under the repo root). Each step
# is a Python script under tests/gpu/ that prints one RESULT line; see docs/real-gpu.md.
# Environment: OUT (default ./gpu-results), SMORE_GPU_SECONDS (window per SM-share run, 8),
# SMORE_GPU_SHARES (10,25,50,75), SMORE_GPU_CAP (4GiB), SMORE_GPU_SWITCH_SECONDS (window per
# condition of switch_cost.py and wait_jitter.py, 4), SMORE_GPU_TRACE_SECONDS (replay of
# demo_trace.py's `smore demo --gpu`, 30).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/gpu"
BIN="${SMORE_BIN_DIR:-$ROOT/target-gpu/release}"
OUT="${OUT:-$ROOT/gpu-results}"
SECS="${SMORE_GPU_SECONDS:-8}"
SHARES="${SMORE_GPU_SHARES:-10,25,50,75}"
CAP="${SMORE_GPU_CAP:-4GiB}"
WORK="$(mktemp -d /tmp/smore-gpu.XXXXXX)"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(all)
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

SMORE="$BIN/smore"
SHIM="$BIN/libsmore_shim.so"
for f in "$SMORE" "$SHIM"; do
  if [ ! -e "$f" ]; then
    echo "missing $f: build with 'CARGO_TARGET_DIR=target-gpu cargo build --release -p smore-cli -p smore-shim', strip --strip-debug both, and carry target-gpu/release/{smore,libsmore_shim.so} (or set SMORE_BIN_DIR); see docs/real-gpu.md" >&2
    exit 2
  fi
done
chmod +x "$SMORE" 2>/dev/null || true
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

echo "== smore real-GPU run, $(date -u +%FT%TZ), steps: ${STEPS[*]}"
nvidia-smi || { echo "nvidia-smi failed: no GPU here?" >&2; exit 3; }
"$SMORE" --version || true

# Facts for the report.
"$PY" - "$WORK/meta.json" "$0 ${STEPS[*]}" <<'PYEOF'
import json, platform, subprocess, sys, time
meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "command": sys.argv[2],
        "uname": " ".join(platform.uname()[:3])}
try:
    q = "name,driver_version,memory.total,uuid"
    line = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.splitlines()[0]
    meta.update(dict(zip(["gpu", "driver", "memory", "uuid"], [x.strip() for x in line.split(",")])))
except Exception as e:
    meta["nvidia_smi_error"] = str(e)
try:
    import torch
    meta["torch"] = torch.__version__
except Exception as e:
    meta["torch"] = f"not importable: {e}"
try:
    meta["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip() or "unknown"
except Exception:
    meta["commit"] = "unknown"
json.dump(meta, open(sys.argv[1], "w"), indent=2)
print(json.dumps(meta))
PYEOF

want() { for s in "${STEPS[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1; }
only() { for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# step NAME TIMEOUT CMD...: runs CMD, keeps its RESULT line as $WORK/NAME.json.
step() {
  local name="$1" limit="$2"; shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" > "$WORK/$name.out"
  local rc=$?
  cat "$WORK/$name.out"
  local line
  line="$(grep '^RESULT ' "$WORK/$name.out" | tail -n 1 | cut -c8-)"
  if [ -n "$line" ]; then
    printf '%s\n' "$line" > "$WORK/$name.json"
  else
    printf '{"test": "%s", "pass": false, "error": "exit code %s, no RESULT line"}\n' "$name" "$rc" > "$WORK/$name.json"
  fi
  RESULTS+=("$WORK/$name.json")
}

RESULTS=()
want mem && step mem_cap 300 "$PY" "$HERE/mem_cap.py" --shim "$SHIM" --cap "$CAP"
want share && step sm_share 540 "$PY" "$HERE/sm_share.py" --shim "$SHIM" --shares "$SHARES" --seconds "$SECS"
want nvml && step nvml_view 240 "$PY" "$HERE/nvml_view.py" --shim "$SHIM" --shares "${SHARES%%,*},50" --seconds "$SECS"
want switch && step switch_cost 150 "$PY" "$HERE/switch_cost.py" --seconds "${SMORE_GPU_SWITCH_SECONDS:-4}"
want jitter && step wait_jitter 240 "$PY" "$HERE/wait_jitter.py" --seconds "${SMORE_GPU_SWITCH_SECONDS:-4}"
want arbiter && step arbiter_e2e 240 "$PY" "$HERE/arbiter_e2e.py" --smore "$SMORE" --shim "$SHIM" --workdir "$WORK/arbiter" --memory "$CAP"
# Not part of `all` (a demo of its own, ~80-100 s at 30 s of replay): ask for `trace`.
TRACE_S="${SMORE_GPU_TRACE_SECONDS:-30}"
only trace && step demo_trace "$((TRACE_S + 450))" "$PY" "$HERE/demo_trace.py" --smore "$SMORE" --workdir "$WORK/demo-trace" --out "$OUT" --seconds "$TRACE_S"
# Not part of `all` either: the same traced demo under an MPS control daemon the step starts and
# quits (docs/real-gpu.md, "MPS"); its files carry the prefix mps_. Ask for `mps`.
only mps && step demo_mps "$((TRACE_S + 450))" "$PY" "$HERE/demo_trace.py" --smore "$SMORE" --workdir "$WORK/demo-mps" --out "$OUT" --seconds "$TRACE_S" --mps --label mps
[ -f "$WORK/arbiter/arbiter.log" ] && cp "$WORK/arbiter/arbiter.log" "$OUT/arbiter.log"

"$PY" "$HERE/report.py" --meta "$WORK/meta.json" --out "$OUT" "${RESULTS[@]}"
echo "== results in $OUT (results.json, results.md, run.log)"
