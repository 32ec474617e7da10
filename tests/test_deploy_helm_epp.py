"""Helm `mode: epp`: the Endpoint Picker's objects. The rendered InferencePool is validated against
the OpenAPI schema of the InferencePool CRD (tests/fixtures/crd/, copied from the Gateway API
Inference Extension) since kubernetes-validate has no schema for it; the core objects go through
kubernetes-validate with the other value sets (tests/test_deploy_helm.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from app.config import Settings
from tests.deploy_tools import CHART
from tests.test_deploy_helm import by_kind, render_set

CRD = Path(__file__).parent / "fixtures" / "crd" / "inference.networking.k8s.io_inferencepools.yaml"
EPP_VALUES = CHART / "ci" / "epp-values.yaml"


def crd_schema(version: str = "v1") -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return entry["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render_set(EPP_VALUES)


def test_the_rendered_inference_pool_satisfies_the_crd_schema(docs) -> None:
    (pool,) = by_kind(docs, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    jsonschema.validate(pool, crd_schema())
    (svc,) = by_kind(docs, "Service")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == svc["metadata"]["name"] and ref["failureMode"] == "FailOpen"
    grpc_port = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert ref["port"]["number"] == grpc_port["port"] == 9002


def test_a_broken_pool_fails_the_crd_schema() -> None:
    """The check above can fail: a pool without targetPorts or with a bad failureMode is refused."""
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "p"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "Sometimes"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, crd_schema())


def test_epp_deployment_serves_ext_proc_and_grpc_health(docs) -> None:
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][0] == "epp"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == 9002 and ports["grpc-health"] == 9003
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    assert container["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
    assert pod["automountServiceAccountToken"] is True  # the Role reads pods and pools
    (role,) = by_kind(docs, "Role")
    resources = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert resources == {("", "pods"), ("inference.networking.k8s.io", "inferencepools")}
    (binding,) = by_kind(docs, "RoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_the_example_route_sends_to_the_pool(docs) -> None:
    (route,) = by_kind(docs, "HTTPRoute")
    (pool,) = by_kind(docs, "InferencePool")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"])


def test_gateway_mode_renders_none_of_the_epp_objects() -> None:
    kinds = {d["kind"] for d in render_set(None)}
    assert kinds.isdisjoint({"InferencePool", "HTTPRoute", "Role", "RoleBinding"})


def test_the_epp_config_watches_the_charts_pool(docs) -> None:
    (pool,) = by_kind(docs, "InferencePool")
    config = next(d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"])
    settings = Settings(**yaml.safe_load(config["data"]["config.yaml"]))
    assert settings.epp.pool == pool["metadata"]["name"] and not settings.backends and settings.discovery is None
