"""`prefixgate sim` as a process: N replicas on consecutive ports, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from app.serving import consecutive_free_ports


def test_sim_command_starts_replicas_and_stops_on_sigterm():
    base = consecutive_free_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "app", "sim", "--replicas", "2", "--port", str(base),
                             "--time-scale", "0", "--block-size", "32", "--model", "m"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        urls = [f"http://127.0.0.1:{base + i}" for i in range(2)]
        while True:
            try:
                if all(httpx.get(u + "/health", timeout=1).status_code == 200 for u in urls):
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "replicas did not come up"
            time.sleep(0.2)
        for u in urls:
            assert httpx.get(u + "/v1/models").json()["data"][0]["id"] == "m"
            assert 'block_size="32"' in httpx.get(u + "/metrics").text
            r = httpx.post(u + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
            assert r.json()["usage"]["completion_tokens"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert f"replica 1: http://127.0.0.1:{base + 1}/v1" in out
