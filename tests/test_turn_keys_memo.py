"""conversation.turn_keys keeps its answer on the sketch: read again, it equals a fresh computation."""

from __future__ import annotations

from app.prefix.conversation import last_turn_key, turn_keys
from app.prefix.prompt import prompt_input
from app.prefix.sketch import build_sketch, sketch_bytes
from app.prefix.tokens import SegmentTokenizer


def test_kept_turn_keys_equal_a_fresh_computation_and_do_not_change_the_byte_count() -> None:
    template = SegmentTokenizer.load().template
    messages = [{"role": "system", "content": "rules"}]
    for k in range(6):
        messages += [{"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": f"answer {k}"}]
    inp = prompt_input("chat", {"model": "m", "messages": messages})
    assert inp is not None and template is not None
    text = template.render(inp.messages, tools=inp.tools)
    sketch = build_sketch(inp, text)
    size = sketch_bytes(sketch)
    first = turn_keys(sketch)
    assert sketch.turn_keys_memo is not None and len(first) == 6
    first.append("mutated by a caller")
    assert turn_keys(sketch) == turn_keys(build_sketch(inp, text)) == first[:-1]
    assert last_turn_key(sketch) == first[-2]
    assert sketch_bytes(sketch) == size
