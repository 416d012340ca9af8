"""SMORE's workloads as torch.nn modules with random weights (no downloads, no torchvision).

Layouts mirror arch.py exactly (same layers, same order), so `features.py --check` can compare the
hook-extracted features with the analytic ones. Inputs: `example_input(name, batch, device)`.
"""
import torch
import torch.nn as nn


class MatMul(nn.Module):
    """A leaf wrapper around torch.matmul so forward hooks see (and count) attention matmuls."""

    def forward(self, a, b):
        return torch.matmul(a, b)


def _vgg_convs(cfg, bn):
    layers, c = [], 3
    for stage in cfg:
        for co in stage:
            layers.append(nn.Conv2d(c, co, 3, padding=1, bias=not bn))
            if bn:
                layers.append(nn.BatchNorm2d(co))
            layers.append(nn.ReLU(inplace=False))
            c = co
        layers.append(nn.MaxPool2d(2, 2))
    return layers


VGG_CFG = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]


def vgg16():
    return nn.Sequential(
        nn.Sequential(*_vgg_convs(VGG_CFG, bn=False)),
        nn.AdaptiveAvgPool2d(7), nn.Flatten(),
        nn.Linear(512 * 49, 4096), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(4096, 1000))


def _cbr(cin, cout, k, s=1, groups=1, relu=True):
    m = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if relu:
        m.append(nn.ReLU6())
    return nn.Sequential(*m)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, s, t):
        super().__init__()
        hid = cin * t
        m = [] if t == 1 else [_cbr(cin, hid, 1)]
        m += [_cbr(hid, hid, 3, s, groups=hid), _cbr(hid, cout, 1, relu=False)]
        self.body = nn.Sequential(*m)
        self.res = s == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.res else y


def mobilenet_v2():
    layers, c = [_cbr(3, 32, 3, 2)], 32
    for t, co, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            layers.append(InvertedResidual(c, co, s if i == 0 else 1, t))
            c = co
    layers += [_cbr(320, 1280, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, s, down):
        super().__init__()
        out = width * 4
        self.c1, self.b1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.c2, self.b2 = nn.Conv2d(width, width, 3, s, 1, bias=False), nn.BatchNorm2d(width)
        self.c3, self.b3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU()
        self.down = nn.Sequential(nn.Conv2d(cin, out, 1, s, bias=False), nn.BatchNorm2d(out)) if down else None

    def forward(self, x):
        y = self.relu(self.b1(self.c1(x)))
        y = self.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        idt = self.down(x) if self.down is not None else x
        return self.relu(y + idt)


def resnet50():
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1, i == 0))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


class Attention(nn.Module):
    def __init__(self, d, heads, fused_qkv, attn_dropout):
        super().__init__()
        self.h, self.d = heads, d
        self.fused = fused_qkv
        if fused_qkv:
            self.qkv = nn.Linear(d, 3 * d)
        else:
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.mm1, self.mm2 = MatMul(), MatMul()
        self.softmax = nn.Softmax(dim=-1)
        self.drop = nn.Dropout(0.1) if attn_dropout else None
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        hd = d // self.h
        if self.fused:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = (t.reshape(b, n, self.h, hd).transpose(1, 2) for t in (q, k, v))
        a = self.softmax(self.mm1(q, k.transpose(-2, -1)) / hd ** 0.5)
        if self.drop is not None:
            a = self.drop(a)
        y = self.mm2(a, v).transpose(1, 2).reshape(b, n, d)
        return self.proj(y)


class ViTBlock(nn.Module):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.n1, self.attn, self.d1 = nn.LayerNorm(d), Attention(d, heads, True, False), nn.Dropout(0.1)
        self.n2, self.fc1, self.act, self.fc2, self.d2 = nn.LayerNorm(d), nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d), nn.Dropout(0.1)

    def forward(self, x):
        x = x + self.d1(self.attn(self.n1(x)))
        return x + self.d2(self.fc2(self.act(self.fc1(self.n2(x)))))


class ViT(nn.Module):
    def __init__(self, d=768, depth=12, heads=12, mlp=3072):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 16, 16)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, 197, d))
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.Sequential(*[ViTBlock(d, heads, mlp) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 1000)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(self.drop(x)))
        return self.head(x[:, 0])


class BertLayer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.attn, self.d1, self.n1 = Attention(d, heads, False, True), nn.Dropout(0.1), nn.LayerNorm(d)
        self.fc1, self.act, self.fc2, self.d2, self.n2 = nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d), nn.Dropout(0.1), nn.LayerNorm(d)

    def forward(self, x):
        x = self.n1(x + self.d1(self.attn(x)))
        return self.n2(x + self.d2(self.fc2(self.act(self.fc1(x)))))


