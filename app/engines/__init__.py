"""Engine telemetry: scrape vLLM / SGLang /metrics into windowed gauges and per-backend verdicts.

- sample.py   parse Prometheus text; the canonical EngineSample every adapter produces
- vllm.py     vLLM metric names -> EngineSample (pure)
- sglang.py   SGLang metric names (+ /server_info) -> EngineSample (pure)
- rates.py    windowed counter deltas with restart handling; hit ratio, acceptance length
- status.py   per-backend view, "is the prefix cache on?" decision, one-line verdict
- scrape.py   EngineScraper: the background loop, gauges, Replica updates, prediction fidelity
- request_metrics.py  vLLM's per-request `metrics` object in a response (pure; the TTFT ledger)
"""

from app.engines.sample import EngineSample, detect_engine, parse_exposition
from app.engines.scrape import EngineScraper

__all__ = ["EngineSample", "EngineScraper", "detect_engine", "parse_exposition"]
