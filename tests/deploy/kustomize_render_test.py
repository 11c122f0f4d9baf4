#!/usr/bin/env python3
"""Unit tests of kustomize_render.py: strategic merge and JSON 6902 semantics (lists of a
custom resource replaced), target selection (label selectors), generators, images,
replacements, local configuration, resources deleted by a patch, and the loud refusal of
everything it does not implement. When kubectl is installed, the strategic-merge
list-order cases, the resource deletions and a kustomization using every feature the
sidecar Component relies on are also rendered by `kubectl kustomize` and must agree.
"""
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kustomize_render as kr  # noqa: E402
import yaml  # noqa: E402

# (dest container names, patch elements ('-x' deletes x), expected names afterwards)
LIST_ORDER_CASES = [
    ("a,b", "b", "b,a"),
    ("a,b,c", "b", "b,a,c"),
    ("a,b", "c", "c,a,b"),
    ("a,b,c", "c,a", "c,a,b"),
    ("a,b,c", "d,b", "d,b,a,c"),
    ("a,b,c", "-b", "a,c"),
    ("a,b,c", "-b,d", "d,a,c"),
    ("a,b", "a", "a,b"),
]


def Deployment(containers):
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
            "spec": {"template": {"spec": {"containers": containers}}}}


# `$patch: delete` at the top of a strategic merge patch: the resources it selects go
# (by its own kind and name, or by its target).
DELETE_RESOURCES = "---\n".join(yaml.safe_dump(d) for d in (
    dict(Deployment([]), metadata={"name": "x", "labels": {"a": "1"}}),
    dict(Deployment([]), metadata={"name": "y", "labels": {"a": "1"}}),
    dict(Deployment([]), metadata={"name": "z"}),
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}}))
_DELETE = "$patch: delete\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: %s}\n"
DELETE_CASES = [
    ([{"patch": _DELETE % "x"}], [("Deployment", "y"), ("Deployment", "z"), ("Service", "x")]),
    ([{"target": {"kind": "Deployment", "labelSelector": "a=1"}, "patch": _DELETE % "any"}],
     [("Deployment", "z"), ("Service", "x")]),
]


def PatchFor(spec):
    items = []
    for n in spec.split(","):
        items.append({"name": n[1:], "$patch": "delete"} if n.startswith("-")
                     else {"name": n, "image": "patched"})
    return Deployment(items)


class StrategicMergeTest(unittest.TestCase):
    def test_list_order_and_delete(self):
        for dest, patch, want in LIST_ORDER_CASES:
            with self.subTest(dest=dest, patch=patch):
                base = Deployment([{"name": n, "image": "base"} for n in dest.split(",")])
                out = kr.StrategicMerge(base, PatchFor(patch))
                got = [c["name"] for c in out["spec"]["template"]["spec"]["containers"]]
                self.assertEqual(got, want.split(","))

    def test_merges_by_key_and_replaces_scalar_lists(self):
        base = {"containers": [{"name": "a", "args": ["--x=1", "--y=2"],
                                "volumeMounts": [{"name": "v", "mountPath": "/m"}],
                                "ports": [{"name": "p", "containerPort": 1}]}]}
        patch = {"containers": [{"name": "a", "args": ["--z=3"],
                                 "volumeMounts": [{"name": "w", "mountPath": "/m", "readOnly": True}],
                                 "ports": [{"name": "q", "containerPort": 2}]}]}
        out = kr.StrategicMerge(base, patch)["containers"][0]
        self.assertEqual(out["args"], ["--z=3"])                       # replaced
        self.assertEqual(out["volumeMounts"], [{"name": "w", "mountPath": "/m", "readOnly": True}])
        self.assertEqual([p["containerPort"] for p in out["ports"]], [2, 1])

    def test_null_deletes_and_replace_directive(self):
        base = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": {"y": 1, "z": 2}}}
        patch = {"metadata": {"labels": {"a": None}}, "spec": {"x": {"$patch": "replace", "w": 3}}}
        out = kr.StrategicMerge(base, patch)
        self.assertEqual(out, {"metadata": {"labels": {"b": "2"}}, "spec": {"x": {"w": 3}}})

    def test_unknown_directives_fail(self):
        for patch in ({"$retainKeys": ["a"]}, {"containers": [{"name": "a", "$patch": "replace"}]},
                      {"args": [{"$patch": "delete"}]}):
            with self.subTest(patch=patch), self.assertRaises(kr.KustomizeError):
                kr.StrategicMerge({"containers": [{"name": "a"}], "args": []}, patch)

    def test_inputs_are_not_modified(self):
        base = {"a": {"b": [1]}}
        kr.StrategicMerge(base, {"a": {"c": 1}})
        self.assertEqual(base, {"a": {"b": [1]}})


