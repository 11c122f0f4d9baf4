#!/usr/bin/env python3
"""Renders deploy/k8s (base, every overlay, the TLS component on the per-job overlay, and
docs/deploy.md's own Job on the per-job overlay) and checks what a cluster would reject or
silently get wrong.

Rendering: tests/deploy/kustomize_render.py always; `kubectl kustomize` as well when
kubectl is installed, and then both renderings must be identical.

Checks on every rendering:
  - spgated's gRPC probes use numeric ports, equal to its --health_listen port, which is
    a declared container port and not the (possibly TLS) worker port;
  - the PodMonitor's port name is a container port name of spgated in every pod template
    it selects, that port is --metrics_listen's, and some pod template is selected;
  - --config lies in a directory mount (no subPath, so ConfigMap updates arrive) of the
    ConfigMap that holds that key, with the content of base/gates.textproto;
  - --admin_token_file lies in a mount of the admin token Secret; --state_dir is a
    writable mount;
  - a worker API listening beyond loopback has a worker credential (--worker_token_file,
    from key `tokens` of Secret spgated-worker-tokens, or mTLS's --tls_client_ca) and no
    --allow_unauthenticated_workers: spgated refuses to start without one, and must not
    be shipped open (docs/security.md, "Worker credentials");
  - every container runs non-root with a read-only root filesystem, no privilege
    escalation, all capabilities dropped, resource requests, and a memory limit;
  - every image was rewritten by `images:`;
  - the trainer's --controller reaches a spgated worker API (loopback sidecar, or the
    Service in the per-job overlay);
  - the trainer speaks what that spgated serves: no TLS flags against a plaintext daemon;
    against a TLS daemon --tls_ca, and --tls_cert/--tls_key when it requires client
    certificates (--tls_client_ca), each the matching key (ca.crt, tls.crt, tls.key) of
    one client Secret mounted in the trainer (not the daemon's own Secret), and
    --tls_server_name equal to the Service it dials (the name the daemon's certificate
    must carry). Without them every step would go to the local fallback;
  - the trainer sends a worker token exactly when its spgated requires one: its own
    --worker_token_file from key `token` of a Secret mounted in the trainer, never the
    daemon's token file (every tenant's tokens).
Per shape: native sidecar (initContainer, restartPolicy Always) in the base; an ordinary
container plus a shared process namespace in legacy-sidecar; no sidecar, a Service whose
selector and targetPort match the Deployment, and a NetworkPolicy letting the trainers
in, in per-job-daemon; TLS flags whose files are mounted in the TLS composition, on
spgated and on the trainer; in docs/deploy.md's "Your own job" example (its
kustomization as the doc shows it, over a Job of the base's shape without spgate's pod
label), the example Job gone, the overlay's other resources unchanged, and the own Job
given the job id and let through the NetworkPolicy.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kustomize_render  # noqa: E402
import yaml  # noqa: E402  (kustomize_render reported a missing python3-yaml)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY_DOC = os.path.join(REPO, "docs", "deploy.md")
# SPGATE_K8S_DIR: check another tree (the mutation self-test uses it).
K8S = os.environ.get("SPGATE_K8S_DIR", os.path.join(REPO, "deploy", "k8s"))
GATES = os.path.join(K8S, "components", "sidecar", "gates.textproto")
SIDECAR = "spgated"
CONFIGMAP = "spgated-gates"
ADMIN_SECRET = "spgated-admin-token"
# The daemon's worker tokens (NAME:TOKEN JOB_PATTERN lines) and the trainer's own line,
# which a sidecar, serving only its own pod's job, reads as its whole token file.
WORKER_SECRET, WORKER_KEY = "spgated-worker-tokens", "tokens"
TRAINER_SECRET, TRAINER_TOKEN_KEY = "spgate-trainer-token", "token"
# The client TLS flags of spgate-sim / spgate-worker (worker/client/tls.h kTlsFlagNames)
# and the key each takes from a cert-manager style Secret.
TRAINER_TLS_KEYS = {"tls_ca": "ca.crt", "tls_cert": "tls.crt", "tls_key": "tls.key"}
TRAINER_TLS_FLAGS = tuple(TRAINER_TLS_KEYS) + ("tls_server_name",)

failures = []


def Fail(where, msg):
    failures.append(f"{where}: {msg}")


def Env(container):
    """The container's variables with a literal value (valueFrom ones map to None)."""
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def Expand(arg, env):
    """$(VAR) as the kubelet expands it in command and args: a defined variable's value;
    an undefined one, or one without a literal value here, stays as written."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: env[m.group(1)] if env.get(m.group(1)) is not None else m.group(0), arg)


def Flags(container):
    out = {}
    env = Env(container)
    for arg in container.get("args", []) + container.get("command", []):
        m = re.match(r"^--([a-z_]+)(?:=(.*))?$", Expand(arg, env))
        if m:  # a bare --flag is a boolean set to true
            out[m.group(1)] = "true" if m.group(2) is None else m.group(2)
    return out


def Port(address):
    return int(address.rsplit(":", 1)[1])


def IsLoopback(address):
    """Whether a listen address reaches only its host (spgated's IsLoopbackListenAddress)."""
    host = address.rsplit(":", 1)[0].strip("[]").lower()
    return host == "localhost" or host == "::1" or re.match(r"^127\.\d+\.\d+\.\d+$", host) is not None


class Pod:
    """One pod template of a workload: a Job's or Deployment's, or one replica type's of a
    PyTorchJob (`replica`)."""

    def __init__(self, resource, template, replica=None):
        self.resource, self.template, self.replica = resource, template, replica
        self.kind, self.name = resource["kind"], resource["metadata"]["name"]
        self.meta, self.spec = template.get("metadata", {}), template["spec"]

    def __str__(self):
        return f"{self.kind}/{self.name}" + (f" {self.replica}" if self.replica else "")


def PodTemplates(resources):
    """Every pod template of every workload, as Pod."""
    for r in resources:
        if r["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield Pod(r, r["spec"]["template"])
        elif r["kind"] == "PyTorchJob":
            for replica, rs in sorted(r["spec"]["pytorchReplicaSpecs"].items()):
                yield Pod(r, rs["template"], replica)


def AllContainers(spec):
    return [("initContainers", c) for c in spec.get("initContainers") or []] + \
           [("containers", c) for c in spec.get("containers") or []]


def Find(resources, kind, name=None):
    return [r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]


def MountFor(container, spec, path):
    """(mount, volume) whose mountPath is the longest prefix directory of `path`."""
    best = None
    for m in container.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"]):
                best = m
    if best is None:
        return None, None
    volume = next((v for v in spec.get("volumes") or [] if v["name"] == best["name"]), None)
    return best, volume


def CheckDaemonContainer(where, c, spec, resources, gates_text):
    flags = Flags(c)
    for flag in ("listen", "admin_listen", "metrics_listen", "health_listen", "config",
                 "state_dir", "admin_token_file"):
        if flag not in flags:
            Fail(where, f"spgated has no --{flag}")
    if failures and not all(f in flags for f in ("health_listen", "metrics_listen", "config")):
        return
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
    health = Port(flags["health_listen"])
    if health == Port(flags["listen"]):
        Fail(where, "--health_listen must be its own plaintext port, not the worker API's")
    if not flags["admin_listen"].startswith("127.0.0.1:"):
        Fail(where, "--admin_listen should stay on loopback (kubectl port-forward reaches it)")
    if health not in ports.values():
        Fail(where, f"health port {health} is not a declared container port")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe)
        if not p:
            Fail(where, f"spgated has no {probe}")
            continue
        if "grpc" not in p:
            Fail(where, f"{probe} is not a gRPC probe")
            continue
        port = p["grpc"].get("port")
        if not isinstance(port, int) or isinstance(port, bool):
            Fail(where, f"{probe}.grpc.port must be a number (gRPC probes take no names), is {port!r}")
        elif port != health:
            Fail(where, f"{probe} probes port {port}, --health_listen is {health}")
    if Port(flags["metrics_listen"]) != ports.get("metrics"):
        Fail(where, f"container port `metrics` ({ports.get('metrics')}) is not "
                    f"--metrics_listen's ({flags['metrics_listen']})")
    if not flags["metrics_listen"].startswith("0.0.0.0:"):
        Fail(where, "--metrics_listen must listen beyond loopback for Prometheus")
    # --config
    mount, volume = MountFor(c, spec, flags["config"])
    if not mount:
        Fail(where, f"--config {flags['config']} is not inside any volume mount")
    else:
        if mount.get("subPath"):
            Fail(where, "the config mount uses subPath: ConfigMap updates would never arrive")
        key = os.path.relpath(flags["config"], mount["mountPath"])
        cm_name = (volume or {}).get("configMap", {}).get("name")
        if cm_name != CONFIGMAP:
            Fail(where, f"--config is mounted from {volume}, not ConfigMap {CONFIGMAP}")
        cms = Find(resources, "ConfigMap", cm_name)
        if not cms:
            Fail(where, f"ConfigMap {cm_name} is not in the rendering")
        elif cms[0].get("data", {}).get(key) != gates_text:
            Fail(where, f"ConfigMap {cm_name} key {key} is not "
                        f"deploy/k8s/components/sidecar/gates.textproto")
    # --admin_token_file
    mount, volume = MountFor(c, spec, flags["admin_token_file"])
    if not mount or (volume or {}).get("secret", {}).get("secretName") != ADMIN_SECRET:
        Fail(where, f"--admin_token_file is not in a mount of Secret {ADMIN_SECRET}")
    elif os.path.relpath(flags["admin_token_file"], mount["mountPath"]) != "token":
        Fail(where, "the admin token file must be the Secret's `token` key")
    # --state_dir
    mount, volume = MountFor(c, spec, flags["state_dir"])
    if not mount or mount.get("readOnly"):
        Fail(where, "--state_dir needs a writable volume (the root filesystem is read-only)")
    # TLS, when on: files mounted
    for flag in ("tls_cert", "tls_key", "tls_client_ca"):
        if flag in flags and not MountFor(c, spec, flags[flag])[0]:
            Fail(where, f"--{flag} {flags[flag]} is not inside a volume mount")
    # The worker API beyond loopback: a worker credential, never shipped open.
    if "allow_unauthenticated_workers" in flags:
        Fail(where, "--allow_unauthenticated_workers must not ship: it opens the worker API to anyone")
    if not IsLoopback(flags["listen"]) and not any(
            f in flags for f in ("worker_token_file", "tls_client_ca")):
        Fail(where, f"--listen={flags['listen']} is beyond loopback without --worker_token_file or "
                    "--tls_client_ca: spgated refuses to start, and anyone reaching it could "
                    "register any job")
    if "worker_token_file" in flags:
        secret, key = SecretOf(c, spec, flags["worker_token_file"])
        sidecar = any(x["name"] != SIDECAR for _, x in AllContainers(spec))
        want = (TRAINER_SECRET, TRAINER_TOKEN_KEY) if sidecar else (WORKER_SECRET, WORKER_KEY)
        if (secret, key) != want:
            Fail(where, f"--worker_token_file must be key `{want[1]}` of a mount of Secret "
                        f"{want[0]}, is {(secret, key)}")
    return flags


def CheckSecurity(where, c, pod_sc):
    sc = c.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False:
        Fail(where, "allowPrivilegeEscalation must be false")
    if sc.get("readOnlyRootFilesystem") is not True:
        Fail(where, "readOnlyRootFilesystem must be true")
    if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
        Fail(where, "capabilities.drop must contain ALL")
    if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
        Fail(where, "runAsNonRoot must be true")
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if not isinstance(uid, int) or uid == 0:
        Fail(where, "needs a numeric non-zero runAsUser (runAsNonRoot cannot check a user name)")
    res = c.get("resources") or {}
    if not res.get("requests", {}).get("cpu") or not res.get("requests", {}).get("memory"):
        Fail(where, "needs cpu and memory requests")
    if not res.get("limits", {}).get("memory"):
        Fail(where, "needs a memory limit")
    if not c.get("image", "").startswith("ghcr.io/spgate/spgate:"):
        Fail(where, f"image {c.get('image')!r} was not set by `images:`")


def SecretOf(container, spec, path):
    """(secret name, key) of the Secret volume mount holding `path`, or (None, None)."""
    mount, volume = MountFor(container, spec, path)
    if not mount or mount.get("subPath"):
        return None, None
    return (volume or {}).get("secret", {}).get("secretName"), os.path.relpath(path, mount["mountPath"])


def CheckTrainerTls(where, c, spec, host, daemon, daemon_spec):
    """The trainer's TLS flags against what the spgated it dials (`daemon`) serves."""
    flags = Flags(c)
    daemon_flags = Flags(daemon)
    mine = sorted(f for f in TRAINER_TLS_FLAGS if f in flags)
    if "tls_cert" not in daemon_flags:
        if mine:
            Fail(where, f"trainer sets {['--' + f for f in mine]} but spgated serves plaintext")
        return
    need = ["tls_ca"] + (["tls_cert", "tls_key"] if "tls_client_ca" in daemon_flags else [])
    need.append("tls_server_name")
    for f in need:
        if f not in flags:
            Fail(where, f"spgated serves {'mTLS' if 'tls_client_ca' in daemon_flags else 'TLS'} "
                        f"but the trainer has no --{f}: every step would fall back to local decisions")
    daemon_secret, _ = SecretOf(daemon, daemon_spec, daemon_flags["tls_cert"])
    secrets = set()
    for f, want_key in TRAINER_TLS_KEYS.items():
        if f not in flags:
            continue
        secret, key = SecretOf(c, spec, flags[f])
        if not secret:
            Fail(where, f"--{f} {flags[f]} is not inside a Secret volume mount of the trainer")
            continue
        if key != want_key:
            Fail(where, f"--{f} reads key {key!r} of Secret {secret}, expected {want_key!r}")
        secrets.add(secret)
    if len(secrets) > 1:
        Fail(where, f"the trainer's CA, certificate and key come from different Secrets {sorted(secrets)}")
    if daemon_secret and daemon_secret in secrets:
        Fail(where, f"the trainer mounts the daemon's own Secret {daemon_secret} (its private key)")
    if "tls_server_name" in flags and host != "127.0.0.1" and flags["tls_server_name"] != host:
        Fail(where, f"--tls_server_name={flags['tls_server_name']} is not the Service dialled ({host})")


def CheckTrainerToken(where, c, spec, daemon, daemon_spec):
    """The trainer's worker token against what the spgated it dials (`daemon`) requires."""
    flags = Flags(c)
    daemon_flags = Flags(daemon)
    if "worker_token_file" not in daemon_flags:
        if "worker_token_file" in flags:
            Fail(where, "the trainer sends a worker token but spgated requires none")
        return
    if "worker_token_file" not in flags:
        Fail(where, "spgated requires a worker token but the trainer has no --worker_token_file: "
                    "every call would be refused and every step fall back to local decisions")
        return
    secret, key = SecretOf(c, spec, flags["worker_token_file"])
    daemon_secret, _ = SecretOf(daemon, daemon_spec, daemon_flags["worker_token_file"])
    if not secret:
        Fail(where, f"--worker_token_file {flags['worker_token_file']} is not inside a Secret "
                    "volume mount of the trainer")
    elif secret == daemon_secret and daemon_spec is not spec:
        Fail(where, f"the trainer mounts the daemon's Secret {secret} (every tenant's token); "
                    "give it its own line in its own Secret")
    elif key != TRAINER_TOKEN_KEY:
        Fail(where, f"--worker_token_file reads key {key!r} of Secret {secret}, expected "
                    f"{TRAINER_TOKEN_KEY!r}")


def Selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def Check(name, resources, gates_text):
    daemons = []  # (where, flags, template labels)
    trainers = []
    for pod in PodTemplates(resources):
        spec, meta = pod.spec, pod.meta
        pod_sc = spec.get("securityContext") or {}
        if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            Fail(f"{name} {pod}", "pod seccompProfile must be RuntimeDefault")
        for field, c in AllContainers(spec):
            where = f"{name} {pod} {field}/{c['name']}"
            CheckSecurity(where, c, pod_sc)
            if field == "initContainers" and c.get("restartPolicy") not in (None, "Always"):
                Fail(where, f"init container restartPolicy {c.get('restartPolicy')}")
            if field == "containers" and "restartPolicy" in c:
                Fail(where, "ordinary containers may not set restartPolicy")
            if c["name"] == SIDECAR:
                flags = CheckDaemonContainer(where, c, spec, resources, gates_text) or {}
                daemons.append((where, field, c, flags, meta.get("labels") or {}, pod))
            else:
                trainers.append((where, c, pod, meta.get("labels") or {}))
    if not daemons:
        Fail(name, "no spgated container rendered")
    # PodMonitor
    for pm in Find(resources, "PodMonitor"):
        selector = pm["spec"]["selector"].get("matchLabels")
        selected = [d for d in daemons if Selects(selector, d[4])]
        non_daemon = [t for t in trainers if Selects(selector, t[3]) and not any(
            d[5] is t[2] for d in daemons)]
        if not selected:
            Fail(name, f"PodMonitor {pm['metadata']['name']} selects no pod running spgated")
        if non_daemon:
            Fail(name, f"PodMonitor selects pods without spgated: {[t[0] for t in non_daemon]}")
        for ep in pm["spec"]["podMetricsEndpoints"]:
            for where, _, c, flags, _, _ in selected:
                names = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
                if ep.get("port") not in names:
                    Fail(where, f"PodMonitor port {ep.get('port')!r} is not a container port name "
                                f"of spgated ({sorted(names)})")
            relabel = ep.get("relabelings") or []
            if not any(x.get("targetLabel") == "job" and x.get("replacement") == "spgated"
                       for x in relabel):
                Fail(name, "PodMonitor must set job=\"spgated\" (the alert rules select it)")
    # Trainers reach a worker API
    services = Find(resources, "Service")
    for where, c, r, _ in trainers:
        controller = Flags(c).get("controller")
        if controller is None:
            Fail(where, "trainer has no --controller")
            continue
        host, port = controller.rsplit(":", 1)
        if host == "127.0.0.1":
            same_pod = [d for d in daemons if d[5] is r]
            if not same_pod or Port(same_pod[0][3].get("listen", ":0")) != int(port):
                Fail(where, f"--controller={controller} but no spgated in the pod listens there")
                continue
            spec = r.spec
            CheckTrainerTls(where, c, spec, host, same_pod[0][2], spec)
            CheckTrainerToken(where, c, spec, same_pod[0][2], spec)
        else:
            svc = next((s for s in services if s["metadata"]["name"] == host), None)
            if not svc:
                Fail(where, f"--controller={controller}: no Service {host}")
                continue
            sp = next((p for p in svc["spec"]["ports"] if p["port"] == int(port)), None)
            backends = [d for d in daemons if Selects(svc["spec"]["selector"], d[4])]
            if not sp or not backends:
                Fail(where, f"Service {host} has no port {port} or selects no spgated")
                continue
            names = {p.get("name"): p["containerPort"] for p in backends[0][2].get("ports") or []}
            target = sp["targetPort"]
            target = names.get(target) if isinstance(target, str) else target
            if target != Port(backends[0][3]["listen"]):
                Fail(where, f"Service {host}:{port} targets {sp['targetPort']}, spgated "
                            f"listens on {backends[0][3]['listen']}")
            if backends[0][3]["listen"].startswith("127.0.0.1:"):
                Fail(where, "the per-job daemon must listen beyond loopback")
            CheckTrainerTls(where, c, r.spec, host, backends[0][2], backends[0][5].spec)
            CheckTrainerToken(where, c, r.spec, backends[0][2], backends[0][5].spec)
    return daemons, trainers


def CheckNetworkPolicy(name, resources, daemons, job):
    """The NetworkPolicy lets `job`'s pods reach the worker API and leaves metrics open."""
    nps = Find(resources, "NetworkPolicy")
    if not nps:
        Fail(name, "no NetworkPolicy rendered")
    for np in nps:
        listen = Port(daemons[0][3]["listen"]) if daemons else None
        trainer_labels = job["spec"]["template"].get("metadata", {}).get("labels") or {}
        allowed = any(
            listen in [p.get("port") for p in rule.get("ports", [])]
            and any(Selects(f.get("podSelector", {}).get("matchLabels"), trainer_labels)
                    for f in rule.get("from", []))
            for rule in np["spec"].get("ingress", []))
        if not allowed:
            Fail(name, "the NetworkPolicy does not let the trainer pods reach the worker API")
        metrics_open = any(9461 in [p.get("port") for p in rule.get("ports", [])] and not rule.get("from")
                           for rule in np["spec"].get("ingress", []))
        if not metrics_open:
            Fail(name, "the NetworkPolicy must leave the metrics port open to Prometheus")


def CheckOwnJob(renders):
    """docs/deploy.md's own Job on the per-job overlay: the example Job deleted, the
    daemon's side as the overlay renders it, and the own Job dialling it (Check above
    followed its --controller to the Service and its worker token to its Secret)."""
    name = "per-job-daemon+own-job"
    own, per_job = renders[name], renders["per-job-daemon"]
    d, trainers = own["checked"]
    jobs = Find(own["resources"], "Job")
    if [j["metadata"]["name"] for j in jobs] != [OWN_JOB]:
        Fail(name, f"exactly the own Job {OWN_JOB} expected, got {[j['metadata']['name'] for j in jobs]}")
        return
    daemon_side = {Key(r): r for r in own["resources"] if r["kind"] != "Job"}
    expected = {Key(r): r for r in per_job["resources"] if r["kind"] != "Job"}
    if daemon_side != expected:
        Fail(name, "the overlay's Deployment, Service, NetworkPolicy, ConfigMap and PodMonitor "
                   "differ from the per-job-daemon rendering")
    spec = jobs[0]["spec"]["template"]["spec"]
    if any(c["name"] == SIDECAR for _, c in AllContainers(spec)):
        Fail(name, "the own Job runs spgated")
    if not trainers:
        Fail(name, "no trainer rendered")
    for where, c, _, _ in trainers:
        env = {e["name"]: e for e in c.get("env") or []}
        if "SPGATE_JOB_ID" not in env:
            Fail(where, "the own Job's trainer has no SPGATE_JOB_ID")
    CheckNetworkPolicy(name, own["resources"], d, jobs[0])


def CheckShapes(renders):
    base = renders["base"]
    d, _ = base["checked"]
    if not any(field == "initContainers" and c.get("restartPolicy") == "Always"
               for _, field, c, _, _, _ in d):
        Fail("base", "spgated must be a native sidecar: initContainers with restartPolicy: Always")
    if any(Flags(c).get("listen", "").split(":")[0] != "127.0.0.1" for _, _, c, _, _, _ in d):
        Fail("base", "the sidecar's worker API should listen on loopback only")

    legacy = renders["legacy-sidecar"]
    d, trainers = legacy["checked"]
    for where, field, c, _, _, r in d:
        if field != "containers" or "restartPolicy" in c:
            Fail(where, "legacy-sidecar: spgated must be an ordinary container")
        spec = r.spec
        if spec.get("initContainers"):
            Fail(where, "legacy-sidecar: init containers left behind")
        if spec.get("shareProcessNamespace") is not True:
            Fail(where, "legacy-sidecar: the trainer needs shareProcessNamespace to stop spgated")
    for where, c, _, _ in trainers:
        script = " ".join(c.get("command", []))
        if "kill -TERM" not in script or "spgated" not in script:
            Fail(where, "legacy-sidecar: the trainer must stop spgated when it exits")

    per_job = renders["per-job-daemon"]
    d, trainers = per_job["checked"]
    job = Find(per_job["resources"], "Job")[0]
    spec = job["spec"]["template"]["spec"]
    if any(c["name"] == SIDECAR for _, c in AllContainers(spec)):
        Fail("per-job-daemon", "the training Job still runs spgated")
    # The volumes only the base's sidecar mounted (the trainer keeps its worker credential).
    base_spec = Find(renders["base"]["resources"], "Job")[0]["spec"]["template"]["spec"]
    mounted = {field: {m["name"] for c in base_spec.get(field) or [] for m in c.get("volumeMounts") or []}
               for field in ("initContainers", "containers")}
    sidecar_volumes = mounted["initContainers"] - mounted["containers"]
    kept = [v["name"] for v in spec.get("volumes") or [] if v["name"] in sidecar_volumes]
    if kept:
        Fail("per-job-daemon", f"the Job keeps the sidecar's volumes {kept}")
    if [x[5].kind for x in d] != ["Deployment"]:
        Fail("per-job-daemon", "exactly one spgated, in the Deployment, expected")
    deploy = Find(per_job["resources"], "Deployment", "spgated")
    if deploy and (deploy[0]["spec"].get("replicas") != 1
                   or deploy[0]["spec"].get("strategy", {}).get("type") != "Recreate"):
        Fail("per-job-daemon", "one replica with the Recreate strategy (one daemon per job)")
    # The per-job daemon runs with the sidecar's flags, except where it listens and the
    # worker credential that listening beyond loopback takes.
    base_flags = dict(renders["base"]["checked"][0][0][3])
    job_flags = dict(d[0][3]) if d else {}
    if d and "worker_token_file" not in job_flags:
        Fail("per-job-daemon", "the per-job daemon's worker API is on the pod network: it must "
                               "ship with --worker_token_file")
    for flag in ("listen", "worker_token_file"):
        base_flags.pop(flag, None)
        job_flags.pop(flag, None)
    if base_flags != job_flags:
        Fail("per-job-daemon", f"spgated flags differ from the sidecar's: {base_flags} vs {job_flags}")
    CheckNetworkPolicy("per-job-daemon", per_job["resources"], d, job)
    CheckOwnJob(renders)

    tls = renders["per-job-daemon+tls"]
    d, trainers = tls["checked"]
    for where, _, c, flags, _, _ in d:
        if not all(f in flags for f in ("tls_cert", "tls_key", "tls_client_ca")):
            Fail(where, "TLS component: --tls_cert/--tls_key/--tls_client_ca missing")
        if "worker_token_file" not in flags:
            Fail(where, "TLS component: the per-job overlay's worker token must stay on")
    # The TLS component must reach the trainer too (mTLS: CA, certificate, key, name);
    # CheckTrainerTls above checked where the files come from.
    if not trainers:
        Fail("per-job-daemon+tls", "no trainer rendered")
    for where, c, _, _ in trainers:
        missing = [f for f in TRAINER_TLS_FLAGS if f not in Flags(c)]
        if missing:
            Fail(where, f"TLS component: the trainer lacks {['--' + f for f in missing]}")
    for name in ("base", "legacy-sidecar", "per-job-daemon"):
        for where, c, _, _ in renders[name]["checked"][1]:
            if any(f in Flags(c) for f in TRAINER_TLS_FLAGS):
                Fail(where, "TLS flags on a trainer without the TLS component")


OWN_JOB = None  # the own Job's name, as docs/deploy.md's example names it


def OwnJobFromDoc(tmp):
    """docs/deploy.md's "Your own job" kustomization, written as the doc shows it next to
    a copy of deploy/k8s at the relative path it names, over a Job of the base's shape
    (the name its patch gives, without the pod label its patch must add)."""
    global OWN_JOB
    with open(DEPLOY_DOC, encoding="utf-8") as f:
        blocks = re.findall(r"^```yaml\n(.*?)^```", f.read(), re.S | re.M)
    found = [b for b in blocks if "overlays/per-job-daemon" in b and "$patch: delete" in b]
    if len(found) != 1:
        raise RuntimeError(f"{DEPLOY_DOC}: expected one yaml block with the per-job overlay and "
                           f"a `$patch: delete`, found {len(found)}")
    kust = yaml.safe_load(found[0])
    overlay = next(r for r in kust["resources"] if r.endswith("overlays/per-job-daemon"))
    job_file = next(r for r in kust["resources"] if r.endswith(".yaml"))
    patches = [yaml.safe_load(p["patch"]) for p in kust.get("patches", [])]
    own = next(p for p in patches if p.get("kind") == "Job" and "$patch" not in p)
    OWN_JOB = own["metadata"]["name"]
    root = os.path.join(tmp, "own-job")
    here = os.path.join(root, "my-training")
    k8s = os.path.normpath(os.path.join(here, overlay, "..", ".."))
    shutil.copytree(K8S, k8s)
    with open(os.path.join(K8S, "base", "job.yaml"), encoding="utf-8") as f:
        job = yaml.safe_load(f)
    job["metadata"] = {"name": OWN_JOB}
    job["spec"]["template"]["metadata"]["labels"].pop("app.kubernetes.io/part-of", None)
    for c in job["spec"]["template"]["spec"]["containers"]:  # your image: no `images:` here
        c["image"] = "ghcr.io/spgate/spgate:0.1.0"
    os.makedirs(here)
    with open(os.path.join(here, job_file), "w", encoding="utf-8") as f:
        yaml.safe_dump(job, f)
    with open(os.path.join(here, "kustomization.yaml"), "w", encoding="utf-8") as f:
        f.write(found[0])
    return here


def RenderAll(tmp):
    targets = {
        "base": os.path.join(K8S, "base"),
        "legacy-sidecar": os.path.join(K8S, "overlays", "legacy-sidecar"),
        "per-job-daemon": os.path.join(K8S, "overlays", "per-job-daemon"),
        "pytorchjob": os.path.join(K8S, "examples", "pytorchjob"),
    }
    # The TLS component composed onto the per-job overlay, the way docs/deploy.md says.
    copy = os.path.join(tmp, "k8s")
    shutil.copytree(K8S, copy)
    compose = os.path.join(copy, "overlays", "per-job-daemon-tls")
    os.makedirs(compose)
    with open(os.path.join(compose, "kustomization.yaml"), "w") as f:
        f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                "resources:\n  - ../per-job-daemon\ncomponents:\n  - ../../components/tls\n")
    targets["per-job-daemon+tls"] = compose
    targets["per-job-daemon+own-job"] = OwnJobFromDoc(tmp)
    for parent in ("overlays", "examples"):
        for overlay in sorted(os.listdir(os.path.join(K8S, parent))):
            if overlay not in targets:
                Fail(f"deploy/k8s/{parent}", f"{overlay} is not covered by this test")
    return targets


