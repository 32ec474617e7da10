# syntax=docker/dockerfile:1
# prefixgate: slim, multi-stage, non-root. Build: docker build -t prefixgate .
# Run:   docker run -p 8080:8080 prefixgate serve --backend http://vllm:8000

# --- build stage: a virtualenv with prefixgate and its dependencies (wheels only, no compilers
# needed for the pinned platforms; build tools stay in this stage if any sdist needs them)
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/prefixgate
COPY pyproject.toml README.md ./
COPY app ./app
# xds-protos (prefixgate epp) bundles an older copy of opentelemetry/proto/*: the real
# opentelemetry-proto goes back over it, or the OTLP trace exporter cannot import its messages
RUN /opt/prefixgate/bin/pip install --no-cache-dir . \
    && /opt/prefixgate/bin/pip install --no-cache-dir --force-reinstall --no-deps \
       "opentelemetry-proto==$(/opt/prefixgate/bin/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')" \
    && find /opt/prefixgate -name '__pycache__' -prune -exec rm -rf {} +

# --- runtime stage: the virtualenv only, as an unprivileged user
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="prefixgate" \
      org.opencontainers.image.description="OpenAI-compatible gateway for vLLM/SGLang that makes prefix caching visible and dependable" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/prefixgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 prefixgate \
    && useradd --system --uid 10001 --gid prefixgate --home-dir /nonexistent --shell /usr/sbin/nologin prefixgate
COPY --from=build /opt/prefixgate /opt/prefixgate
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["prefixgate"]
CMD ["serve", "--config", "/etc/prefixgate/config.yaml"]