class JsonPatchTest(unittest.TestCase):
    DOC = {"spec": {"init": [{"name": "s", "restartPolicy": "Always"}], "main": [{"name": "t"}],
                    "labels": {"a/b": "1"}}}

    def test_move_remove_test(self):
        out = kr.JsonPatch(self.DOC, [
            {"op": "test", "path": "/spec/init/0/name", "value": "s"},
            {"op": "move", "from": "/spec/init/0", "path": "/spec/main/0"},
            {"op": "remove", "path": "/spec/main/0/restartPolicy"},
            {"op": "remove", "path": "/spec/labels/a~1b"},
            {"op": "add", "path": "/spec/main/-", "value": {"name": "u"}},
            {"op": "replace", "path": "/spec/main/1/name", "value": "T"},
            {"op": "copy", "from": "/spec/main/0", "path": "/spec/copied"},
        ])
        self.assertEqual(out["spec"]["init"], [])
        self.assertEqual(out["spec"]["main"], [{"name": "s"}, {"name": "T"}, {"name": "u"}])
        self.assertEqual(out["spec"]["labels"], {})
        self.assertEqual(out["spec"]["copied"], {"name": "s"})
        self.assertEqual(self.DOC["spec"]["init"][0]["name"], "s")  # input untouched

    def test_failures(self):
        for ops in ([{"op": "test", "path": "/spec/init/0/name", "value": "x"}],
                    [{"op": "remove", "path": "/spec/nope"}],
                    [{"op": "replace", "path": "/spec/main/5", "value": 1}],
                    [{"op": "add", "path": "spec", "value": 1}],
                    [{"op": "frobnicate", "path": "/spec"}]):
            with self.subTest(ops=ops), self.assertRaises(kr.KustomizeError):
                kr.JsonPatch(self.DOC, ops)


class BuildTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kr-test-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def Write(self, rel, content):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else yaml.safe_dump(content))
        return path

    def test_generator_images_targets(self):
        self.Write("base/dep.yaml", Deployment([{"name": "a", "image": "img:1"},
                                                {"name": "b", "image": "other"}]))
        self.Write("base/cfg.txt", "hello\n")
        self.Write("base/kustomization.yaml", {
            "resources": ["dep.yaml"],
            "configMapGenerator": [{"name": "cm", "files": ["k=cfg.txt"], "literals": ["x=1"]}],
            "generatorOptions": {"disableNameSuffixHash": True},
            "images": [{"name": "img", "newName": "reg/img", "newTag": "2"}]})
        self.Write("comp/kustomization.yaml", {
            "apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
            "patches": [{"target": {"kind": "Deploy.*", "name": "x"},
                         "patch": "- op: add\n  path: /metadata/labels\n  value: {c: '1'}\n"}]})
        self.Write("over/kustomization.yaml", {"resources": ["../base"], "components": ["../comp"]})
        out = {r["kind"]: r for r in kr.Build(os.path.join(self.dir, "over"))}
        self.assertEqual(out["ConfigMap"]["data"], {"k": "hello\n", "x": "1"})
        images = [c["image"] for c in out["Deployment"]["spec"]["template"]["spec"]["containers"]]
        self.assertEqual(images, ["reg/img:2", "other"])
        self.assertEqual(out["Deployment"]["metadata"]["labels"], {"c": "1"})

    def test_delete_directive_removes_resources(self):
        self.Write("r.yaml", DELETE_RESOURCES)
        for patches, want in DELETE_CASES:
            with self.subTest(patches=patches):
                self.Write("kustomization.yaml", {"resources": ["r.yaml"], "patches": patches})
                got = sorted((r["kind"], r["metadata"]["name"]) for r in kr.Build(self.dir))
                self.assertEqual(got, want)

    def test_refuses_what_it_does_not_implement(self):
        self.Write("r.yaml", Deployment([]))
        cases = [
            {"resources": ["r.yaml"], "namePrefix": "p-"},
            {"resources": ["r.yaml"], "commonLabels": {"a": "b"}},
            {"resources": ["r.yaml"], "secretGenerator": [{"name": "s", "literals": ["a=b"]}]},
            {"resources": ["r.yaml"], "configMapGenerator": [{"name": "c", "literals": ["a=b"]}]},
            {"resources": ["https://github.com/x/y"]},
            {"resources": ["missing.yaml"]},
            {"resources": ["r.yaml"], "patches": [{"patch": "- op: add\n  path: /a\n  value: 1\n"}]},
            {"resources": ["r.yaml"], "patches": [{"target": {"labelSelector": "a=(b"},
                                                   "patch": "- op: add\n  path: /a\n  value: 1\n"}]},
            {"resources": ["r.yaml"], "patches": [{"target": {"fieldSelector": "a=b"},
                                                   "patch": "- op: add\n  path: /a\n  value: 1\n"}]},
            {"resources": ["r.yaml"], "replacements": [{"path": "r.yaml"}]},
            {"resources": ["r.yaml"], "replacements": [{
                "source": {"kind": "Deployment", "fieldPath": "spec.template.spec.containers.0"},
                "targets": []}]},
            {"resources": ["r.yaml"], "replacements": [{
                "source": {"kind": "Deployment"},
                "targets": [{"select": {"kind": "Deployment"}, "fieldPaths": ["metadata.name"],
                             "options": {"delimiter": "-"}}]}]},
            {"resources": ["r.yaml"], "replacements": [{
                "source": {"kind": "Deployment", "fieldPath": "spec.nope"}, "targets": []}]},
            {"resources": ["r.yaml"], "components": ["/abs/component"]},
        ]
        for kust in cases:
            with self.subTest(kust=kust):
                self.Write("kustomization.yaml", kust)
                with self.assertRaises((kr.KustomizeError, OSError)):
                    kr.Build(self.dir)


