"""`prefixgate epp` as a real process: flags, TLS on the ext_proc port, gRPC health, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.serving import free_port
from tests.epp_dataplane import DataPlane

ROOT = Path(__file__).resolve().parent.parent


def health(port: int, service: str) -> int | None:
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status
    except grpc.RpcError:
        return None


def test_epp_process_serves_tls_ext_proc_and_health_then_drains(sim_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    grpc_port, health_port, http_port = free_port(), free_port(), free_port()
    log = tempfile.NamedTemporaryFile(prefix="prefixgate-epp-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "app", "epp", "--backend", sim.urls[0], "--host", "127.0.0.1",
                             "--port", str(http_port), "--grpc-port", str(grpc_port), "--health-port",
                             str(health_port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while health(health_port, "readiness") != health_pb2.HealthCheckResponse.SERVING:
            assert proc.poll() is None, Path(log.name).read_text()
            assert time.monotonic() < deadline, Path(log.name).read_text()
            time.sleep(0.1)
        cert = ssl.get_server_certificate(("127.0.0.1", grpc_port)).encode()  # TLS: a self-signed certificate

        async def one() -> int:
            plane = DataPlane(f"127.0.0.1:{grpc_port}", cert)
            try:
                r = await plane.request("/v1/chat/completions", {"model": "sim", "max_tokens": 2,
                                                                 "messages": [{"role": "user", "content": "hi"}]})
                return r.status
            finally:
                await plane.close()

        assert asyncio.run(one()) == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, Path(log.name).read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
