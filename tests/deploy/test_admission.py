"""The manifests as a hardened cluster reads them: checkov's Kubernetes policies (offline) with no
failed check and a reason for every inline skip, Pod Security "restricted" on every pod, and the
kustomizations that set the namespace and the images in one place.

checkov does not know KServe's InferenceService: its predictor is checked as the Pod KServe makes
of it (a PodSpec, labelled with the InferenceService's name, which the NetworkPolicies select)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_manifests import DEPLOY, KUSTOMIZE_FILES, MANIFESTS, documents, pod_specs

KSERVE_POD_LABEL = "serving.kserve.io/inferenceservice"


def as_checkov_sees_them(doc: dict) -> dict:
    if doc["kind"] != "InferenceService":
        return doc
    meta = doc["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "spec": pod_specs(doc)[0],
            "metadata": {"name": meta["name"], "labels": {KSERVE_POD_LABEL: meta["name"]}, "annotations": meta.get("annotations", {})}}


@pytest.fixture(scope="module")
def checkov_report(tmp_path_factory) -> dict:
    """One offline checkov run (about 5-15 s on 2 cores) over every manifest, one file per directory."""
    scanned = tmp_path_factory.mktemp("checkov")
    for directory in sorted({p.parent for p in MANIFESTS}):
        docs = [as_checkov_sees_them(d) for p in MANIFESTS if p.parent == directory for d in documents(p)]
        (scanned / f"{directory.name}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    checkov = Path(sys.executable).with_name("checkov")
    proc = subprocess.run([str(checkov), "-d", str(scanned), "--framework", "kubernetes", "--output", "json", "--skip-download"],
                          capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(scanned)})
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_checkov_finds_no_failed_check(checkov_report):
    failed = [(c["check_id"], c["check_name"], c["resource"]) for c in checkov_report["results"]["failed_checks"]]
    assert failed == []
    assert checkov_report["summary"]["parsing_errors"] == 0
    # every pod is scanned: the Deployments' and the InferenceServices' (as Pods)
    resources = {c["resource"] for c in checkov_report["results"]["passed_checks"]}
    for name in ("Deployment.default.vkact-cpu", "Deployment.default.vkact-gpu", "Pod.default.vkact-cpu", "Pod.default.vkact-gpu"):
        assert name in resources


def test_every_skipped_check_says_why(checkov_report):
    skipped = checkov_report["results"]["skipped_checks"]
    assert skipped, "the manifests skip the checks whose answer is in kustomization.yaml"
    for check in skipped:
        reason = check["check_result"].get("suppress_comment", "")
        assert len(reason.split()) >= 5, (check["check_id"], check["resource"], reason)
    # what kustomization.yaml answers, and the CPU limit decided against: nothing else
    assert {c["check_id"] for c in skipped} == {"CKV_K8S_21", "CKV_K8S_43", "CKV_K8S_11"}


def every_pod() -> list[tuple[str, dict]]:
    return [(f"{p.relative_to(DEPLOY)}:{d['metadata']['name']}", spec) for p in MANIFESTS for d in documents(p) for spec in pod_specs(d)]


@pytest.mark.parametrize("name,spec", every_pod(), ids=lambda v: v if isinstance(v, str) else "")
def test_pods_meet_pod_security_restricted(name, spec):
    """What the "restricted" profile of Pod Security Admission requires (and "baseline" under it),
    plus the read-only root, whose writable paths are the emptyDirs the image expects."""
    pod_ctx = spec.get("securityContext", {})
    assert pod_ctx.get("runAsNonRoot") is True and pod_ctx.get("runAsUser", 1) != 0
    assert pod_ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    assert spec.get("automountServiceAccountToken") is False
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert all(set(v) == {"name", "emptyDir"} for v in volumes.values()), "restricted pods may use emptyDir, not hostPath"
    for c in spec["containers"]:
        ctx = c["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
        assert ctx["readOnlyRootFilesystem"] is True and not ctx.get("privileged")
        assert c["imagePullPolicy"] in ("Always", "IfNotPresent")
        mounts = {m["mountPath"]: volumes[m["name"]]["emptyDir"] for m in c["volumeMounts"]}
        # the paths docker/Dockerfile says the service writes: slots and registry, temporary files and caches
        assert mounts["/dev/shm"].get("medium") == "Memory" and "/tmp" in mounts
        assert all("sizeLimit" in v for v in mounts.values()), "an emptyDir without a bound can fill the node"
        assert "cpu" not in c["resources"].get("limits", {}), "no CPU limit: decided (see the manifests)"


def test_network_policies_admit_only_the_service_ports():
    for path in MANIFESTS:
        docs = documents(path)
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        for doc in docs:
            for spec in pod_specs(doc):
                labels = doc["spec"]["template"]["metadata"]["labels"] if doc["kind"] == "Deployment" else {KSERVE_POD_LABEL: doc["metadata"]["name"]}
                mine = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
                assert len(mine) == 1, (path, doc["metadata"]["name"])
                policy = mine[0]["spec"]
                env = {e["name"]: e.get("value") for c in spec["containers"] for e in c.get("env", [])}
                wanted = {int(env["VKACT_PORT"]), int(env.get("VKACT_GRPC_PORT", 8001))}
                assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and policy["egress"] == []
                assert {p["port"] for rule in policy["ingress"] for p in rule["ports"]} == wanted
                assert all(set(rule) == {"ports"} for rule in policy["ingress"])


def test_replicated_deployments_have_a_disruption_budget():
    for path in MANIFESTS:
        docs = documents(path)
        for doc in (d for d in docs if d["kind"] == "Deployment"):
            budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"
                       and d["spec"]["selector"]["matchLabels"] == doc["spec"]["selector"]["matchLabels"]]
            assert len(budgets) == 1, (path, doc["metadata"]["name"])
            hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler" and d["spec"]["scaleTargetRef"]["name"] == doc["metadata"]["name"])
            # a budget that blocks a drain for good: minAvailable as large as the smallest replica count
            assert budgets[0]["spec"].get("minAvailable", 0) < hpa["spec"]["minReplicas"]


def kustomizations() -> list[Path]:
    return sorted(DEPLOY.rglob("kustomization.yaml"))


def test_a_kustomization_per_directory_lists_every_manifest():
    assert {k.parent for k in kustomizations()} == {p.parent for p in MANIFESTS}
    for k in kustomizations():
        spec = yaml.safe_load(k.read_text())
        assert spec["namespace"] == "vkact"
        assert sorted(spec["resources"]) == sorted(p.name for p in k.parent.glob("*.yaml") if p.name not in KUSTOMIZE_FILES)
        # every image a manifest names has its entry, which can set the registry and a tag or digest
        images = {c["image"] for p in MANIFESTS if p.parent == k.parent for d in documents(p) for s in pod_specs(d) for c in s["containers"]}
        assert {i["name"] for i in spec["images"]} == images


def kustomize() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@pytest.mark.skipif(kustomize() is None, reason="neither kustomize nor kubectl is installed (the structure is checked above)")
@pytest.mark.parametrize("kustomization", kustomizations(), ids=lambda p: p.parent.name)
def test_kustomize_sets_the_namespace_and_pins_images(kustomization, tmp_path):
    """`kubectl apply -k` as an operator runs it, with a digest pinned for one image and a registry for the other."""
    work = tmp_path / kustomization.parent.name
    shutil.copytree(kustomization.parent, work)
    spec = yaml.safe_load((work / "kustomization.yaml").read_text())
    digest = "sha256:" + "ab" * 32
    spec["images"][0] |= {"newName": "registry.example/vkact", "digest": digest}
    spec["images"][0].pop("newTag", None)
    spec["images"][1] |= {"newName": "registry.example/vkact"}
    (work / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run([*kustomize(), str(work)], capture_output=True, text=True, timeout=120, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert len(docs) == sum(len(documents(p)) for p in MANIFESTS if p.parent == kustomization.parent)
    assert {d["metadata"].get("namespace") for d in docs} == {"vkact"}
    images = sorted(c["image"] for d in docs for s in pod_specs(d) for c in s["containers"])
    flavour = spec["images"][1]["name"].split(":")[1]
    assert images == sorted([f"registry.example/vkact@{digest}", f"registry.example/vkact:{flavour}"])
