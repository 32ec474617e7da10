"""The cold-prompt process pool (app/prefix/pool.py) behind a real gateway and the simulator:
a never-seen long prompt is tokenised in a pool process and its prediction is still exact; a
cold prompt that finds the pool full is routed at once, fingerprinted approximately and counted
`mode="approx"` (never queued), and after its response `prefixgate_fingerprint_deferred_total`
says whether its chain was completed then; the pool's processes stop with the server, and with every worker
of `serve --workers N`."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from app.prefix.pool import ColdPool, spare_cores
from tests.gateway_process import GatewayProcess

# these tests send 100 KB cold prompts: below the "auto" threshold with the fast encoder (256 KiB),
# so they set the pool's threshold to the one without it
POOL_MIN = 64 * 1024
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _doc(seed: int, chars: int = 100_000) -> str:
    rng = random.Random(seed)
    lines, n = [], 0
    while n < chars:
        lines.append(" ".join(rng.choice(WORDS) for _ in range(12)))
        n += len(lines[-1]) + 1
    return "\n".join(lines)


def _ask(client: httpx.Client, content: str) -> dict[str, Any]:
    body = {"model": "sim", "max_tokens": 8, "messages": [
        {"role": "system", "content": "You read documents."}, {"role": "user", "content": content}]}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _wait_processed(hook: Any, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while hook.processed < n:
        assert time.monotonic() < deadline, f"only {hook.processed}/{n} requests processed"
        time.sleep(0.01)


def _count(proxy: Any, mode: str) -> float:
    return proxy.sample("prefixgate_fingerprint_requests_total", mode=mode) or 0.0


def _deferred(proxy: Any, outcome: str) -> float:
    return proxy.sample("prefixgate_fingerprint_deferred_total", outcome=outcome) or 0.0


def _second_turn_is_predicted_exactly(client: httpx.Client, hook: Any, doc: str, first: dict[str, Any]) -> None:
    """The conversation's next turn after `first` (asked "one?" about `doc`): the engine has the
    document cached, and the gateway predicts exactly that."""
    body = {"model": "sim", "max_tokens": 8, "messages": [
        {"role": "system", "content": "You read documents."}, {"role": "user", "content": f"{doc}\nQuestion: one?"},
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And two?"}]}
    second = client.post("/v1/chat/completions", json=body).json()
    _wait_processed(hook, 2)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 20_000 and hook.predictions[-1][2:] == (cached, cached)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids: list[int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still alive: {[p for p in pids if _alive(p)]}"
        time.sleep(0.05)


def test_cold_prompt_is_tokenised_in_the_pool_and_predictions_stay_exact(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=200_000)
    proxy = proxy_factory(sim, prefix={"cold_pool_workers": 1, "cold_pool_min_chars": POOL_MIN})
    hook = proxy.services.prefix
    pool = hook.fingerprinter.tokenizer.cold
    assert isinstance(pool, ColdPool) and pool.pids() == []  # nothing spawned before a cold prompt
    doc = _doc(1)
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        _ask(client, f"{doc}\nQuestion: first?")
        _wait_processed(hook, 1)
        assert _count(proxy, "pending") == 1
        assert pool.encoded == 1 and len(pool.pids()) == 1 and pool.inflight == 0
        second = _ask(client, f"{doc}\nQuestion: second?")  # the head is memoised now
        _wait_processed(hook, 2)
    assert _count(proxy, "exact") == 1 and _count(proxy, "approx") == 0
    assert pool.encoded == 1  # the new tail was encoded inline, not in the pool
    rows = list(hook.predictions)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert [r[2] for r in rows] == [0, cached] and all(r[2] == r[3] for r in rows)


def test_a_full_pool_means_approx_for_that_request_not_a_queue(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=200_000)
    proxy = proxy_factory(sim, prefix={"cold_pool_workers": 1, "cold_pool_inflight": 1, "cold_pool_min_chars": POOL_MIN,
                                       "cold_pool_defer_s": 0.3})
    hook = proxy.services.prefix
    pool = hook.fingerprinter.tokenizer.cold
    assert pool.capacity == 1 and pool.try_reserve()  # the one slot is taken (a long cold prompt)
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        first = _ask(client, f"{_doc(2)}\nQuestion: saturated?")
        _wait_processed(hook, 1)
        assert _count(proxy, "approx") == 1 and _count(proxy, "pending") == 0
        assert pool.encoded == 0 and pool.refused == 1  # never tokenised, never waited for
        # still full 0.3 s after its response: its chain stays the leading blocks, and /metrics says so
        assert _deferred(proxy, "dropped") == 1 and _deferred(proxy, "completed") == 0
        # its prediction is on the blocks known exactly (none) over the engine's token count
        assert hook.predictions[-1][2] == 0 == first["usage"]["prompt_tokens_details"]["cached_tokens"]
        pool.release()
        _ask(client, f"{_doc(3)}\nQuestion: room again?")
        _wait_processed(hook, 2)
    assert _count(proxy, "pending") == 1 and pool.encoded == 1 and pool.inflight == 0


def test_a_chain_refused_by_a_full_pool_is_learned_after_the_response(sim_factory, proxy_factory) -> None:
    """A burst of cold prompts fills the pool: the one refused is routed approx, and once its
    response is done (the burst passed) its chain is tokenised after all, so the conversation's
    next turn is predicted exactly. Refused for good, that turn predicted none of the document
    the engine had cached."""
    sim = sim_factory(replicas=1, time_scale=1.0, prefill_tps=50_000.0, kv_blocks=200_000)
    proxy = proxy_factory(sim, prefix={"cold_pool_workers": 1, "cold_pool_inflight": 1, "cold_pool_min_chars": POOL_MIN})
    hook = proxy.services.prefix
    pool = hook.fingerprinter.tokenizer.cold
    assert pool.try_reserve()  # another cold prompt holds the one slot
    doc = _doc(4)
    first: dict[str, Any] = {}
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        asking = threading.Thread(target=lambda: first.update(_ask(client, f"{doc}\nQuestion: one?")))
        asking.start()
        deadline = time.monotonic() + 20
        while pool.refused < 1:  # refused the pool, so routed approx (the engine prefills it for ~0.5 s)
            assert time.monotonic() < deadline
            time.sleep(0.005)
        pool.release()  # the burst passed before its response ended
        asking.join()
        _wait_processed(hook, 1)
        assert pool.encoded == 1 and pool.refused == 1 and pool.inflight == 0
        assert _deferred(proxy, "completed") == 1 and _deferred(proxy, "dropped") == 0  # exact in the end
        _second_turn_is_predicted_exactly(client, hook, doc, first)


def test_a_refused_chain_waits_for_a_slot_after_its_response(sim_factory, proxy_factory) -> None:
    """The pool is still full when the refused request's response ends (a burst of cold prompts
    longer than one answer): its chain waits for a slot instead of being dropped, is tokenised
    when one frees, and the conversation's next turn is predicted exactly."""
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=200_000)
    proxy = proxy_factory(sim, prefix={"cold_pool_workers": 1, "cold_pool_inflight": 1, "cold_pool_min_chars": POOL_MIN})
    hook = proxy.services.prefix
    pool = hook.fingerprinter.tokenizer.cold
    assert pool.try_reserve()  # another cold prompt holds the one slot
    doc = _doc(5)
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        first = _ask(client, f"{doc}\nQuestion: one?")  # answered while the slot is still taken
        time.sleep(0.3)
        assert hook.processed == 0 and pool.encoded == 0  # waiting for a slot, not dropped
        pool.release()
        _wait_processed(hook, 1)
        assert pool.encoded == 1 and pool.inflight == 0 and _count(proxy, "approx") == 1
        assert _deferred(proxy, "completed") == 1 and _deferred(proxy, "dropped") == 0
        _second_turn_is_predicted_exactly(client, hook, doc, first)


