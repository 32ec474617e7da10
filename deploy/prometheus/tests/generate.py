"""Writes prefixgate-rules.test.yaml next to this file; run it after editing the rules' texts.

Expected annotations are the rule's own text with $labels filled in; `$value` renderings are given
per case (checked by hand against promtool's output), so a broken template still fails the test.
"""
import re
from pathlib import Path

import yaml

root = Path(__file__).resolve().parent.parent
rules = {(r['alert'], r.get('labels', {}).get('prompt_bucket')): r for g in yaml.safe_load((root/'prefixgate-rules.yaml').read_text())['groups'] for r in g['rules']}

def ann(alert, labels, **values):
    out = {}
    for key, text in rules[(alert, labels.get('prompt_bucket'))]['annotations'].items():
        def sub(m, key=key):
            inner = m.group(1).strip()
            if inner.startswith('$labels.'):
                return labels[inner[len('$labels.'):]]
            return values[key]
        out[key] = re.sub(r'\{\{(.*?)\}\}', sub, text)
    return out

def alert(name, labels, **values):
    lab = dict(rules[(name, labels.get('prompt_bucket'))]['labels'])
    lab.update(labels)
    return {'exp_labels': lab, 'exp_annotations': ann(name, labels, **values)}

S = 'prefixgate_'
tests = []
# --- TTFT p95 per bucket, each bucket's requests split over two routes: one alert per bucket
# (the rule sums the routes away), none per route
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}ttft_seconds_bucket{{route="{r}",prompt_bucket="{b}",le="{le}",instance="p1"}}', 'values': v}
    for b in ('0-1k', '4k-16k') for r in ('chat', 'messages')
    for le, v in (('1', '0x30'), ('2', '0+5x30'), ('+Inf', '0+5x30'))],
  'alert_rule_test': [
    {'eval_time': '10m', 'alertname': 'PrefixgateTTFTP95High', 'exp_alerts': []},
    {'eval_time': '25m', 'alertname': 'PrefixgateTTFTP95High', 'exp_alerts': [
        alert('PrefixgateTTFTP95High', {'prompt_bucket': '0-1k'}, summary='1.95s')]}]})
# --- the two longest buckets have their own thresholds: the same latencies (all between 60 s and
# 90 s, p95 88.5 s) fire 128k-256k (> 60 s) and not 256k+ (> 120 s)
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}ttft_seconds_bucket{{route="messages",prompt_bucket="{b}",le="{le}",instance="p1"}}', 'values': v}
    for b in ('128k-256k', '256k+')
    for le, v in (('60', '0x30'), ('90', '0+5x30'), ('+Inf', '0+5x30'))],
  'alert_rule_test': [
    {'eval_time': '10m', 'alertname': 'PrefixgateTTFTP95High', 'exp_alerts': []},
    {'eval_time': '25m', 'alertname': 'PrefixgateTTFTP95High', 'exp_alerts': [
        alert('PrefixgateTTFTP95High', {'prompt_bucket': '128k-256k'}, summary='1m 28s')]}]})
# --- hit ratio low: a fires; b has no traffic; c hits well
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}engine_prefix_cache_hit_ratio{{backend="a",instance="p1"}}', 'values': '0.1x60'},
    {'series': f'{S}engine_prefix_cache_hit_ratio{{backend="b",instance="p1"}}', 'values': '0.1x60'},
    {'series': f'{S}engine_prefix_cache_hit_ratio{{backend="c",instance="p1"}}', 'values': '0.8x60'},
    {'series': f'{S}engine_prefix_caching_enabled{{backend="a",instance="p1"}}', 'values': '1x60'},
    {'series': f'{S}engine_prefix_caching_enabled{{backend="b",instance="p1"}}', 'values': '1x60'},
    {'series': f'{S}engine_prefix_caching_enabled{{backend="c",instance="p1"}}', 'values': '1x60'},
    {'series': f'{S}route_decisions_total{{backend="a",reason="prefix_hit",instance="p1"}}', 'values': '0+10x60'},
    {'series': f'{S}route_decisions_total{{backend="b",reason="prefix_hit",instance="p1"}}', 'values': '5x60'},
    {'series': f'{S}route_decisions_total{{backend="c",reason="prefix_hit",instance="p1"}}', 'values': '0+10x60'},
  ], 'alert_rule_test': [
    {'eval_time': '20m', 'alertname': 'PrefixgateEnginePrefixCacheHitRatioLow', 'exp_alerts': []},
    {'eval_time': '50m', 'alertname': 'PrefixgateEnginePrefixCacheHitRatioLow', 'exp_alerts': [
        alert('PrefixgateEnginePrefixCacheHitRatioLow', {'backend': 'a'}, summary='10%')]}]})
