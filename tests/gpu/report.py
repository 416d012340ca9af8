"""Merges the step results of tests/gpu/run_all.sh into results.json and results.md.

    python3 tests/gpu/report.py --meta meta.json --out DIR step1.json step2.json ...

Each step file holds the `RESULT` object of one script (or {"test": name, "error": ...} when it
produced none). The markdown states the date, device, driver and the exact commands, then one
table per test.
"""

import argparse
import json
import os


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"test": os.path.basename(path), "pass": False, "error": f"unreadable: {e}"}


def fmt_bytes(b):
    return f"{b / (1 << 30):.2f} GiB" if isinstance(b, (int, float)) else str(b)


def mem_md(r):
    out = ["## (a) Memory cap under PyTorch's caching allocator", "",
           f"Cap: {fmt_bytes(r.get('cap'))}. Pass: **{r.get('pass')}**", "",
           "| case | mem_get_info total | free at start | over-cap tensor | allocated until stop "
           "(stopped by) | reserved at stop | checks failed |",
           "|---|---|---|---|---|---|---|"]
    for name, c in (r.get("cases") or {}).items():
        failed = [k for k, v in (c.get("checks") or {}).items() if not v]
        out.append(f"| {name} | {fmt_bytes(c.get('total_reported'))} | "
                   f"{fmt_bytes(c.get('free_at_start'))} | {c.get('over_cap_single')} | "
                   f"{fmt_bytes(c.get('allocated_until_stop'))} ({c.get('stopped_by')}) | "
                   f"{fmt_bytes(c.get('reserved_at_stop'))} | {', '.join(failed) or '-'} |")
    out += ["", "Commands:", ""] + [f"- `{c.get('command')}`" for c in
                                    (r.get("cases") or {}).values()]
    return out


def share_md(r):
    out = ["## (b) SM share: shimmed inference beside unshimmed training", "",
           f"Window {r.get('seconds')} s per run. Training alone: {r.get('train_solo_sps')} "
           f"steps/s; inference alone (no shim): {r.get('infer_solo_rps')} requests/s. "
           f"All runs completed: **{r.get('pass')}**", "",
           "| share % | inference alone, shimmed (rps, fraction of solo) | inference beside "
           "training (rps, fraction) | inference p99 beside training (ms) | training beside "
           "inference (steps/s) | training slowdown |",
           "|---|---|---|---|---|---|"]
    for t in r.get("table") or []:
        out.append(f"| {t['share']} | {t['infer_alone_rps']} ({t['infer_alone_fraction']:.3f}) |"
                   f" {t['infer_with_train_rps']} ({t['infer_with_train_fraction']:.3f}) | "
                   f"{t['infer_with_train_p99_ms']} | {t['train_with_sps']} | "
                   f"{100 * t['train_slowdown']:.1f} % |")
    cmds = r.get("commands") or {}
    out += ["", "Commands:", ""] + [f"- {k}: `{v}`" for k, v in cmds.items()]
    if r.get("error"):
        out += ["", f"Error: {r['error']}"]
    return out


def arbiter_md(r):
    out = ["## (c) Arbiter path: `smore arbiter` (real NVML) + `smore run` a PyTorch function", "",
           f"Pass: **{r.get('pass')}**", "", "| check | result |", "|---|---|"]
    for k, v in (r.get("checks") or {}).items():
        out.append(f"| {k} | {v} |")
    f = r.get("function") or {}
    adm = (r.get("snapshots") or {}).get("admitted") or {}
    out += ["", f"Admitted: cap {fmt_bytes(adm.get('cap'))}, share {adm.get('share')} %, "
            f"GPU {adm.get('gpu')}. Killed at {r.get('killed_at_s')} s, re-attached by "
            f"{r.get('reattached_at_s')} s.",
            f"Requests per second through the restart: {f.get('requests_per_second')}", "",
            f"Command: `{r.get('function_command')}`", "", "Config:", "", "```toml",
            (r.get("config") or "").rstrip(), "```"]
    if r.get("error"):
        out += ["", f"Error: {r['error']}"]
    return out