def test_the_pool_stops_with_the_server(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim, prefix={"cold_pool_workers": 1, "cold_pool_min_chars": POOL_MIN})
    hook = proxy.services.prefix
    pool = hook.fingerprinter.tokenizer.cold
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        _ask(client, _doc(4))
        _wait_processed(hook, 1)
    pids = pool.pids()
    assert len(pids) == 1
    proxy.stop()
    _wait_dead(pids)
    assert not pool.try_reserve()  # closed: a late cold prompt would be approx, not a new spawn


def test_auto_size_is_the_spare_cores_per_serving_process() -> None:
    cores = len(os.sched_getaffinity(0))
    assert spare_cores(1) == max(1, cores - 1)
    assert spare_cores(cores) == 1  # no spare core: still one process, off the event loop's GIL
    assert spare_cores(2) == max(1, (cores - 2) // 2)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def test_serve_workers_each_run_a_pool_that_stops_on_sigterm(sim_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    cfg = {"backends": [{"url": u} for u in sim.urls], "prefix": {"cold_pool_workers": 1, "cold_pool_min_chars": POOL_MIN},
           "shutdown": {"accept_s": 0, "grace_s": 2}}
    with GatewayProcess(cfg, args=["--workers", "2"]) as gw:
        assert gw.proc is not None
        workers = _descendants(gw.proc.pid)
        for i in range(6):  # new connections: the kernel spreads them over both workers
            with httpx.Client(base_url=gw.url, timeout=60) as client:
                _ask(client, _doc(10 + i))
        deadline = time.monotonic() + 30
        while len(_descendants(gw.proc.pid)) <= len(workers):  # a pool process under some worker
            assert time.monotonic() < deadline, "no cold-prompt pool process was started"
            time.sleep(0.1)
        everything = _descendants(gw.proc.pid)
        gw.signal(signal.SIGTERM)
        assert gw.wait(30) == 0, gw.log()
        _wait_dead(sorted(everything))


