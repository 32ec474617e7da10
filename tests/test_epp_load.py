"""Replica load in EPP mode: the Endpoint Picker holds the same counters `serve` does (the one load
owner, app/routing/load.py), so the long-prefill lane (app/routing/lanes.py) sees a long prefill
the EPP picked, and the counters come back to zero when the stream ends."""

from __future__ import annotations

import asyncio

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from app.epp import protocol
from tests.epp_dataplane import DataPlane
from tests.epp_testing import chat, conversation, endpoint, epp_factory_fixture  # noqa: F401
from tests.test_epp_admission import hold_a_pick, wait_healthy

LANES = {"policy": "prefix_affinity", "lanes": {"long_prefill_tokens": 200, "max_share": 0.5}}


def primary(pick: pb.ProcessingResponse) -> str:
    """The endpoint the EPP picked first (the pick lists the fallbacks after it)."""
    value = pick.dynamic_metadata.fields[protocol.LB_NAMESPACE].struct_value.fields[protocol.DESTINATION]
    return value.string_value.split(",")[0]


def test_the_long_lane_sees_a_long_prefill_the_epp_picked(sim_factory, epp_factory):
    """Two replicas, shared lane mode (at most one may hold a long prefill). A cold long prompt is
    picked and held (no first byte yet); a second cold long prompt must then queue behind it on the
    same replica rather than take the other one, which stays free for short requests."""
    sim = sim_factory(replicas=2, time_scale=0.0)
    epp = epp_factory(sim, routing=LANES)
    wait_healthy(epp)
    replicas = {endpoint(r.url): r for r in epp.app.services.replicas.all()}

    async def drive(plane: DataPlane) -> tuple[str, str, dict[str, int]]:
        first_call, first = await hold_a_pick(plane, chat(conversation(1, 1)[0]), "a")
        held = replicas[primary(first)]
        backlog = {"queued_long_tokens": held.queued_long_tokens, "inflight": held.inflight}
        second_call, second = await hold_a_pick(plane, chat(conversation(2, 1)[0]), "b")
        picked = primary(second)
        first_call.cancel()
        second_call.cancel()
        await asyncio.sleep(0.2)
        return endpoint(held.url), picked, backlog

    held, picked, backlog = epp.run(drive)
    assert backlog["inflight"] == 1
    assert backlog["queued_long_tokens"] > 200  # the lane's counter holds the long prefill
    assert picked == held  # the long share (1 of 2) is taken: queue behind it, keep the other free
    epp.settle()
    for r in replicas.values():  # the reset streams gave everything back
        assert (r.inflight, r.queued_prompt_tokens, r.queued_long_tokens) == (0, 0, 0), r.name
