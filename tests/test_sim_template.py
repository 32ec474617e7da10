"""Chat-template rendering as transformers does it: the gateway's (app/prefix/template.py) and the
simulator's own (app/sim/chat_template.py), each checked on the same environment rules."""

from __future__ import annotations

import json

import pytest

from app.prefix.template import ChatTemplate, TemplateError, load_chat_template
from app.sim.chat_template import HfChatTemplate, RenderError
from app.sim.tokens import load_tokenizer


def write_dir(tmp_path, template: str, config_extra: dict | None = None, jinja_file: str | None = None):
    config = {"chat_template": template, "bos_token": {"content": "<s>", "special": True},
              "eos_token": "</s>", **(config_extra or {})}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja_file is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja_file)
    return tmp_path


def test_default_chatml_render():
    t = load_chat_template()
    text = t.render([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}])
    assert text == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render([{"role": "user", "content": "hi"}], add_generation_prompt=False).endswith("<|im_end|>\n")
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(t.special_tokens)


def test_string_content_format_joins_text_parts_and_tool_arguments_become_dicts():
    t = load_chat_template()
    assert t.content_format == "string"
    text = t.render([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": "é"}'}}]}])
    assert "a\nb" in text
    assert '{"name": "f", "arguments": {"x": "é"}}' in text  # tojson keeps non-ASCII, no HTML escaping


def test_transformers_environment(tmp_path):
    source = ("{{ bos_token }}{% for m in messages %}{% generation %}{{ m['content'] | tojson }}{% endgeneration %}"
              "{% if m['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
              "{% endfor %}{{ strftime_now('%Y') | length }}{{ extra }}")
    t = ChatTemplate.from_dir(write_dir(tmp_path, source))
    assert t.special_token_vars["bos_token"] == "<s>"
    assert t.render([{"role": "user", "content": "<b>"}], extra="!") == '<s>"<b>"4!'
    with pytest.raises(TemplateError, match="no bad roles"):
        t.render([{"role": "bad", "content": "x"}])


def test_jinja_file_overrides_config_and_named_lists(tmp_path):
    d = write_dir(tmp_path, "from-config", jinja_file="from-file")
    assert ChatTemplate.from_dir(d).render([]) == "from-file"
    (tmp_path / "chat_template.jinja").unlink()
    write_dir(tmp_path, [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "dflt"}])
    assert ChatTemplate.from_dir(tmp_path).render([]) == "dflt"


def test_sim_encodes_without_special_tokens_and_memo_is_exact():
    tok = load_tokenizer()
    text = tok.render_chat([{"role": "system", "content": "Stable prefix. " * 20},
                            {"role": "user", "content": "Ünïcödé  tabs\t"}], None)
    whole = list(tok.tokenizer.encode(text, add_special_tokens=False).ids)
    assert tok.encode(text) == whole
    assert tok.encode(text) == whole  # second time from the segment memo
    assert whole[0] == tok.tokenizer.token_to_id("<|im_start|>")


def test_sim_renderer_transformers_environment(tmp_path):
    source = ("{{ bos_token }}{% for m in messages %}{% generation %}{{ m['content'] | tojson }}{% endgeneration %}"
              "{% if m['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
              "{% endfor %}{{ strftime_now('%Y') | length }}{{ extra }}")
    t = HfChatTemplate(write_dir(tmp_path, source))
    assert t.variables["bos_token"] == "<s>"
    assert t.render([{"role": "user", "content": "<b>"}], extra="!") == '<s>"<b>"4!'
    with pytest.raises(RenderError, match="no bad roles"):
        t.render([{"role": "bad", "content": "x"}])


def test_sim_renderer_jinja_file_and_named_templates(tmp_path):
    d = write_dir(tmp_path, "from-config", jinja_file="from-file")
    assert HfChatTemplate(d).render([]) == "from-file"
    (tmp_path / "chat_template.jinja").unlink()
    write_dir(tmp_path, [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "dflt"}])
    assert HfChatTemplate(tmp_path).render([]) == "dflt"
    assert HfChatTemplate(tmp_path).render([], tools=[{"type": "function", "function": {"name": "f"}}]) == "tools"


def test_sim_renders_list_content_as_each_engine_does():
    tok = load_tokenizer()
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"},
                                             {"type": "text", "text": ""}, {"type": "text", "text": "c"}]}]
    assert "user\na\nb\nc<|im_end|>" in tok.render_chat(messages, None)  # vLLM: text-like parts, "\n", empty skipped
    # SGLang 0.5.23: `text` / `input_text` parts, empty ones too, joined with " "
    assert "user\na b  c<|im_end|>" in tok.render_chat(messages, None, engine="sglang")


def test_sim_sglang_chat_turns_a_final_assistant_message_into_a_user_one_and_always_prompts():
    tok = load_tokenizer()
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "partial"}]
    text = tok.render_chat(messages, None, add_generation_prompt=False, engine="sglang")
    assert text.endswith("<|im_start|>user\npartial<|im_end|>\n<|im_start|>assistant\n")
