"""Multi-turn chat prompts for the routing and shared-state tests: each turn's messages extend the
previous turn's, the shape whose prefix reuse prefix-affinity routing exists for."""

from __future__ import annotations

from collections.abc import Sequence


def words(seed: int, n: int, letter: str = "w") -> str:
    """`n` deterministic pseudo-words for `seed` (distinct seeds give distinct text)."""
    return " ".join(f"{letter}{(seed * 7919 + i * 31) % 9973}" for i in range(n))


def growing_history(system: dict, users: Sequence[str], replies: Sequence[str]) -> list[list[dict]]:
    """One message list per turn: the system message, the earlier turns (user, assistant), then
    this turn's user message."""
    history: list[dict] = [system]
    out = []
    for user, reply in zip(users, replies, strict=True):
        history = [*history, {"role": "user", "content": user}]
        out.append(list(history))
        history = [*history, {"role": "assistant", "content": reply}]
    return out
