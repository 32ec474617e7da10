"""deploy/: kustomize overlays rendered with `kubectl kustomize` and validated with
`kubernetes-validate --strict`; the compose stack's files; the Dockerfile linted with hadolint."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings
from tests.deploy_tools import KUSTOMIZE, ROOT, run, tool

OVERLAYS = ("gateway", "sidecar")


def kustomize(overlay: str) -> list[dict[str, Any]]:
    out = run(tool("kubectl"), "kustomize", str(KUSTOMIZE / "overlays" / overlay)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay: str, tmp_path: Path) -> None:
    docs = kustomize(overlay)
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    run(tool("kubernetes-validate"), "--strict", "-k", "1.30.0", str(path))
    config = one(docs, "ConfigMap")
    Settings(**yaml.safe_load(config["data"]["config.yaml"]))  # the proxy accepts its config


def test_gateway_overlay() -> None:
    docs = kustomize("gateway")
    deploy = one(docs, "Deployment", "prefixgate")
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "ghcr.io/prefixgate/prefixgate:0.1.0"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert any(e["name"] == "PREFIXGATE_STATE" and "secretKeyRef" in e["valueFrom"] for e in c["env"])
    assert one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == "prefixgate"
    config = one(docs, "ConfigMap")
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config["metadata"]["name"]  # hashed name propagated
    assert yaml.safe_load(config["data"]["config.yaml"])["discovery"]["dns"]


def test_sidecar_overlay_puts_prefixgate_in_the_engine_pod() -> None:
    docs = kustomize("sidecar")
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == ["vllm"]
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    pod = one(docs, "Deployment", "vllm")["spec"]["template"]
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["prefixgate", "vllm"] or names == ["vllm", "prefixgate"]
    svc = one(docs, "Service", "prefixgate")
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    backends = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])["backends"]
    assert backends[0]["url"].startswith("http://127.0.0.1:")


def test_compose_stack_files_exist_and_configs_are_valid(tmp_path: Path) -> None:
    compose_path = ROOT / "deploy" / "compose.yaml"
    compose = yaml.safe_load(compose_path.read_text())
    assert {"vllm", "prefixgate", "prometheus", "grafana", "redis"} <= set(compose["services"])
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (compose_path.parent / source).exists(), f"{name}: {source} missing"
        build = svc.get("build")
        if build:
            assert (compose_path.parent / build["context"] / build["dockerfile"]).is_file()
    Settings(**yaml.safe_load((ROOT / "deploy" / "compose" / "prefixgate.yaml").read_text()))
    # the Prometheus config, with the rule path pointed at the repository's file
    prom = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    prom = prom.replace("/etc/prometheus/rules/prefixgate-rules.yaml",
                        str(ROOT / "deploy" / "prometheus" / "prefixgate-rules.yaml"))
    (tmp_path / "prometheus.yml").write_text(prom)
    run(tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml"))


def test_dockerfile_is_hadolint_clean_multistage_non_root_with_healthcheck() -> None:
    dockerfile = ROOT / "Dockerfile"
    run(tool("hadolint"), "--failure-threshold", "info", str(dockerfile))
    text = dockerfile.read_text()
    stages = re.split(r"(?m)^FROM ", text)[1:]
    assert len(stages) >= 2, "multi-stage"
    final = stages[-1]
    assert re.search(r"(?m)^USER (?!root|0\b)", final), "final stage runs as non-root"
    assert "HEALTHCHECK" in final and "/healthz" in final
    assert not re.search(r"apt-get|apk add|gcc|build-essential|pip install", final), "no build tools in the final image"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignored and "!app/" in ignored


def test_hadolint_fails_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    import subprocess

    proc = subprocess.run([tool("hadolint"), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0


@pytest.mark.parametrize(("overlay", "deployment"), [("gateway", "prefixgate"), ("sidecar", "vllm")])
def test_drain_and_admin_port_in_the_manifests(overlay: str, deployment: str) -> None:
    """terminationGracePeriodSeconds >= preStop + shutdown.grace_s; preStop waits; readiness is
    /readyz; the Service carries the admin port the scrape annotation points at."""
    docs = kustomize(overlay)
    pod = one(docs, "Deployment", deployment)["spec"]["template"]
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "prefixgate"]
    settings = Settings(**yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"]))
    sleep = float(re.search(r"sleep\((\d+)\)", c["lifecycle"]["preStop"]["exec"]["command"][-1]).group(1))
    assert pod["spec"]["terminationGracePeriodSeconds"] >= sleep + settings.shutdown.grace_s + 10
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert settings.admin.listen is not None and ports["admin"] == settings.admin.listen.port
    assert ports["http"] == settings.listen.port
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(settings.admin.listen.port)
    svc = one(docs, "Service", "prefixgate")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"http": "http", "admin": "admin"}
    if overlay == "gateway":
        assert one(docs, "PodDisruptionBudget")
