"""Fuzzing the engine scraper: real vLLM and SGLang /metrics captures (and SGLang's /server_info),
bent, scraped in pairs over loopback HTTP by the real EngineScraper.

Each case takes a recorded pair (tests/fixtures/real_vllm, real_sglang, engines/) and bends both
pages: sample values replaced by NaN, ±Inf, -1, 0, 1e308 or a word, label values changed, lines
deleted, repeated or cut, garbage lines; /server_info's values replaced likewise. What must hold
after every pair: the scrape returns (a page that does not parse is a failed scrape, not an
exception), every prefixgate gauge is a finite number (a ratio within 0..1, a count >= 0), the
replica's engine geometry is absent or positive, the engines' report (`/hygiene/engines`) is
strict JSON, and the pair after a bent one is read as usual. `PREFIXGATE_SCRAPE_FUZZ_CASES`
(default 300) seeded cases.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.api.engines import build_engines_router
from tests.test_engines_scrape import ExpositionServer, make, server  # noqa: F401  (server: the fixture)

CASES = int(os.environ.get("PREFIXGATE_SCRAPE_FUZZ_CASES", "300"))
FIX = Path(__file__).parent / "fixtures"
PAIRS = [
    (FIX / "real_vllm" / "metrics_idle.txt", FIX / "real_vllm" / "metrics_after.txt", None),
    (FIX / "engines" / "vllm-0.33-spec-a.txt", FIX / "engines" / "vllm-0.33-spec-b.txt", None),
    (FIX / "engines" / "vllm-0.33-hybrid-a.txt", FIX / "engines" / "vllm-0.33-hybrid-b.txt", None),
    (FIX / "real_sglang" / "metrics_idle.txt", FIX / "real_sglang" / "metrics_after.txt",
     FIX / "real_sglang" / "server_info.json"),
    (FIX / "engines" / "sglang-0.5.23-a.txt", FIX / "engines" / "sglang-0.5.23-b.txt", None),
]
NUMBERS = ["NaN", "+Inf", "-Inf", "-1", "0", "1e308", "-1e308", "2.5", "abc", "", "0x10", "1_000"]
INFO_VALUES: list[Any] = [None, True, -1, 0, 1e308, "x", "", [], {}, [1, 2], {"a": 1}, 2**70]
RATIO_GAUGES = ("engine_prefix_cache_hit_ratio", "engine_kv_usage_ratio", "prediction_fidelity")


def bend_page(text: str, r: random.Random) -> str:
    lines = text.splitlines()
    samples = [i for i, ln in enumerate(lines) if ln and not ln.startswith("#")]
    for _ in range(r.randint(1, 4)):
        if not samples:
            break
        i = r.choice(samples)
        how = r.choice(["value", "value", "value", "label", "delete", "repeat", "cut", "garbage"])
        line = lines[i]
        if how == "value":
            name, _, _ = line.rpartition(" ")
            lines[i] = f"{name} {r.choice(NUMBERS)}"
        elif how == "label" and "{" in line:
            head, _, rest = line.partition("{")
            lines[i] = head + "{" + r.choice(['engine="x",', 'le="abc",', 'model_name="",', "",
                                               'page_size="-3",', 'x="\\"",']) + rest
        elif how == "delete":
            lines[i] = ""
        elif how == "repeat":
            lines.insert(i, line)
        elif how == "cut":
            lines[i] = line[:r.randrange(len(line) + 1)]
        else:
            lines.insert(i, r.choice(["garbage", "{}", "x{ 1", "# TYPE x counter", "name{a=\"b\"} 1 2 3 4"]))
    return "\n".join(lines) + "\n"


def bend_info(info: dict[str, Any], r: random.Random) -> dict[str, Any]:
    out = dict(info)
    for _ in range(r.randint(1, 3)):
        key = r.choice(sorted(out))
        out[key] = r.choice(INFO_VALUES)
    return out


def _check(metrics, replicas, scraper) -> list[str]:
    bad = []
    for family in metrics.registry.collect():
        for s in family.samples:
            if not s.name.startswith("prefixgate_engine") and not s.name.startswith("prefixgate_prediction"):
                continue
            if not math.isfinite(s.value):
                bad.append(f"{s.name}{s.labels} = {s.value}")
            elif any(s.name == f"prefixgate_{g}" for g in RATIO_GAUGES) and not 0 <= s.value <= 1:
                bad.append(f"{s.name}{s.labels} = {s.value} (a ratio)")
            elif s.value < 0 and not s.name.endswith("_created"):
                bad.append(f"{s.name}{s.labels} = {s.value}")
    for rep in replicas.all():
        for attr in ("block_size", "kv_blocks"):
            value = getattr(rep, attr)
            if value is not None and not (isinstance(value, int) and value > 0):
                bad.append(f"replica.{attr} = {value!r}")
        for attr in ("engine_waiting", "engine_running"):
            value = getattr(rep, attr)
            if value is not None and not (math.isfinite(value) and value >= 0):
                bad.append(f"replica.{attr} = {value!r}")
    try:
        json.dumps(scraper.status(), allow_nan=False)
    except (TypeError, ValueError) as exc:
        bad.append(f"status() is not strict JSON: {exc}")
    return bad


@pytest.mark.parametrize("part", range(3))
async def test_bent_engine_pages_are_read_or_refused(server: ExpositionServer, part: int) -> None:  # noqa: F811
    failures: list[str] = []
    for i in range(part, CASES, 3):
        r = random.Random(i)
        first, second, info = r.choice(PAIRS)
        scraper, replicas, metrics, clock = make(server.thread.url)
        server.info = json.loads(info.read_text()) if info is not None else None
        try:
            for page in (first, second):
                server.text = bend_page(page.read_text(), r)
                if server.info is not None and r.random() < 0.5:
                    server.info = bend_info(server.info, r)
                await scraper.scrape_once()
                clock.now += 5
            bad = _check(metrics, replicas, scraper)
            server.info = json.loads(info.read_text()) if info is not None else None
            server.text = second.read_text()  # a good page after bent ones is read as usual
            await scraper.scrape_once()
            rep = replicas.all()[0]
            if rep.engine not in ("vllm", "sglang") or rep.block_size is None:
                bad.append(f"a good page after bent ones: engine {rep.engine}, block size {rep.block_size}")
        except Exception as exc:  # noqa: BLE001 -- the case number is the report
            bad = [f"{type(exc).__name__}: {exc}"]
        finally:
            server.info = None
            await scraper.stop()
        failures += [f"case {i} ({first.name}): {b}" for b in bad]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("bent", ["NaN", "-1", "+Inf", "2.5"])
async def test_a_gauge_that_is_no_value_is_absent_and_the_report_is_json(server: ExpositionServer,  # noqa: F811
                                                                         bent: str) -> None:
    """An engine page whose running count or KV usage is NaN, negative, infinite or (usage) past
    1: the gauge is absent rather than that number, the replica's load reads unknown, and
    /hygiene/engines answers strict JSON (it answered 500 for a NaN)."""
    page = (FIX / "real_vllm" / "metrics_after.txt").read_text()
    lines = [f"{ln.rpartition(' ')[0]} {bent}" if ln.startswith(("vllm:num_requests_running", "vllm:kv_cache_usage_perc"))
             else ln for ln in page.splitlines()]
    scraper, replicas, metrics, _ = make(server.thread.url)
    server.text = "\n".join(lines) + "\n"
    try:
        await scraper.scrape_once()
        app = FastAPI()
        app.include_router(build_engines_router(scraper))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            got = await client.get("/hygiene/engines")
    finally:
        await scraper.stop()
    assert got.status_code == 200 and "b0" in got.json()["backends"]
    running = None if bent != "2.5" else 2.5  # a count may read 2.5; a fraction may not
    assert metrics.registry.get_sample_value("prefixgate_engine_requests_running", {"backend": "b0"}) == running
    assert metrics.registry.get_sample_value("prefixgate_engine_kv_usage_ratio", {"backend": "b0"}) is None
    assert replicas.all()[0].engine_running == running
    assert replicas.all()[0].block_size == 32  # the rest of the page is read