class SelectorTest(unittest.TestCase):
    def test_kubernetes_selector_semantics(self):
        labels = {"a": "1", "b": "x"}
        for selector, want in (("a=1", True), ("a==1", True), ("a=2", False), ("a!=2", True),
                               ("c!=2", True), ("a", True), ("c", False), ("!c", True),
                               ("!a", False), ("b in (x,y)", True), ("b in (y)", False),
                               ("b notin (x)", False), ("c notin (x)", True), ("c in (x)", False),
                               ("a=1,b notin (y, z)", True), ("a=1, c", False), ("", True)):
            with self.subTest(selector=selector):
                self.assertEqual(kr.SelectorMatches(selector, labels), want)
        with self.assertRaises(kr.KustomizeError):
            kr.SelectorMatches("a in x", labels)


class CustomResourceMergeTest(unittest.TestCase):
    def test_lists_of_unknown_kinds_are_replaced(self):
        base = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "spec": {"containers": [{"name": "a", "image": "x"}], "m": {"k": 1}}}
        patch = {"spec": {"containers": [{"name": "a", "env": []}], "m": {"j": 2}}}
        out = kr.StrategicMerge(base, patch, builtin=kr.IsBuiltin(base))
        self.assertEqual(out["spec"]["containers"], [{"name": "a", "env": []}])
        self.assertEqual(out["spec"]["m"], {"k": 1, "j": 2})  # maps still merge
        self.assertTrue(kr.IsBuiltin({"apiVersion": "batch/v1"}))
        self.assertTrue(kr.IsBuiltin({"apiVersion": "v1"}))


