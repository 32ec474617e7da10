"""The OpenTelemetry tracer provider of one gateway (the spans themselves: app/pipeline/tracing_stage.py).

The exporter is OTLP/HTTP configured by the standard env (OTEL_EXPORTER_OTLP_ENDPOINT /
_TRACES_ENDPOINT, _HEADERS, _TIMEOUT, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
OTEL_TRACES_SAMPLER, OTEL_BSP_*), so the proxy has no tracing settings of its own to learn. Each
app gets its own TracerProvider (not the global one): several proxies in one process (tests, the
demo) stay independent and shut down cleanly.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span

DEFAULT_SERVICE_NAME = "prefixgate"


def build_provider(exporter: SpanExporter | None = None) -> TracerProvider:
    """A TracerProvider exporting in batches; OTLP/HTTP from the OTEL_* env unless `exporter`."""
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def add_ttft_parts(span: Span, parts: Mapping[str, float]) -> None:
    """The TTFT ledger's measured parts on the request's span: `prefixgate.ttft.<part>_s`
    (gateway, retries, queue, prefill, rest; docs/ttft-ledger.md). Absent parts stay absent."""
    span.set_attributes({f"prefixgate.ttft.{part}_s": seconds for part, seconds in parts.items()})
