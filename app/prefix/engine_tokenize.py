"""The engine's own `POST /tokenize` (vLLM and SGLang both serve it), for `prefix.mode: engine`.

It rides the proxy's one pooled aiohttp session (the one the upstream requests use), handed in as
a zero-argument callable because that session only exists once the serving loop started it: no
second HTTP stack, no second connection pool to the same replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp


class TokenizeTarget(Protocol):
    """What /tokenize needs of a replica (app.routing.base.Replica has it; the prefix core does
    not import routing, which imports the fingerprint)."""

    @property
    def url(self) -> str: ...
    @property
    def healthy(self) -> bool: ...


class ReplicaSource(Protocol):
    def all(self) -> list[TokenizeTarget]: ...


SessionSource = Callable[[], aiohttp.ClientSession | None]
MAX_ID = 2**32  # ids are packed as array('I') (app/prefix/chain.py)


class EngineTokenizeError(RuntimeError):
    """The engine gave no ids for a prompt: unreachable, an HTTP error, or an answer that is not a
    list of token ids. The request is served; only its tracking is lost."""


class EngineTokenize:
    """The engine's ids for a whole request, from the first healthy replica."""

    def __init__(self, replicas: ReplicaSource, session: SessionSource, timeout_s: float = 10.0) -> None:
        self.replicas = replicas
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    def _url(self) -> str:
        replicas = self.replicas.all()
        healthy = [r for r in replicas if r.healthy] or replicas
        if not healthy:
            raise EngineTokenizeError("no replica to ask for /tokenize")
        return healthy[0].url.rstrip("/") + "/tokenize"

    async def tokenize(self, payload: Mapping[str, Any]) -> list[int]:
        """The engine's ids; EngineTokenizeError when it gives none (never an id it did not send:
        a float, a bool or a negative number is no token id)."""
        session = self.session()
        if session is None or session.closed:
            raise EngineTokenizeError("the upstream session is not started")
        try:
            # identity: the shared session does not decompress (the relay passes bytes through as sent)
            async with session.post(self._url(), json=dict(payload), timeout=self.timeout,
                                    headers={"accept-encoding": "identity"}) as resp:
                resp.raise_for_status()
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise EngineTokenizeError(f"/tokenize failed: {type(exc).__name__}: {exc}") from exc
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(
                type(t) is int and 0 <= t < MAX_ID for t in tokens):  # `type(t) is int`: a bool is no id
            raise EngineTokenizeError("/tokenize answered no list of token ids")
        return tokens
