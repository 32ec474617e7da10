"""Multi-turn chat prompts for the routing, shared-state and agents' API tests (and the agents'
benchmarks): each turn's messages extend the previous turn's, the shape whose prefix reuse
prefix-affinity routing exists for."""

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


def codex_items(turns: int, question_seed: int, question_words: int, output_seed: int, output_words: int,
                tool: str) -> list[list[dict]]:
    """A Codex-shaped session's Responses `input` per turn: each turn's items extend the previous
    turn's by a user message; after it a `function_call` of `tool` and its output follow."""
    items: list[dict] = []
    out = []
    for t in range(turns):
        items.append({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"step {t}: " + words(question_seed + t, question_words)}]})
        out.append(list(items))
        items.append({"type": "function_call", "call_id": f"call_{t}", "name": tool,
                      "arguments": '{"path": "src/mod' + str(t) + '.py"}'})
        items.append({"type": "function_call_output", "call_id": f"call_{t}",
                      "output": words(output_seed + t, output_words)})
    return out