def nvml_md(r):
    out = ["## (d) NVML's per-process SM utilization of a shimmed process", "",
           f"Window {r.get('seconds')} s per run, NVML sampled every 250 ms. Measurements only; "
           f"all runs completed: **{r.get('pass')}**", "",
           "| run | process | rate (/s) | p50 (ms) | NVML smUtil mean (max, samples) | device util |",
           "|---|---|---|---|---|---|"]
    for key, run in (r.get("runs") or {}).items():
        for name, v in run.items():
            if not isinstance(v, dict):
                continue
            out.append(f"| {key} | {name} | {v.get('rate', 0):.1f} | {v.get('p50_ms')} | "
                       f"{v.get('nvml_sm_mean')} ({v.get('nvml_sm_max')}, "
                       f"{v.get('nvml_sm_samples')}) | {run.get('device_util_mean')} |")
    return out


def switch_md(r):
    rows = [("probe alone", r.get("probe_alone")),
            ("probe beside an idle context", r.get("probe_beside_idle_context"))]
    rows += [(f"probe beside the trainer: {k}", v)
             for k, v in (r.get("probe_beside_trainer") or {}).items()]
    rows += [("trainer burst alone", r.get("trainer_burst_alone")),
             ("trainer burst, a probe inside", r.get("trainer_burst_with_probe")),
             ("trainer burst, no probe", r.get("trainer_burst_without_probe"))]
    md = ["## Context switches (switch_cost.py)", "", f"config: {r.get('config')}", "",
          "| case | n | p50 µs | p90 µs | p99 µs |", "|---|---|---|---|---|"]
    for name, s in rows:
        s = s or {}
        md.append(f"| {name} | {s.get('n', 0)} | {s.get('p50_us', '')} | {s.get('p90_us', '')} "
                  f"| {s.get('p99_us', '')} |")
    md += ["", f"- probes per overlapped burst: {r.get('probes_per_hit_burst')}",
           f"- trainer time added per overlapping probe: "
           f"{r.get('trainer_extra_us_per_overlapping_probe')} µs, of which beyond the probe's "
           f"own time ({r.get('probe_kernel_us')} µs): "
           f"{r.get('of_which_beyond_probe_own_time_us')} µs",
           f"- trainer busy alone: {r.get('trainer_busy_fraction_alone')}"]
    return md


def jitter_md(r):
    md = ["## The shim's wait estimator without co-runners (wait_jitter.py)", "",
          f"config: {r.get('config')}", "",
          "| condition | wait p50 / p90 / p99 µs | ≥10 µs | ≥20 µs | ≥50 µs | ≥100 µs "
          "| kernel over its floor p50 / p99 µs |", "|---|---|---|---|---|---|---|"]
    for k in ("alone", "cpu_busy", "beside_trainer"):
        s = r.get(k) or {}
        w, o = s.get("wait") or {}, s.get("over_floor") or {}
        md.append(f"| {k} | {w.get('p50_us')} / {w.get('p90_us')} / {w.get('p99_us')} "
                  f"| {s.get('wait_ge_10us')} | {s.get('wait_ge_20us')} | {s.get('wait_ge_50us')} "
                  f"| {s.get('wait_ge_100us')} | {o.get('p50_us')} / {o.get('p99_us')} |")
    md += ["", f"- trainer iteration p50, alone: {r.get('trainer_ms_p50_alone')} ms; beside "
           f"CPU hogs: {r.get('trainer_ms_p50_cpu_busy')} ms (slowdown "
           f"{r.get('trainer_slowdown_cpu_busy')})"]
    return md