# --- caching disabled: a (traffic) fires, b (no traffic) does not, c (on) does not
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}engine_prefix_caching_enabled{{backend="a",instance="p1"}}', 'values': '0x20'},
    {'series': f'{S}engine_prefix_caching_enabled{{backend="b",instance="p1"}}', 'values': '0x20'},
    {'series': f'{S}engine_prefix_caching_enabled{{backend="c",instance="p1"}}', 'values': '1x20'},
    {'series': f'{S}route_decisions_total{{backend="a",reason="cold_spread",instance="p1"}}', 'values': '0+5x20'},
    {'series': f'{S}route_decisions_total{{backend="b",reason="cold_spread",instance="p1"}}', 'values': '3x20'},
    {'series': f'{S}route_decisions_total{{backend="c",reason="cold_spread",instance="p1"}}', 'values': '0+5x20'},
  ], 'alert_rule_test': [
    {'eval_time': '3m', 'alertname': 'PrefixgatePrefixCachingDisabled', 'exp_alerts': []},
    {'eval_time': '12m', 'alertname': 'PrefixgatePrefixCachingDisabled', 'exp_alerts': [
        alert('PrefixgatePrefixCachingDisabled', {'backend': 'a'})]}]})
# --- continuity breaks: t1 spikes after 70m; t2 is steady; t3 only starts new sessions; t4 only
# compacts (expected, one cold turn each: no break)
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}prefix_breaks_total{{route="messages",tenant="t1",cause="dynamic_head",instance="p1"}}', 'values': '0x69 5+5x50'},
    {'series': f'{S}prefix_breaks_total{{route="chat",tenant="t1",cause="dynamic_head",instance="p1"}}', 'values': '0x69 5+5x50'},
    {'series': f'{S}prefix_breaks_total{{route="chat",tenant="t2",cause="tool_order",instance="p1"}}', 'values': '0+6x120'},
    {'series': f'{S}prefix_breaks_total{{route="chat",tenant="t3",cause="new_session",instance="p1"}}', 'values': '0x69 10+10x50'},
    {'series': f'{S}prefix_breaks_total{{route="messages",tenant="t4",cause="compaction",instance="p1"}}', 'values': '0x69 10+10x50'},
  ], 'alert_rule_test': [
    {'eval_time': '60m', 'alertname': 'PrefixgateContinuityBreaksSpiking', 'exp_alerts': []},
    {'eval_time': '95m', 'alertname': 'PrefixgateContinuityBreaksSpiking', 'exp_alerts': [
        alert('PrefixgateContinuityBreaksSpiking', {'tenant': 't1'}, description='0.17')]}]})
