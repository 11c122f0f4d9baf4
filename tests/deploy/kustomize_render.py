#!/usr/bin/env python3
"""A small, strict renderer for the subset of kustomize that deploy/k8s uses.

Debian 12 ships no kustomize and no recent kubectl, so the manifest tests render with
this when `kubectl kustomize` is absent (and compare against it when present). It
implements exactly, and refuses loudly everything else:

  resources (files and directories), components (kind: Component),
  configMapGenerator (files, literals) with generatorOptions.disableNameSuffixHash: true,
  patches (path or inline; strategic merge or JSON 6902; target by kind/name/
  group/version/namespace, name as a regular expression as in kustomize),
  images (newName, newTag, digest).

Strategic merge follows Kubernetes' patch strategy for the fields it knows: containers,
initContainers, volumes, env, imagePullSecrets by `name`, volumeMounts by `mountPath`,
container ports by `containerPort`, Service ports by `port` (patched elements first,
then the rest, as kustomize orders them); other lists are replaced;
`null` deletes a key; `$patch: delete` removes a list element; `$patch: replace`
replaces a map. Any other `$` directive is an error.

Usage: kustomize_render.py DIR   -> multi-document YAML on stdout (exit 1 on error)
"""
import copy
import os
import re
import sys

try:
    import yaml
except ImportError:
    sys.exit("python3-yaml is missing (Debian: apt-get install python3-yaml; make deps)")


class KustomizeError(Exception):
    pass


SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "components", "configMapGenerator",
                    "generatorOptions", "patches", "images"}
PATCH_FIELDS = {"path", "patch", "target", "options"}
TARGET_FIELDS = {"group", "version", "kind", "name", "namespace"}
GENERATOR_FIELDS = {"name", "files", "literals", "behavior"}
IMAGE_FIELDS = {"name", "newName", "newTag", "digest"}

# Kubernetes' patchMergeKey for the list fields deploy/k8s patches.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
              "volumes": "name", "env": "name", "imagePullSecrets": "name",
              "volumeMounts": "mountPath"}

# Output order, as kustomize's legacy ordering puts these kinds.
KIND_ORDER = ["Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret",
              "Service", "Deployment", "StatefulSet", "Job", "CronJob"]


def _load_yaml_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _kustomization_file(directory):
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise KustomizeError(f"{directory}: no kustomization.yaml")


def _check_fields(where, obj, allowed):
    extra = set(obj) - allowed
    if extra:
        raise KustomizeError(f"{where}: unsupported field(s) {sorted(extra)}; this renderer "
                             f"implements {sorted(allowed)}")


# --- strategic merge patch ---------------------------------------------------------------

def _list_merge_key(field, base_list, patch_list):
    if field in MERGE_KEYS:
        return MERGE_KEYS[field]
    if field == "ports":
        items = [i for i in (base_list or []) + (patch_list or []) if isinstance(i, dict)]
        if items and all("containerPort" in i for i in items):
            return "containerPort"
        if items and all("port" in i for i in items):
            return "port"
        raise KustomizeError("ports list with neither containerPort nor port keys")
    return None


def StrategicMerge(base, patch, field=None):
    """Returns base merged with patch (inputs are not modified)."""
    if isinstance(patch, dict):
        directive = patch.get("$patch")
        for key in patch:
            if key.startswith("$") and key != "$patch":
                raise KustomizeError(f"unsupported strategic merge directive {key}")
        if directive == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if directive not in (None, "merge"):
            raise KustomizeError(f"unsupported $patch: {directive} on a map")
        if not isinstance(base, dict):
            base = {}
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if key == "$patch":
                continue
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = StrategicMerge(out[key], value, key)
            else:
                out[key] = StrategicMerge(None, value, key)
        return out
    if isinstance(patch, list):
        merge_key = _list_merge_key(field, base if isinstance(base, list) else [], patch)
        if merge_key is None:
            for item in patch:
                if isinstance(item, dict) and any(k.startswith("$") for k in item):
                    raise KustomizeError(f"list {field!r} has no merge key; "
                                         f"directives inside it are not supported")
            return copy.deepcopy(patch)
        # Order as kustomize (kyaml) produces it, which differs from the API server's:
        # the patch's elements first, in patch order, then the untouched ones in their
        # original order.
        base = base if isinstance(base, list) else []
        by_key = {e.get(merge_key): e for e in base if isinstance(e, dict)}
        merged, mentioned = [], set()
        for item in patch:
            if not isinstance(item, dict) or merge_key not in item:
                raise KustomizeError(f"{field}: patch element without merge key {merge_key}")
            key = item[merge_key]
            mentioned.add(key)
            directive = item.get("$patch")
            if directive == "delete":
                continue
            if directive not in (None, "merge"):
                raise KustomizeError(f"unsupported $patch: {directive} in list {field}")
            body = {k: v for k, v in item.items() if k != "$patch"}
            merged.append(StrategicMerge(by_key.get(key), body, field))
        rest = [copy.deepcopy(e) for e in base
                if not (isinstance(e, dict) and e.get(merge_key) in mentioned)]
        return merged + rest
    return copy.deepcopy(patch)


