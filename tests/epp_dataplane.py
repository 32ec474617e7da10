"""A test data plane for the Endpoint Picker: what Envoy's ext_proc filter does, in Python.

No Envoy binary installs here, so this drives the EPP the way the gateway would (docs/epp.md,
"Message sequence"), through the real generated protos over real gRPC (TLS) on loopback, and
forwards the request over real HTTP to the endpoint the EPP picked (a simulator replica):

1. `request_headers` (with the subset hint in `metadata_context` when given), then the body as
   `request_body` chunks, the last with `end_of_stream`;
2. the EPP's answers: an `immediate_response` (the client gets it, no replica is called), or the
   `request_headers` answer (the pick: header + `envoy.lb` metadata, which must agree) and the
   `request_body` answer(s) carrying the bytes to send; header mutations are applied;
3. POST to the listed endpoints in order until one answers (the data plane's retry);
4. `response_headers` with `x-gateway-destination-endpoint-served`, then each upstream read as a
   `response_body`, the client getting the bytes of each answer as it comes; `end_of_stream` last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from app.epp import protocol


@dataclass
class Result:
    status: int
    headers: dict[str, str]
    body: bytes
    endpoints: list[str] = field(default_factory=list)  # the EPP's list, in order
    served: str | None = None
    log: list[str] = field(default_factory=list)  # the message sequence, one line each
    chunk_answer_s: list[float] = field(default_factory=list)  # per response chunk: write -> answer
    pick_s: float | None = None  # request body's end written -> the pick and the body read back
    forwarded: bytes = b""  # the request body the replica got (after the EPP's body mutation)

    def json(self) -> Any:
        return orjson.loads(self.body)


def _headers(pairs: dict[str, str], end_of_stream: bool = False) -> pb.HttpHeaders:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]), end_of_stream=end_of_stream)


def _metadata(namespace: str, values: dict[str, Any]) -> base_pb2.Metadata:
    md = base_pb2.Metadata()
    st = struct_pb2.Struct()
    st.update(values)
    md.filter_metadata[namespace].CopyFrom(st)
    return md


def _apply(headers: dict[str, str], common: pb.CommonResponse) -> None:
    for option in common.header_mutation.set_headers:
        h = option.header
        headers[h.key.lower()] = h.raw_value.decode() if h.raw_value else h.value
    for name in common.header_mutation.remove_headers:
        headers.pop(name.lower(), None)


class DataPlane:
    """`await plane.request(path, body, ...)` -> Result. One gRPC channel (TLS), one HTTP session."""

    def __init__(self, target: str, certificate: bytes | None, chunk_bytes: int = 4096) -> None:
        if certificate is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=certificate)
            self.channel = grpc.aio.secure_channel(target, creds,
                                                   options=[("grpc.ssl_target_name_override", "localhost")])
        else:
            self.channel = grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)
        self.chunk_bytes = chunk_bytes
        self.session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.channel.close()

    async def request(self, path: str, body: Any, headers: dict[str, str] | None = None,
                      subset: list[str] | None = None, break_after: int | None = None) -> Result:
        """`break_after`: the data plane ends the exchange after that many response chunks (the
        replica died mid-stream as far as the EPP can tell)."""
        if self.session is None:
            self.session = aiohttp.ClientSession()
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        req_headers = {":method": "POST", ":path": path, ":authority": "gateway", "content-type": "application/json",
                       "content-length": str(len(raw)), **(headers or {})}
        method = req_headers[":method"]
        bodyless = method == "GET" and not raw  # headers only, their end_of_stream set
        if bodyless:
            req_headers.pop("content-length")
        call = self.stub.Process()
        log: list[str] = []
        md = _metadata(protocol.SUBSET_NAMESPACE, {protocol.SUBSET: subset}) if subset is not None else None
        first = pb.ProcessingRequest(request_headers=_headers(req_headers, end_of_stream=bodyless))
        if md is not None:
            first.metadata_context.CopyFrom(md)
        await call.write(first)
        log.append("-> request_headers" + (" (+ subset hint)" if md is not None else ""))
        chunks = [] if bodyless else [raw[i:i + self.chunk_bytes] for i in range(0, len(raw), self.chunk_bytes)] or [b""]
        for i, chunk in enumerate(chunks):
            eos = i == len(chunks) - 1
            await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=eos)))
            log.append(f"-> request_body ({len(chunk)} B{', end_of_stream' if eos else ''})")
        sent_at = time.perf_counter()
        # the pick, or an immediate response
        answer = await call.read()
        pick_s = time.perf_counter() - sent_at  # an immediate response's; a pick's once its body is back
        if answer.HasField("immediate_response"):
            imm = answer.immediate_response
            log.append(f"<- immediate_response ({imm.status.code})")
            out = {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}
            await call.done_writing()
            return Result(imm.status.code, out, imm.body, log=log, pick_s=pick_s)
        assert answer.HasField("request_headers"), answer
        _apply(req_headers, answer.request_headers.response)
        header_value = req_headers[protocol.DESTINATION]
        meta_value = answer.dynamic_metadata.fields[protocol.LB_NAMESPACE].struct_value.fields[
            protocol.DESTINATION].string_value
        assert header_value == meta_value, (header_value, meta_value)  # the protocol's MUST
        endpoints = header_value.split(",")
        log.append(f"<- request_headers (set {protocol.DESTINATION}: {header_value}; dynamic_metadata envoy.lb same)")
        forwarded = b""
        while not bodyless:
            answer = await call.read()
            assert answer.HasField("request_body"), answer
            streamed = answer.request_body.response.body_mutation.streamed_response
            forwarded += streamed.body
            log.append(f"<- request_body (streamed_response {len(streamed.body)} B"
                       f"{', end_of_stream' if streamed.end_of_stream else ''})")
            if streamed.end_of_stream:
                break
        pick_s = time.perf_counter() - sent_at  # the request side's whole added wait: pick + body back
        assert bodyless or int(req_headers["content-length"]) == len(forwarded)
        # the data plane's retry: down the list until one endpoint answers
        upstream_headers = {k: v for k, v in req_headers.items() if not k.startswith(":")}
        resp = served = None
        for endpoint in endpoints:
            try:
                resp = await self.session.request(method, f"http://{endpoint}{path}", data=forwarded or None,
                                                  headers=upstream_headers)
                served = endpoint
                break
            except aiohttp.ClientConnectionError:
                log.append(f"   (connect to {endpoint} failed: next endpoint)")
        assert resp is not None and served is not None, "no endpoint answered"
        status_headers = {":status": str(resp.status), **{k.lower(): v for k, v in resp.headers.items()
                                                          if k.lower() not in ("content-length", "transfer-encoding")}}
        msg = pb.ProcessingRequest(response_headers=_headers(status_headers),
                                   metadata_context=_metadata(protocol.LB_NAMESPACE, {protocol.SERVED: served}))
        await call.write(msg)
        log.append(f"-> response_headers (:status {resp.status}; metadata_context envoy.lb {protocol.SERVED}: {served})")
        answer = await call.read()
        assert answer.HasField("response_headers"), answer
        client_headers = {k: v for k, v in status_headers.items() if not k.startswith(":")}
        _apply(client_headers, answer.response_headers.response)
        log.append("<- response_headers (x-request-id, x-prefixgate-backend, x-prefixgate-prefix)")
        out = b""
        timings: list[float] = []
        n = 0
        async for data in resp.content.iter_any():
            if break_after is not None and n >= break_after:
                resp.close()
                call.cancel()  # the data plane gives up on the exchange
                log.append("   (upstream gone: the data plane ends the exchange)")
                return Result(resp.status, client_headers, out, endpoints, served, log, timings, pick_s, forwarded)
            t0 = time.perf_counter()
            await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=data)))
            answer = await call.read()
            timings.append(time.perf_counter() - t0)
            streamed = answer.response_body.response.body_mutation.streamed_response
            out += streamed.body
            n += 1
            if n <= 2:
                log.append(f"-> response_body ({len(data)} B)  <- response_body (streamed_response {len(streamed.body)} B)")
        await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"", end_of_stream=True)))
        answer = await call.read()
        out += answer.response_body.response.body_mutation.streamed_response.body
        log.append("-> response_body (0 B, end_of_stream)  <- response_body (streamed_response, end_of_stream)")
        await call.done_writing()
        resp.release()
        return Result(resp.status, client_headers, out, endpoints, served, log, timings, pick_s, forwarded)