# --- what hygiene costs: t1's breaks (two causes, two pods) cost 30% of its reported prefill
# seconds; t2's 10%; t3 has no reported prefill (no ratio) and t4 a zero one: neither fires
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}break_prefill_seconds_total{{tenant="t1",cause="dynamic_head",instance="p1"}}', 'values': '0+2x60'},
    {'series': f'{S}break_prefill_seconds_total{{tenant="t1",cause="tool_order",instance="p2"}}', 'values': '0+1x60'},
    {'series': f'{S}tenant_prefill_seconds_total{{tenant="t1",instance="p1"}}', 'values': '0+5x60'},
    {'series': f'{S}tenant_prefill_seconds_total{{tenant="t1",instance="p2"}}', 'values': '0+5x60'},
    {'series': f'{S}break_prefill_seconds_total{{tenant="t2",cause="dynamic_head",instance="p1"}}', 'values': '0+1x60'},
    {'series': f'{S}tenant_prefill_seconds_total{{tenant="t2",instance="p1"}}', 'values': '0+10x60'},
    {'series': f'{S}break_prefill_seconds_total{{tenant="t3",cause="dynamic_head",instance="p1"}}', 'values': '0+5x60'},
    {'series': f'{S}break_prefill_seconds_total{{tenant="t4",cause="dynamic_head",instance="p1"}}', 'values': '0+5x60'},
    {'series': f'{S}tenant_prefill_seconds_total{{tenant="t4",instance="p1"}}', 'values': '0x60'},
  ], 'alert_rule_test': [
    {'eval_time': '10m', 'alertname': 'PrefixgateBreakPrefillShareHigh', 'exp_alerts': []},
    {'eval_time': '40m', 'alertname': 'PrefixgateBreakPrefillShareHigh', 'exp_alerts': [
        alert('PrefixgateBreakPrefillShareHigh', {'tenant': 't1'}, summary='30%')]}]})
# --- speculative acceptance: a drops from 3 to 1.5 at 400m; b stays at 3
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}engine_spec_acceptance_length{{backend="a",instance="p1"}}', 'values': '3x400 1.5x60'},
    {'series': f'{S}engine_spec_acceptance_length{{backend="b",instance="p1"}}', 'values': '3x460'},
  ], 'alert_rule_test': [
    {'eval_time': '390m', 'alertname': 'PrefixgateSpecAcceptanceLengthDropped', 'exp_alerts': []},
    {'eval_time': '440m', 'alertname': 'PrefixgateSpecAcceptanceLengthDropped', 'exp_alerts': [
        alert('PrefixgateSpecAcceptanceLengthDropped', {'backend': 'a'}, summary='1.5')]}]})
# --- upstream errors: a fails 10% of routed requests, b 1%
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}upstream_errors_total{{backend="a",kind="connect",instance="p1"}}', 'values': '0+1x20'},
    {'series': f'{S}upstream_errors_total{{backend="b",kind="timeout",instance="p1"}}', 'values': '0+0.1x20'},
    {'series': f'{S}route_decisions_total{{backend="a",reason="prefix_hit",instance="p1"}}', 'values': '0+10x20'},
    {'series': f'{S}route_decisions_total{{backend="b",reason="prefix_hit",instance="p1"}}', 'values': '0+10x20'},
  ], 'alert_rule_test': [
    {'eval_time': '3m', 'alertname': 'PrefixgateUpstreamErrors', 'exp_alerts': []},
    {'eval_time': '15m', 'alertname': 'PrefixgateUpstreamErrors', 'exp_alerts': [
        alert('PrefixgateUpstreamErrors', {'backend': 'a'}, summary='10%')]}]})
# --- no healthy backend: pod p1 sees none healthy, p2 sees one
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}backend_healthy{{backend="a",instance="p1"}}', 'values': '0x5'},
    {'series': f'{S}backend_healthy{{backend="b",instance="p1"}}', 'values': '0x5'},
    {'series': f'{S}backend_healthy{{backend="a",instance="p2"}}', 'values': '1x5'},
    {'series': f'{S}backend_healthy{{backend="b",instance="p2"}}', 'values': '0x5'},
  ], 'alert_rule_test': [
    {'eval_time': '3m', 'alertname': 'PrefixgateNoHealthyBackend', 'exp_alerts': [
        alert('PrefixgateNoHealthyBackend', {'instance': 'p1'})]}]})
