"""EngineScraper over real loopback HTTP: fixture expositions served by a tiny app, a hanging and
a trickling /metrics, gauges, Replica updates, restarts, prediction fidelity, /hygiene/engines."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from app.api.engines import build_engines_router
from app.config import Settings
from app.engines.scrape import EngineScraper
from app.routing.base import Replica
from app.routing.replicas import ReplicaSet
from app.serving import ServerThread
from app.telemetry.metrics import Metrics
from tests.fake_clock import FakeClock

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
REAL_SGLANG = Path(__file__).parent / "fixtures" / "real_sglang"  # recorded from SGLang 0.5.23 on CPU
REAL = Path(__file__).parent / "fixtures" / "real_vllm"


class ExpositionServer:
    """Serves whatever text the test puts in `text` at /metrics (and `info` at /server_info)."""

    def __init__(self) -> None:
        self.text = ""
        self.info: dict[str, Any] | None = None
        app = FastAPI()

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            return PlainTextResponse(self.text)

        @app.get("/server_info")
        async def server_info() -> JSONResponse:
            if self.info is None:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return JSONResponse(self.info)

        self.thread = ServerThread(app)

    def serve(self, fixture: str) -> None:
        self.text = (FIXTURES / fixture).read_text()


@pytest.fixture(scope="module")
def server() -> Iterator[ExpositionServer]:
    s = ExpositionServer()
    s.thread.start()
    yield s
    s.thread.stop()


def make(url: str, name: str = "b0", timeout_s: float = 2.0, window_s: float = 3600, **replica: Any):
    replicas = ReplicaSet([Replica(name=name, url=url, **replica)])
    metrics = Metrics()
    clock = FakeClock(1000.0)
    settings = Settings(scrape={"interval_s": 0.05, "timeout_s": timeout_s, "window_s": window_s})
    return EngineScraper(replicas, metrics, settings, clock=clock), replicas, metrics, clock


def gauge(metrics: Metrics, name: str, backend: str = "b0") -> float | None:
    return metrics.registry.get_sample_value(f"prefixgate_{name}", {"backend": backend})


async def two_scrapes(scraper: EngineScraper, server: ExpositionServer, clock: FakeClock,
                      first: str, second: str, dt: float = 5.0) -> None:
    server.serve(first)
    await scraper.scrape_once()
    clock.now += dt
    server.serve(second)
    await scraper.scrape_once()


async def test_vllm_pair_gives_window_ratios_gauges_and_replica_geometry(server: ExpositionServer) -> None:
    scraper, replicas, metrics, clock = make(server.thread.url)
    try:
        server.serve("vllm-0.33-spec-a.txt")
        await scraper.scrape_once()
        assert gauge(metrics, "engine_prefix_cache_hit_ratio") is None  # one sample: no window yet
        assert gauge(metrics, "engine_prefix_caching_enabled") == 1.0  # config says on
        clock.now += 5
        server.serve("vllm-0.33-spec-b.txt")
        await scraper.scrape_once()
    finally:
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_cache_hit_ratio") == pytest.approx(10000 / 12000)
    assert gauge(metrics, "engine_spec_acceptance_length") == pytest.approx(1 + 900 / 500)
    assert gauge(metrics, "engine_requests_waiting") == 1.0
    assert gauge(metrics, "engine_requests_running") == 6.0
    assert gauge(metrics, "engine_kv_usage_ratio") == pytest.approx(0.41)
    assert gauge(metrics, "engine_block_size_tokens") == 16
    assert gauge(metrics, "engine_kv_capacity_blocks") == 27306
    assert gauge(metrics, "engine_metrics_stale") == 0.0
    replica = replicas.get("b0")
    assert replica is not None
    # num_gpu_blocks less the pool's null block (vLLM's block 0 is never cached): what the index may hold
    assert (replica.engine, replica.block_size, replica.kv_blocks) == ("vllm", 16, 27306 - 1)
    assert (replica.engine_waiting, replica.engine_running) == (1.0, 6.0)
    status = scraper.status()["b0"]
    assert status["verdict"] == "prefix cache on, 83% hit, spec acceptance length 2.80"
    assert status["hash_algo"] == "sha256"


async def test_real_vllm_capture_pair(server: ExpositionServer) -> None:
    scraper, replicas, metrics, clock = make(server.thread.url)
    try:
        server.text = (REAL / "metrics_idle.txt").read_text()
        await scraper.scrape_once()
        clock.now += 30
        server.text = (REAL / "metrics_after.txt").read_text()
        await scraper.scrape_once()
        verdict = scraper.status()["b0"]["verdict"]
    finally:
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_cache_hit_ratio") == pytest.approx(3584 / 7235)
    assert verdict == "prefix cache on, 50% hit"
    replica = replicas.get("b0")
    assert replica is not None and (replica.block_size, replica.kv_blocks) == (32, 32768 - 1)  # less the null block


async def test_restart_gives_no_negative_or_spiking_rate(server: ExpositionServer) -> None:
    scraper, _, metrics, clock = make(server.thread.url)
    try:
        await two_scrapes(scraper, server, clock, "vllm-0.33-spec-a.txt", "vllm-0.33-spec-b.txt")
        before = gauge(metrics, "engine_prefix_cache_hit_ratio")
        clock.now += 5
        server.serve("vllm-0.33-restart.txt")  # counters went back: a new process
        await scraper.scrape_once()
        after = gauge(metrics, "engine_prefix_cache_hit_ratio")
        spec_after = gauge(metrics, "engine_spec_acceptance_length")
        status = scraper.status()["b0"]
    finally:
        await scraper.stop()
    assert after == before  # unchanged: no delta spans the restart
    assert spec_after == pytest.approx(2.8)
    assert status["restarts"] == 1 and status["window_s"] is None


async def test_hybrid_model_prompts_without_queries_flip_to_off_with_one_warning(
        server: ExpositionServer, caplog: pytest.LogCaptureFixture) -> None:
    scraper, replicas, metrics, clock = make(server.thread.url)
    caplog.set_level(logging.WARNING, logger="app.engines.scrape")
    try:
        await two_scrapes(scraper, server, clock, "vllm-0.33-hybrid-a.txt", "vllm-0.33-hybrid-b.txt")
        status = scraper.status()["b0"]
        clock.now += 5
        await scraper.scrape_once()  # still OFF: no second warning
    finally:
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_caching_enabled") == 0.0
    assert status["verdict"] == "prefix cache OFF: 0 queries over 1,200 prompt tokens/s"
    assert any("Mamba" in cause for cause in status["likely_causes"])
    warnings = [r for r in caplog.records if "prefix cache OFF" in r.getMessage()]
    assert len(warnings) == 1 and "b0" in warnings[0].getMessage()
    replica = replicas.get("b0")
    assert replica is not None
    assert replica.block_size == 528  # hits land on cache_hit_alignment_tokens
    assert replica.kv_blocks == (1850 - 1) * 1056 // 528  # the same cacheable KV memory, in 528-token units


async def test_a_long_prefill_ending_in_a_window_without_new_requests_is_not_cache_off(
        server: ExpositionServer, caplog: pytest.LogCaptureFixture) -> None:
    """vLLM counts a request's cache queries when it is scheduled and its prompt tokens when its
    prefill ends: a scrape window in which a long prefill ended and nothing new was scheduled has
    prompt tokens and no queries, with the cache on (the query counter has moved before). Seen
    with 8 agent sessions of 57k-token turns on the simulator: a false "prefix cache OFF"."""
    scraper, _, metrics, clock = make(server.thread.url, window_s=5)  # a window of one scrape interval
    caplog.set_level(logging.WARNING, logger="app.engines.scrape")
    spec_b = (FIXTURES / "vllm-0.33-spec-b.txt").read_text()
    assert 'vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 133000.0' in spec_b
    try:
        await two_scrapes(scraper, server, clock, "vllm-0.33-spec-a.txt", "vllm-0.33-spec-b.txt")
        assert gauge(metrics, "engine_prefix_caching_enabled") == 1.0
        clock.now += 5  # the next window: a 57k-token prefill ends, no new request is scheduled
        server.text = spec_b.replace('vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 133000.0',
                                     'vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 190000.0')
        await scraper.scrape_once()
    finally:
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_caching_enabled") == 1.0
    assert not [r for r in caplog.records if "prefix cache OFF" in r.getMessage()]


async def test_config_off_and_absent_spec_family(server: ExpositionServer) -> None:
    scraper, _, metrics, clock = make(server.thread.url)
    try:
        await two_scrapes(scraper, server, clock, "vllm-0.32-prefix-off.txt", "vllm-0.32-prefix-off.txt")
    finally:
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_caching_enabled") == 0.0
    assert gauge(metrics, "engine_spec_acceptance_length") is None  # absent family: absent gauge
    assert gauge(metrics, "engine_prefix_cache_hit_ratio") is None  # no queries: no ratio


async def test_config_pinned_geometry_is_kept(server: ExpositionServer) -> None:
    scraper, replicas, _, clock = make(server.thread.url, block_size=32, kv_blocks=100)
    try:
        await two_scrapes(scraper, server, clock, "vllm-0.33-spec-a.txt", "vllm-0.33-spec-b.txt")
        scraper.record_prediction("b0", 1000, 300)
        status = scraper.status()["b0"]
    finally:
        await scraper.stop()
    replica = replicas.get("b0")
    assert replica is not None and (replica.block_size, replica.kv_blocks) == (32, 100)
    assert status["prediction_fidelity"] == pytest.approx(0.3)
    assert "32-token" in status["fidelity_note"]  # the pinned block size contradicts the engine


async def test_sglang_pair_and_server_info(server: ExpositionServer) -> None:
    scraper, replicas, metrics, clock = make(server.thread.url)
    server.info = {"disable_radix_cache": False, "page_size": 1, "max_total_num_tokens": 412000}
    try:
        await two_scrapes(scraper, server, clock, "sglang-0.5.23-a.txt", "sglang-0.5.23-b.txt")
    finally:
        server.info = None
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_cache_hit_ratio") == pytest.approx(12000 / 15000)
    assert gauge(metrics, "engine_spec_acceptance_length") == pytest.approx(2.58)
    assert gauge(metrics, "engine_requests_waiting") == 1.0
    assert gauge(metrics, "engine_kv_capacity_blocks") == 412000
    replica = replicas.get("b0")
    assert replica is not None and (replica.engine, replica.block_size) == ("sglang", 1)


async def test_real_sglang_pair_and_server_info(server: ExpositionServer) -> None:
    """Recorded /metrics before and after a cold + warm 904-token request, real /server_info."""
    scraper, replicas, metrics, clock = make(server.thread.url)
    server.info = json.loads((REAL_SGLANG / "server_info.json").read_text())
    try:
        await two_scrapes(scraper, server, clock, str(REAL_SGLANG / "metrics_idle.txt"),
                          str(REAL_SGLANG / "metrics_after.txt"))
    finally:
        server.info = None
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_cache_hit_ratio") == pytest.approx(903 / 1808)
    assert gauge(metrics, "engine_spec_acceptance_length") is None
    assert gauge(metrics, "engine_prefix_caching_enabled") == 1.0
    assert gauge(metrics, "engine_kv_capacity_blocks") == 8192
    replica = replicas.get("b0")
    assert replica is not None and (replica.engine, replica.block_size) == ("sglang", 1)


async def test_sglang_radix_cache_disabled_in_server_info(server: ExpositionServer) -> None:
    """Recorded from a `--disable-radix-cache` replica: its prefill counters still move (every
    token is `input`), yet its /server_info says disabled, and that wins."""
    scraper, _, metrics, _ = make(server.thread.url)
    server.info = json.loads((REAL_SGLANG / "server_info_noradix.json").read_text())
    server.serve(str(REAL_SGLANG / "metrics_after_noradix.txt"))
    try:
        await scraper.scrape_once()
        verdict = scraper.status()["b0"]["verdict"]
    finally:
        server.info = None
        await scraper.stop()
    assert gauge(metrics, "engine_prefix_caching_enabled") == 0.0
    assert verdict == "prefix cache OFF: disabled in the engine's config"


async def test_prediction_fidelity_gauge(server: ExpositionServer) -> None:
    scraper, _, metrics, clock = make(server.thread.url)
    server.serve("vllm-0.33-spec-a.txt")
    try:
        scraper.record_prediction("b0", 1000, 900)
        scraper.record_prediction("b0", 1000, 100)
        scraper.record_prediction("nope", 1000, 0)  # unknown backend: ignored
        await scraper.scrape_once()
        assert gauge(metrics, "prediction_fidelity_ratio") == pytest.approx(0.5)
        clock.now += 7200  # the window forgot them
        await scraper.scrape_once()
    finally:
        await scraper.stop()
    assert gauge(metrics, "prediction_fidelity_ratio") is None
    assert gauge(metrics, "prediction_fidelity_ratio", "nope") is None


class StuckServer:
    """Accepts connections and then either never answers (`hang`) or trickles a body forever."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            if self.mode == "trickle":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
                while not self.stopping.is_set():
                    conn.sendall(b"#")
                    time.sleep(0.05)
            else:
                self.stopping.wait()
        except OSError:
            pass

    def close(self) -> None:
        self.stopping.set()
        for conn in self.conns:
            conn.close()
        self.sock.close()