KUBECTL, WHY_NO_KUBECTL = kustomize_render.KubectlForComparison()


def KubectlKustomize(path):
    kubectl = KUBECTL
    if not kubectl:
        return None
    r = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d is not None]


def Key(r):
    return (r.get("apiVersion"), r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"])


def main():
    with open(GATES, encoding="utf-8") as f:
        gates_text = f.read()
    renders = {}
    compared = []
    with tempfile.TemporaryDirectory(prefix="spgate-k8s-") as tmp:
        try:
            targets = RenderAll(tmp)
        except (RuntimeError, OSError, KeyError, StopIteration, yaml.YAMLError) as e:
            print(f"FAIL: composing the renderings: {e!r}")
            return 1
        for name, path in targets.items():
            try:
                resources = kustomize_render.Build(path)
            except kustomize_render.KustomizeError as e:
                Fail(name, f"render failed: {e}")
                continue
            try:
                theirs = KubectlKustomize(path)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                Fail(name, str(e))
                theirs = None
            if theirs is not None:
                mine = {Key(r): r for r in resources}
                other = {Key(r): r for r in theirs}
                if mine != other:
                    diff = sorted(set(mine) ^ set(other)) or [k for k in mine if mine[k] != other.get(k)]
                    Fail(name, f"kustomize_render.py and kubectl kustomize disagree on {diff}")
                compared.append(name)
            renders[name] = {"resources": resources,
                             "checked": Check(name, resources, gates_text)}
    if len(renders) == len(targets) and not failures:
        CheckShapes(renders)
    if failures:
        print(f"FAIL: {len(failures)} problem(s)")
        for f in failures:
            print("  " + f)
        return 1
    how = (f"compared with kubectl kustomize: {', '.join(compared)}" if compared else
           f"{WHY_NO_KUBECTL}: rendered with tests/deploy/kustomize_render.py only")
    print(f"PASS: rendered {', '.join(renders)} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