# --- observation errors: p1's tracking raised once at 5m; p2's counter never moved
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}observation_errors_total{{stage="prefix",instance="p1"}}', 'values': '0x4 1x30'},
    {'series': f'{S}observation_errors_total{{stage="prefix",instance="p2"}}', 'values': '0x35'},
  ], 'alert_rule_test': [
    {'eval_time': '3m', 'alertname': 'PrefixgateObservationErrors', 'exp_alerts': []},
    {'eval_time': '6m', 'alertname': 'PrefixgateObservationErrors', 'exp_alerts': [
        alert('PrefixgateObservationErrors', {'instance': 'p1', 'stage': 'prefix'})]},
    {'eval_time': '25m', 'alertname': 'PrefixgateObservationErrors', 'exp_alerts': []}]})
# --- diagnosis over budget: p1 skips breaks for 30 min, p2 diagnoses them all
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}diagnoses_total{{outcome="over_budget",instance="p1"}}', 'values': '0+2x40'},
    {'series': f'{S}diagnoses_total{{outcome="diagnosed",instance="p2"}}', 'values': '0+50x40'},
  ], 'alert_rule_test': [
    {'eval_time': '10m', 'alertname': 'PrefixgateDiagnosisOverBudget', 'exp_alerts': []},
    {'eval_time': '20m', 'alertname': 'PrefixgateDiagnosisOverBudget', 'exp_alerts': [
        alert('PrefixgateDiagnosisOverBudget', {'instance': 'p1'})]}]})
# --- state backend: p1 down, p2 up
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}state_backend_up{{instance="p1"}}', 'values': '0x5'},
    {'series': f'{S}state_backend_up{{instance="p2"}}', 'values': '1x5'},
  ], 'alert_rule_test': [
    {'eval_time': '1m', 'alertname': 'PrefixgateStateBackendDown', 'exp_alerts': []},
    {'eval_time': '4m', 'alertname': 'PrefixgateStateBackendDown', 'exp_alerts': [
        alert('PrefixgateStateBackendDown', {'instance': 'p1'})]}]})
# --- engine metrics stale: a stale, b fresh
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}engine_metrics_stale{{backend="a",instance="p1"}}', 'values': '1x15'},
    {'series': f'{S}engine_metrics_stale{{backend="b",instance="p1"}}', 'values': '0x15'},
  ], 'alert_rule_test': [
    {'eval_time': '12m', 'alertname': 'PrefixgateEngineMetricsStale', 'exp_alerts': [
        alert('PrefixgateEngineMetricsStale', {'backend': 'a'})]}]})
# --- admission shedding: p1 sheds 0.5/s, p2 sheds nothing and only rate-limits (429s do not count)
tests.append({'interval': '1m', 'input_series': [
    {'series': f'{S}admission_rejections_total{{tenant="a",reason="queue_ttl",instance="p1"}}', 'values': '0+30x15'},
    {'series': f'{S}admission_rejections_total{{tenant="a",reason="requests_per_s",instance="p2"}}', 'values': '0+60x15'},
  ], 'alert_rule_test': [
    {'eval_time': '3m', 'alertname': 'PrefixgateAdmissionShedding', 'exp_alerts': []},
    {'eval_time': '12m', 'alertname': 'PrefixgateAdmissionShedding', 'exp_alerts': [
        alert('PrefixgateAdmissionShedding', {'instance': 'p1'})]}]})

head = """# promtool unit tests for ../prefixgate-rules.yaml: every alert has a case that fires and
# cases that must not (other buckets, backends, tenants or pods in the same input).
# Run: promtool test rules deploy/prometheus/tests/prefixgate-rules.test.yaml
# Regenerating the expected annotations: they are the rule's text with $labels filled in.
"""
doc = {'rule_files': ['../prefixgate-rules.yaml'], 'evaluation_interval': '1m', 'tests': tests}
(root/'tests'/'prefixgate-rules.test.yaml').write_text(head + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True))