# --- JSON patch (RFC 6902) --------------------------------------------------------------

def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc, tokens, path):
    node = doc
    for t in tokens:
        if isinstance(node, list):
            if not t.isdigit() or int(t) >= len(node):
                raise KustomizeError(f"JSON patch path {path}: no element {t}")
            node = node[int(t)]
        elif isinstance(node, dict):
            if t not in node:
                raise KustomizeError(f"JSON patch path {path}: no key {t}")
            node = node[t]
        else:
            raise KustomizeError(f"JSON patch path {path}: {t} inside a scalar")
    return node


def _add(doc, path, value):
    tokens = _pointer(path)
    if not tokens:
        return copy.deepcopy(value)
    parent = _resolve(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), copy.deepcopy(value))
        else:
            raise KustomizeError(f"JSON patch add {path}: bad index")
    elif isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    else:
        raise KustomizeError(f"JSON patch add {path}: parent is a scalar")
    return doc


def _remove(doc, path):
    tokens = _pointer(path)
    if not tokens:
        raise KustomizeError("JSON patch cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, list):
        if not last.isdigit() or int(last) >= len(parent):
            raise KustomizeError(f"JSON patch remove {path}: no element {last}")
        return parent.pop(int(last))
    if isinstance(parent, dict):
        if last not in parent:
            raise KustomizeError(f"JSON patch remove {path}: no key {last}")
        return parent.pop(last)
    raise KustomizeError(f"JSON patch remove {path}: parent is a scalar")


def JsonPatch(doc, ops):
    doc = copy.deepcopy(doc)
    for op in ops:
        kind = op.get("op")
        path = op.get("path")
        if kind == "add":
            doc = _add(doc, path, op["value"])
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            tokens = _pointer(path)
            _resolve(doc, tokens, path)  # the target must exist
            if not tokens:
                doc = copy.deepcopy(op["value"])
            else:
                parent = _resolve(doc, tokens[:-1], path)
                slot = int(tokens[-1]) if isinstance(parent, list) else tokens[-1]
                parent[slot] = copy.deepcopy(op["value"])
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, _resolve(doc, _pointer(op["from"]), op["from"]))
        elif kind == "test":
            got = _resolve(doc, _pointer(path), path)
            if got != op["value"]:
                raise KustomizeError(f"JSON patch test {path}: is {got!r}, expected {op['value']!r}")
        else:
            raise KustomizeError(f"unsupported JSON patch op {kind!r}")
    return doc


# --- targets, generators, images --------------------------------------------------------

def _gv(resource):
    api = resource.get("apiVersion", "")
    return api.split("/", 1) if "/" in api else ("", api)


def _matches(resource, target):
    group, version = _gv(resource)
    meta = resource.get("metadata", {})
    checks = {"kind": resource.get("kind"), "name": meta.get("name"),
              "namespace": meta.get("namespace", ""), "group": group, "version": version}
    for key, want in target.items():
        if not re.fullmatch(str(want), str(checks[key] or "")):
            return False
    return True


def _is_json6902(patch):
    return isinstance(patch, list) and all(isinstance(o, dict) and "op" in o for o in patch)