def trace_md(r):
    d, o = r.get("demo") or {}, r.get("overlap") or {}
    pc = lambda x: "—" if x is None else f"{x * 100:.1f} %"  # noqa: E731
    num = lambda x: "—" if x is None else f"{x:.1f}"  # noqa: E731
    dash = lambda x: "—" if x is None else x  # noqa: E731
    err = [f"Error: {r['error']}", ""] if r.get("error") else []
    return ["## The demo with every function's sample trace (demo_trace.py)", ""] + err + [
            f"command: `{r.get('command')}`" + (" (SIMULATED GPU)" if r.get("simulated") else "")
            + (" under an MPS control daemon" if r.get("mps") else ""),
            "",
            f"- trainer {num(d.get('trainer_iter_alone_ms'))} ms/iteration alone before, "
            f"{num(d.get('trainer_iter_colocated_ms'))} beside the functions, "
            f"{num(d.get('trainer_iter_alone_after_ms'))} alone after (SFD against the after "
            f"baseline {pc(d.get('sfd_against_after'))})",
            f"- trainer slowdown {pc(d.get('sfd'))}, the arbiter's estimate "
            f"{pc(d.get('sfd_estimate'))}; DSR {pc(d.get('dsr'))} ({pc(d.get('dsr_admitted'))} "
            f"of admitted); GPU {num(d.get('gui_exclusive_pct'))} → "
            f"{num(d.get('gui_colocated_pct'))} % busy",
            f"- traces of {dash(o.get('processes'))} processes over {dash(o.get('traced_s'))} s: "
            f"sampled run time {dash(o.get('sampled_run_s'))} s, collision time "
            f"{dash(o.get('collision_s'))} s ({dash(o.get('collision_unknown_wait_s'))} s with no "
            f"known wait)",
            f"- collision time that overlapped another process's sampled kernel: "
            f"{pc(o.get('overlapping_share'))}"] + status_md(r.get("status") or {})


def status_md(st):
    """The demo's `smore status --json` timeline, as demo_trace.py summarised it."""
    if not st:
        return []
    dash = lambda x: "—" if x is None else x  # noqa: E731
    noise = lambda n: f"{n.get('wait_us')} / {n.get('stretch_us')}" if n else "—"  # noqa: E731
    ph = st.get("phase") or {}
    md = ["", f"`smore status --json` polled {st.get('polls')} times; the trainer's phase was read "
          f"at {ph.get('predicted')} ({ph.get('busy')} busy, {ph.get('idle')} idle; busy "
          f"{ph.get('busy_ms')} ms, idle {ph.get('idle_ms')} ms); sharing as the arbiter read it "
          f"(polls): {st.get('sharing') or '—'}; training processes seen: "
          f"{dash(st.get('training_seen'))}", "",
          "| instance | function | requests | paced refusals | turn waits ms | held ms | "
          "collision / request ms | GPU / request ms | timing noise µs (wait / stretch) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for inst, f in sorted((st.get("functions") or {}).items()):
        md.append(f"| {inst} | {f.get('function')} | {dash(f.get('requests'))} | "
                  f"{dash(f.get('paced_refusals'))} | {dash(f.get('turn_waited_ms'))} | "
                  f"{dash(f.get('held_ms'))} | {dash(f.get('collision_per_request_ms'))} | "
                  f"{dash(f.get('gpu_per_request_ms'))} | {noise(f.get('timing_noise'))} |")
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meta", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("steps", nargs="*")
    a = ap.parse_args()
    meta = load(a.meta)
    steps = [load(p) for p in a.steps]
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": steps}, f, indent=2, sort_keys=True)
    md = ["# smore on a real GPU", "",
          f"- date (UTC): {meta.get('date')}",
          f"- device: {meta.get('gpu')} ({meta.get('memory')}), driver {meta.get('driver')}",
          f"- host: {meta.get('uname')}; torch {meta.get('torch')}; smore commit "
          f"{meta.get('commit')}",
          f"- driver script: `{meta.get('command')}`", ""]
    md += ["| test | pass |", "|---|---|"]
    md += [f"| {s.get('test')} | {s.get('pass')} |" for s in steps]
    md.append("")
    for s in steps:
        kind = s.get("test")
        body = {"mem_cap": mem_md, "sm_share": share_md, "arbiter_e2e": arbiter_md,
                "nvml_view": nvml_md, "switch_cost": switch_md,
                "wait_jitter": jitter_md, "demo_trace": trace_md}.get(kind)
        md += (body(s) if body else [f"## {kind}", "", f"Error: {s.get('error')}"]) + [""]
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
