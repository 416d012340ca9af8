#!/usr/bin/env python3
"""Offline checks of deploy/kubernetes (run by .ci/run; docs/kubernetes.md, "Manifests").

1. Every manifest validates against the Kubernetes OpenAPI schemas bundled with the
   `kubernetes-validate` package (strict: unknown fields are errors), no cluster and no network.
   The Knative Service has no bundled schema: its pod template is checked as a v1 PodSpec.
2. The pieces agree with each other and with the code: the KubeSchedulerConfiguration's extender
   verbs and port are the ones `smore k8s extender` serves, its managed resource is the one the
   device plugin advertises (k8s/src/resources.rs), function examples use the smore scheduler,
   and the node config's policy is `smore` (what the extender predicts with).

Exit status 0 when everything holds; each failure is printed with the file it concerns.
"""
import glob
import os
import sys

import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
RESOURCE = "smore.dev/gpu-memory"
SCHEDULER = "smore-scheduler"
K8S_VERSION = "1.31.0"
failures = []


def fail(path, msg):
    failures.append(f"{os.path.relpath(path, HERE)}: {msg}")


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def validate(path, doc):
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        fail(path, f"{doc.get('kind')}/{doc['metadata'].get('name')}: {e.message} at {list(e.path)}")
    except Exception as e:  # noqa: BLE001 — a missing schema is a failure too
        fail(path, f"{doc.get('kind')}: {e}")


def main():
    files = sorted(glob.glob(os.path.join(HERE, "*.yaml")) + glob.glob(os.path.join(HERE, "examples", "*.yaml")))
    if not files:
        fail(HERE, "no manifests found")
    by_kind = {}
    for path in files:
        for doc in docs(path):
            by_kind.setdefault(doc["kind"], []).append((path, doc))
            if doc["apiVersion"].startswith("serving.knative.dev/"):
                # No Knative schema is bundled: check its pod template as a PodSpec.
                spec = dict(doc["spec"]["template"]["spec"])
                # Knative names containers itself (user-container).
                spec["containers"] = [{"name": "user-container", **c} for c in spec["containers"]]
                for knative_only in ("containerConcurrency", "timeoutSeconds", "responseStartTimeoutSeconds", "idleTimeoutSeconds"):
                    spec.pop(knative_only, None)
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "knative-template"}, "spec": spec}
                validate(path, pod)
            else:
                validate(path, doc)

    # The scheduler configuration against the extender's command line and routes.
    cms = {d["metadata"]["name"]: (p, d) for p, d in by_kind.get("ConfigMap", [])}
    path, cm = cms.get("smore-scheduler-config", (HERE, None))
    if cm is None:
        fail(HERE, "ConfigMap smore-scheduler-config missing")
    else:
        cfg = yaml.safe_load(cm["data"]["config.yaml"])
        if cfg.get("kind") != "KubeSchedulerConfiguration" or cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
            fail(path, "config.yaml is not a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration")
        if [p["schedulerName"] for p in cfg.get("profiles", [])] != [SCHEDULER]:
            fail(path, f"expected one profile named {SCHEDULER}")
        (ext,) = cfg["extenders"]
        if ext.get("filterVerb") != "filter" or ext.get("prioritizeVerb") != "prioritize":
            fail(path, "extender verbs must be filter/prioritize (the routes of k8s/src/server.rs)")
        if ext.get("ignorable", False):
            fail(path, "the extender must not be ignorable: pods would be placed blindly when it is down")
        if [m["name"] for m in ext.get("managedResources", [])] != [RESOURCE]:
            fail(path, f"managedResources must be exactly {RESOURCE}")
        port = ext["urlPrefix"].rsplit(":", 1)[1].rstrip("/")
        deploy = [d for p, d in by_kind.get("Deployment", []) if d["metadata"]["name"] == SCHEDULER]
        if not deploy:
            fail(HERE, f"Deployment {SCHEDULER} missing")
        else:
            cmds = [c.get("command", []) for c in deploy[0]["spec"]["template"]["spec"]["containers"]]
            ext_cmd = [c for c in cmds if c[:3] == ["smore", "k8s", "extender"]]
            if not ext_cmd or not any(a.startswith("--listen=") and a.endswith(":" + port) for a in ext_cmd[0]):
                fail(HERE, f"the extender container must listen on port {port} (urlPrefix)")
    path, cm = cms.get("smore-node-config", (HERE, None))
    if cm is None:
        fail(HERE, "ConfigMap smore-node-config missing")
    else:
        import tomllib

        node = tomllib.loads(cm["data"]["node.toml"])
        if node.get("policy", {}).get("name") != "smore":
            fail(path, "[policy] name must be smore: the extender predicts with SMORE's policy")
        if not node.get("arbiter", {}).get("metrics_addr", "").endswith(":9464"):
            fail(path, "[arbiter] metrics_addr must serve port 9464 (the extender's --arbiter-port)")

    # Function examples: the smore scheduler and the smore resource, one container asking.
    for path in glob.glob(os.path.join(HERE, "examples", "*.yaml")):
        for doc in docs(path):
            spec = None
            if doc["kind"] == "Deployment":
                spec = doc["spec"]["template"]["spec"]
            elif doc["apiVersion"].startswith("serving.knative.dev/"):
                spec = doc["spec"]["template"]["spec"]
            if spec is None:
                continue
            if spec.get("schedulerName") != SCHEDULER:
                fail(path, f"{doc['metadata']['name']}: schedulerName must be {SCHEDULER}")
            asking = [c for c in spec["containers"] if RESOURCE in c.get("resources", {}).get("limits", {})]
            if len(asking) != 1:
                fail(path, f"{doc['metadata']['name']}: exactly one container must request {RESOURCE}")
            elif not any(e["name"] == "SMORE_MODEL" for e in asking[0].get("env", [])):
                fail(path, f"{doc['metadata']['name']}: the function container must declare SMORE_MODEL")

    for f in failures:
        print("FAIL", f)
    print(f"deploy/kubernetes: {len(files)} files, {sum(len(v) for v in by_kind.values())} objects, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
