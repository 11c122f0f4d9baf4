#!/usr/bin/env python3
"""The sidecar Component (deploy/k8s/components/sidecar) and the monitoring kustomization
(deploy/k8s/monitoring), rendered and checked against the Kubernetes API's rules.

Sidecar, in both examples (the batch/v1 Job of deploy/k8s/base and the Master and Worker
pods of the PyTorchJob in deploy/k8s/examples/pytorchjob):
  - spgated is an init container with restartPolicy: Always, with gRPC startup,
    readiness and liveness probes, mounts of the gates ConfigMap, the admin token, the
    worker credential and a writable --state_dir, identical in every pod it was put into
    and equal to components/sidecar/sidecar.yaml's;
  - the training container (`trainer`, `pytorch`) gets SPGATE_CONTROLLER (the sidecar's
    worker API), SPGATE_JOB_ID (from the label its controller sets: the workload's name)
    and SPGATE_WORKER_TOKEN_FILE (a file of the mounted credential the sidecar reads too),
    and keeps everything it had: the Component adds list elements, never replaces lists;
  - the pod carries spgate.io/daemon: "true" (a string), and the local-config source Pod
    stays out of the output;
  - opting out: a Job labelled spgate.io/inject=none is untouched, a PyTorchJob labelled
    Worker (Master) gets a sidecar in that replica type only and no invented other one.
Monitoring: one ConfigMap per dashboards/*.json, labelled grafana_dashboard: "1", holding
the file byte for byte; a PrometheusRule whose spec is deploy/prometheus/spgate-rules.yml's
groups (generate.py --check).
Every rendering of deploy/k8s (base, overlays, examples, monitoring) passes a structural
check of what the API server would refuse: container, volume and port names, one image
each, env with one source, mounts of declared volumes, one probe handler, restartPolicy
only on init containers, string label values, ConfigMaps within the size that client-side
apply can annotate, PrometheusRule and PodMonitor shapes.
Where `kubectl kustomize` (kustomize >= 4) is installed, the opt-out rendering must agree
with it (k8s_manifests_test.py compares the shipped kustomizations).
"""
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_manifests_test as m  # noqa: E402
import kustomize_render as kr  # noqa: E402
import yaml  # noqa: E402

REPO, K8S = m.REPO, m.K8S
COMPONENT = os.path.join(K8S, "components", "sidecar")
TREE = os.path.dirname(os.path.dirname(os.path.abspath(K8S)))  # the repository, or its copy
DASHBOARDS = os.path.join(TREE, "dashboards")
RULES = os.path.join(TREE, "deploy", "prometheus", "spgate-rules.yml")
TRAINERS = {"Job": "trainer", "PyTorchJob": "pytorch"}
JOB_LABELS = {"Job": "job-name",
              "PyTorchJob": "training.kubeflow.org/job-name"}
SPGATE_ENV = ("SPGATE_CONTROLLER", "SPGATE_JOB_ID", "SPGATE_WORKER_TOKEN_FILE")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# kubectl apply (client side) stores the object in an annotation of at most 256 KiB.
MAX_APPLY_BYTES = 256 * 1024
VOLUME_SOURCES = {"configMap", "secret", "emptyDir", "persistentVolumeClaim", "projected",
                  "hostPath", "downwardAPI", "csi", "ephemeral", "nfs"}

failures = []


def Fail(where, msg):
    failures.append(f"{where}: {msg}")


def Render(path):
    try:
        return kr.Build(path)
    except kr.KustomizeError as e:
        Fail(path, f"render failed: {e}")
        return []


# --- what the API server would refuse ----------------------------------------------------

def CheckContainer(where, c, volumes, field):
    if not DNS_LABEL.match(str(c.get("name", ""))):
        Fail(where, f"container name {c.get('name')!r} is not a DNS label")
    if not isinstance(c.get("image"), str) or not c["image"]:
        Fail(where, "container without an image (a patch made up a container?)")
    if field == "initContainers" and c.get("restartPolicy", "Always") != "Always":
        Fail(where, f"init container restartPolicy {c['restartPolicy']!r}: only Always exists")
    for e in c.get("env") or []:
        if not isinstance(e.get("name"), str) or (("value" in e) == ("valueFrom" in e)):
            Fail(where, f"env {e}: needs a name and exactly one of value, valueFrom")
        elif "value" in e and not isinstance(e["value"], str):
            Fail(where, f"env {e['name']}: value {e['value']!r} is not a string")
    names = [p.get("name") for p in c.get("ports") or [] if p.get("name")]
    for p in c.get("ports") or []:
        if not isinstance(p.get("containerPort"), int) or not 0 < p["containerPort"] < 65536:
            Fail(where, f"port {p}: containerPort must be a number in 1..65535")
        if "name" in p and (len(p["name"]) > 15 or not DNS_LABEL.match(p["name"])):
            Fail(where, f"port name {p['name']!r}: at most 15 characters, a DNS label")
    if len(names) != len(set(names)):
        Fail(where, f"duplicate port names {names}")
    for mnt in c.get("volumeMounts") or []:
        if mnt.get("name") not in volumes:
            Fail(where, f"mounts volume {mnt.get('name')!r}, which the pod does not declare")
        if not str(mnt.get("mountPath", "")).startswith("/"):
            Fail(where, f"mountPath {mnt.get('mountPath')!r} is not absolute")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if h in (c.get(probe) or {})]
        if c.get(probe) is not None and len(handlers) != 1:
            Fail(where, f"{probe} needs exactly one handler, has {handlers}")


