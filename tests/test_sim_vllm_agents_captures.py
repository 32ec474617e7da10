"""The simulator answers the agents' routes in real vLLM 0.32's shapes (no vLLM needed).

tests/fixtures/real_vllm_agents/ holds real captures (scripts/record_vllm_agents.py): a streamed
and a non-streamed `/v1/messages` and `/v1/responses`, and their error answers (unknown model,
missing field, unknown response id). Each recorded request is replayed on the simulator, serving
the same model name with the same tokenizer; the answers must have the same status, the same SSE
event names in the same order (a run of one event, e.g. the text deltas, counts once: how many
tokens are generated differs) with `event:` equal to the data's `type`, and the same field sets,
nested objects included. Values (ids, text, token counts) may differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.sim.testing import SimCluster
from tests.e2e.proxy_handle import sse_events

CAPTURES = Path(__file__).parent / "fixtures" / "real_vllm_agents"
REQUESTS: dict[str, Any] = json.loads((CAPTURES / "requests.json").read_text())


def shape(value: Any) -> Any:
    """The field structure of a JSON value: objects by key (recursively), a list by its first
    object element; scalars and null alike (values may differ)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value and isinstance(value[0], dict) else []
    return None


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two shapes differ, as readable paths (vLLM first, simulator second)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in vLLM" for k in a.keys() - b.keys()]
        out += [f"{path}.{k}: only in the simulator" for k in b.keys() - a.keys()]
        for k in a.keys() & b.keys():
            out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        return diff(a[0], b[0], f"{path}[0]") if a and b else []
    return [] if type(a) is type(b) else [f"{path}: {type(a).__name__} in vLLM, {type(b).__name__} in the simulator"]


def collapsed(names: list[str | None]) -> list[str | None]:
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


@pytest.fixture(scope="module")
def sim() -> Any:
    with SimCluster(replicas=1, model="tiny", time_scale=0.0, kv_blocks=100_000, max_model_len=4096) as cluster:
        yield cluster


def _replay(sim: Any, name: str) -> tuple[int, bytes]:
    req = REQUESTS[name]
    with httpx.Client(timeout=30) as client, client.stream(req["method"], sim.urls[0] + req["path"],
                                                           json=req["body"]) as resp:
        return resp.status_code, b"".join(resp.iter_raw())


STREAMS = sorted(p.stem for p in CAPTURES.glob("*.sse"))
BODIES = sorted(n for n in REQUESTS if n not in STREAMS)


@pytest.mark.parametrize("name", STREAMS)
def test_streams_have_vllms_event_order_and_fields(sim: Any, name: str) -> None:
    real = sse_events((CAPTURES / f"{name}.sse").read_bytes())
    status, raw = _replay(sim, name)
    assert status == 200
    ours = sse_events(raw)
    for events in (real, ours):
        assert all(n == d.get("type") for n, d, _ in events), "`event:` must repeat the data's type"
    assert collapsed([n for n, _, _ in ours]) == collapsed([n for n, _, _ in real])
    first_real = {n: d for n, d, _ in reversed(real)}  # the first event of each name
    first_ours = {n: d for n, d, _ in reversed(ours)}
    problems = [f"{n}{p}" for n in first_real for p in diff(shape(first_real[n]), shape(first_ours[n]))]
    assert not problems, problems


@pytest.mark.parametrize("name", BODIES)
def test_bodies_and_errors_have_vllms_status_and_fields(sim: Any, name: str) -> None:
    real = json.loads((CAPTURES / f"{name}.json").read_text())
    status, raw = _replay(sim, name)
    assert status == real["status"]
    problems = diff(shape(real["body"]), shape(json.loads(raw)))
    assert not problems, problems
