"""Helm chart: `helm lint --strict` and `helm template` over several value sets, every rendered
manifest through `kubernetes-validate --strict`, values.schema.json enforced, the ConfigMap a
valid prefixgate config, the PrometheusRule checked by promtool, dashboards shipped intact."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings
from tests.deploy_tools import CHART, DASHBOARDS, RULES, run, tool

VALUE_SETS = sorted((CHART / "ci").glob("*-values.yaml"))
K8S_VERSION = "1.30.0"


def template(*args: str) -> list[dict[str, Any]]:
    out = run(tool("helm"), "template", "pg", str(CHART), "--namespace", "llm", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render_set(values: Path | None) -> list[dict[str, Any]]:
    return template(*(["-f", str(values)] if values else []))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def validate(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    run(tool("kubernetes-validate"), "--strict", "-k", K8S_VERSION, str(path))


@pytest.mark.parametrize("values", [None, *VALUE_SETS], ids=lambda p: p.stem if p else "defaults")
def test_lint_template_and_validate(values: Path | None, tmp_path: Path) -> None:
    args = ["-f", str(values)] if values else []
    run(tool("helm"), "lint", "--strict", str(CHART), *args)
    docs = render_set(values)
    validate(docs, tmp_path)
    config = next(d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"])
    Settings(**yaml.safe_load(config["data"]["config.yaml"]))  # the proxy accepts its config


def test_value_sets_cover_both_modes_and_toggles() -> None:
    kinds = {p.stem: {d["kind"] for d in render_set(p)} for p in VALUE_SETS}
    full = kinds["gateway-full-values"]
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "Secret", "ServiceMonitor", "PrometheusRule"} <= full
    assert "Deployment" not in kinds["sidecar-values"] and "HorizontalPodAutoscaler" not in kinds["sidecar-values"]
    defaults = {d["kind"] for d in render_set(None)}
    assert defaults.isdisjoint({"ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler", "Secret"})


def test_gateway_deployment_probes_security_and_redis_secret() -> None:
    docs = render_set(CHART / "ci" / "gateway-full-values.yaml")
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "replicas" not in deploy["spec"]  # the HPA owns it
    state = next(e for e in c["env"] if e["name"] == "PREFIXGATE_STATE")
    (secret,) = by_kind(docs, "Secret")
    assert state["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert secret["stringData"]["url"].startswith("redis://")
    (svc,) = by_kind(docs, "Service")
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]


def test_schema_rejects_bad_values() -> None:
    bad = [("mode", "daemonset"), ("config.routing.policy", "random"), ("config.listen.port", "http"),
           ("replicaCount", "0"), ("redis.url", "http://not-redis"), ("nonsense", "1")]
    for key, value in bad:
        proc = subprocess.run([tool("helm"), "template", "pg", str(CHART), "--set", f"{key}={value}"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, f"{key}={value} was accepted"
        assert "schema" in proc.stderr, proc.stderr


def test_prometheus_rule_is_the_rules_file_with_thresholds_from_values(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"prometheusRule": {"enabled": True,
                                                         "ttftP95Thresholds": {"0-1k": 0.25},
                                                         "breakPrefillShare": 0.4}}))
    docs = template("-f", str(values))
    (rule,) = by_kind(docs, "PrometheusRule")
    groups = rule["spec"]["groups"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    run(tool("promtool"), "check", "rules", str(path))
    source = yaml.safe_load(RULES.read_text())["groups"]
    assert [g["name"] for g in groups] == [g["name"] for g in source]
    exprs = {(r.get("alert"), (r.get("labels") or {}).get("prompt_bucket")): " ".join(r["expr"].split())
             for g in groups for r in g["rules"]}
    assert exprs[("PrefixgateTTFTP95High", "0-1k")].endswith("> 0.25")
    assert exprs[("PrefixgateTTFTP95High", "1k-4k")].endswith("> 2")
    assert exprs[("PrefixgateBreakPrefillShareHigh", None)].endswith("> 0.4")
    # annotations keep Prometheus' own templating (not eaten by Helm)
    assert "{{ $labels.backend }}" in yaml.safe_dump(groups, width=1000)


def test_dashboards_configmaps_for_the_grafana_sidecar() -> None:
    docs = template("--set", "dashboards.enabled=true", "--set", "dashboards.folder=LLM")
    maps = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(maps) == len(DASHBOARDS)
    shipped = {k: json.loads(v) for m in maps for k, v in m["data"].items()}
    assert shipped == {p.name: json.loads(p.read_text()) for p in DASHBOARDS}
    assert all(m["metadata"]["annotations"]["grafana_folder"] == "LLM" for m in maps)


def test_sidecar_mode_ships_the_container_spec() -> None:
    docs = render_set(CHART / "ci" / "sidecar-values.yaml")
    snippet = next(d for d in by_kind(docs, "ConfigMap") if "pod-snippet.yaml" in d["data"])
    spec = yaml.safe_load(snippet["data"]["pod-snippet.yaml"])
    (container,) = spec["containers"]
    assert container["name"] == "prefixgate"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {v["name"] for v in spec["volumes"]} == {"config", "tmp"}
    (svc,) = by_kind(docs, "Service")
    assert svc["spec"]["selector"] == {"app.kubernetes.io/name": "vllm"}
    (config,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"]]
    assert yaml.safe_load(config["data"]["config.yaml"])["backends"][0]["url"] == "http://127.0.0.1:8000"


def test_drain_grace_period_prestop_readiness_and_pdb() -> None:
    """terminationGracePeriodSeconds covers the preStop wait, the gateway's own drain
    (config.shutdown.grace_s) and a margin, so Kubernetes never SIGKILLs a stream the gateway would
    still let finish; readiness is /readyz (503 from SIGTERM on); the PDB stays."""
    docs = template("--set", "config.shutdown.grace_s=900", "--set", "shutdown.preStopSeconds=15",
                    "--set", "shutdown.marginSeconds=20")
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 15 + 900 + 20
    (c,) = pod["containers"]
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1].endswith("time.sleep(15)")
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert by_kind(docs, "PodDisruptionBudget")
    config = yaml.safe_load(next(d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"])["data"]["config.yaml"])
    assert Settings(**config).shutdown.grace_s == 900
    defaults = by_kind(template(), "Deployment")[0]["spec"]["template"]["spec"]
    assert defaults["terminationGracePeriodSeconds"] == 10 + 600 + 30  # grace_s default: agent streams


def test_admin_port_is_served_and_scraped(tmp_path: Path) -> None:
    docs = template("--set", "serviceMonitor.enabled=true")
    validate(docs, tmp_path)
    (deploy,) = by_kind(docs, "Deployment")
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    assert {"name": "admin", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    (svc,) = by_kind(docs, "Service")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"http": 8080, "admin": 9090}
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "admin"
    config = yaml.safe_load(next(d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"])["data"]["config.yaml"])
    assert Settings(**config).admin.listen.port == 9090
    shared = template("--set", "serviceMonitor.enabled=true", "--set", "config.admin.listen=null")
    (monitor,) = by_kind(shared, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert [p["name"] for p in by_kind(shared, "Service")[0]["spec"]["ports"]] == ["http"]
