"""`prefixgate` console script: serve | sim | demo | check | lint | bench.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
only the chosen one is imported, so `prefixgate sim` does not pay for the proxy's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("app.serve", "run the proxy in front of vLLM/SGLang replicas"),
    "sim": ("app.sim.cli", "start N simulated vLLM-compatible replicas"),
    "demo": ("app.demo", "simulated replicas + the proxy + a multi-tenant workload, with a report"),
    "check": ("app.doctor.cli", "is this endpoint's prefix cache really working?"),
    "lint": ("app.prefix.lint", "hygiene findings for a request body (JSON) or a sequence (JSONL)"),
    "bench": ("app.benchcmd", "run a benchmark from bench/ and print its table"),
    "epp": ("app.epp.server", "serve as a Gateway API Inference Extension Endpoint Picker (ext_proc gRPC)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prefixgate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    if not args.command:
        build_parser().print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