def CheckPodSpec(where, spec):
    volumes = [v.get("name") for v in spec.get("volumes") or []]
    if len(volumes) != len(set(volumes)):
        Fail(where, f"duplicate volume names {volumes}")
    for v in spec.get("volumes") or []:
        sources = set(v) & VOLUME_SOURCES
        if len(sources) != 1 or len(set(v) - {"name"}) != 1:
            Fail(where, f"volume {v.get('name')}: exactly one source, has {sorted(set(v) - {'name'})}")
    containers = m.AllContainers(spec)
    if not spec.get("containers"):
        Fail(where, "a pod needs at least one container")
    names = [c.get("name") for _, c in containers]
    if len(names) != len(set(names)):
        Fail(where, f"duplicate container names {names}")
    for field, c in containers:
        CheckContainer(f"{where} {field}/{c.get('name')}", c, set(volumes), field)
        if field == "containers" and "restartPolicy" in c:
            Fail(where, f"ordinary container {c.get('name')} may not set restartPolicy")


def CheckLabels(where, meta):
    for key, value in (meta.get("labels") or {}).items():
        if not isinstance(value, str) or not LABEL_VALUE.match(value) or len(value) > 63:
            Fail(where, f"label {key}: {value!r} is not a valid label value (a string)")


def StructuralProblems(name, resources):
    for r in resources:
        where = f"{name} {r.get('kind')}/{r.get('metadata', {}).get('name')}"
        if not r.get("apiVersion") or not r.get("kind") or not r.get("metadata", {}).get("name"):
            Fail(where, "apiVersion, kind and metadata.name are required")
        CheckLabels(where, r.get("metadata", {}))
        if r["kind"] == "ConfigMap":
            data = r.get("data") or {}
            if any(not isinstance(v, str) or not re.match(r"^[-._a-zA-Z0-9]+$", k)
                   for k, v in data.items()):
                Fail(where, "ConfigMap data: keys [-._a-zA-Z0-9]+, string values")
            if len(json.dumps(r).encode()) > MAX_APPLY_BYTES:
                Fail(where, "too large for kubectl apply's last-applied annotation (256 KiB)")
        elif r["kind"] == "PrometheusRule":
            for g in r["spec"].get("groups") or []:
                for rule in g.get("rules") or []:
                    if ("record" in rule) == ("alert" in rule) or not isinstance(rule.get("expr"), str):
                        Fail(where, f"rule {rule}: one of record/alert, and an expr")
        elif r["kind"] == "PodMonitor":
            if not r["spec"].get("selector") or not all(
                    e.get("port") for e in r["spec"].get("podMetricsEndpoints") or [{}]):
                Fail(where, "PodMonitor needs a selector and a named port per endpoint")
    for pod in m.PodTemplates(resources):
        CheckLabels(f"{name} {pod} template", pod.meta)
        CheckPodSpec(f"{name} {pod}", pod.spec)


# --- the sidecar Component ---------------------------------------------------------------

def SourcePod():
    docs = kr._load_yaml_docs(os.path.join(COMPONENT, "sidecar.yaml"))
    (pod,) = docs
    return pod


def Named(items, name):
    return next((x for x in items or [] if x.get("name") == name), None)


