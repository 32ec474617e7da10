"""app/prefix/convert_responses.py: a Responses body as the chat messages + tools vLLM 0.32 renders."""

from __future__ import annotations

from app.prefix.convert_responses import ResponseHistory, continued_history, convert, responses_prompt_input


def test_instructions_items_and_function_calls_become_chat_messages() -> None:
    body = {"model": "m", "instructions": "be terse", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                          {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "cat", "arguments": "{\"p\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "x.py"},
    ]}
    assert convert(body).messages == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "let me look", "tool_calls": [
            {"id": "c1", "function": {"name": "ls", "arguments": "{}"}, "type": "function"},
            {"id": "c2", "function": {"name": "cat", "arguments": "{\"p\":1}"}, "type": "function"}]},
        {"role": "tool", "content": "x.py", "tool_call_id": "c1"},
    ]


def test_flat_tools_take_the_chat_layout_and_builtins_are_dropped() -> None:
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}, "strict": True},
             {"type": "web_search_preview"}]
    assert convert({"input": "hi", "tools": tools}).tools == [
        {"type": "function", "function": {"name": "ls", "description": None, "parameters": {"type": "object"},
                                          "strict": True}}]


def test_previous_response_history_is_prepended_without_system_and_unknown_ids_are_unknown() -> None:
    history = ResponseHistory()
    first = convert({"instructions": "sys", "input": "q1"}).messages
    history.put("resp_1", continued_history(first, "a1"))
    inp = responses_prompt_input({"model": "m", "instructions": "sys2", "input": "q2",
                                  "previous_response_id": "resp_1"}, history)
    assert inp is not None and inp.messages == [
        {"role": "system", "content": "sys2"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert responses_prompt_input({"model": "m", "input": "q", "previous_response_id": "resp_x"}, history) is None
    assert responses_prompt_input({"model": "openai/gpt-oss-20b", "input": "q"}, history) is None  # Harmony


def test_history_is_bounded_by_bytes() -> None:
    history = ResponseHistory(max_bytes=2000)
    for i in range(50):
        history.put(f"r{i}", [{"role": "user", "content": "x" * 100}])
    assert history.bytes <= 2000 and history.get("r0") is None and history.get("r49") is not None
