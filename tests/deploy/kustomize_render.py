#!/usr/bin/env python3
"""A small, strict renderer for the subset of kustomize that deploy/k8s uses.

Debian 12 ships no kustomize and no recent kubectl, so the manifest tests render with
this when `kubectl kustomize` is absent (and compare against it when present). It
implements exactly, and refuses loudly everything else:

  resources (files and directories), components (kind: Component),
  configMapGenerator (files, literals, options.labels/annotations) with
  generatorOptions.disableNameSuffixHash: true (and generatorOptions.labels/annotations),
  patches (path or inline; strategic merge or JSON 6902; target by kind/name/
  group/version/namespace, name as a regular expression as in kustomize, and by
  labelSelector/annotationSelector with Kubernetes' selector syntax),
  images (newName, newTag, digest; every containers/initContainers list in any kind),
  replacements (source by kind/name/..., fieldPath with [key=value] list selectors and
  [dotted.key] map keys; targets with select, reject, fieldPaths, options.create), and
  resources annotated config.kubernetes.io/local-config: "true" left out of the output.

Strategic merge follows Kubernetes' patch strategy for the fields it knows: containers,
initContainers, volumes, env, imagePullSecrets by `name`, volumeMounts by `mountPath`,
container ports by `containerPort`, Service ports by `port` (patched elements first,
then the rest, as kustomize orders them); other lists are replaced; `null` deletes a
key; `$patch: delete` removes a list element, or, at the top of a patch, every resource
the patch selects; `$patch: replace` replaces a map. Any other `$` directive is an
error. Kustomize knows the merge keys of built-in kinds only: a strategic merge into any
other kind (a custom resource such as a PyTorchJob) replaces every list it names, and so
does this renderer.

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
                    "generatorOptions", "patches", "images", "replacements"}
PATCH_FIELDS = {"path", "patch", "target", "options"}
TARGET_FIELDS = {"group", "version", "kind", "name", "namespace", "labelSelector",
                 "annotationSelector"}
GENERATOR_FIELDS = {"name", "files", "literals", "behavior", "options"}
GENERATOR_OPTION_FIELDS = {"labels", "annotations", "disableNameSuffixHash"}
LOCAL_CONFIG = "config.kubernetes.io/local-config"

# API groups of the kinds whose schema kustomize has built in (their lists merge by the
# keys below); any other group is a custom resource, whose lists a strategic merge replaces.
BUILTIN_GROUPS = {"", "apps", "batch", "networking.k8s.io", "policy", "rbac.authorization.k8s.io",
                  "autoscaling", "storage.k8s.io", "scheduling.k8s.io", "coordination.k8s.io",
                  "discovery.k8s.io", "node.k8s.io"}
IMAGE_FIELDS = {"name", "newName", "newTag", "digest"}

# Kubernetes' patchMergeKey for the list fields deploy/k8s patches.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
              "volumes": "name", "env": "name", "imagePullSecrets": "name",
              "volumeMounts": "mountPath"}

# Output order, as kustomize's legacy ordering puts these kinds.
KIND_ORDER = ["Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret",
              "Service", "Deployment", "StatefulSet", "Job", "CronJob"]


def _load_yaml_docs(path):
    # deepcopy: YAML aliases (*pod) load as one shared object, kustomize's as copies.
    with open(path, encoding="utf-8") as f:
        return [copy.deepcopy(d) for d in yaml.safe_load_all(f) if d is not None]


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


def StrategicMerge(base, patch, field=None, builtin=True):
    """Returns base merged with patch (inputs are not modified). `builtin`: the resource
    is of a kind whose schema kustomize knows; otherwise every list is replaced."""
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
                out[key] = StrategicMerge(out[key], value, key, builtin)
            else:
                out[key] = StrategicMerge(None, value, key, builtin)
        return out
    if isinstance(patch, list):
        merge_key = (_list_merge_key(field, base if isinstance(base, list) else [], patch)
                     if builtin else None)
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
            merged.append(StrategicMerge(by_key.get(key), body, field, builtin))
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


SELECTOR_RE = re.compile(r"""\s*(?:(?P<not>!)\s*(?P<absent>[\w./-]+)
                           |(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*)
                             |\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?)\s*(?:,|$)""",
                         re.X)


def SelectorMatches(selector, labels):
    """Kubernetes' label selector syntax (labels.Parse): k=v, k==v, k!=v, k, !k,
    k in (a,b), k notin (a,b). != and notin also match objects without the key."""
    pos, text = 0, selector.strip()
    if not text:
        return True
    while pos < len(text):
        m = SELECTOR_RE.match(text, pos)
        if not m or m.end() == pos:
            raise KustomizeError(f"label selector {selector!r}: cannot parse at {text[pos:]!r}")
        pos = m.end()
        if m.group("not"):
            ok = m.group("absent") not in labels
        else:
            key, have = m.group("key"), labels.get(m.group("key"))
            if m.group("op") in ("=", "=="):
                ok = have == m.group("value")
            elif m.group("op") == "!=":
                ok = have != m.group("value")
            elif m.group("setop"):
                values = {v.strip() for v in m.group("values").split(",")}
                ok = (have in values) if m.group("setop") == "in" else (have not in values)
            else:
                ok = key in labels
        if not ok:
            return False
    return True


def _matches(resource, target):
    group, version = _gv(resource)
    meta = resource.get("metadata", {})
    checks = {"kind": resource.get("kind"), "name": meta.get("name"),
              "namespace": meta.get("namespace", ""), "group": group, "version": version}
    for key, want in target.items():
        if key == "labelSelector":
            if not SelectorMatches(want, meta.get("labels") or {}):
                return False
        elif key == "annotationSelector":
            if not SelectorMatches(want, meta.get("annotations") or {}):
                return False
        elif not re.fullmatch(str(want), str(checks[key] or "")):
            return False
    return True


def IsBuiltin(resource):
    return _gv(resource)[0] in BUILTIN_GROUPS


def _is_json6902(patch):
    return isinstance(patch, list) and all(isinstance(o, dict) and "op" in o for o in patch)


def ApplyPatch(resources, entry, directory):
    _check_fields(f"{directory}: patches entry", entry, PATCH_FIELDS)
    if entry.get("options"):
        raise KustomizeError(f"{directory}: patch options are not supported")
    if "path" in entry and "patch" in entry:
        raise KustomizeError(f"{directory}: a patch has both path and patch")
    if "path" in entry:
        with open(os.path.join(directory, entry["path"]), encoding="utf-8") as f:
            text = f.read()
    else:
        text = entry.get("patch", "")
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
        # A target that selects nothing is no error in kustomize: the patch does nothing.
        for i, r in enumerate(resources):
            if _matches(r, target):
                resources[i] = JsonPatch(r, patch)
        return
    if not isinstance(patch, dict):
        raise KustomizeError(f"{directory}: a strategic merge patch must be a map")
    if target is None:
        name = patch.get("metadata", {}).get("name")
        if not name or not patch.get("kind"):
            raise KustomizeError(f"{directory}: an untargeted patch needs kind and metadata.name")
        target = {"kind": re.escape(patch["kind"]), "name": re.escape(name)}
    selected = [i for i, r in enumerate(resources) if _matches(r, target)]
    if not selected and "target" not in entry:  # kustomize: "no resource matches"
        raise KustomizeError(f"{directory}: patch target {target} matches nothing")
    if patch.get("$patch") == "delete":  # the whole resource goes
        for i in reversed(selected):
            del resources[i]
        return
    for i in selected:
        body = copy.deepcopy(patch)
        if "target" in entry:  # a targeted patch does not rename what it patches
            body.get("metadata", {}).pop("name", None)
            body.pop("kind", None)
            body.pop("apiVersion", None)
        resources[i] = StrategicMerge(resources[i], body, builtin=IsBuiltin(resources[i]))


def GenerateConfigMaps(kust, directory):
    out = []
    options = kust.get("generatorOptions") or {}
    _check_fields(f"{directory}: generatorOptions", options, GENERATOR_OPTION_FIELDS)
    for gen in kust.get("configMapGenerator") or []:
        _check_fields(f"{directory}: configMapGenerator", gen, GENERATOR_FIELDS)
        own = gen.get("options") or {}
        _check_fields(f"{directory}: configMapGenerator options", own, GENERATOR_OPTION_FIELDS)
        if gen.get("behavior", "create") != "create":
            raise KustomizeError(f"{directory}: configMapGenerator behavior "
                                 f"{gen['behavior']} is not supported")
        if own.get("disableNameSuffixHash", options.get("disableNameSuffixHash")) is not True:
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
        meta = {"name": gen["name"]}
        for field in ("labels", "annotations"):  # the generator's own win over the level's
            merged = {**(options.get(field) or {}), **(own.get(field) or {})}
            if merged:
                meta[field] = {k: str(v) for k, v in merged.items()}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return out


def _split_image(image):
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, None, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1:], None
    return image, None, None


def _container_lists(node):
    """Every containers/initContainers list anywhere in `node`: kustomize's image
    transformer finds them at any depth, in any kind (a PyTorchJob's replica templates)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield value
            yield from _container_lists(value)
    elif isinstance(node, list):
        for item in node:
            yield from _container_lists(item)


def ApplyImages(resources, images, directory):
    for img in images:
        _check_fields(f"{directory}: images entry", img, IMAGE_FIELDS)
        for resource in resources:
            for containers in _container_lists(resource):
                for container in containers:
                    if not isinstance(container, dict):
                        continue
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


# --- replacements -----------------------------------------------------------------------

REPLACEMENT_FIELDS = {"source", "targets"}
SOURCE_FIELDS = {"group", "version", "kind", "name", "namespace", "fieldPath"}
REPLACEMENT_TARGET_FIELDS = {"select", "reject", "fieldPaths", "options"}
REPLACEMENT_OPTION_FIELDS = {"create"}


def FieldPath(path):
    """A kustomize field path as segments: ("key", name) for a map key (`a.b`, or
    `[dotted.key]`), ("match", key, value) for the list element `[key=value]`."""
    parts, buf, depth = [], "", 0
    for ch in path:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "." and depth == 0:
            parts.append(buf)
            buf = ""
        else:
            buf += ch
    parts.append(buf)
    out = []
    for part in parts:
        if part.startswith("[") and part.endswith("]") and "[" not in part[1:]:
            key, eq, value = part[1:-1].partition("=")
            out.append(("match", key, value) if eq else ("key", key))
        elif not part or part.isdigit() or any(c in part for c in "[]*"):
            raise KustomizeError(f"field path {path!r}: segment {part!r} is not supported "
                                 f"(wildcards and list indexes are not implemented)")
        else:
            out.append(("key", part))
    return out


def _step(node, seg, create, next_seg):
    """The child of `node` that `seg` names; created (a list before a [key=value]
    segment, else a map) when missing and `create`; None when missing."""
    if seg[0] == "key":
        if not isinstance(node, dict):
            return None
        if node.get(seg[1]) is None:
            if not create:
                return None
            node[seg[1]] = [] if next_seg and next_seg[0] == "match" else {}
        return node[seg[1]]
    if not isinstance(node, list):
        return None
    for element in node:
        if isinstance(element, dict) and str(element.get(seg[1])) == seg[2]:
            return element
    if not create:
        return None
    node.append({seg[1]: seg[2]})
    return node[-1]


def GetField(resource, path):
    node, segs = resource, FieldPath(path)
    for i, seg in enumerate(segs):
        node = _step(node, seg, False, None)
        if node is None:
            return None
    return node


def SetField(resource, path, value, create):
    """Sets the node at `path` to a copy of `value`; False when the path is missing and
    `create` is off."""
    segs = FieldPath(path)
    node = resource
    for i, seg in enumerate(segs[:-1]):
        node = _step(node, seg, create, segs[i + 1])
        if node is None:
            return False
    last = segs[-1]
    if last[0] == "key":
        if not isinstance(node, dict) or (last[1] not in node and not create):
            return False
        node[last[1]] = copy.deepcopy(value)
        return True
    element = _step(node, last, create, None)
    if element is None:
        return False
    node[node.index(element)] = copy.deepcopy(value)
    return True


def ApplyReplacements(resources, replacements, directory):
    for entry in replacements:
        where = f"{directory}: replacement"
        if not isinstance(entry, dict) or "path" in entry:
            raise KustomizeError(f"{where}: only inline replacements are implemented")
        _check_fields(where, entry, REPLACEMENT_FIELDS)
        source = dict(entry["source"])
        _check_fields(f"{where} source", source, SOURCE_FIELDS)
        field = source.pop("fieldPath", "metadata.name")
        selector = {k: re.escape(str(v)) if k in ("kind", "group", "version") else v
                    for k, v in source.items()}
        found = [r for r in resources if _matches(r, selector)]
        if len(found) != 1:
            raise KustomizeError(f"{where}: source {entry['source']} matches {len(found)} "
                                 f"resources, expected one")
        value = GetField(found[0], field)
        if value is None:
            raise KustomizeError(f"{where}: source field {field} is missing")
        for target in entry["targets"]:
            _check_fields(f"{where} target", target, REPLACEMENT_TARGET_FIELDS)
            options = target.get("options") or {}
            _check_fields(f"{where} target options", options, REPLACEMENT_OPTION_FIELDS)
            for sel in [target["select"]] + list(target.get("reject") or []):
                _check_fields(f"{where} selector", sel, TARGET_FIELDS)
            for r in resources:
                if not _matches(r, target["select"]) or any(
                        _matches(r, rej) for rej in target.get("reject") or []):
                    continue
                for path in target["fieldPaths"]:
                    if not SetField(r, path, value, options.get("create", False)):
                        raise KustomizeError(f"{where}: unable to find field {path} in "
                                             f"{r['kind']}/{r['metadata']['name']}")


def _drop_local_config(resources):
    return [r for r in resources
            if str((r.get("metadata", {}).get("annotations") or {}).get(LOCAL_CONFIG)) != "true"]


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
            resources.extend(Build(path, top=False))
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
    """Generators, then patches, images and replacements: kustomize's order inside one
    level."""
    resources.extend(GenerateConfigMaps(kust, directory))
    _check_unique(resources)
    for entry in kust.get("patches") or []:
        ApplyPatch(resources, entry, directory)
    ApplyImages(resources, kust.get("images") or [], directory)
    ApplyReplacements(resources, kust.get("replacements") or [], directory)


def _read_kustomization(directory, expect_kind):
    path = _kustomization_file(directory)
    with open(path, encoding="utf-8") as f:
        kust = yaml.safe_load(f) or {}
    kind = kust.get("kind", "Kustomization")
    if kind != expect_kind:
        raise KustomizeError(f"{path}: kind {kind}, expected {expect_kind}")
    _check_fields(path, kust, SUPPORTED_FIELDS)
    return kust


def _apply_components(resources, kust, directory):
    for comp in kust.get("components") or []:
        if os.path.isabs(comp):  # kustomize: "new root ... cannot be absolute"
            raise KustomizeError(f"{directory}: component {comp} must be a relative path")
        path = os.path.normpath(os.path.join(directory, comp))
        if not os.path.isdir(path):
            raise KustomizeError(f"{directory}: component {comp} must be a directory")
        ApplyComponent(resources, path)


def ApplyComponent(resources, directory):
    kust = _read_kustomization(directory, "Component")
    _accumulate(resources, kust.get("resources") or [], directory)
    _apply_components(resources, kust, directory)
    _apply_own(resources, kust, directory)


def Build(directory, expect_kind="Kustomization", top=True):
    """Renders the kustomization in `directory`; returns a list of resources. Local
    configuration (annotation config.kubernetes.io/local-config: "true") stays in while
    the levels below the top are built, as replacement sources, and leaves the output."""
    kust = _read_kustomization(directory, expect_kind)
    resources = []
    _accumulate(resources, kust.get("resources") or [], directory)
    _apply_components(resources, kust, directory)
    _apply_own(resources, kust, directory)
    _check_unique(resources)
    return _drop_local_config(resources) if top else resources


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
