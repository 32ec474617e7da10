"""Which conversation a request continues, by keys of its turns and system prompt (no text), and
what a tenant sent before (`TenantPast`). Diagnosis (app/prefix/diagnose.py), the tracker and the
cross-pod digest all key turns this way, so keys written by one pod are read by another."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.prefix.sketch import RequestSketch

KEY_SIZE = 16


@dataclass
class TenantPast:
    """What the tenant sent before, as stable keys (shareable between pods, no text): the last user
    turn of each earlier request (a conversation's newest turn) and the system prompts seen."""

    last_turns: set[str] = field(default_factory=set)
    systems: set[str] = field(default_factory=set)
    edits: set[str] = field(default_factory=set)  # `Diagnosis.edit_at` of recent requests


# ---------------------------------------------------------------------- stable keys

def text_key(role: str, text: str) -> str:
    """A process-independent identity of a message: role, length and the first and last 512
    characters (O(1) per message; a full digest of a 1 MB system prompt costs ~1 ms)."""
    return span_key(role, text, 0, len(text))


def span_key(role: str, text: str, start: int, end: int, before: str | None = None) -> str:
    """`text_key(role, before + "\x01" + text[start:end])` (without `before`: of text[start:end])
    from the 512 characters at each end, never copying the span (a 1 MB turn was copied three
    times per request to be keyed)."""
    head, tail = text[start:min(end, start + 512)], text[max(start, end - 512):end]
    n = end - start
    if before is not None:
        lead = before + "\x01"
        n += len(lead)
        head, tail = (lead + head)[:512], (lead[-512:] + tail)[-512:]
    raw = f"{role}\x00{n}\x00{head}\x00{tail}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=KEY_SIZE // 2).hexdigest()


def turn_keys(sketch: RequestSketch) -> list[str]:
    """One key per user turn: the turn with the message before it (two conversations that share a
    question such as "thanks" still differ in what preceded it). Computed once per sketch."""
    memo = sketch.turn_keys_memo
    if memo is not None and memo[0] == len(sketch.regions):
        return list(memo[1])
    out: list[str] = []
    text = sketch.text
    prev = (0, 0)  # the message before, as a span
    for region in sketch.regions:
        if region.role in ("system", "developer"):
            continue
        if region.role == "user":
            before = text[max(prev[0], prev[1] - 512):prev[1]]
            out.append(span_key("user", text, region.start, region.end, before))
        prev = (region.start, region.end)
    sketch.turn_keys_memo = (len(sketch.regions), out)
    return list(out)


def last_turn_key(sketch: RequestSketch) -> str | None:
    """Key of the newest user turn: what a later request of the same conversation still contains."""
    keys = turn_keys(sketch)
    return keys[-1] if keys else None


def system_key(sketch: RequestSketch) -> str | None:
    return text_key("system", sketch.system_text) if sketch.system_text is not None else None


def past_of(sketches: Iterable[RequestSketch]) -> TenantPast:
    past = TenantPast()
    for sk in sketches:
        key = last_turn_key(sk)
        if key:
            past.last_turns.add(key)
        skey = system_key(sk)
        if skey:
            past.systems.add(skey)
    return past


def continues(cur: RequestSketch, past: TenantPast) -> bool:
    """Does `cur` carry on a conversation the tenant sent before (holds one's last user turn)?"""
    return bool(past.last_turns) and any(k in past.last_turns for k in turn_keys(cur))
