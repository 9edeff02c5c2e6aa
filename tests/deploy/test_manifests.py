"""The deployment files are valid Kubernetes objects and probe endpoints that the service has."""
from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from service.api import create_app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.37.0"
# kustomize's own files are not Kubernetes objects (test_admission.py checks them)
KUSTOMIZE_FILES = {"kustomization.yaml", "kustomizeconfig.yaml"}
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if p.name not in KUSTOMIZE_FILES)
# serving.kserve.io/v1beta1's predictor, as the kserve 0.21 Python SDK has it (V1beta1PredictorSpec.attribute_map):
# a Kubernetes PodSpec's fields inline, and KServe's own.
KSERVE_PREDICTOR_SPEC = frozenset("""
    activeDeadlineSeconds affinity annotations autoScaling automountServiceAccountToken batcher canaryTrafficPercent
    containerConcurrency containers deploymentStrategy dnsConfig dnsPolicy enableServiceLinks ephemeralContainers
    hostAliases hostIPC hostNetwork hostPID hostUsers hostname hostnameOverride huggingface imagePullSecrets
    initContainers labels lightgbm logger maxReplicas minReplicas model name nodeName nodeSelector onnx os overhead
    paddle pmml preemptionPolicy priority priorityClassName pytorch readinessGates resourceClaims resources
    restartPolicy runtimeClassName scaleMetric scaleMetricType scaleTarget schedulerName schedulingGates
    schedulingGroup securityContext serviceAccount serviceAccountName setHostnameAsFQDN shareProcessNamespace sklearn
    storageContainerName storageUris subdomain tensorflow terminationGracePeriodSeconds timeout tolerations
    topologySpreadConstraints triton volumes workerSpec xgboost""".split())
# the same, less what a PodSpec has (core/v1 in K8S_VERSION's schema): KServe's own fields
KSERVE_PREDICTOR_FIELDS = KSERVE_PREDICTOR_SPEC - set(json.loads(
    (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{K8S_VERSION}-local-strict" / "podspec-v1.json").read_text())["properties"])


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def pod_specs(doc: dict) -> list[dict]:
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]["spec"]]
    if doc["kind"] == "InferenceService":
        return [{k: v for k, v in doc["spec"]["predictor"].items() if k not in KSERVE_PREDICTOR_FIELDS}]
    return []


def test_there_are_manifests_for_both_targets():
    names = {p.relative_to(DEPLOY).as_posix() for p in MANIFESTS}
    assert {"kubernetes/vkact-gpu.yaml", "kubernetes/vkact-cpu.yaml", "kserve/vkact-gpu.yaml", "kserve/vkact-cpu.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_valid_against_the_kubernetes_schemas(path):
    for doc in documents(path):
        if doc["apiVersion"].startswith("serving.kserve.io/"):
            assert doc["kind"] == "InferenceService" and set(doc["spec"]) <= {"predictor", "transformer", "explainer"}
            assert set(doc["spec"]["predictor"]) <= KSERVE_PREDICTOR_SPEC, set(doc["spec"]["predictor"]) - KSERVE_PREDICTOR_SPEC
            # the predictor is a PodSpec plus KServe's fields: validate that part as a core/v1 Pod
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": doc["metadata"]["name"]}, "spec": pod_specs(doc)[0]}
            kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_probes_and_ports_point_at_the_service():
    routes = set(create_app().openapi()["paths"])
    for path in MANIFESTS:
        for doc in documents(path):
            for spec in pod_specs(doc):
                for container in spec["containers"]:
                    env = {e["name"]: e.get("value") for e in container.get("env", [])}
                    port = int(env["VKACT_PORT"])
                    assert port in {p["containerPort"] for p in container["ports"]}, path
                    assert env["VKACT_HOST"] == "0.0.0.0"
                    probes = [container[k] for k in ("readinessProbe", "livenessProbe", "startupProbe") if k in container]
                    assert {"readinessProbe", "livenessProbe"} <= set(container), path
                    for probe in probes:
                        assert probe["httpGet"]["path"] in routes, (path, probe)
                    assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"]), "tensors cross in /dev/shm"
                    gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
                    assert container["image"].endswith(":gpu") == gpu
                    assert not gpu or env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",").count("graphics") == 1


def test_service_settings_in_the_manifests_are_valid():
    """Every VKACT_* variable a manifest sets is a setting, with a value the service accepts; CPU
    deployments, whose replicas share a node's CPUs, do not pin (see README: VKACT_PIN_CPU)."""
    from service.config import Settings

    for path in MANIFESTS:
        for doc in documents(path):
            for spec in pod_specs(doc):
                for container in spec["containers"]:
                    env = {e["name"]: e["value"] for e in container.get("env", []) if e["name"].startswith("VKACT_")}
                    fields = {f"VKACT_{name.upper()}": name for name in Settings.model_fields}
                    assert set(env) <= set(fields), (path, set(env) - set(fields))
                    Settings(**{fields[k]: v for k, v in env.items()})  # raises on a value the service refuses
                    if container["image"].endswith(":cpu"):
                        assert env.get("VKACT_PIN_CPU") == "off", path


def test_compose_passes_every_service_setting_through():
    """docker/compose.yaml lists every VKACT_* setting (the build-time paths aside), so a variable set
    in the shell reaches the container."""
    from service.config import Settings

    compose = yaml.safe_load((DEPLOY.parent / "docker" / "compose.yaml").read_text())
    build_time = {"glsl_dir", "spirv_cache", "glslang"}
    wanted = {f"VKACT_{name.upper()}" for name in Settings.model_fields if name not in build_time}
    for name, service in compose["services"].items():
        assert wanted <= set(service["environment"]), (name, wanted - set(service["environment"]))


def test_containers_are_restarted_when_the_service_dies():
    """Inside a container ``python -m service`` restarts its HTTP server; if the whole service dies
    anyway (the supervisor killed, the container's memory limit), the orchestrator restarts it:
    compose's restart policy, and Kubernetes' restartPolicy Always (the Deployment default; KServe
    makes Deployments too)."""
    compose = yaml.safe_load((DEPLOY.parent / "docker" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        assert service.get("restart") in ("unless-stopped", "always"), name
    for path in MANIFESTS:
        for doc in documents(path):
            for spec in pod_specs(doc):
                assert spec.get("restartPolicy", "Always") == "Always", path
