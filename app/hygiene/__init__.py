"""Hygiene enforcement: find, rewrite or reject what defeats the engine's prefix cache, and
isolate tenants' caches with a per-tenant `cache_salt`.

- findings.py: bounded scan of one request body (dynamic head lines, varying tool order);
- rewrite.py: pure, deterministic rewrites (move_dynamic, sort_tools, canonical_json);
- salt.py: per-tenant salt derivation and the client-salt decision.

The stage that applies them to a request is app/pipeline/hygiene_stage.py.
"""
