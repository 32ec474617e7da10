"""A multi-turn, multi-tenant chat sequence and a small streaming client, for the real-vLLM tier.

The sequence exercises what prefix prediction has to get right against a real engine: a tenant's
growing history (hits up to the previous turn), two tenants sharing one system prompt (a
cross-tenant hit), a timestamp on top of the system prompt (a break every turn), an exact repeat
(the engine's `(N-1)//B` cap) and a history trimmed from the front (a break after the system
prompt). Assistant turns are either scripted text (`echo=False`: prompt blocks only, identical for
any engine) or the engine's own reply fed back (`echo=True`: the next turn can hit the blocks the
engine cached while generating, if re-tokenising the reply gives back the sampled ids).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

WORDS = (
    "cache prefix block token engine replica router tenant request stream system prompt history "
    "turn answer question model server latency memory budget policy window metric gauge counter "
    "signal event index chain hash shard queue batch decode prefill schedule warm cold hit miss "
    "the a of to and in is it that for on with as was be by this are or from at which not have "
    "river mountain garden window letter market winter summer orange silver yellow purple "
    "quickly slowly carefully honest gentle brave clever quiet loud simple complex ancient modern "
    "build measure explain compare record observe predict verify deliver reduce expand collect"
).split()


def words(seed: int | str, count: int) -> str:
    """Deterministic pseudo-English text (the default tokenizer knows these words well)."""
    rng = random.Random(str(seed))
    out = [rng.choice(WORDS) for _ in range(count)]
    for i in range(11, count, 12):
        out[i] += "."
    return " ".join(out)


@dataclass(frozen=True)
class Step:
    conversation: str
    label: str
    kind: str = "turn"  # turn | repeat | trim


@dataclass
class Conversation:
    tenant: str
    system: str
    dynamic_head: bool = False
    messages: list[dict[str, str]] = field(default_factory=list)  # history after the system prompt
    turns: int = 0
    last_body: dict[str, Any] | None = None

    def system_text(self) -> str:
        if not self.dynamic_head:
            return self.system
        return f"Current time: 2026-11-30T00:{self.turns:02d}:{17 * self.turns % 60:02d}Z\n{self.system}"


def conversations() -> dict[str, Conversation]:
    shared = words("shared-system", 700)
    return {
        "c1": Conversation("alpha", words("alpha-system", 520)),
        "c2": Conversation("beta", shared),
        "c3": Conversation("gamma", shared),
        "c4": Conversation("delta", words("delta-system", 400), dynamic_head=True),
    }


SEQUENCE: tuple[Step, ...] = (
    Step("c1", "alpha t1"), Step("c2", "beta t1"), Step("c3", "gamma t1 (shared system)"),
    Step("c4", "delta t1"), Step("c1", "alpha t2"), Step("c2", "beta t2"),
    Step("c4", "delta t2 (timestamp head)"), Step("c3", "gamma t2"), Step("c1", "alpha t3"),
    Step("c1", "alpha repeat", "repeat"), Step("c2", "beta t3 (front trim)", "trim"), Step("c3", "gamma t3"),
)


@dataclass
class StreamResult:
    status: int
    events: list[tuple[float, dict[str, Any]]]  # (perf_counter at receipt, parsed data)
    headers: dict[str, str]
    sent_at: float

    @property
    def usage(self) -> dict[str, Any]:
        for _, event in reversed(self.events):
            if event.get("usage"):
                return event["usage"]
        return {}

    @property
    def cached_tokens(self) -> int | None:
        return (self.usage.get("prompt_tokens_details") or {}).get("cached_tokens")

    @property
    def prompt_tokens(self) -> int | None:
        return self.usage.get("prompt_tokens")

    def contents(self) -> list[tuple[float, str | None]]:
        """(receipt time, delta.content) of every choice-0 chunk; None where the key is absent."""
        out = []
        for t, event in self.events:
            choices = event.get("choices") or []
            if choices:
                delta = choices[0].get("delta") or {}
                out.append((t, delta.get("content")))
        return out

    @property
    def text(self) -> str:
        return "".join(c for _, c in self.contents() if c)


def stream_chat(client: httpx.Client, base_url: str, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> StreamResult:
    """POST a streaming chat request; every SSE event is stamped when its line arrives."""
    events: list[tuple[float, dict[str, Any]]] = []
    sent = time.perf_counter()
    with client.stream("POST", base_url.rstrip("/") + "/v1/chat/completions", json=body,
                       headers=headers or {}) as resp:
        if resp.status_code != 200:
            resp.read()
            raise AssertionError(f"{resp.status_code}: {resp.text[:500]}")
        # read to the end of the body, as the openai SDK does (it drains the stream after [DONE])
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data != "[DONE]":
                events.append((time.perf_counter(), orjson.loads(data)))
        return StreamResult(resp.status_code, events, dict(resp.headers), sent)


def chat_body(messages: list[dict[str, str]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, **extra}


@dataclass
class Record:
    request_id: str
    step: Step
    tenant: str
    body: dict[str, Any]
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    text: str
    previous: str | None  # request id of the conversation's previous reply (None on a first turn)


def run_sequence(client: httpx.Client, base_url: str, *, echo: bool, max_tokens: int, tag: str,
                 steps: tuple[Step, ...] = SEQUENCE,
                 after_each: Callable[[Record], None] | None = None) -> list[Record]:
    """Send the sequence in order; returns what the engine reported for each request.
    `after_each(record)` runs after every response (e.g. to wait for KV events to settle)."""
    convs = conversations()
    previous: dict[str, str] = {}
    records: list[Record] = []
    for i, step in enumerate(steps):
        conv = convs[step.conversation]
        if step.kind == "repeat":
            assert conv.last_body is not None
            body = conv.last_body
        else:
            if step.kind == "trim":
                conv.messages = conv.messages[2:]
            conv.turns += 1
            conv.messages.append({"role": "user", "content": words(f"{step.conversation}-user-{conv.turns}",
                                                                    40 + 15 * conv.turns)})
            messages = [{"role": "system", "content": conv.system_text()}, *conv.messages]
            body = chat_body(messages, max_tokens)
        request_id = f"{tag}-{i:02d}"
        result = stream_chat(client, base_url, body, {"x-tenant-id": conv.tenant, "x-request-id": request_id})
        if step.kind != "repeat":
            reply = result.text if echo else words(f"{step.conversation}-assistant-{conv.turns}", 60)
            conv.messages.append({"role": "assistant", "content": reply})
        conv.last_body = body
        record = Record(request_id, step, conv.tenant, body, result.prompt_tokens, result.cached_tokens,
                        result.usage.get("completion_tokens"), result.text, previous.get(step.conversation))
        previous[step.conversation] = request_id
        records.append(record)
        if after_each is not None:
            after_each(record)
    return records


def replay(client: httpx.Client, base_url: str, records: list[Record]) -> list[int | None]:
    """The same request bodies, in order, against another server (e.g. the simulator)."""
    out = []
    for rec in records:
        result = stream_chat(client, base_url, rec.body, {"x-tenant-id": rec.tenant})
        out.append(result.cached_tokens)
    return out


def table(rows: list[tuple[Any, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = [" | ".join(str(x).ljust(w) for x, w in zip(header, widths, strict=True))]
    lines += [" | ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def wait_processed(hook: Any, count: int, timeout: float = 30.0) -> None:
    """Until the prefix hook finished its after-response work for `count` requests."""
    deadline = time.monotonic() + timeout
    while hook.processed < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"prefix hook processed {hook.processed} of {count} requests")
        time.sleep(0.02)
