"""Keeps the Helm chart's derived files in step with their sources: `python deploy/sync.py`.

- helm/prefixgate/files/dashboards/*.json  <- dashboards/*.json (built by dashboards/build.py)
- helm/prefixgate/files/prefixgate-rules.yaml <- deploy/prometheus/prefixgate-rules.yaml
- helm/prefixgate/values.schema.json: `properties.config` <- app.config.Settings' JSON schema, so
  `helm install` rejects a config key of the wrong type before a pod crash-loops on it.

Helm cannot read files outside the chart directory, hence copies. `--check` exits 1 when a copy
is stale (the tests run it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from dashboards.build import write_outputs  # noqa: E402

CHART = ROOT / "helm" / "prefixgate"
RULES = ROOT / "deploy" / "prometheus" / "prefixgate-rules.yaml"
DEFS_PREFIX = "config."  # the Settings $defs live in the values schema's $defs under this prefix


def _prefix_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (v.replace("#/$defs/", f"#/$defs/{DEFS_PREFIX}") if k == "$ref" else _prefix_refs(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_prefix_refs(v) for v in node]
    return node


def values_schema(current: dict[str, Any]) -> dict[str, Any]:
    """The chart's values schema with `config` replaced by Settings' schema (env-only keys kept
    optional: the chart's ConfigMap need not set them)."""
    settings = _prefix_refs(Settings.model_json_schema())
    defs = {k: v for k, v in current.get("$defs", {}).items() if not k.startswith(DEFS_PREFIX)}
    defs.update({DEFS_PREFIX + k: v for k, v in settings.pop("$defs", {}).items()})
    settings.pop("title", None)
    settings["description"] = ("prefixgate's config.yaml (keys of app.config.Settings); generated "
                               "by deploy/sync.py")
    out = dict(current)
    out["properties"] = dict(current["properties"], config=settings)
    out["$defs"] = dict(sorted(defs.items()))
    return out


def outputs() -> dict[Path, str]:
    files = {CHART / "files" / "dashboards" / p.name: p.read_text()
             for p in sorted((ROOT / "dashboards").glob("*.json"))}
    files[CHART / "files" / "prefixgate-rules.yaml"] = RULES.read_text()
    schema_path = CHART / "values.schema.json"
    files[schema_path] = json.dumps(values_schema(json.loads(schema_path.read_text())), indent=2) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if any copy is out of date")
    return write_outputs(outputs(), parser.parse_args(argv).check)


if __name__ == "__main__":
    sys.exit(main())
