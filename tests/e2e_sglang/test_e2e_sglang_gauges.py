"""Engine gauges scraped from real SGLang: the proxy's windowed hit ratio equals what SGLang's own
`sglang:prefill_effective_tokens_total{mode}` counters give over the same span (hits = the `*_hit`
modes, queried = every mode), and the `--disable-radix-cache` replica reads caching OFF with the
reason `config` (its /server_info says `disable_radix_cache: true`)."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from tests.e2e.workload import chat_body, stream_chat, words

pytestmark = [pytest.mark.e2e_sglang, pytest.mark.timeout(600)]
EFFECTIVE = "sglang:prefill_effective_tokens_total"


def effective_tokens(replica: Any) -> dict[str, float]:
    """mode -> value of SGLang's prefill-effective-tokens counter, from its own /metrics."""
    out: dict[str, float] = {}
    for line in replica.metrics_text().splitlines():
        if line.startswith(EFFECTIVE + "{"):
            mode = re.search(r'mode="([^"]+)"', line)
            if mode:
                out[mode.group(1)] = out.get(mode.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def settled_effective_tokens(replica: Any, quiet_s: float = 2.0, timeout: float = 60.0) -> dict[str, float]:
    """`effective_tokens` once it stopped moving for `quiet_s`: SGLang adds to this counter on its
    log interval, not when a request ends, so a read right after traffic (this test's, or an
    earlier test's on the shared replica) can miss tokens a later scrape sees."""
    deadline = time.monotonic() + timeout
    last, since = effective_tokens(replica), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise TimeoutError("SGLang's prefill counters never settled")
        time.sleep(0.25)
        now = effective_tokens(replica)
        if now != last:
            last, since = now, time.monotonic()
    return last


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _send_shared_prefix(url: str, tag: str) -> None:
    system = words("gauge-system", 500)
    with httpx.Client(timeout=120) as client:
        for i in range(4):  # one cold prompt, then three that share its system prompt
            messages = [{"role": "system", "content": system}, {"role": "user", "content": words(f"{tag}{i}", 30)}]
            stream_chat(client, url, chat_body(messages, 4))


def test_hit_ratio_gauge_equals_sglang_counters(e2e_proxy: Any, sglang_radix: Any) -> None:
    # SGLang answers an idle GET /health by generating one token from a one-token prompt
    # (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, on by default): every idle probe adds 1 to its
    # `input` tokens. So this proxy probes once, at start, and its window may hold that one token
    # beyond the span read here; the ratio must then be SGLang's hits over the window's lookups.
    settled_effective_tokens(sglang_radix)  # earlier tests' tokens counted before the proxy's first scrape
    proxy = e2e_proxy([sglang_radix], scrape={"window_s": 600.0}, routing={"health_interval_s": 3600.0})
    before = settled_effective_tokens(sglang_radix)
    _send_shared_prefix(sglang_radix.url, "q")
    after = settled_effective_tokens(sglang_radix)
    delta = {mode: after.get(mode, 0.0) - before.get(mode, 0.0) for mode in after}
    hits = sum(v for mode, v in delta.items() if mode.endswith("_hit"))
    queried = sum(delta.values())
    assert 0.3 < hits / queried < 1.0, delta

    def gauge() -> float | None:
        return proxy.services.metrics.registry.get_sample_value(
            "prefixgate_engine_prefix_cache_hit_ratio", {"backend": "radix"})

    def view() -> dict[str, Any]:
        return httpx.get(proxy.url + "/hygiene/engines", timeout=10).json()["backends"]["radix"]

    def matches() -> bool:
        looked_up = view()["window_queried_tokens"] or 0.0
        return (gauge() is not None and looked_up - queried in (0.0, 1.0)
                and abs(gauge() - hits / looked_up) < 1e-9)

    try:
        wait_for(matches, what=f"hit ratio {hits:.0f}/{queried:.0f}")
    except TimeoutError:
        raise AssertionError(f"gauge {gauge()} vs SGLang Δ{EFFECTIVE} {delta}; now "
                             f"{effective_tokens(sglang_radix)}; proxy view {view()}") from None
    looked_up = view()["window_queried_tokens"]
    print(f"\nSGLang Δ{EFFECTIVE}: {delta}; proxy window looked up {looked_up:.0f} "
          f"(+{looked_up - queried:.0f} from its start-up health probe); hits/looked up = "
          f"{hits:.0f}/{looked_up:.0f} = {hits / looked_up:.4f}; proxy gauge {gauge():.4f}")
    assert proxy.sample("prefixgate_engine_prefix_caching_enabled", backend="radix") == 1.0
    assert proxy.sample("prefixgate_engine_block_size_tokens", backend="radix") == 1.0


def test_disabled_radix_cache_reads_off_with_reason(e2e_proxy: Any, sglang_noradix: Any, sglang_radix: Any) -> None:
    proxy = e2e_proxy([sglang_noradix, sglang_radix])
    _send_shared_prefix(sglang_noradix.url, "n")  # traffic must not turn the config's OFF into "on"

    def enabled(name: str) -> float | None:
        return proxy.services.metrics.registry.get_sample_value(
            "prefixgate_engine_prefix_caching_enabled", {"backend": name})

    wait_for(lambda: enabled("noradix") is not None and enabled("radix") is not None, what="caching gauges")
    assert enabled("noradix") == 0.0
    assert enabled("radix") == 1.0
    body = httpx.get(proxy.url + "/hygiene/engines", timeout=10).json()
    assert body["prefix_cache_off"] == ["noradix"]
    view = body["backends"]["noradix"]
    assert (view["caching_enabled"], view["caching_reason"]) == (False, "config")
    assert view["cache_config"].get("disable_radix_cache") == "True"
    assert "--disable-radix-cache" in " ".join(view["likely_causes"]), view["likely_causes"]
    print(f"\nnoradix: caching_enabled={view['caching_enabled']} reason={view['caching_reason']} "
          f"verdict={view['verdict']!r} causes={view['likely_causes']}")