def CheckInjected(name, pod, images):
    """One pod template the Component put spgated into."""
    where = f"{name} {pod}"
    source = SourcePod()
    sidecar = Named(pod.spec.get("initContainers"), m.SIDECAR)
    if sidecar is None or sidecar.get("restartPolicy") != "Always":
        Fail(where, "spgated must be an init container with restartPolicy: Always")
        return None
    want = copy.deepcopy(Named(source["spec"]["initContainers"], m.SIDECAR))
    want["image"] = images
    if sidecar != want:
        Fail(where, "spgated differs from components/sidecar/sidecar.yaml's")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if "grpc" not in (sidecar.get(probe) or {}):
            Fail(where, f"spgated has no gRPC {probe}")
    for v in source["spec"]["volumes"]:
        if Named(pod.spec.get("volumes"), v["name"]) != v:
            Fail(where, f"volume {v['name']} missing or different from sidecar.yaml's")
    if pod.meta.get("labels", {}).get("spgate.io/daemon") != "true":
        Fail(where, 'the pod lacks the label spgate.io/daemon: "true" (a string)')
    trainer = Named(pod.spec.get("containers"), TRAINERS[pod.kind])
    if trainer is None:
        Fail(where, f"no training container {TRAINERS[pod.kind]}")
        return sidecar
    env = {e["name"]: e for e in trainer.get("env") or []}
    flags = m.Flags(sidecar)
    if env.get("SPGATE_CONTROLLER", {}).get("value") != f"127.0.0.1:{m.Port(flags['listen'])}":
        Fail(where, f"SPGATE_CONTROLLER is not the sidecar's worker API {flags['listen']}")
    ref = env.get("SPGATE_JOB_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if ref != f"metadata.labels['{JOB_LABELS[pod.kind]}']":
        Fail(where, f"SPGATE_JOB_ID reads {ref}, not the {pod.kind} controller's job-name label")
    token = env.get("SPGATE_WORKER_TOKEN_FILE", {}).get("value")
    if token != flags.get("worker_token_file"):
        Fail(where, f"SPGATE_WORKER_TOKEN_FILE {token} is not the file spgated reads "
                    f"({flags.get('worker_token_file')})")
    elif m.SecretOf(trainer, pod.spec, token) != (m.TRAINER_SECRET, m.TRAINER_TOKEN_KEY):
        Fail(where, f"SPGATE_WORKER_TOKEN_FILE is not key {m.TRAINER_TOKEN_KEY} of a mount of "
                    f"Secret {m.TRAINER_SECRET} in {trainer['name']}")
    return sidecar


def Stripped(container):
    """A training container without what the Component adds to it."""
    c = copy.deepcopy(container)
    c["env"] = [e for e in c.get("env") or [] if e["name"] not in SPGATE_ENV]
    c["volumeMounts"] = [v for v in c.get("volumeMounts") or [] if v["name"] != "spgate-worker-token"]
    return {k: v for k, v in c.items() if v != []}


def CheckKept(name, rendered, source_file, images):
    """The workload's own containers and volumes survive the Component unchanged."""
    (source,) = [d for d in kr._load_yaml_docs(source_file)]
    source_pods = {p.replica: p for p in m.PodTemplates([source])}
    injected = {n for n in ("spgated",)}
    for pod in m.PodTemplates([r for r in rendered if r["kind"] == source["kind"]]):
        mine = source_pods.get(pod.replica)
        if mine is None:
            Fail(f"{name} {pod}", "a replica type the workload does not have was made up")
            continue
        for c in mine.spec["containers"]:
            want = dict(c, image=images) if c.get("image") == "spgate" else c
            got = Named(pod.spec["containers"], c["name"])
            if got is None or Stripped(got) != want:
                Fail(f"{name} {pod}", f"container {c['name']} lost or changed what it had")
        extra = [c["name"] for c in pod.spec["containers"] if Named(mine.spec["containers"], c["name"]) is None]
        extra += [c["name"] for c in pod.spec.get("initContainers") or [] if c["name"] not in injected
                  and Named(mine.spec.get("initContainers"), c["name"]) is None]
        if extra:
            Fail(f"{name} {pod}", f"containers appeared that neither the workload nor the "
                                  f"Component declares: {extra}")


def CheckExamples():
    images = "ghcr.io/spgate/spgate:0.1.0"
    renders = {}
    for name, path, source in (
            ("base", os.path.join(K8S, "base"), os.path.join(K8S, "base", "job.yaml")),
            ("pytorchjob", os.path.join(K8S, "examples", "pytorchjob"),
             os.path.join(K8S, "examples", "pytorchjob", "pytorchjob.yaml"))):
        rendered = Render(path)
        renders[name] = rendered
        if any(r["kind"] == "Pod" for r in rendered):
            Fail(name, "the Component's local-config source Pod leaked into the output")
        pods = list(m.PodTemplates(rendered))
        if not pods:
            Fail(name, "no pod template rendered")
        sidecars = [CheckInjected(name, pod, images) for pod in pods]
        if name == "pytorchjob" and sorted(p.replica for p in pods) != ["Master", "Worker"]:
            Fail(name, f"expected Master and Worker pod templates, got {[str(p) for p in pods]}")
        if len({json.dumps(s, sort_keys=True) for s in sidecars}) != 1:
            Fail(name, "the sidecar differs between pod templates")
        CheckKept(name, rendered, source, images)
    return renders


OPT_OUT = """\
apiVersion: batch/v1
kind: Job
metadata: {name: prep, labels: {spgate.io/inject: none}}
spec: {template: {spec: {restartPolicy: Never, containers: [{name: trainer, image: prep}]}}}
---
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: workers-only, labels: {spgate.io/inject: Worker}}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      template: {spec: {containers: [{name: pytorch, image: t, env: [{name: A, value: "1"}]}]}}
---
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: master-only, labels: {spgate.io/inject: Master}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template: {spec: {containers: [{name: pytorch, image: t}]}}
"""


def CheckOptOut(tmp):
    d = os.path.join(tmp, "opt-out")
    os.makedirs(d)
    with open(os.path.join(d, "workloads.yaml"), "w") as f:
        f.write(OPT_OUT)
    with open(os.path.join(d, "kustomization.yaml"), "w") as f:
        f.write(f"resources: [workloads.yaml]\ncomponents: [{os.path.relpath(COMPONENT, d)}]\n")
    rendered = Render(d)
    by_name = {r["metadata"]["name"]: r for r in rendered}
    source = {r["metadata"]["name"]: r for r in yaml.safe_load_all(OPT_OUT)}
    if by_name.get("prep") != source["prep"]:
        Fail("opt-out", "a Job labelled spgate.io/inject=none was changed")
    for job, have, absent in (("workers-only", "Worker", "Master"), ("master-only", "Master", "Worker")):
        specs = by_name.get(job, {}).get("spec", {}).get("pytorchReplicaSpecs", {})
        if absent in specs:
            Fail("opt-out", f"{job}: a {absent} replica spec was made up")
        pod = next((p for p in m.PodTemplates([by_name[job]]) if p.replica == have), None)
        if pod is None or not Named(pod.spec.get("initContainers"), m.SIDECAR):
            Fail("opt-out", f"{job}: its {have} pods got no sidecar")
    trainer = Named(by_name["workers-only"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
                    ["spec"]["containers"], "pytorch")
    if not trainer or [e["name"] for e in trainer.get("env") or []][:1] != ["A"]:
        Fail("opt-out", "the training container's own env was not kept (first)")
    if m.KUBECTL:
        r = subprocess.run([m.KUBECTL, "kustomize", d], capture_output=True, text=True, timeout=60)
        theirs = [x for x in yaml.safe_load_all(r.stdout) if x] if r.returncode == 0 else None
        key = lambda x: (x["kind"], x["metadata"]["name"])  # noqa: E731
        if theirs is None or sorted(theirs, key=key) != sorted(rendered, key=key):
            Fail("opt-out", f"kustomize_render.py and kubectl kustomize disagree {r.stderr[-500:]}")
    return rendered


# --- monitoring --------------------------------------------------------------------------

def CheckMonitoring():
    rendered = Render(os.path.join(K8S, "monitoring"))
    maps = {r["metadata"]["name"]: r for r in rendered if r["kind"] == "ConfigMap"}
    files = sorted(f for f in os.listdir(DASHBOARDS) if f.endswith(".json"))
    held = {}
    for cm in maps.values():
        if cm["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
            Fail(f"monitoring ConfigMap/{cm['metadata']['name']}",
                 'needs the label grafana_dashboard: "1" (Grafana sidecar)')
        held.update(cm.get("data") or {})
    if sorted(held) != files or len(maps) != len(files):
        Fail("monitoring", f"one ConfigMap per dashboard expected: {files}, got {sorted(held)}")
    for f in files:
        with open(os.path.join(DASHBOARDS, f), encoding="utf-8") as fh:
            if held.get(f) != fh.read():
                Fail("monitoring", f"ConfigMap data {f} is not dashboards/{f}")
    with open(RULES, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["groups"]
    rules = [r for r in rendered if r["kind"] == "PrometheusRule"]
    if len(rules) != 1 or rules[0]["spec"] != {"groups": groups}:
        Fail("monitoring", "the PrometheusRule's spec is not deploy/prometheus/spgate-rules.yml's groups")
    gen = subprocess.run([sys.executable, os.path.join(K8S, "monitoring", "generate.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    if gen.returncode != 0:
        Fail("monitoring", gen.stdout.strip() or gen.stderr.strip())
    return rendered


def main():
    with tempfile.TemporaryDirectory(prefix="spgate-k8s-component-") as tmp:
        renders = CheckExamples()
        renders["opt-out"] = CheckOptOut(tmp)
        renders["monitoring"] = CheckMonitoring()
        for overlay in sorted(os.listdir(os.path.join(K8S, "overlays"))):
            renders[overlay] = Render(os.path.join(K8S, "overlays", overlay))
        for name, resources in renders.items():
            StructuralProblems(name, resources)
    if failures:
        print(f"FAIL: {len(failures)} problem(s)")
        for f in failures:
            print("  " + f)
        return 1
    print(f"PASS: {', '.join(renders)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
