"""Stateful Responses API: which replica holds a response id (docs/agents-responses.md).

vLLM keeps a stored response (`store: true`, with `VLLM_ENABLE_RESPONSES_API_STORE`) in the
memory of the replica that produced it, so `previous_response_id`, `GET /v1/responses/{id}` and
`POST /v1/responses/{id}/cancel` only work there. After a response the gateway remembers
id -> replica in the Store (a binding with the Store's TTL, shared over Redis), and pins every
later request naming that id to that replica. When the replica is gone (no longer listed, or
unhealthy) the gateway answers what the engine itself answers for an unknown id: a 404 in vLLM's
shape, not a 502 from a replica that never had it. An id the gateway never saw is routed as usual
(the engine answers for itself).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any

from app.proxy.context import ProxyError, RequestContext
from app.proxy.upstream import UpstreamError
from app.routing.base import NoReplicaAvailable

if TYPE_CHECKING:
    from app.routing.replicas import ReplicaSet
    from app.state.base import Store

log = logging.getLogger("prefixgate.responses")
_ID_PATH = re.compile(r"^/v1/responses/([A-Za-z0-9._:\-]{1,256})(?:/cancel|/input_items)?$")


class ResponseNotFound(ProxyError):
    """vLLM's own answer for an unknown response id (`_make_not_found_error`): code is the status."""

    def __init__(self, response_id: str) -> None:
        super().__init__(404, f"Response with id '{response_id}' not found.", param="response_id")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": 404}}


def response_id_of_path(path: str) -> str | None:
    """The id in `/v1/responses/{id}` (also `/cancel`, `/input_items`); None for other paths."""
    found = _ID_PATH.match(path)
    return found.group(1) if found else None


class ResponseOwners:
    """id -> replica pins, over the Store."""

    def __init__(self, store: Store, replicas: ReplicaSet) -> None:
        self.store = store
        self.replicas = replicas
        self._tasks: set[asyncio.Task[None]] = set()

    async def pin(self, response_id: str) -> str | None:
        """The replica holding `response_id`; None when the gateway never saw it. Raises
        ResponseNotFound when that replica is gone."""
        owner = await self.store.response_owner_get(response_id)
        if owner is None:
            return None
        replica = next((r for r in self.replicas.all() if r.name == owner), None)
        if replica is None or not replica.healthy:
            raise ResponseNotFound(response_id)
        return owner

    @staticmethod
    def unreachable(response_id: str, exc: BaseException) -> BaseException:
        """What a pinned request that could not reach its replica answers: the engine's 404 when the
        replica is gone (connection refused: its in-memory store died with it, or no longer a
        candidate), else the failure itself (a 5xx or a timeout from a live replica)."""
        if isinstance(exc, NoReplicaAvailable) or (isinstance(exc, UpstreamError) and exc.kind == "connect"):
            return ResponseNotFound(response_id)
        return exc

    def remember(self, ctx: RequestContext) -> None:
        """After a successful response that the engine may have stored: write id -> replica (a task)."""
        if (ctx.response_id is None or ctx.decision is None or ctx.outcome != "ok"
                or (ctx.status or 200) >= 400 or ctx.body.get("store") is False):
            return
        task = asyncio.get_running_loop().create_task(
            self._write(ctx.response_id, ctx.decision.replica.name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, response_id: str, replica: str) -> None:
        try:
            await self.store.response_owner_set(response_id, replica)
        except Exception:  # the pin is an optimisation of routing; the store reports its own health
            log.warning("could not remember the owner of a response", exc_info=True)

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
