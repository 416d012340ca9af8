"""Architectural facts of SMORE's workloads, computed analytically (pure Python, no torch).

These are facts about the architectures, not measurements: FLOPs, parameters, activation
elements and layer counts follow from layer shapes. `features.py` extracts the same quantities
from the torch modules in `models.py` with forward hooks; `python3 -m smore_profiling.features
--check` compares both when torch is installed.

Conventions (shared with features.py):
- FLOPs = 2 x multiply-accumulates of Conv2d, Linear and attention matmuls (QK^T, AV), per sample,
  forward only; element-wise ops (norm, activation, pooling, add) are not counted.
- activation_elems = sum of output elements of every leaf-layer application, per sample;
  peak_activation_elems = the largest single one.
- Counts are layer *applications* in one forward pass (a ReLU module called 3 times counts 3).
- activation_fns counts ReLU, ReLU6, GELU, Sigmoid, Tanh and Softmax applications; num_relu counts
  ReLU and ReLU6 only; num_pool counts max/avg/adaptive pooling and max-unpooling.
"""

from dataclasses import dataclass, field, asdict


@dataclass
class Arch:
    name: str
    description: str
    flops: float = 0.0
    params: int = 0
    act_sum: int = 0
    act_peak: int = 0
    activation_fns: int = 0
    num_conv: int = 0
    num_linear: int = 0
    num_norm: int = 0
    num_relu: int = 0
    num_embedding: int = 0
    num_pool: int = 0
    num_dropout: int = 0
    kernels: int = 0  # leaf applications (≈ kernels launched); used by the latency estimate

    def _out(self, elems):
        self.act_sum += elems
        self.act_peak = max(self.act_peak, elems)
        self.kernels += 1

    # --- image layers (c, h, w) ---
    def conv(self, cin, cout, k, h, w, s=1, p=None, groups=1, bias=False):
        p = k // 2 if p is None else p
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        self.params += cout * (cin // groups) * k * k + (cout if bias else 0)
        self.flops += 2.0 * (cin // groups) * k * k * cout * ho * wo
        self.num_conv += 1
        self._out(cout * ho * wo)
        return ho, wo

    def bn(self, c, elems):
        self.params += 2 * c
        self.num_norm += 1
        self._out(elems)

    def relu(self, elems):
        self.num_relu += 1
        self.activation_fns += 1
        self._out(elems)

    def act(self, elems):  # GELU, Sigmoid, Tanh, Softmax
        self.activation_fns += 1
        self._out(elems)

    def pool(self, elems):
        self.num_pool += 1
        self._out(elems)

    def dropout(self, elems):
        self.num_dropout += 1
        self._out(elems)

    def linear(self, fin, fout, tokens=1, bias=True):
        self.params += fin * fout + (fout if bias else 0)
        self.flops += 2.0 * fin * fout * tokens
        self.num_linear += 1
        self._out(fout * tokens)

    def layernorm(self, d, tokens):
        self.params += 2 * d
        self.num_norm += 1
        self._out(d * tokens)

    def embedding(self, vocab, dim, tokens):
        self.params += vocab * dim
        self.num_embedding += 1
        self._out(dim * tokens)

    def matmul(self, flops, out_elems):
        self.flops += flops
        self._out(out_elems)

    def facts(self):
        d = asdict(self)
        return d


def vgg16():
    a = Arch("vgg16", "VGG-16 (torchvision layout), 3x224x224 input, 1000 classes")
    h = w = 224
    c = 3
    for stage in [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]:
        for co in stage:
            h, w = a.conv(c, co, 3, h, w, bias=True)
            a.relu(co * h * w)
            c = co
        h, w = h // 2, w // 2
        a.pool(c * h * w)
    a.pool(512 * 7 * 7)  # AdaptiveAvgPool2d(7)
    a.linear(512 * 7 * 7, 4096); a.relu(4096); a.dropout(4096)
    a.linear(4096, 4096); a.relu(4096); a.dropout(4096)
    a.linear(4096, 1000)
    return a


def mobilenet_v2():
    a = Arch("mobilenet_v2", "MobileNetV2 width 1.0 (torchvision layout), 3x224x224, 1000 classes")
    h = w = 224

    def cbr(cin, cout, k, h, w, s=1, groups=1, relu=True):
        h, w = a.conv(cin, cout, k, h, w, s=s, groups=groups)
        a.bn(cout, cout * h * w)
        if relu:
            a.relu(cout * h * w)  # ReLU6
        return h, w

    h, w = cbr(3, 32, 3, h, w, s=2)
    c = 32
    for t, co, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hid = c * t
            hh, ww = h, w
            if t != 1:
                hh, ww = cbr(c, hid, 1, hh, ww)
            hh, ww = cbr(hid, hid, 3, hh, ww, s=stride, groups=hid)
            hh, ww = cbr(hid, co, 1, hh, ww, relu=False)
            h, w, c = hh, ww, co
    h, w = cbr(320, 1280, 1, h, w)
    a.pool(1280)  # AdaptiveAvgPool2d(1)
    a.dropout(1280)
    a.linear(1280, 1000)
    return a


def resnet50():
    a = Arch("resnet50", "ResNet-50 v1.5 (torchvision layout), 3x224x224, 1000 classes")
    h = w = 224
    h, w = a.conv(3, 64, 7, h, w, s=2, p=3)
    a.bn(64, 64 * h * w); a.relu(64 * h * w)
    h, w = (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1
    a.pool(64 * h * w)
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            s = stride if i == 0 else 1
            out = width * 4
            h1, w1 = a.conv(cin, width, 1, h, w)
            a.bn(width, width * h1 * w1); a.relu(width * h1 * w1)
            h2, w2 = a.conv(width, width, 3, h1, w1, s=s)
            a.bn(width, width * h2 * w2); a.relu(width * h2 * w2)
            h3, w3 = a.conv(width, out, 1, h2, w2)
            a.bn(out, out * h3 * w3)
            if i == 0:
                a.conv(cin, out, 1, h, w, s=s, p=0)
                a.bn(out, out * h3 * w3)
            a.relu(out * h3 * w3)
            h, w, cin = h3, w3, out
    a.pool(2048)
    a.linear(2048, 1000)
    return a


def vit_b16():
    a = Arch("vit_b16", "ViT-B/16-like encoder: 224x224 patches 16, dim 768, depth 12, 12 heads, MLP 3072, 1000 classes")
    d, depth, mlp, n = 768, 12, 3072, 197
    a.conv(3, d, 16, 224, 224, s=16, p=0, bias=True)
    a.params += d + n * d  # class token + position embedding (parameters, not nn.Embedding)
    a.dropout(n * d)
    for _ in range(depth):
        a.layernorm(d, n)
        a.linear(d, 3 * d, n)
        a.matmul(2.0 * n * n * d, 12 * n * n)  # QK^T over 12 heads
        a.act(12 * n * n)  # softmax
        a.matmul(2.0 * n * n * d, n * d)  # attention x V
        a.linear(d, d, n)
        a.dropout(n * d)
        a.layernorm(d, n)
        a.linear(d, mlp, n)
        a.act(mlp * n)  # GELU
        a.linear(mlp, d, n)
        a.dropout(n * d)
    a.layernorm(d, n)
    a.linear(d, 1000)
    return a


def bert_base():
    a = Arch("bert_base", "BERT-base-like encoder: seq 128, vocab 30522, dim 768, 12 layers, 12 heads, 2-class head")
    d, L, n, ff = 768, 12, 128, 3072
    a.embedding(30522, d, n); a.embedding(512, d, n); a.embedding(2, d, n)
    a.layernorm(d, n); a.dropout(n * d)
    for _ in range(L):
        a.linear(d, d, n); a.linear(d, d, n); a.linear(d, d, n)  # Q, K, V
        a.matmul(2.0 * n * n * d, 12 * n * n)
        a.act(12 * n * n)  # softmax
        a.dropout(12 * n * n)
        a.matmul(2.0 * n * n * d, n * d)
        a.linear(d, d, n); a.dropout(n * d); a.layernorm(d, n)
        a.linear(d, ff, n); a.act(ff * n)  # GELU
        a.linear(ff, d, n); a.dropout(n * d); a.layernorm(d, n)
    a.linear(d, d); a.act(d)  # pooler + tanh
    a.dropout(d)
    a.linear(d, 2)
    return a


def deepfm():
    a = Arch("deepfm", "DeepFM-like CTR model: 26 sparse fields x 100k hashed ids, 13 dense, embed 16, DNN 400-400-400")
    fields, vocab, k, dense = 26, 100_000, 16, 13
    a.embedding(fields * vocab, 1, fields)  # first-order weights
    a.embedding(fields * vocab, k, fields)  # second-order (FM) vectors
    a.linear(dense, 1)  # first-order dense part
    a.matmul(2.0 * 2 * fields * k, k)  # FM: (sum v)^2 - sum v^2
    x = fields * k + dense
    for h in [400, 400, 400]:
        a.linear(x, h); a.relu(h); a.dropout(h)
        x = h
    a.linear(x, 1)
    a.act(1)  # sigmoid
    return a


def segnet():
    a = Arch("segnet", "SegNet-like encoder-decoder (VGG-16 encoder, BN), 3x224x224, 12 classes")
    h = w = 224
    c = 3
    enc = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    for stage in enc:
        for co in stage:
            h, w = a.conv(c, co, 3, h, w)
            a.bn(co, co * h * w); a.relu(co * h * w)
            c = co
        h, w = h // 2, w // 2
        a.pool(c * h * w)
    dec = [[512, 512, 512], [512, 512, 256], [256, 256, 128], [128, 64], [64, 12]]
    for si, stage in enumerate(dec):
        h, w = h * 2, w * 2
        a.pool(c * h * w)  # MaxUnpool2d
        for i, co in enumerate(stage):
            last = si == len(dec) - 1 and i == len(stage) - 1
            h, w = a.conv(c, co, 3, h, w, bias=last)
            if not last:
                a.bn(co, co * h * w); a.relu(co * h * w)
            c = co
    return a


ALL = [vgg16, mobilenet_v2, resnet50, vit_b16, bert_base, deepfm, segnet]


def all_facts():
    return [f().facts() for f in ALL]


if __name__ == "__main__":
    import json
    for f in all_facts():
        print(json.dumps(f))
