"""A real Prometheus (Debian package) scrapes a running prefixgate proxy (in front of simulated
vLLM replicas) with traffic, loads the alert rules, and evaluates every alert's and every
dashboard panel's PromQL through its HTTP API without error."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from app.serving import free_port, stop_process
from tests.deploy_proxy import RunningProxy, running_proxy, send_traffic
from tests.deploy_tools import DASHBOARDS as DASHBOARD_FILES
from tests.deploy_tools import RULES, concrete, dashboard_exprs, load_dashboard, rule_exprs, tool


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=10)

    def query(self, expr: str) -> dict[str, Any]:
        return self.client.get("/api/v1/query", params={"query": expr}).json()

    def query_range(self, expr: str, seconds: int = 30) -> dict[str, Any]:
        end = time.time()
        return self.client.get("/api/v1/query_range", params={
            "query": expr, "start": end - seconds, "end": end, "step": "1s"}).json()

    def wait_for(self, expr: str, timeout: float = 40.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:  # before it is ready, Prometheus answers 503 with a plain-text body
                result = self.query(expr).get("data", {}).get("result", [])
            except (httpx.HTTPError, ValueError):
                result = []
            if result:
                return result
            time.sleep(0.25)
        raise TimeoutError(f"Prometheus never returned data for {expr}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProxy, Prometheus]]:
    binary = tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    with running_proxy() as proxy:
        target = urlparse(proxy.url).netloc
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "prefixgate", "static_configs": [{"targets": [target]}]}],
        }))
        port = free_port()
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"))
        try:
            prom = Prometheus(f"http://127.0.0.1:{port}")
            prom.wait_for("prefixgate_requests_total")
            send_traffic(proxy.url, 4)  # more traffic between scrapes, so rates have two points
            prom.wait_for("sum(rate(prefixgate_requests_total[1m])) > 0")
            time.sleep(2)  # a few rule evaluations
            yield proxy, prom
        finally:
            stop_process(proc)


def test_every_dashboard_panel_query_evaluates(stack: tuple[RunningProxy, Prometheus]) -> None:
    _, prom = stack
    failures = {}
    for where, expr in dashboard_exprs():
        for answer in (prom.query(concrete(expr)), prom.query_range(concrete(expr))):
            if answer.get("status") != "success":
                failures[where] = answer.get("error")
    assert failures == {}


def test_every_alert_expression_evaluates(stack: tuple[RunningProxy, Prometheus]) -> None:
    _, prom = stack
    failures = {where: a.get("error") for where, expr in rule_exprs()
                if (a := prom.query(expr)).get("status") != "success"}
    assert failures == {}


def test_prometheus_loaded_and_evaluated_every_rule(stack: tuple[RunningProxy, Prometheus]) -> None:
    _, prom = stack
    groups = prom.client.get("/api/v1/rules").json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(rule_exprs())
    unhealthy = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert unhealthy == {}


def test_core_panels_show_the_traffic(stack: tuple[RunningProxy, Prometheus]) -> None:
    """Not just valid: the gateway's main panels have data from the proxy's real scrape."""
    _, prom = stack
    wanted = {"Request rate", "TTFT p95 by prompt bucket", "TTFT p95 by route", "Decisions by backend"}
    for path in DASHBOARD_FILES:
        for p in load_dashboard(path)["panels"]:
            if p["title"] in wanted:
                result = prom.query(concrete(p["targets"][0]["expr"]))["data"]["result"]
                assert result, f"{p['title']}: no data"
                wanted.discard(p["title"])
    assert wanted == set()


def test_dashboard_variables_resolve(stack: tuple[RunningProxy, Prometheus]) -> None:
    """The label_values() queries behind $route, $model, $backend and $tenant find values."""
    _, prom = stack
    seen = set()
    for path in DASHBOARD_FILES:
        for v in load_dashboard(path)["templating"]["list"]:
            if v["type"] != "query" or v["name"] in seen:
                continue
            metric, label = v["query"].removeprefix("label_values(").rstrip(")").split(", ")
            values = prom.client.get(f"/api/v1/label/{label}/values", params={"match[]": metric}).json()
            assert values["status"] == "success" and values["data"], v["name"]
            seen.add(v["name"])
    assert seen == {"route", "model", "backend", "tenant"}
