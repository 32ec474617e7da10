"""`prefixgate serve`: its arguments, its settings, and running the gateway in one process or as
`--workers N` (app/workers.py).

The command sits above both the app (app/server.py, `create_app`) and the worker master
(app/workers.py), which each import only what is below them (docs/pipeline.md, "Layers").
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from app.config import ConfigError, Settings, load_settings
from app.server import create_app
from app.workers import serve_workers, worker_count

log = logging.getLogger("prefixgate.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (keys: see README ## Configuration)")
    parser.add_argument("--backend", action="append", metavar="URL",
                        help="replica base URL (repeatable); replaces the file's backends")
    parser.add_argument("--host", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (default 8080)")
    parser.add_argument("--policy", choices=["round_robin", "least_load", "session", "prefix_affinity"])
    parser.add_argument("--state", help="memory | redis://host:6379/0")
    parser.add_argument("--tokenizer", help="Hugging Face tokenizer directory (default: built-in)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--workers", type=worker_count, default=1, metavar="N",
                        help="worker processes behind the one port (SO_REUSEPORT), sharing state through "
                             "the store; 'auto' = the cores available (default 1; docs/performance.md)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {"state": args.state, "tokenizer": args.tokenizer}
    if args.backend:
        overrides["backends"] = [{"url": url} for url in args.backend]
    listen = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if listen:
        overrides["listen"] = listen
    if args.policy:
        overrides["routing"] = {"policy": args.policy}
    return load_settings(args.config, **overrides)


def run(args: argparse.Namespace) -> int:
    from app.proxy.gctune import tune_for_serving
    from app.serving import serve_draining, uvicorn_config

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workers = getattr(args, "workers", 1)
    try:
        settings = settings_from_args(args)
        if not settings.backends and settings.discovery is None:
            raise ConfigError("backends: none: pass --backend URL, set backends or discovery in the config file")
        app = create_app(settings) if workers == 1 else None
    except ValueError as exc:  # ConfigError, or a hook refusing its settings: one line naming the key
        print(f"prefixgate: {exc}", file=sys.stderr)
        return 2
    if app is None:
        return serve_workers(settings, workers, args.log_level)
    log.info("prefixgate on http://%s:%d -> %s", settings.listen.host, settings.listen.port,
             ", ".join(r.url for r in app.services.replicas.all()))
    tune_for_serving()  # app/proxy/gctune.py: no full collections over start-up objects
    level = args.log_level.lower()
    configs = [uvicorn_config(app, settings.listen.host, settings.listen.port, log_level=level)]
    admin = settings.admin.listen
    if app.admin is not None and admin is not None:
        log.info("admin surface on http://%s:%d", admin.host, admin.port)
        configs.append(uvicorn_config(app.admin, admin.host, admin.port, log_level=level, lifespan="off"))
    return serve_draining(app, *configs, accept_s=settings.shutdown.accept_s, grace_s=settings.shutdown.grace_s)
