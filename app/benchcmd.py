"""`prefixgate bench NAME [ARGS...]`: run bench/NAME.py's `main()` and print its table.

Benchmarks are plain scripts in the repository's bench/ folder (not part of the installed
package): each defines `main()` (sync or async, optionally taking argv) and prints a table with
the command that reproduces it. `prefixgate bench all` runs every one of them in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def available() -> list[str]:
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_"))


def load(name: str) -> ModuleType:
    path = BENCH_DIR / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"no benchmark {name!r}; available: {', '.join(available()) or 'none'}")
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_one(name: str, argv: list[str]) -> int:
    module = load(name)
    main = getattr(module, "main", None)
    if main is None:
        raise SystemExit(f"bench/{name}.py has no main()")
    saved = sys.argv
    sys.argv = [str(BENCH_DIR / f"{name}.py"), *argv]
    try:
        result = main(argv) if inspect.signature(main).parameters else main()
        if inspect.isawaitable(result):
            result = asyncio.run(result)  # type: ignore[arg-type]
    finally:
        sys.argv = saved
    return int(result or 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="a bench/NAME.py, or `all`")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")


def run(args: argparse.Namespace) -> int:
    if args.name == "all":
        status = 0
        for name in available():
            print(f"\n=== bench {name} ===", flush=True)
            status |= run_one(name, [])
        return status
    return run_one(args.name, list(args.args))
