"""`prefixgate serve`: flags over file over env, and the real command in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.cli import build_parser
from app.serve import settings_from_args
from app.serving import ServerThread, free_port


def parse(*argv: str):
    return build_parser("serve").parse_args(["serve", *argv])


def test_flags_override_the_file(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "pg.yaml"
    config.write_text("listen: {host: 10.0.0.1, port: 9000}\nbackends: [{url: 'http://a:8000'}]\n"
                      "routing: {policy: session, max_retries: 5}\n")
    monkeypatch.setenv("PREFIXGATE_LIMITS__MAX_BODY_BYTES", "1234")
    s = settings_from_args(parse("--config", str(config), "--backend", "http://b:1", "--backend", "http://c:2",
                                 "--port", "9100", "--policy", "round_robin"))
    assert [b.url for b in s.backends] == ["http://b:1", "http://c:2"]
    assert (s.listen.host, s.listen.port) == ("10.0.0.1", 9100)
    assert s.routing.policy == "round_robin" and s.routing.max_retries == 5  # merged, not replaced
    assert s.limits.max_body_bytes == 1234


def test_serve_subprocess_proxies_to_a_replica(sim) -> None:
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--backend", sim.urls[0],
                             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                            cwd=root, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        r = httpx.post(base + "/v1/chat/completions", timeout=30,
                       json={"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        assert "prefixgate_requests_total" in httpx.get(base + "/metrics").text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def test_serve_without_backends_exits_2() -> None:
    from app.serve import run

    assert run(parse()) == 2


async def _health_app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"data": [{"id": "late"}]}'})


def test_dead_replica_comes_back_after_its_health_probe(proxy_factory) -> None:
    port = free_port()
    proxy = proxy_factory([f"http://127.0.0.1:{port}"], names=["late"], routing={"health_interval_s": 0.2})
    replica = proxy.services.replicas.get("late")
    deadline = time.monotonic() + 10
    while replica.healthy or proxy.sample("prefixgate_backend_healthy", backend="late") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert httpx.get(proxy.url + "/readyz").status_code == 503
    with ServerThread(_health_app, port=port):
        while not replica.healthy:
            assert time.monotonic() < deadline + 10
            time.sleep(0.05)
        assert proxy.sample("prefixgate_backend_healthy", backend="late") == 1
        assert httpx.get(proxy.url + "/readyz").status_code == 200


def test_health_answers_beside_healthz(proxy) -> None:
    for path in ("/health", "/healthz"):
        r = httpx.get(proxy.url + path, timeout=5)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, path
