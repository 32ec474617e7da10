"""Hygiene findings on `/v1/messages`, found on what the engine renders (the converted chat
messages and tools), with the real `anthropic` client -> proxy -> simulator over loopback:

- a per-request value on top of the system blocks is a `dynamic_head` finding named by its
  place in the client's body (`system line 1`), and the engine really misses there;
- tools sent in another order are a `tool_order` finding; `rewrite` sorts them and the cache hits;
- an inline system message that a system-first template makes the engine merge into the head is
  an `inline_system` finding; the same message with a template that accepts it in place is not;
- `reject` answers a 400 in Anthropic's shape saying what to fix.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anthropic
import pytest

from app.prefix.default_tokenizer import DEFAULT_TOKENIZER_DIR
from tests.test_api_messages import STATIC, TOOLS, billing, client_for, prompt_of, wait_processed

QUESTION = [{"role": "user", "content": "Fix the failing test."}]
SYSTEM_FIRST_GUARD = ("{%- for message in messages %}{%- if message['role'] == 'system' and not loop.first %}"
                      "{{ raise_exception('System message must be at the beginning.') }}{%- endif %}{%- endfor %}")


def system_first_tokenizer(tmp_path: Path) -> str:
    """The default tokenizer with a Qwen-style guard: a system message after the first one raises."""
    out = tmp_path / "system-first"
    shutil.copytree(DEFAULT_TOKENIZER_DIR, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["chat_template"] = SYSTEM_FIRST_GUARD + config["chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return str(out)


def send(client: anthropic.Anthropic, tenant: str, **kwargs: Any) -> Any:
    """A non-streamed request; the raw response (headers) and its parsed message."""
    raw = client.messages.with_raw_response.create(model="sim", max_tokens=4, extra_headers={"x-tenant-id": tenant},
                                                   **kwargs)
    return raw, raw.parse()


def test_a_timestamp_in_the_system_blocks_is_a_dynamic_head_finding(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, tenants={"default": {"policy": "warn"}})
    client = client_for(proxy)
    usages = []
    for turn in range(2):
        system = [billing(turn), {"type": "text", "text": f"Current time: 2026-01-05T09:1{turn}:00Z\n"},
                  {"type": "text", "text": STATIC}]
        raw, message = send(client, "cc", system=system, tools=TOOLS, messages=QUESTION)
        usages.append(message.usage)
        # the billing block is its own finding; the timestamp is the first line of the system text
        # the engine renders (blocks joined, billing block dropped): `system line 1`
        assert raw.headers["x-prefixgate-hygiene"] == \
            "dynamic_head(system[0]: billing_header), dynamic_head(system line 1: timestamp)"
        wait_processed(proxy.services.prefix, turn + 1)
    # and it is real: the engine reuses almost nothing of the second turn
    assert usages[1].cache_read_input_tokens < 0.1 * prompt_of(usages[1])
    assert proxy.sample("prefixgate_hygiene_findings_total", route="messages", tenant="cc", kind="dynamic_head") == 2


def test_tools_in_another_order_are_a_finding_and_rewrite_sorts_them(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0, kv_blocks=100_000)
    proxy = proxy_factory(sim, tenants={"overrides": {"fixer": {"policy": "rewrite"}, "seer": {"policy": "warn"}}})
    client = client_for(proxy)
    system = [{"type": "text", "text": STATIC}]
    shuffled = TOOLS[1::2] + TOOLS[0::2]
    raw, _ = send(client, "seer", system=system, tools=TOOLS, messages=QUESTION)
    assert "x-prefixgate-hygiene" not in raw.headers  # a stable order (sorted here) is no finding
    raw, _ = send(client, "seer", system=system, tools=shuffled, messages=QUESTION)
    assert raw.headers["x-prefixgate-hygiene"] == "tool_order(tools: order)"
    assert proxy.sample("prefixgate_hygiene_findings_total", route="messages", tenant="seer", kind="tool_order") == 1
    # under rewrite the shuffled tools are sorted before they leave: the engine sees one prompt
    send(client, "fixer", system=system, tools=TOOLS, messages=QUESTION)
    wait_processed(proxy.services.prefix, 3)
    raw, message = send(client, "fixer", system=system, tools=shuffled, messages=QUESTION)
    assert raw.headers["x-prefixgate-rewrites"] == "sort_tools"
    assert "x-prefixgate-hygiene" not in raw.headers  # the rewrite fixed it
    assert message.usage.cache_read_input_tokens > 0.9 * prompt_of(message.usage)


def inline_session(client: anthropic.Anthropic, tenant: str) -> list[Any]:
    """Two turns; the second carries an inline system reminder after the first answer."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Turn 0: read the failing test."}]
    raws = []
    for turn in range(2):
        raw, message = send(client, tenant, system=STATIC, tools=TOOLS, messages=history)
        raws.append(raw)
        history += [{"role": "assistant", "content": message.content[0].text or "ok"},
                    {"role": "system", "content": "<system-reminder>The tests changed.</system-reminder>"},
                    {"role": "user", "content": f"Turn {turn + 1}: fix it."}]
    return raws


def test_an_inline_system_message_merged_into_the_head_is_a_finding(sim_factory, proxy_factory, tmp_path) -> None:
    tokenizer = system_first_tokenizer(tmp_path)
    sim = sim_factory(replicas=1, time_scale=0.0, tokenizer=tokenizer)
    proxy = proxy_factory(sim, tokenizer=tokenizer, tenants={"default": {"policy": "warn"}})
    assert proxy.services.prefix.system_first() and sim.apps[0].system_first
    raws = inline_session(client_for(proxy), "qwen")
    assert "x-prefixgate-hygiene" not in raws[0].headers
    assert raws[1].headers["x-prefixgate-hygiene"] == "inline_system(messages[2]: merged into system)"
    assert proxy.sample("prefixgate_hygiene_findings_total", route="messages", tenant="qwen",
                        kind="inline_system") == 1


def test_an_inline_system_message_kept_in_place_is_no_finding(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim, tenants={"default": {"policy": "warn"}})
    assert not proxy.services.prefix.system_first()  # the default template accepts it in place
    raws = inline_session(client_for(proxy), "chatml")
    assert all("x-prefixgate-hygiene" not in r.headers for r in raws)


def test_reject_names_the_system_line_in_anthropic_shape(sim_factory, proxy_factory) -> None:
    sim = sim_factory(replicas=1, time_scale=0.0)
    proxy = proxy_factory(sim, tenants={"default": {"policy": "reject"}})
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client_for(proxy), "strict", system=[{"type": "text", "text": "Today is 2026-01-05.\n" + STATIC}],
             messages=QUESTION)
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prefix-cache hygiene: system line 1 holds a per-request value (date)")
    assert proxy.sample("prefixgate_rejections_total", route="messages", tenant="strict", reason="dynamic_head") == 1