class ReplacementTest(unittest.TestCase):
    def test_field_paths(self):
        self.assertEqual(kr.FieldPath("a.[x=1].b.[c.d/e]"),
                         [("key", "a"), ("match", "x", "1"), ("key", "b"), ("key", "c.d/e")])
        for bad in ("a.*.b", "a.0.b", "a..b", "a[x=1]"):
            with self.subTest(path=bad), self.assertRaises(kr.KustomizeError):
                kr.FieldPath(bad)

    def test_set_field_creates_by_key_and_keeps_the_rest(self):
        doc = {"spec": {"c": [{"name": "a", "env": [{"name": "X", "value": "1"}]}]}}
        self.assertTrue(kr.SetField(doc, "spec.c.[name=a].env.[name=Y]", {"name": "Y", "value": "2"}, True))
        self.assertTrue(kr.SetField(doc, "spec.c.[name=a].env.[name=X]", {"name": "X", "value": "3"}, True))
        self.assertTrue(kr.SetField(doc, "spec.v.[name=w]", {"name": "w"}, True))
        self.assertEqual(doc["spec"]["c"][0]["env"], [{"name": "X", "value": "3"},
                                                      {"name": "Y", "value": "2"}])
        self.assertEqual(doc["spec"]["v"], [{"name": "w"}])
        self.assertFalse(kr.SetField(doc, "spec.c.[name=b].env", [], False))
        self.assertFalse(kr.SetField(doc, "spec.nope.x", 1, False))
        self.assertEqual(kr.GetField(doc, "spec.c.[name=a].env.[name=Y].value"), "2")

    def test_select_reject_and_source(self):
        src = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s"},
               "spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}
        a = Deployment([{"name": "c", "image": "i"}])
        b = copy.deepcopy(a)
        b["metadata"] = {"name": "y", "labels": {"skip": "yes"}}
        resources = [src, a, b]
        kr.ApplyReplacements(resources, [{
            "source": {"kind": "Pod", "name": "s", "fieldPath": "spec.volumes.[name=v]"},
            "targets": [{"select": {"kind": "Deployment"}, "reject": [{"labelSelector": "skip=yes"}],
                         "fieldPaths": ["spec.template.spec.volumes.[name=v]"],
                         "options": {"create": True}}]}], "t")
        self.assertEqual(a["spec"]["template"]["spec"]["volumes"], [{"name": "v", "emptyDir": {}}])
        self.assertNotIn("volumes", b["spec"]["template"]["spec"])
        with self.assertRaises(kr.KustomizeError):  # missing target without create
            kr.ApplyReplacements(resources, [{
                "source": {"kind": "Pod", "name": "s", "fieldPath": "spec.volumes.[name=v]"},
                "targets": [{"select": {"kind": "Deployment"}, "fieldPaths": ["spec.x.[name=v]"]}]}], "t")
        with self.assertRaises(kr.KustomizeError):  # two sources
            kr.ApplyReplacements(resources, [{"source": {"kind": "Deployment"}, "targets": []}], "t")


def FeatureTree(root):
    """A kustomization using what the sidecar Component relies on: a Component with a
    local-config source, replacements with create/reject, label-selected patches into a
    custom resource, generator labels, images in nested containers, YAML aliases."""
    def write(rel, text):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    write("comp/src.yaml", """apiVersion: v1
kind: Pod
metadata: {name: src, annotations: {config.kubernetes.io/local-config: "true"}}
spec:
  initContainers: [{name: side, image: img, restartPolicy: Always}]
  containers: [{name: main, env: [{name: E, value: "1"}]}]
""")
    write("comp/kustomization.yaml", """apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources: [src.yaml]
configMapGenerator:
  - {name: cm, literals: [a=b], options: {labels: {x: "1"}}}
generatorOptions: {disableNameSuffixHash: true, labels: {g: "2"}}
patches:
  - target: {group: example.com, kind: Thing, labelSelector: "skip notin (yes)"}
    patch: |-
      apiVersion: example.com/v1
      kind: Thing
      metadata: {name: any}
      spec: {pods: {A: {template: {metadata: {labels: {l: "true"}}}}}, other: [{name: z}]}
replacements:
  - source: {kind: Pod, name: src, fieldPath: "spec.initContainers.[name=side]"}
    targets:
      - select: {group: example.com, kind: Thing}
        reject: [{labelSelector: skip=yes}]
        fieldPaths: ["spec.pods.A.template.spec.initContainers.[name=side]"]
        options: {create: true}
  - source: {kind: Pod, name: src, fieldPath: "spec.containers.[name=main].env.[name=E]"}
    targets:
      - select: {kind: Thing}
        fieldPaths: ["spec.pods.A.template.spec.containers.[name=main].env.[name=E]"]
        options: {create: true}
""")
    write("top/things.yaml", """apiVersion: example.com/v1
kind: Thing
metadata: {name: t1}
spec:
  other: [{name: keep-replaced}]
  pods:
    A:
      template: &tmpl
        spec: {containers: [{name: main, image: img, env: [{name: F, value: "2"}]}]}
    B: {template: *tmpl}
---
apiVersion: example.com/v1
kind: Thing
metadata: {name: t2, labels: {skip: "yes"}}
spec: {pods: {A: {template: {spec: {containers: [{name: main, image: img:3}]}}}}}
""")
    write("top/kustomization.yaml", """resources: [things.yaml]
components: [../comp]
images: [{name: img, newName: reg/img, newTag: "9"}]
""")
    return os.path.join(root, "top")


