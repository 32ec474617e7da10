"""`prefixgate check URL`: is this endpoint's prefix cache really working?

Exit codes: 0 healthy, 1 problems found (cache off or unconfirmed, ignore_eos not honoured,
a crash on the length ladder), 2 could not measure (busy engine, unreachable, no model).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

from rich.console import Console

from app.doctor.check import CheckOptions, run_check
from app.doctor.report import RichProgress, render, to_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the endpoint, with or without /v1 (a vLLM/SGLang replica or prefixgate)")
    parser.add_argument("--model", help="model id (default: the first one GET /v1/models lists)")
    parser.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    parser.add_argument("--prompt-tokens", type=int, default=8000,
                        help="size of the probe document in the endpoint's tokens (default 8000)")
    parser.add_argument("--repeats", type=int, default=3, help="sends of the identical prompt (default 3)")
    parser.add_argument("--warmups", type=int, default=3, help="two-point warmups per point (default 3)")
    parser.add_argument("--measurements", type=int, default=5, help="two-point measurements per point (default 5)")
    parser.add_argument("--no-decode", action="store_true", help="skip the two-point prefill/decode measurement")
    parser.add_argument("--ladder", action="store_true", help="climb prompt lengths to find the context ceiling")
    parser.add_argument("--max-tokens-ladder", type=int, default=None,
                        help="top of the ladder in tokens (default: max_model_len from /v1/models)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--force", action="store_true", help="measure even when the engine is busy")
    parser.add_argument("--timeout", type=float, default=1200.0, help="per-request timeout in seconds")


def options_from_args(args: argparse.Namespace) -> CheckOptions:
    return CheckOptions(
        url=args.url,
        model=args.model,
        api_key=args.api_key,
        prompt_tokens=args.prompt_tokens,
        repeats=max(2, args.repeats),
        warmups=max(0, args.warmups),
        measurements=max(1, args.measurements),
        two_point=not args.no_decode,
        ladder=args.ladder,
        ladder_max_tokens=args.max_tokens_ladder,
        force=args.force,
        timeout_s=args.timeout,
    )


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    err = Console(stderr=True)
    show_progress = err.is_terminal and not args.json
    progress = RichProgress(err) if show_progress else None
    with progress or contextlib.nullcontext():
        result = asyncio.run(run_check(opts, progress))
    if args.json:
        sys.stdout.write(json.dumps(to_json(result)) + "\n")
    else:
        render(result, Console())
    return result.exit_code
