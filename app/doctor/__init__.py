"""`prefixgate check URL`: is this endpoint's prefix cache really working? (issue 10)

- cli.py      — argparse surface and exit code (0 healthy, 1 problems, 2 could not measure)
- check.py    — the procedure: quiet gate, calibration, same prompt N times, two-point, ladder
- probe.py    — timed streaming requests (client-side TTFT, usage) and /v1/models, /health, /tokenize
- metrics.py  — the engine's /metrics through app.engines' adapters: busy?, cache counters, config
- document.py — the probe document: deterministic per run, unique across runs, sized in tokens
- verdict.py  — pure judgement: cache on/off/unclear, two-point slope, ladder ceiling
- report.py   — rich table, progress bars, the --json object
"""
