"""The Endpoint Picker protocol's wire facts, as small pure functions over the generated protos.

What the data plane sends and what it reads back (docs/epp.md, "Protocol"): the request's headers
as a `HeaderMap` (Envoy fills `raw_value`, older builds `value`); the optional subset under
`metadata_context.filter_metadata["envoy.lb.subset_hint"]["x-gateway-destination-endpoint-subset"]`;
the endpoint that served under `filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]`.
The pick goes back twice with one value: the `x-gateway-destination-endpoint` header and the same
key in `dynamic_metadata["envoy.lb"]`. Bodies are answered in the full-duplex streamed mode, where
every body message the EPP receives is answered with a `streamed_response` carrying the bytes the
data plane must send on (the EPP owns the body).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


def header_dict(headers: pb.HttpHeaders) -> dict[str, str]:
    """Lower-case names -> values (pseudo-headers such as `:path` included)."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        value = h.raw_value.decode("latin-1") if h.raw_value else h.value
        out[h.key.lower()] = value
    return out


def endpoint_of(url: str) -> str:
    """A backend base URL as the `ip:port` the protocol names endpoints by."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _struct_value(md: base_pb2.Metadata, namespace: str, key: str) -> struct_pb2.Value | None:
    if namespace not in md.filter_metadata:
        return None
    fields = md.filter_metadata[namespace].fields
    return fields[key] if key in fields else None


def subset_hint(md: base_pb2.Metadata) -> list[str] | None:
    """The endpoints the data plane allows (None: no hint, pick from the whole pool)."""
    value = _struct_value(md, SUBSET_NAMESPACE, SUBSET)
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values if v.string_value]
    if kind == "string_value":  # tolerated: a comma-separated string
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []


def served_endpoint(md: base_pb2.Metadata) -> str | None:
    value = _struct_value(md, LB_NAMESPACE, SERVED)
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    return value.string_value or None


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1")))


def _mutation(set_headers: list[tuple[str, str]], remove: list[str] | None = None) -> pb.HeaderMutation:
    return pb.HeaderMutation(set_headers=[_header(k, v) for k, v in set_headers], remove_headers=remove or [])


def picked(endpoints: list[str], body_length: int | None) -> pb.ProcessingResponse:
    """The request-headers answer: the pick as a header and as `envoy.lb` dynamic metadata (one
    value), and the content-length of the body the EPP sends on (None: the body passes as it came)."""
    value = ",".join(endpoints)
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION: value}})
    headers = [(DESTINATION, value)]
    if body_length is not None:
        headers.append(("content-length", str(body_length)))
    common = pb.CommonResponse(header_mutation=_mutation(headers), clear_route_cache=True)
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata)


def continue_headers(phase: str, set_headers: list[tuple[str, str]] | None = None) -> pb.ProcessingResponse:
    """`phase` is "request_headers" or "response_headers"."""
    common = pb.CommonResponse(header_mutation=_mutation(set_headers or []))
    return pb.ProcessingResponse(**{phase: pb.HeadersResponse(response=common)})


def streamed_body(phase: str, body: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    """`phase` is "request_body" or "response_body": the bytes the data plane sends on."""
    mutation = pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=end_of_stream))
    return pb.ProcessingResponse(**{phase: pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))})


def immediate(status: int, body: bytes, headers: list[tuple[str, str]]) -> pb.ProcessingResponse:
    """The data plane answers the client itself (reject, no endpoint) and never calls a replica."""
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), body=body,
        headers=_mutation([("content-type", "application/json"), *headers]), details="prefixgate_epp"))


def trailers(phase: str) -> pb.ProcessingResponse:
    """`phase` is "request_trailers" or "response_trailers": passed on unchanged."""
    return pb.ProcessingResponse(**{phase: pb.TrailersResponse()})
