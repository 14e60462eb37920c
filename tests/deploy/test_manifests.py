"""deploy/k8s/base: every manifest valid against a pinned Kubernetes schema (strict), and the
shape the services need: recall autoscaled, HTTP pods probed on /health, the worker and beat
probed, known env only, every shipped secret refused in production. The overlays, the
NetworkPolicies' reachability and the monitoring objects: test_k8s_overlays.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.env_contract import INFRA_ENV, build_settings, settings_aliases

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "k8s" / "base"
# Pinned: kubernetes-validate ships schemas for 1.25..1.37; a floating "latest" would change
# what passes when the package is upgraded.
KUBERNETES_VERSION = "1.33.0"
HTTP_COMPONENTS = {"gateway": 57332, "recall": 57333, "ingest": 57334}
OPTIONAL_MANIFESTS = {"ingress.yaml"}


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def load_resources() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in manifest_files()
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


RESOURCES = load_resources()


def resources(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in RESOURCES if doc["kind"] == kind}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def workloads() -> list[dict[str, Any]]:
    return [doc for _, doc in RESOURCES if doc["kind"] in ("Deployment", "Job")]


def test_kubernetes_version_is_shipped_by_the_validator() -> None:
    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize(
    "filename, resource",
    RESOURCES,
    ids=[f"{name}:{doc['kind']}/{doc['metadata']['name']}" for name, doc in RESOURCES],
)
def test_manifest_is_valid_kubernetes(filename: str, resource: dict[str, Any]) -> None:
    # A kind without a schema raises SchemaNotFoundError and fails the test too.
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_validator_rejects_a_broken_manifest() -> None:
    """Guards the test above against validating nothing."""
    broken = yaml.safe_load(yaml.safe_dump(resources("Deployment")["engram-gateway"]))
    probe = broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGett"] = probe.pop("httpGet")  # a typo strict mode must reject
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    expected = {p.name for p in manifest_files()} - OPTIONAL_MANIFESTS
    assert listed == expected
    assert kustomization["namespace"] == "engram"
    assert {doc["metadata"].get("namespace") for _, doc in RESOURCES if doc["kind"] != "Namespace"} == {"engram"}


def test_every_process_has_its_workload() -> None:
    deployments = resources("Deployment")
    assert set(deployments) == {f"engram-{c}" for c in ("gateway", "recall", "ingest", "worker", "beat")}
    assert "engram-migrate" in resources("Job")
    for name, port in ((f"engram-{c}", p) for c, p in HTTP_COMPONENTS.items()):
        service = resources("Service")[name]
        assert service["spec"]["selector"] == deployments[name]["spec"]["selector"]["matchLabels"]
        assert service["spec"]["ports"][0]["port"] == port


def test_recall_is_autoscaled_on_cpu() -> None:
    hpas = [h for h in resources("HorizontalPodAutoscaler").values()]
    recall = [h for h in hpas if h["spec"]["scaleTargetRef"]["name"] == "engram-recall"]
    assert len(recall) == 1
    hpa = recall[0]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert "engram-recall" in resources("Deployment")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    [metric] = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    # Utilization is relative to the request: without one the HPA cannot compute it.
    [container] = resources("Deployment")["engram-recall"]["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"]
    # The HPA owns the replica count; a fixed one would be reset on every apply.
    assert "replicas" not in resources("Deployment")["engram-recall"]["spec"]


def test_recall_has_a_disruption_budget() -> None:
    selector = resources("Deployment")["engram-recall"]["spec"]["selector"]["matchLabels"]
    budgets = [p for p in resources("PodDisruptionBudget").values() if p["spec"]["selector"]["matchLabels"] == selector]
    assert budgets and budgets[0]["spec"]["minAvailable"] == 1


def test_gateway_runs_two_or_more_replicas_with_a_budget_and_an_autoscaler() -> None:
    """Issue 16: any gateway replica serves any Streamable HTTP request (sessions in Redis)."""
    deployment = resources("Deployment")["engram-gateway"]
    # The HPA owns the replica count; a fixed one would be reset on every apply.
    assert "replicas" not in deployment["spec"]
    [hpa] = [h for h in resources("HorizontalPodAutoscaler").values() if h["spec"]["scaleTargetRef"]["name"] == "engram-gateway"]
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    [metric] = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    budgets = [p for p in resources("PodDisruptionBudget").values() if p["spec"]["selector"]["matchLabels"] == selector]
    assert len(budgets) == 1 and budgets[0]["spec"]["minAvailable"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_ingress_needs_no_session_affinity() -> None:
    ingress = yaml.safe_load((K8S_DIR / "ingress.yaml").read_text())
    annotations = ingress["metadata"]["annotations"]
    assert not [a for a in annotations if "upstream-hash-by" in a or "affinity" in a]


@pytest.mark.parametrize("component", sorted(HTTP_COMPONENTS))
def test_http_deployment_probes_health(component: str) -> None:
    deployment = resources("Deployment")[f"engram-{component}"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": HTTP_COMPONENTS[component]}
    assert str(HTTP_COMPONENTS[component]) in container["command"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        # Readiness asks /health (dependencies); the gateway's startup and liveness ask
        # /health/live: restarting it cures no dependency (README, Operations).
        assert get["path"] == ("/health" if probe == "readinessProbe" or component != "gateway" else "/health/live"), probe
        assert ports.get(get["port"], get["port"]) == HTTP_COMPONENTS[component], probe


def test_beat_runs_exactly_once() -> None:
    beat = resources("Deployment")["engram-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert "beat" in beat["spec"]["template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("workload", workloads(), ids=lambda d: d["metadata"]["name"])
def test_workload_runs_unprivileged_with_bounded_resources(workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in containers(workload):
        assert container["image"] == "engram:latest"
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert set(container["resources"]) == {"requests", "limits"}
        for key in ("cpu", "memory"):
            assert container["resources"]["requests"][key] and container["resources"]["limits"][key]


def test_requests_fit_a_two_core_node_at_minimum_scale() -> None:
    """Everything at its minimum replica count schedules on one 2-core / 24 GiB node."""

    def cpu(value: str) -> float:
        return float(value[:-1]) / 1000 if value.endswith("m") else float(value)

    def memory_mib(value: str) -> float:
        return float(value[:-2]) * (1024 if value.endswith("Gi") else 1)

    autoscaled = resources("HorizontalPodAutoscaler")
    minimum = {name: autoscaled[name]["spec"]["minReplicas"] for name in ("engram-recall", "engram-gateway")}
    total_cpu = total_mib = 0.0
    for name, deployment in resources("Deployment").items():
        replicas = minimum.get(name, deployment["spec"].get("replicas", 1))
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            total_cpu += replicas * cpu(container["resources"]["requests"]["cpu"])
            total_mib += replicas * memory_mib(container["resources"]["requests"]["memory"])
    assert total_cpu <= 1.6  # 2 cores less what the kubelet and system pods reserve
    assert total_mib <= 20 * 1024


def operator_value(value: str) -> str:
    """What an operator puts where the manifest says REPLACE_ME (a long random secret)."""
    return re.sub(r"REPLACE_ME[\w-]*", "operator-chosen-5f1c9a0e7d2b4c6a8e3f1b0d9c7a5e2f", value)


def secret_and_config_values(shipped: bool = False) -> dict[tuple[str, str], dict[str, str]]:
    """ConfigMaps and Secrets by (kind, name); the Secret's placeholders replaced as an operator
    would, unless `shipped`."""
    values: dict[tuple[str, str], dict[str, str]] = {}
    for name, doc in resources("ConfigMap").items():
        values[("configMap", name)] = dict(doc["data"])
    for name, doc in resources("Secret").items():
        values[("secret", name)] = {k: v if shipped else operator_value(v) for k, v in doc["stringData"].items()}
    return values


def container_env(container: dict[str, Any], shipped: bool = False) -> dict[str, str]:
    """The environment Kubernetes gives the container, resolved from the manifests."""
    sources = secret_and_config_values(shipped)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(sources[("configMap", source["configMapRef"]["name"])])
        else:
            env.update(sources[("secret", source["secretRef"]["name"])])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var["valueFrom"]:
            # Filled by Kubernetes at run time (the downward API); an address stands in.
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", var
            env[var["name"]] = "10.0.0.7"
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = sources[("secret", ref["name"])][ref["key"]]
        else:
            ref = var["valueFrom"]["configMapKeyRef"]
            env[var["name"]] = sources[("configMap", ref["name"])][ref["key"]]
    return env


ENGRAM_CONTAINERS = [(doc["metadata"]["name"], c) for doc in workloads() for c in containers(doc)]


@pytest.mark.parametrize("container", [c for _, c in ENGRAM_CONTAINERS], ids=[f"{w}/{c['name']}" for w, c in ENGRAM_CONTAINERS])
def test_container_env_is_read_by_the_app(container: dict[str, Any]) -> None:
    unknown = set(container_env(container)) - settings_aliases() - INFRA_ENV
    assert not unknown, f"env vars no settings class reads: {sorted(unknown)}"


@pytest.mark.parametrize("container", [c for _, c in ENGRAM_CONTAINERS], ids=[f"{w}/{c['name']}" for w, c in ENGRAM_CONTAINERS])
def test_container_env_parses_into_settings(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    build_settings(monkeypatch, container["command"], container_env(container))


def test_config_map_keys_are_read_by_the_app() -> None:
    for (_, name), data in secret_and_config_values().items():
        if name == "engram-wait-for-schema":
            continue
        unknown = set(data) - settings_aliases() - INFRA_ENV
        assert not unknown, f"{name}: {sorted(unknown)}"


def test_secret_placeholders_are_marked() -> None:
    secret = resources("Secret")["engram-secrets"]["stringData"]
    assert set(secret) == {"MEMENTO_ACCESS_KEY", "ENGRAM_SERVICE_TOKEN", "ARTIFACT_TOKEN_SECRET", "DATABASE_URL"}
    assert all("REPLACE_ME" in value for value in secret.values())
    assert resources("ConfigMap")["engram-config"]["data"]["ENGRAM_ENV"] == "production"


SERVICE_CONTAINERS = [(w, c) for w, c in ENGRAM_CONTAINERS if c["name"] in ("gateway", "recall", "ingest", "worker", "beat")]


@pytest.mark.parametrize("container", [c for _, c in SERVICE_CONTAINERS], ids=[w for w, _ in SERVICE_CONTAINERS])
def test_every_process_refuses_the_shipped_placeholders(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Applied as shipped (ENGRAM_ENV=production, REPLACE_ME secrets), no service starts."""
    with pytest.raises(ValueError, match="placeholder"):
        build_settings(monkeypatch, container["command"], container_env(container, shipped=True))