def ApplyPatch(resources, entry, directory):
    _check_fields(f"{directory}: patches entry", entry, PATCH_FIELDS)
    if entry.get("options"):
        raise KustomizeError(f"{directory}: patch options are not supported")
    if "path" in entry and "patch" in entry:
        raise KustomizeError(f"{directory}: a patch has both path and patch")
    text = (open(os.path.join(directory, entry["path"]), encoding="utf-8").read()
            if "path" in entry else entry.get("patch", ""))
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if len(docs) != 1:
        raise KustomizeError(f"{directory}: a patch must hold exactly one document")
    patch = docs[0]
    target = entry.get("target")
    if target is not None:
        _check_fields(f"{directory}: patch target", target, TARGET_FIELDS)
    if _is_json6902(patch):
        if target is None:
            raise KustomizeError(f"{directory}: a JSON 6902 patch needs a target")
        selected = [i for i, r in enumerate(resources) if _matches(r, target)]
        if not selected:
            raise KustomizeError(f"{directory}: patch target {target} matches nothing")
        for i in selected:
            resources[i] = JsonPatch(resources[i], patch)
        return
    if not isinstance(patch, dict):
        raise KustomizeError(f"{directory}: a strategic merge patch must be a map")
    if target is None:
        name = patch.get("metadata", {}).get("name")
        if not name or not patch.get("kind"):
            raise KustomizeError(f"{directory}: an untargeted patch needs kind and metadata.name")
        target = {"kind": re.escape(patch["kind"]), "name": re.escape(name)}
    selected = [i for i, r in enumerate(resources) if _matches(r, target)]
    if not selected:
        raise KustomizeError(f"{directory}: patch target {target} matches nothing")
    for i in selected:
        body = copy.deepcopy(patch)
        if "target" in entry:  # a targeted patch does not rename what it patches
            body.get("metadata", {}).pop("name", None)
            body.pop("kind", None)
            body.pop("apiVersion", None)
        resources[i] = StrategicMerge(resources[i], body)


def GenerateConfigMaps(kust, directory):
    out = []
    options = kust.get("generatorOptions") or {}
    _check_fields(f"{directory}: generatorOptions", options, {"disableNameSuffixHash"})
    for gen in kust.get("configMapGenerator") or []:
        _check_fields(f"{directory}: configMapGenerator", gen, GENERATOR_FIELDS)
        if gen.get("behavior", "create") != "create":
            raise KustomizeError(f"{directory}: configMapGenerator behavior "
                                 f"{gen['behavior']} is not supported")
        if options.get("disableNameSuffixHash") is not True:
            raise KustomizeError(f"{directory}: name hash suffixes are not implemented; "
                                 f"set generatorOptions.disableNameSuffixHash: true")
        data = {}
        for spec in gen.get("files") or []:
            key, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
            key = key or os.path.basename(path)
            with open(os.path.join(directory, path), encoding="utf-8") as f:
                data[key] = f.read()
        for literal in gen.get("literals") or []:
            key, sep, value = literal.partition("=")
            if not sep:
                raise KustomizeError(f"{directory}: literal {literal!r} has no '='")
            data[key] = value
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": gen["name"]}, "data": data})
    return out


def _pod_specs(resource):
    spec = resource.get("spec", {})
    kind = resource.get("kind")
    if kind == "Pod":
        yield spec
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield spec.get("template", {}).get("spec", {})
    elif kind == "CronJob":
        yield spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})


def _split_image(image):
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, None, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1:], None
    return image, None, None


def ApplyImages(resources, images, directory):
    for img in images:
        _check_fields(f"{directory}: images entry", img, IMAGE_FIELDS)
        for resource in resources:
            for spec in _pod_specs(resource):
                for field in ("initContainers", "containers"):
                    for container in spec.get(field) or []:
                        name, tag, digest = _split_image(container.get("image", ""))
                        if name != img["name"]:
                            continue
                        name = img.get("newName", name)
                        if "digest" in img:
                            container["image"] = f"{name}@{img['digest']}"
                        elif "newTag" in img:
                            container["image"] = f"{name}:{img['newTag']}"
                        else:
                            container["image"] = name + (f":{tag}" if tag else "") + (
                                f"@{digest}" if digest else "")