@pytest.mark.parametrize("mode", ["hang", "trickle"])
async def test_stuck_metrics_endpoint_is_bounded_and_marked_stale(mode: str, server: ExpositionServer) -> None:
    stuck = StuckServer(mode)
    replicas = ReplicaSet([Replica(name="stuck", url=f"http://127.0.0.1:{stuck.port}"),
                           Replica(name="ok", url=server.thread.url)])
    metrics = Metrics()
    settings = Settings(scrape={"interval_s": 0.05, "timeout_s": 0.5, "window_s": 60})
    scraper = EngineScraper(replicas, metrics, settings)
    server.serve("vllm-0.33-spec-a.txt")
    try:
        started = time.perf_counter()
        await scraper.scrape_once()
        elapsed = time.perf_counter() - started
        status = scraper.status()
    finally:
        await scraper.stop()
        stuck.close()
    assert elapsed < 3.0  # bounded by timeout_s (0.5 s), not by the stuck server (forever)
    assert status["stuck"]["stale"] and status["stuck"]["error"] == "timeout"
    assert gauge(metrics, "engine_metrics_stale", "stuck") == 1.0
    assert gauge(metrics, "engine_requests_waiting", "stuck") is None
    assert gauge(metrics, "engine_metrics_stale", "ok") == 0.0  # the healthy replica was scraped


