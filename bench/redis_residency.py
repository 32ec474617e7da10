"""Redis CPU of the residency writes (a replica's sorted set, app/state/redis.py `_ADD_LUA`).

    .venv/bin/python bench/redis_residency.py [--blocks 1500,14000] [--adds 200]

A real redis-server of its own; each row is `--adds` adds through RedisStore (the gateway's code
path), the server's CPU read from /proc around them. Rows:
- `agent turn`: the same conversation again with one block more each time (its head used just
  before, within the refresh window);
- `new chain`: a chain no add has seen (every block new: the floor, a write per block);
- `3x capacity`: a chain three times the replica's capacity, the same each time (a replica whose
  capacity the engine did not report holds 4096 blocks; a 1 MB prompt is ~14k).
`refresh_s` 0 is exact LRU (every add rewrites its whole chain); 1 is the default
(`state_options.residency_refresh_s`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.state.redis import RedisStore  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _chain(rng: random.Random, n: int) -> list[int]:
    return [rng.getrandbits(64) for _ in range(n)]


def _length(shape: str, blocks: int) -> int:
    """The chain a row adds: three times the capacity (`blocks`) for `3x capacity`, else `blocks`."""
    return 3 * blocks if shape == "3x capacity" else blocks


async def _row(server: RedisServer, refresh_s: float, blocks: int, adds: int, shape: str) -> float:
    """Redis CPU per add, in ms."""
    long = _length(shape, blocks) > blocks
    store = RedisStore(server.url, namespace=f"bench-{shape}-{blocks}-{refresh_s}".replace(" ", ""),
                       capacity_blocks=blocks if long else 4 * blocks, refresh_s=refresh_s)
    await store.start()
    rng = random.Random(blocks)
    chain = _chain(rng, _length(shape, blocks))
    await store.residency_add("r", chain)
    assert server.proc is not None
    before = _cpu_s(server.proc.pid)
    for _ in range(adds):
        if shape == "agent turn":
            chain = chain + _chain(rng, 1)
        elif shape == "new chain":
            chain = _chain(rng, blocks)
        await store.residency_add("r", chain)
    spent = _cpu_s(server.proc.pid) - before
    await store.close()
    return 1000 * spent / adds


async def main(blocks: list[int], adds: int) -> list[tuple[str, int, float, float]]:
    server = RedisServer().start()
    try:
        rows = []
        for n in blocks:
            for shape in ("agent turn", "new chain", "3x capacity"):
                exact = await _row(server, 0.0, n, adds, shape)
                window = await _row(server, 1.0, n, adds, shape)
                rows.append((shape, n, exact, window))
        return rows
    finally:
        server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="1500,14000", help="chain lengths (100 KB of words is ~1500 blocks, 1 MB ~14k)")
    ap.add_argument("--adds", type=int, default=200)
    a = ap.parse_args()
    out = asyncio.run(main([int(b) for b in a.blocks.split(",")], a.adds))
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    print("| add | chain | Redis CPU / add, refresh_s 0 (exact LRU) | refresh_s 1 (default) |")
    print("|---|---:|---:|---:|")
    for shape, n, exact, window in out:
        print(f"| {shape} | {_length(shape, n):,} blocks | {exact:.2f} ms | {window:.2f} ms |")
