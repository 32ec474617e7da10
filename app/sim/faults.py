"""Injected faults for tests: what the next requests of a replica should suffer.

`POST /sim/faults` with `{"mode": ..., "count": N, "status": 503, "after_chunks": K, "delay_s": x,
"factor": f}`:
- `error`: reply `status` with an OpenAI-shaped error body before any stream byte;
- `drop`: close the connection without any response;
- `die_midstream`: abort the connection after K SSE events;
- `stall`: accept, then send nothing for `delay_s` (then serve normally);
- `stall_midstream`: send K SSE events, then nothing for `delay_s` (then carry on);
- `slow`: multiply every engine step's time by `factor` (until `clear`; `count` is ignored);
- `kv_gap`: the next `count` KV-event batches are not sent (their seq is used up and they stay in
  the replay buffer), so a subscriber sees a sequence gap;
- `clear`: forget pending faults, restore speed, and revive a crashed engine.
Request faults apply to the next `count` requests (default 1), in the order they were posted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

MODES = ("error", "drop", "die_midstream", "stall", "stall_midstream", "slow", "kv_gap", "clear")


@dataclass
class Fault:
    mode: str
    remaining: int = 1
    status: int = 503
    after_chunks: int = 1
    delay_s: float = 5.0
    factor: float = 10.0


def parse_fault(body: Any) -> Fault:
    """Validate a /sim/faults body; raises ValueError with a message for a 400."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    mode = body.get("mode")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    try:
        fault = Fault(mode=mode, remaining=int(body.get("count", 1)), status=int(body.get("status", 503)),
                      after_chunks=int(body.get("after_chunks", 1)), delay_s=float(body.get("delay_s", 5.0)),
                      factor=float(body.get("factor", 10.0)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad fault parameter: {exc}") from exc
    if fault.remaining < 1 or fault.after_chunks < 0 or fault.delay_s < 0 or fault.factor <= 0:
        raise ValueError("count >= 1, after_chunks >= 0, delay_s >= 0 and factor > 0 are required")
    if not 400 <= fault.status <= 599:
        raise ValueError("status must be a 4xx or 5xx code")
    return fault


class FaultPlan:
    def __init__(self) -> None:
        self.pending: deque[Fault] = deque()

    def add(self, fault: Fault) -> None:
        self.pending.append(fault)

    def clear(self) -> None:
        self.pending.clear()

    def take(self) -> Fault | None:
        """The fault the arriving request suffers, if any (consumes one use of it)."""
        if not self.pending:
            return None
        fault = self.pending[0]
        fault.remaining -= 1
        if fault.remaining <= 0:
            self.pending.popleft()
        return fault

    def describe(self) -> list[dict[str, Any]]:
        return [{"mode": f.mode, "remaining": f.remaining} for f in self.pending]