class Bert(nn.Module):
    def __init__(self, vocab=30522, d=768, layers=12, heads=12, ff=3072, seq=128):
        super().__init__()
        self.seq = seq
        self.word, self.posn, self.typ = nn.Embedding(vocab, d), nn.Embedding(512, d), nn.Embedding(2, d)
        self.norm, self.drop = nn.LayerNorm(d), nn.Dropout(0.1)
        self.layers = nn.Sequential(*[BertLayer(d, heads, ff) for _ in range(layers)])
        self.pool, self.tanh, self.cdrop, self.cls = nn.Linear(d, d), nn.Tanh(), nn.Dropout(0.1), nn.Linear(d, 2)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.word(ids) + self.posn(pos) + self.typ(torch.zeros_like(ids))
        x = self.layers(self.drop(self.norm(x)))
        return self.cls(self.cdrop(self.tanh(self.pool(x[:, 0]))))


class FM(nn.Module):
    """Second-order FM term 0.5·((Σv)² − Σv²); counted as 2·2·fields·k FLOPs per sample."""

    def forward(self, v):
        s = v.sum(dim=1)
        return 0.5 * (s * s - (v * v).sum(dim=1))


class DeepFM(nn.Module):
    def __init__(self, fields=26, vocab=100_000, k=16, dense=13, hidden=(400, 400, 400)):
        super().__init__()
        self.fields, self.vocab = fields, vocab
        self.first, self.second = nn.Embedding(fields * vocab, 1), nn.Embedding(fields * vocab, k)
        self.dense_lin = nn.Linear(dense, 1)
        self.fm = FM()
        layers, x = [], fields * k + dense
        for h in hidden:
            layers += [nn.Linear(x, h), nn.ReLU(), nn.Dropout(0.2)]
            x = h
        layers.append(nn.Linear(x, 1))
        self.dnn = nn.Sequential(*layers)
        self.out = nn.Sigmoid()

    def forward(self, inputs):
        sparse, dense = inputs
        idx = sparse + torch.arange(self.fields, device=sparse.device) * self.vocab
        v = self.second(idx)
        y = self.first(idx).sum(dim=(1, 2)) + self.dense_lin(dense).squeeze(1) + self.fm(v).sum(dim=1)
        y = y + self.dnn(torch.cat([v.flatten(1), dense], dim=1)).squeeze(1)
        return self.out(y)


class SegNet(nn.Module):
    def __init__(self, classes=12):
        super().__init__()
        self.enc = nn.ModuleList()
        c = 3
        for stage in VGG_CFG:
            m = []
            for co in stage:
                m += [nn.Conv2d(c, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU()]
                c = co
            self.enc.append(nn.Sequential(*m))
        self.pool = nn.ModuleList([nn.MaxPool2d(2, 2, return_indices=True) for _ in VGG_CFG])
        self.unpool = nn.ModuleList([nn.MaxUnpool2d(2, 2) for _ in VGG_CFG])
        dec = [[512, 512, 512], [512, 512, 256], [256, 256, 128], [128, 64], [64, classes]]
        self.dec = nn.ModuleList()
        for si, stage in enumerate(dec):
            m = []
            for i, co in enumerate(stage):
                last = si == len(dec) - 1 and i == len(stage) - 1
                m.append(nn.Conv2d(c, co, 3, padding=1, bias=last))
                if not last:
                    m += [nn.BatchNorm2d(co), nn.ReLU()]
                c = co
            self.dec.append(nn.Sequential(*m))

    def forward(self, x):
        idx = []
        for e, p in zip(self.enc, self.pool):
            x, i = p(e(x))
            idx.append(i)
        for d, u, i in zip(self.dec, self.unpool, reversed(idx)):
            x = d(u(x, i))
        return x


BUILDERS = {
    "vgg16": vgg16, "mobilenet_v2": mobilenet_v2, "resnet50": resnet50, "vit_b16": ViT,
    "bert_base": Bert, "deepfm": DeepFM, "segnet": SegNet,
}


def build(name):
    return BUILDERS[name]()


def example_input(name, batch, device="cpu"):
    if name == "bert_base":
        return torch.randint(0, 30522, (batch, 128), device=device)
    if name == "deepfm":
        return (torch.randint(0, 100_000, (batch, 26), device=device), torch.randn(batch, 13, device=device))
    return torch.randn(batch, 3, 224, 224, device=device)


def example_target(name, out):
    """A random target shaped for a training loss on `out`."""
    if name == "deepfm":
        return torch.rand_like(out)
    if name == "segnet":
        return torch.randint(0, out.shape[1], (out.shape[0],) + tuple(out.shape[2:]), device=out.device)
    return torch.randint(0, out.shape[1], (out.shape[0],), device=out.device)


def loss_fn(name):
    return nn.BCELoss() if name == "deepfm" else nn.CrossEntropyLoss()