async def test_background_loop_with_a_hung_replica_leaves_the_event_loop_responsive(
        server: ExpositionServer) -> None:
    """The scraper runs beside serving: while one replica's /metrics hangs, requests made from the
    same event loop finish in milliseconds, and the loop keeps scraping the healthy replica."""
    stuck = StuckServer("hang")
    replicas = ReplicaSet([Replica(name="stuck", url=f"http://127.0.0.1:{stuck.port}"),
                           Replica(name="ok", url=server.thread.url)])
    metrics = Metrics()
    scraper = EngineScraper(replicas, metrics, Settings(scrape={"interval_s": 0.05, "timeout_s": 5.0}))
    server.serve("vllm-0.33-spec-a.txt")
    slowest = 0.0
    await scraper.start()
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(20):
                t0 = time.perf_counter()
                response = await client.get(f"{server.thread.url}/metrics")
                slowest = max(slowest, time.perf_counter() - t0)
                assert response.status_code == 200
                await asyncio.sleep(0.02)
        ok_scraped = gauge(metrics, "engine_metrics_stale", "ok")
    finally:
        await scraper.stop()
        stuck.close()
    assert slowest < 1.0  # orders of magnitude below the 5 s scrape timeout of the hung replica
    assert ok_scraped == 0.0


async def test_removed_replica_loses_its_series(server: ExpositionServer) -> None:
    scraper, replicas, metrics, _ = make(server.thread.url)
    server.serve("vllm-0.33-spec-a.txt")
    try:
        await scraper.scrape_once()
        assert gauge(metrics, "engine_requests_running") == 5.0
        replicas.remove("b0")
        await scraper.scrape_once()
    finally:
        await scraper.stop()
    assert gauge(metrics, "engine_requests_running") is None
    assert gauge(metrics, "engine_metrics_stale") is None


