"""Alert rules: `promtool check rules`, `promtool test rules` (fire and don't-fire cases), the
required alerts and texts, and the chart's copy in sync."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from deploy import sync
from tests.deploy_tools import RULE_TESTS, RULES, run, tool

REQUIRED_ALERTS = {
    "PrefixgateTTFTP95High", "PrefixgateEnginePrefixCacheHitRatioLow",
    "PrefixgatePrefixCachingDisabled", "PrefixgateContinuityBreaksSpiking",
    "PrefixgateSpecAcceptanceLengthDropped", "PrefixgateUpstreamErrors",
    "PrefixgateNoHealthyBackend", "PrefixgateStateBackendDown", "PrefixgateBreakPrefillShareHigh",
}
BUCKETS = {"0-1k", "1k-4k", "4k-16k", "16k-64k", "64k-128k", "128k-256k", "256k+"}


def alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_rules() -> None:
    out = run(tool("promtool"), "check", "rules", str(RULES))
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass() -> None:
    run(tool("promtool"), "test", "rules", str(RULE_TESTS))


def unit_tests_against(rules_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` of the committed unit tests against another rule file's text."""
    (tmp_path / "prefixgate-rules.yaml").write_text(rules_text)
    tests_dir = tmp_path / "tests"
    tests_dir.mkdir()
    (tests_dir / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    return subprocess.run([tool("promtool"), "test", "rules", str(tests_dir / RULE_TESTS.name)],
                          capture_output=True, text=True, timeout=60)


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A rule file whose TTFT threshold is raised above the test data must fail the unit tests."""
    broken = RULES.read_text().replace('prompt_bucket="0-1k"}[5m]))) > 1', 'prompt_bucket="0-1k"}[5m]))) > 5')
    assert broken != RULES.read_text()
    proc = unit_tests_against(broken, tmp_path)
    assert proc.returncode != 0 and "PrefixgateTTFTP95High" in proc.stdout + proc.stderr


def test_ttft_alert_sums_the_route_label_away(tmp_path: Path) -> None:
    """The unit tests split each bucket's requests over two routes: a rule that kept `route`
    would fire once per route (with a route label) and must fail them."""
    per_route = RULES.read_text().replace("sum by (prompt_bucket, le)", "sum by (route, prompt_bucket, le)")
    assert per_route != RULES.read_text()
    proc = unit_tests_against(per_route, tmp_path)
    assert proc.returncode != 0 and 'route="messages"' in proc.stdout + proc.stderr


def test_every_required_alert_with_summary_description_runbook() -> None:
    rules = alerts()
    assert REQUIRED_ALERTS <= {r["alert"] for r in rules}
    for r in rules:
        assert r["labels"]["severity"] in {"info", "warning", "critical"}, r["alert"]
        for key in ("summary", "description", "runbook"):
            assert len(r["annotations"].get(key, "")) > 20, f"{r['alert']}: {key}"
    ttft = [r for r in rules if r["alert"] == "PrefixgateTTFTP95High"]
    assert {r["labels"]["prompt_bucket"] for r in ttft} == BUCKETS


def test_every_alert_has_fire_and_no_fire_cases() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fired, quiet = set(), set()
    for case in doc["tests"]:
        for t in case["alert_rule_test"]:
            (fired if t["exp_alerts"] else quiet).add(t["alertname"])
            # a firing case with other series in the input also proves those do not fire
            if t["exp_alerts"] and len(case["input_series"]) > len(t["exp_alerts"]):
                quiet.add(t["alertname"])
    names = {r["alert"] for r in alerts()}
    assert names <= fired
    assert names <= quiet


def test_chart_copies_are_in_sync() -> None:
    assert sync.main(["--check"]) == 0, "run: python deploy/sync.py"
