"""Helpers for the deploy tests: locating the real tools, collecting PromQL from dashboards and
rules, and the metric names a /metrics scrape offers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RULES = ROOT / "deploy" / "prometheus" / "prefixgate-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "prefixgate-rules.test.yaml"
CHART = ROOT / "helm" / "prefixgate"
KUSTOMIZE = ROOT / "deploy" / "kustomize"
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"

# Grafana's template variables, replaced by values Prometheus accepts.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h",
                "$route": ".*", "$model": ".*", "$backend": ".*", "$tenant": ".*"}
METRIC_NAME = re.compile(r"\bprefixgate_[a-z0-9_]+\b")


def tool(name: str) -> str:
    """Path of a real tool (PATH, then .tools/bin, then the venv); skip with the reason if absent.
    `make tools` (scripts/install-tools.sh) installs all of them, so CI never skips."""
    for candidate in (shutil.which(name), ROOT / ".tools" / "bin" / name, VENV_BIN / name):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.skip(f"{name} is not installed: run `make tools` (scripts/install-tools.sh)")


def run(*cmd: str, cwd: Path | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a tool, failing the test with its output when it exits non-zero."""
    proc = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def load_dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expr) for every PromQL target of every dashboard panel."""
    out = []
    for path in DASHBOARDS:
        for p in panels(load_dashboard(path)):
            for t in p.get("targets", []):
                out.append((f"{path.name}: {p['title']} [{t['refId']}]", t["expr"]))
    return out


def rule_exprs(rules: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(where, expr) for every alert and recording rule."""
    rules = rules or yaml.safe_load(RULES.read_text())
    return [(f"{g['name']}: {r.get('alert') or r.get('record')}", r["expr"])
            for g in rules["groups"] for r in g["rules"]]


def concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced (rules pass through)."""
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


def scrape_names(text: str, from_types: bool = True) -> set[str]:
    """Sample names a scrape offers. With `from_types`, also the names a family announced by
    `# TYPE` yields once it has samples (counter: as typed; histogram: _bucket/_sum/_count;
    gauge/untyped: the name): labelled metrics show no sample before their first observation."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE ") and from_types:
            _, _, name, kind = line.split(None, 3)
            if kind == "histogram":
                names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
            elif kind == "summary":
                names.update({name, f"{name}_sum", f"{name}_count"})
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
