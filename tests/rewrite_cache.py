"""Write pytest's rewritten-assert bytecode of the suite's test modules before `make test` starts
its workers, the files spread over every core.

pytest imports a test module through its own loader, which rewrites the module's asserts and
keeps the result in a cache of its own (`__pycache__/*-pytest-<version>.pyc`), apart from the
bytecode `compileall` writes. From a clean clone each of the four xdist workers collects the whole
suite at once and so rewrites every test module itself: ~4 s of CPU a worker, ~8 s of the run's
wall time on two cores. Written once here (~2 s of CPU in all), the workers read it.

Speed only, never behaviour: pytest checks each cached file against the hash of its source and
rewrites whatever this did not write; the rewrite is pytest's own (`_rewrite_test`), with the
assertion-pass hook off, pytest's default (this suite does not turn it on). Where pytest's
internals differ (another version), this writes nothing and says so.

    python tests/rewrite_cache.py [DIR]   (default: the directory of this file)
"""

from __future__ import annotations

import os
import sys
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_QUIET = types.SimpleNamespace(trace=lambda message: None)  # the trace pytest's writer reports errors to


def modules(root: Path) -> list[Path]:
    """The files pytest rewrites when it collects `root`: test modules and conftest files."""
    return sorted(p for p in root.rglob("*.py")
                  if (p.name.startswith("test_") or p.name == "conftest.py") and "__pycache__" not in p.parts)


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
    try:
        from _pytest.assertion import rewrite
        needed = (rewrite.get_cache_dir, rewrite._read_pyc, rewrite._rewrite_test, rewrite._write_pyc, rewrite.PYC_TAIL)
    except (ImportError, AttributeError) as exc:
        print(f"rewrite_cache: pytest's internals differ ({exc}); pytest will rewrite the tests itself")
        return 0
    del needed
    files = [str(p) for p in modules(root)]
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(write, files, chunksize=8))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
