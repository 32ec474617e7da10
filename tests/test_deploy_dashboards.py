"""Grafana dashboards: generated output is current, valid against Grafana's own schema (from npm
@grafana/schema, dashboards/schema/), and only uses metric names the proxy really exports."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import Counter, Gauge, Histogram

from app.telemetry.metrics import Metrics
from dashboards import build
from tests.deploy_proxy import running_proxy
from tests.deploy_tools import (
    DASHBOARDS,
    dashboard_exprs,
    load_dashboard,
    metric_names,
    panels,
    rule_exprs,
    scrape_names,
)

SCHEMAS = Path(build.DASHBOARD_DIR) / "schema"
EXPECTED = {"prefixgate-gateway", "prefixgate-prefix-cache", "prefixgate-speculative", "prefixgate-routing"}


def schema(name: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads((SCHEMAS / name).read_text()))


def schema_errors(dashboard: dict[str, Any]) -> list[str]:
    """Whole-dashboard schema errors plus per-panel options/fieldConfig errors."""
    errors = [f"dashboard: {e.message}" for e in schema("dashboard.schema.json").iter_errors(dashboard)]
    for p in panels(dashboard):
        if p["type"] == "row":
            continue
        opts = SCHEMAS / f"panel-{p['type']}-options.schema.json"
        assert opts.exists(), f"no options schema for panel type {p['type']}"
        errors += [f"{p['title']} options: {e.message}"
                   for e in schema(opts.name).iter_errors(p.get("options", {}))]
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if p["type"] == "timeseries" and custom is not None:
            errors += [f"{p['title']} custom: {e.message}"
                       for e in schema("panel-timeseries-fieldconfig.schema.json").iter_errors(custom)]
    return errors


def test_generated_dashboards_are_current() -> None:
    assert build.main(["--check"]) == 0, "run: python dashboards/build.py"
    assert {p.stem for p in DASHBOARDS} == EXPECTED


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_validates_against_grafana_schema(path: Path) -> None:
    assert schema_errors(load_dashboard(path)) == []


def test_schema_catches_typos_and_wrong_types() -> None:
    good = load_dashboard(DASHBOARDS[0])
    typo = copy.deepcopy(good)
    next(p for p in typo["panels"] if p["type"] == "timeseries")["gridpos"] = {"h": 1}
    wrong_type = copy.deepcopy(good)
    wrong_type["refresh"] = 30
    bad_option = copy.deepcopy(good)
    next(p for p in bad_option["panels"] if p["type"] == "timeseries")["options"]["legend"]["placement"] = "middle"
    for bad in (typo, wrong_type, bad_option):
        assert schema_errors(bad), "the schema accepted a broken dashboard"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_layout_and_variables(path: Path) -> None:
    d = load_dashboard(path)
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(d):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        if p["type"] != "row":
            assert p["description"], f"{p['title']}: every panel explains itself"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    # every $variable an expression uses is defined on the dashboard
    for p in panels(d):
        for t in p.get("targets", []):
            for name in ("route", "model", "backend", "tenant"):
                if f"${name}" in t["expr"]:
                    assert name in variables, f"{p['title']} uses ${name}"


def test_required_panels_exist() -> None:
    titles = {p.stem: {q["title"] for q in panels(load_dashboard(p))} for p in DASHBOARDS}
    exprs = " ".join(e for _, e in dashboard_exprs())
    for q in ("p50", "p95", "p99"):
        assert f"TTFT {q} by prompt bucket" in titles["prefixgate-gateway"]
    assert "Prefix continuity per tenant" in titles["prefixgate-prefix-cache"]
    assert "Mean acceptance length" in titles["prefixgate-speculative"]
    assert "Decisions by reason" in titles["prefixgate-routing"]
    for name in ("prefixgate_proxy_overhead_seconds_bucket", "prefixgate_prefix_breaks_total",
                 "prefixgate_prediction_fidelity_ratio", "prefixgate_engine_prefix_caching_enabled"):
        assert name in exprs


def populated_registry_scrape() -> str:
    """A Metrics() registry with one sample in every metric (labelled ones included)."""
    m = Metrics()
    for metric in vars(m).values():
        if not isinstance(metric, Counter | Gauge | Histogram):
            continue
        labels = getattr(metric, "_labelnames", ())
        child = metric.labels(*["x"] * len(labels)) if labels else metric
        if isinstance(child, Histogram):
            child.observe(0.1)
        elif isinstance(child, Counter):
            child.inc()
        else:
            child.set(1)
    for cached in (0, 0, 0, 0, 1000, 2000, 4000, 8000):  # collector-backed: the prefill model's gauges
        for new in (100, 900):
            m.prefill_models.add("x", new, cached, 0.001 + new / 8000 + 1e-9 * new * cached)
    return m.render()[0].decode()


def test_every_promql_metric_exists_in_the_metrics_registry() -> None:
    offered = scrape_names(populated_registry_scrape(), from_types=False)
    used = {n for _, e in dashboard_exprs() + rule_exprs() for n in metric_names(e)}
    assert len(used) > 20
    assert used - offered == set()


def test_every_promql_metric_exists_in_a_real_proxy_scrape() -> None:
    """The proxy (create_app) in front of simulated vLLM replicas, after real traffic."""
    with running_proxy() as proxy:
        text = proxy.scrape()
    offered = scrape_names(text)
    with_samples = scrape_names(text, from_types=False)
    missing = {}
    for where, expr in dashboard_exprs() + rule_exprs():
        unknown = metric_names(expr) - offered
        if unknown:
            missing[where] = sorted(unknown)
    assert missing == {}
    # the traffic really went through: the core latency series have samples
    assert {"prefixgate_ttft_seconds_bucket", "prefixgate_requests_total",
            "prefixgate_route_decisions_total"} <= with_samples