async def test_unreachable_then_unknown_engine(server: ExpositionServer) -> None:
    scraper, _, metrics, _ = make(f"http://127.0.0.1:{_closed_port()}")
    try:
        await scraper.scrape_once()
        assert scraper.status()["b0"]["verdict"].startswith("engine /metrics unreachable")
    finally:
        await scraper.stop()
    scraper, _, metrics, _ = make(server.thread.url)
    server.text = "process_start_time_seconds 1\n"
    try:
        await scraper.scrape_once()
        view = scraper.status()["b0"]
    finally:
        await scraper.stop()
    assert view["engine"] == "unknown" and "no vLLM or SGLang metrics" in view["verdict"]
    assert gauge(metrics, "engine_prefix_caching_enabled") is None


async def test_counters_without_config_or_traffic_leave_caching_unknown(server: ExpositionServer) -> None:
    """SGLang without /server_info, one scrape (no window): nothing says the cache is on, so the
    gauge is absent and the verdict says unknown; it must never read as 1."""
    scraper, _, metrics, _ = make(server.thread.url)
    server.info = None
    server.serve(str(REAL_SGLANG / "metrics_after.txt"))
    try:
        await scraper.scrape_once()
        view = scraper.status()["b0"]
    finally:
        await scraper.stop()
    assert view["engine"] == "sglang" and view["caching_enabled"] is None
    assert gauge(metrics, "engine_prefix_caching_enabled") is None
    assert "unknown" in view["verdict"]


async def test_hygiene_engines_endpoint(server: ExpositionServer) -> None:
    scraper, _, _, clock = make(server.thread.url)
    try:
        await two_scrapes(scraper, server, clock, "vllm-0.33-hybrid-a.txt", "vllm-0.33-hybrid-b.txt")
        app = FastAPI()
        app.include_router(build_engines_router(scraper))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            body = (await client.get("/hygiene/engines")).json()
    finally:
        await scraper.stop()
    assert body["prefix_cache_off"] == ["b0"] and body["stale"] == []
    assert body["backends"]["b0"]["verdict"] == "prefix cache OFF: 0 queries over 1,200 prompt tokens/s"
    assert body["backends"]["b0"]["caching_enabled"] is False


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
