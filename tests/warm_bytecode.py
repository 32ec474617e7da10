"""Write, before `make test` starts its workers, the bytecode that each of them would otherwise
make for itself at the same moment, the files spread over every core:

- pytest's rewritten-assert bytecode of the suite's test modules (below);
- the bytecode of the two client SDKs the tests import (`anthropic`: ~3,300 modules, `openai`:
  ~2,100), which a fresh venv does not have (uv installs without compiling): importing them from
  source took ~5 s of CPU more in every worker.

pytest imports a test module through its own loader, which rewrites the module's asserts and
keeps the result in a cache of its own (`__pycache__/*-pytest-<version>.pyc`), apart from the
bytecode `compileall` writes. From a clean clone each of the four xdist workers collects the whole
suite at once and so rewrites every test module itself: ~4 s of CPU a worker, ~8 s of the run's
wall time on two cores. Written once here (~2 s of CPU in all), the workers read it.

Speed only, never behaviour: pytest checks each cached file against the hash of its source and
rewrites whatever this did not write; the rewrite is pytest's own (`_rewrite_test`), with the
assertion-pass hook off, pytest's default (this suite does not turn it on). Where pytest's
internals differ (another version), this writes nothing and says so.

    python tests/warm_bytecode.py [DIR]   (default: the directory of this file)
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import sys
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SDKS = ("anthropic", "openai")  # imported by the test modules; ordinary bytecode, as any import writes

_QUIET = types.SimpleNamespace(trace=lambda message: None)  # the trace pytest's writer reports errors to


def modules(root: Path) -> list[Path]:
    """The files pytest rewrites when it collects `root`: test modules and conftest files."""
    return sorted(p for p in root.rglob("*.py")
                  if (p.name.startswith("test_") or p.name == "conftest.py") and "__pycache__" not in p.parts)


def sdk_files() -> list[str]:
    """The SDKs' source files (none for an SDK that is not installed)."""
    files: list[str] = []
    for name in SDKS:
        spec = importlib.util.find_spec(name)
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            files += [str(p) for p in Path(root).rglob("*.py")]
    return files


def compile_source(path: str) -> bool:
    return bool(compileall.compile_file(path, quiet=2))


def write(path: str) -> bool:
    """Rewrite one module as pytest would and cache it where pytest looks; False when it was cached."""
    from _pytest.assertion import rewrite

    source = Path(path)
    pyc = rewrite.get_cache_dir(source) / (source.name[:-3] + rewrite.PYC_TAIL)
    if rewrite._read_pyc(source, pyc) is not None:
        return False
    source_hash, code = rewrite._rewrite_test(source, None)  # type: ignore[arg-type]
    pyc.parent.mkdir(exist_ok=True)
    return rewrite._write_pyc(_QUIET, code, source_hash, pyc)  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).parent).resolve()
    jobs = [(compile_source, sdk_files(), 64)]
    try:
        from _pytest.assertion import rewrite
        (rewrite.get_cache_dir, rewrite._read_pyc, rewrite._rewrite_test, rewrite._write_pyc, rewrite.PYC_TAIL)  # noqa: B018
        jobs.append((write, [str(p) for p in modules(root)], 8))
    except (ImportError, AttributeError) as exc:
        print(f"warm_bytecode: pytest's internals differ ({exc}); pytest will rewrite the tests itself")
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        for done in [pool.map(job, files, chunksize=chunk) for job, files, chunk in jobs]:
            list(done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
