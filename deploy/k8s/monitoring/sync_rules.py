"""Write prometheusrule.yaml from deploy/prometheus/rules.yml: one source for the alert rules
(promtool-tested there), the same groups in the cluster. Run after changing rules.yml:

    python deploy/k8s/monitoring/sync_rules.py

tests/deploy/test_k8s_overlays.py fails while the two differ."""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[1] / "prometheus" / "rules.yml"
TARGET = HERE / "prometheusrule.yaml"
HEADER = """\
# GENERATED from deploy/prometheus/rules.yml by deploy/k8s/monitoring/sync_rules.py; edit
# rules.yml (and its promtool tests in rules.test.yml), then run the script. The Prometheus
# that should load it selects PrometheusRules by label (kube-prometheus-stack: `release: ...`).
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks (|), as rules.yml writes them."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def render() -> str:
    rules = yaml.safe_load(RULES.read_text())
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "engram",
            "namespace": "engram",
            "labels": {"app.kubernetes.io/name": "engram", "app.kubernetes.io/part-of": "engram"},
        },
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.dump(resource, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


if __name__ == "__main__":
    TARGET.write_text(render())
