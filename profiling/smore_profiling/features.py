"""Extract SMORE's 12 features from torch modules with forward hooks (runs on CPU).

    python3 -m smore_profiling.features            # JSON lines of facts per model
    python3 -m smore_profiling.features --check    # compare with arch.py (exit 1 on mismatch)

Conventions are those of arch.py (FLOPs = 2·MACs of conv/linear/attention matmuls, per sample,
forward; counts are leaf applications). `memory` is not extracted here: it is measured on the GPU
by profile_solo.py, and the catalog's feature uses the analytic formula (docs/predictor.md).
"""
import argparse
import json
import sys

import torch
import torch.nn as nn

from . import arch, models

POOL = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.MaxUnpool2d)
NORM = (nn.BatchNorm2d, nn.BatchNorm1d, nn.LayerNorm, nn.GroupNorm)
RELU = (nn.ReLU, nn.ReLU6)
OTHER_ACT = (nn.GELU, nn.Sigmoid, nn.Tanh, nn.Softmax)


def extract(name, batch=1):
    m = models.build(name).eval()
    f = dict(name=name, flops=0.0, params=sum(p.numel() for p in m.parameters()), act_sum=0, act_peak=0,
             activation_fns=0, num_conv=0, num_linear=0, num_norm=0, num_relu=0, num_embedding=0,
             num_pool=0, num_dropout=0, kernels=0)

    def hook(mod, inp, out):
        if isinstance(mod, (nn.Flatten, nn.Identity)):
            return  # views, not layers (arch.py does not count them)
        o = out[0] if isinstance(out, tuple) else out
        n = o.numel() // batch
        f["act_sum"] += n
        f["act_peak"] = max(f["act_peak"], n)
        f["kernels"] += 1
        if isinstance(mod, nn.Conv2d):
            f["num_conv"] += 1
            k = mod.kernel_size[0] * mod.kernel_size[1]
            f["flops"] += 2.0 * (mod.in_channels // mod.groups) * k * mod.out_channels * o.shape[2] * o.shape[3]
        elif isinstance(mod, nn.Linear):
            f["num_linear"] += 1
            f["flops"] += 2.0 * mod.in_features * n
        elif isinstance(mod, NORM):
            f["num_norm"] += 1
        elif isinstance(mod, RELU):
            f["num_relu"] += 1
            f["activation_fns"] += 1
        elif isinstance(mod, OTHER_ACT):
            f["activation_fns"] += 1
        elif isinstance(mod, POOL):
            f["num_pool"] += 1
        elif isinstance(mod, nn.Dropout):
            f["num_dropout"] += 1
        elif isinstance(mod, nn.Embedding):
            f["num_embedding"] += 1
        elif isinstance(mod, models.MatMul):
            a, b = inp
            f["flops"] += 2.0 * a.numel() * b.shape[-1] / batch
        elif isinstance(mod, models.FM):
            v = inp[0]
            f["flops"] += 2.0 * 2 * v.shape[1] * v.shape[2]

    for mod in m.modules():
        if not list(mod.children()):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        m(models.example_input(name, batch))
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="compare with arch.py; exit 1 on mismatch")
    args = ap.parse_args()
    ref = {a["name"]: a for a in arch.all_facts()}
    bad = 0
    for name in models.BUILDERS:
        f = extract(name)
        if args.check:
            for k, v in f.items():
                r = ref[name][k]
                if k != "name" and abs(float(v) - float(r)) > 1e-6 * max(1.0, abs(float(r))):
                    print(f"{name}: {k} torch={v} arch={r}")
                    bad += 1
        else:
            print(json.dumps(f))
    if args.check:
        print("features match arch.py" if not bad else f"{bad} mismatches")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