class FeatureTreeTest(unittest.TestCase):
    def test_render(self):
        with tempfile.TemporaryDirectory() as d:
            out = {(r["kind"], r["metadata"]["name"]): r for r in kr.Build(FeatureTree(d))}
        self.assertNotIn(("Pod", "src"), out)  # local configuration left out
        self.assertEqual(out[("ConfigMap", "cm")]["metadata"]["labels"], {"x": "1", "g": "2"})
        t1 = out[("Thing", "t1")]["spec"]
        a, b = t1["pods"]["A"]["template"], t1["pods"]["B"]["template"]
        self.assertEqual(a["spec"]["initContainers"],
                         [{"name": "side", "image": "reg/img:9", "restartPolicy": "Always"}])
        self.assertEqual(a["spec"]["containers"][0]["env"],
                         [{"name": "F", "value": "2"}, {"name": "E", "value": "1"}])
        self.assertEqual(a["metadata"]["labels"], {"l": "true"})
        self.assertNotIn("initContainers", b["spec"])  # the alias did not share the change
        self.assertEqual(t1["other"], [{"name": "z"}])  # a custom resource's list: replaced
        t2 = out[("Thing", "t2")]["spec"]["pods"]["A"]["template"]
        self.assertNotIn("initContainers", t2["spec"])
        self.assertNotIn("metadata", t2)


KUBECTL, WHY_NO_KUBECTL = kr.KubectlForComparison()


@unittest.skipUnless(KUBECTL, f"{WHY_NO_KUBECTL}: list-order cases checked against the table only")
class AgreesWithKubectlTest(unittest.TestCase):
    def test_list_order_cases(self):
        for dest, patch, want in LIST_ORDER_CASES:
            with self.subTest(dest=dest, patch=patch), tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "dep.yaml"), "w") as f:
                    yaml.safe_dump(Deployment([{"name": n, "image": "base"}
                                               for n in dest.split(",")]), f)
                with open(os.path.join(d, "p.yaml"), "w") as f:
                    yaml.safe_dump(PatchFor(patch), f)
                with open(os.path.join(d, "kustomization.yaml"), "w") as f:
                    f.write("resources: [dep.yaml]\npatches:\n- path: p.yaml\n")
                r = subprocess.run([KUBECTL, "kustomize", d], capture_output=True, text=True,
                                   timeout=60, check=True)
                theirs = yaml.safe_load(r.stdout)
                mine = kr.Build(d)[0]
                self.assertEqual(mine, theirs)

    def test_delete_directive(self):
        for patches, _ in DELETE_CASES:
            with self.subTest(patches=patches), tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "r.yaml"), "w") as f:
                    f.write(DELETE_RESOURCES)
                with open(os.path.join(d, "kustomization.yaml"), "w") as f:
                    yaml.safe_dump({"resources": ["r.yaml"], "patches": patches}, f)
                r = subprocess.run([KUBECTL, "kustomize", d], capture_output=True, text=True,
                                   timeout=60, check=True)
                key = lambda x: (x["kind"], x["metadata"]["name"])  # noqa: E731
                theirs = sorted((x for x in yaml.safe_load_all(r.stdout) if x), key=key)
                self.assertEqual(sorted(kr.Build(d), key=key), theirs)

    def test_feature_tree(self):
        with tempfile.TemporaryDirectory() as d:
            top = FeatureTree(d)
            r = subprocess.run([KUBECTL, "kustomize", top], capture_output=True, text=True,
                               timeout=60, check=True)
            key = lambda x: (x["kind"], x["metadata"]["name"])  # noqa: E731
            theirs = sorted((x for x in yaml.safe_load_all(r.stdout) if x), key=key)
            self.assertEqual(sorted(kr.Build(top), key=key), theirs)


if __name__ == "__main__":
    unittest.main()