def test_the_worker_is_probed_with_celerys_own_ping() -> None:
    [worker] = resources("Deployment")["engram-worker"]["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "livenessProbe"):
        command = worker[probe]["exec"]["command"]
        assert command[:2] == ["sh", "-c"]
        assert "celery -A services.maintenance.celery_app:app inspect ping" in command[2]
        assert '-d "celery@$HOSTNAME"' in command[2]  # its own node only, not any worker that answers
        assert worker[probe]["timeoutSeconds"] > 10  # past the ping's own --timeout
    # The worker's node name is Celery's default, celery@<hostname> (the pod name): no -n.
    assert "-n" not in worker["command"]


def test_beat_is_probed_on_its_schedule_file() -> None:
    [beat] = resources("Deployment")["engram-beat"]["spec"]["template"]["spec"]["containers"]
    assert "/tmp/celerybeat-schedule" in beat["command"]
    assert "/tmp/celerybeat-schedule" in " ".join(beat["livenessProbe"]["exec"]["command"])
    assert {"mountPath": "/tmp", "name": "tmp"} in beat["volumeMounts"]


def test_only_the_gateway_sees_the_master_key() -> None:
    for workload, container in ENGRAM_CONTAINERS:
        if "MEMENTO_ACCESS_KEY" in container_env(container):
            assert (workload, container["name"]) == ("engram-gateway", "gateway")


def test_wait_for_schema_script_compiles_and_imports() -> None:
    source = resources("ConfigMap")["engram-wait-for-schema"]["data"]["wait_for_schema.py"]
    code = compile(source, "wait_for_schema.py", "exec")
    namespace: dict[str, Any] = {"__name__": "wait_for_schema"}
    exec(code, namespace)  # defines functions only: main() runs under __main__
    assert callable(namespace["main"]) and callable(namespace["pending"])


@pytest.mark.parametrize("workload", ["engram-gateway", "engram-worker"])
def test_callers_of_the_internal_services_can_reach_them(workload: str) -> None:
    [container] = resources("Deployment")[workload]["spec"]["template"]["spec"]["containers"]
    env = container_env(container)
    assert env["RECALL_URL"].startswith("http://engram-recall.")
    assert env["INGEST_URL"].startswith("http://engram-ingest.")
    assert env["ENGRAM_SERVICE_TOKEN"]
