#!/usr/bin/env python3
"""Checks that shim/src's modules form an acyclic, layered stack (see the `Layers` section of
shim/src/lib.rs).

Edges: every `crate::a::b` and `super::x` path in a file (comments stripped) is an edge from
that file's module to the named module (the deepest module of the path that exists as a file).
Fails if the file graph has a cycle (reported) or a module uses a module of a higher layer.
Usage: python3 shim/check_layers.py   (exit status 0 = acyclic and layered)
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent / "src"
# Layer of each top-level module (lib.rs's `Layers` list); submodules share their parent's.
LAYERS = {
    "variants": 1, "limits": 1, "config": 1, "ledger": 1, "shared_ledger": 1, "gate": 1, "harvest": 1, "turns": 1,
    "sys": 2,
    "log": 3, "trace": 3,
    "client": 4, "watch": 4,
    "runtime": 5,
    "hooks": 6,
}


def module_of(path):
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    return tuple(p for p in parts if p != "lib")


def main():
    files = {module_of(p): p for p in SRC.rglob("*.rs")}
    edges = {m: set() for m in files}
    for m, p in files.items():
        text = re.sub(r"//[^\n]*", "", p.read_text())
        # Unit tests may use anything of their own module; they are not part of the stack.
        text = text.split("#[cfg(test)]\nmod tests")[0]
        for path in re.findall(r"\b((?:crate|super)(?:::\w+)+)", text):
            segs = path.split("::")
            base = list(m[:-1]) if segs[0] == "super" else []
            names = base + segs[1:]
            target = None
            for k in range(len(names), 0, -1):
                if tuple(names[:k]) in files:
                    target = tuple(names[:k])
                    break
            if target is not None and target != m and target != ():
                edges[m].add(target)
    bad = []
    for m, ts in edges.items():
        for t in ts:
            if m and t and LAYERS[t[0]] > LAYERS[m[0]]:
                bad.append(f"{'::'.join(m)} (layer {LAYERS[m[0]]}) uses {'::'.join(t)} (layer {LAYERS[t[0]]})")
    # Kahn's topological sort.
    indeg = {m: 0 for m in edges}
    for m, ts in edges.items():
        for t in ts:
            indeg[t] += 1
    ready = [m for m, d in indeg.items() if d == 0]
    order = []
    while ready:
        m = ready.pop()
        order.append(m)
        for t in edges[m]:
            indeg[t] -= 1
            if indeg[t] == 0:
                ready.append(t)
    cyclic = [m for m, d in indeg.items() if d > 0]
    for m in sorted(edges):
        print(f"{'::'.join(m) or 'lib'} -> {', '.join(sorted('::'.join(t) for t in edges[m])) or '-'}")
    if cyclic:
        print("CYCLE (not sortable; a cycle runs through some of): " + ", ".join("::".join(m) for m in cyclic))
    for b in bad:
        print("LAYER VIOLATION: " + b)
    if cyclic or bad:
        sys.exit(1)
    print(f"ok: {len(edges)} modules, acyclic, every edge to the same or a lower layer")


main()