# --- the real kustomize, when there is one -----------------------------------------------

def KubectlForComparison():
    """(kubectl path, None) when `kubectl kustomize` can render these manifests, else
    (None, why not). Components and `patches:` need kustomize >= 4 (kubectl >= 1.21);
    Debian 12's kubernetes-client (1.20) embeds kustomize 2. SPGATE_NO_KUBECTL=1 opts out."""
    import json
    import shutil
    import subprocess
    if os.environ.get("SPGATE_NO_KUBECTL"):
        return None, "SPGATE_NO_KUBECTL is set"
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None, "kubectl is not installed"
    try:
        r = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True,
                           text=True, timeout=30)
        version = json.loads(r.stdout).get("kustomizeVersion", "")
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return None, f"kubectl version failed: {e}"
    m = re.match(r"v?(\d+)\.", version)
    if not m or int(m.group(1)) < 4:
        return None, f"kubectl's kustomize ({version or 'unknown'}) is older than v4"
    return kubectl, None


# --- build -------------------------------------------------------------------------------

def _accumulate(resources, entries, directory):
    """`resources:` entries: a file adds its documents, a directory its build."""
    for entry in entries:
        path = os.path.normpath(os.path.join(directory, entry))
        if "://" in entry or entry.startswith("github.com/"):
            raise KustomizeError(f"{directory}: remote resource {entry} is not supported")
        if os.path.isdir(path):
            resources.extend(Build(path))
        elif os.path.isfile(path):
            resources.extend(_load_yaml_docs(path))
        else:
            raise KustomizeError(f"{directory}: resource {entry} does not exist")


def _check_unique(resources):
    seen = set()
    for r in resources:
        key = (r.get("apiVersion"), r.get("kind"), r.get("metadata", {}).get("namespace"),
               r.get("metadata", {}).get("name"))
        if key in seen:
            raise KustomizeError(f"duplicate resource {key}")
        seen.add(key)


def _apply_own(resources, kust, directory):
    """Generators, then patches, then images: kustomize's order inside one level."""
    resources.extend(GenerateConfigMaps(kust, directory))
    _check_unique(resources)
    for entry in kust.get("patches") or []:
        ApplyPatch(resources, entry, directory)
    ApplyImages(resources, kust.get("images") or [], directory)


def _read_kustomization(directory, expect_kind):
    path = _kustomization_file(directory)
    with open(path, encoding="utf-8") as f:
        kust = yaml.safe_load(f) or {}
    kind = kust.get("kind", "Kustomization")
    if kind != expect_kind:
        raise KustomizeError(f"{path}: kind {kind}, expected {expect_kind}")
    _check_fields(path, kust, SUPPORTED_FIELDS)
    return kust


def ApplyComponent(resources, directory):
    kust = _read_kustomization(directory, "Component")
    _accumulate(resources, kust.get("resources") or [], directory)
    for comp in kust.get("components") or []:
        path = os.path.normpath(os.path.join(directory, comp))
        if not os.path.isdir(path):
            raise KustomizeError(f"{directory}: component {comp} must be a directory")
        ApplyComponent(resources, path)
    _apply_own(resources, kust, directory)


def Build(directory, expect_kind="Kustomization"):
    """Renders the kustomization in `directory`; returns a list of resources."""
    kust = _read_kustomization(directory, expect_kind)
    resources = []
    _accumulate(resources, kust.get("resources") or [], directory)
    for comp in kust.get("components") or []:
        path = os.path.normpath(os.path.join(directory, comp))
        if not os.path.isdir(path):
            raise KustomizeError(f"{directory}: component {comp} must be a directory")
        ApplyComponent(resources, path)
    _apply_own(resources, kust, directory)
    _check_unique(resources)
    return resources


def Sorted(resources):
    def key(r):
        kind = r.get("kind", "")
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return (rank, kind, r.get("metadata", {}).get("name", ""))
    return sorted(resources, key=key)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        resources = Sorted(Build(argv[1]))
    except (KustomizeError, OSError, yaml.YAMLError) as e:
        print(f"kustomize_render: {e}", file=sys.stderr)
        return 1
    yaml.safe_dump_all(resources, sys.stdout, sort_keys=True, default_flow_style=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