def test_a_pool_process_that_dies_is_replaced_and_the_ids_stay_exact() -> None:
    from app.prefix.tokens import SegmentTokenizer

    tok = SegmentTokenizer.load()
    assert tok.tokenizer_json is not None
    tok.cold = ColdPool(tok.tokenizer_json, 1, min_chars=0)
    text = _doc(5, 20_000)
    try:
        assert tok._encode_cold([text]) == [tok.encode(text)]
        (pid,) = tok.cold.pids()
        os.kill(pid, signal.SIGKILL)
        _wait_dead([pid])
        assert tok._encode_cold([text]) == [tok.encode(text)]  # this thread, this once
        assert tok._encode_cold([text]) == [tok.encode(text)]  # a new pool process
        assert tok.cold.encoded == 2 and tok.cold.pids() != [pid]
    finally:
        tok.close()


def test_a_cold_prompt_gives_its_pool_slot_back_once_encoded_before_its_chain_is_hashed() -> None:
    """The slot bounds the pool's work: the next cold prompt may use it while this one's chain is
    hashed in the worker thread (measured: 1 MB cold heads at c = 4 were routed approx less often)."""
    from app.prefix.fingerprint import Fingerprinter, prompt_input
    from app.prefix.tokens import SegmentTokenizer

    tok = SegmentTokenizer.load()
    assert tok.tokenizer_json is not None
    tok.cold = ColdPool(tok.tokenizer_json, 1, inflight=1, min_chars=0)
    fpr = Fingerprinter(tok)
    seen: list[int] = []
    extend = fpr._extend_segment

    def hashing(*args: Any, **kwargs: Any) -> Any:
        seen.append(tok.cold.inflight)  # type: ignore[union-attr]
        return extend(*args, **kwargs)

    fpr._extend_segment = hashing  # type: ignore[method-assign]
    try:
        fp = fpr.prepare(prompt_input("chat", {"messages": [{"role": "user", "content": _doc(7)}]}), 16)
        assert fpr.admit(fp) and fp.cold_reserved and tok.cold.inflight == 1
        assert fpr.rest_sync(fp) is not None
        assert seen and set(seen) == {0} and tok.cold.encoded == 1
        fpr.release(fp)  # the chain task's end: nothing left to give back
        assert tok.cold.inflight == 0
    finally:
        tok.close()
