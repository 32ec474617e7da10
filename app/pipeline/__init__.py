"""The request pipeline: the steps every proxied request goes through, and their adapters.

- request.py: `RequestPipeline`, whose module docstring is the table of steps (start there);
- hygiene_stage.py: cache isolation, findings and hygiene policy (step 2);
- tracing_stage.py: the request's OpenTelemetry span (steps 3b and 8b);
- body.py: the forwarded bytes, with the salt and include_usage spliced in (step 4).

The stages are the adapters between a `RequestContext` and the pure cores (app/hygiene/,
app/prefix/): those cores never import app/proxy/ or this package.
"""
