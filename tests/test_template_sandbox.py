"""The chat template's sandbox (app/prefix/template.py): with its attribute verdicts memoised it
refuses what jinja's own ImmutableSandboxedEnvironment refuses, on every render, and renders what
that renders."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.prefix.template import ChatTemplate, TemplateError

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


def _outcome(render: Any) -> str:
    try:
        return "text:" + render()
    except (TemplateError, jinja2.TemplateError) as exc:
        return "refused:" + ("security" if "unsafe" in str(exc) or "safely" in str(exc) else type(exc).__name__)


@pytest.mark.parametrize("source, refused", [
    ("{{ messages.append(1) }}", True),  # mutates a known mutable: calling it raises
    ("{% for m in messages %}{{ m.update({'role': 'x'}) }}{% endfor %}", True),
    ("{{ ''.__class__.__mro__ }}", True),  # an internal attribute: undefined, then used
    ("{% for m in messages %}[{{ m.content.__class__ }}]{% endfor %}", False),  # printed as undefined: ''
    ("{{ raise_exception.__globals__ }}", False),
    ("{% for m in messages %}{{ m.role.upper() }}:{{ m.content.strip().split(' ')|join('_') }}"
     "{% if loop.last %}.{% endif %}{% endfor %}{{ messages|length }}", False),
])
def test_the_memoised_sandbox_renders_and_refuses_as_jinjas_own_on_every_render(source: str, refused: bool) -> None:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda message: None  # a function global, as the template's
    plain = env.from_string(source)
    template = ChatTemplate(source)
    want = _outcome(lambda: plain.render(messages=[dict(m) for m in MESSAGES], add_generation_prompt=False))
    got = [_outcome(lambda: template.render([dict(m) for m in MESSAGES], add_generation_prompt=False))
           for _ in range(3)]  # the first render computes each verdict, the later ones read the memo
    assert got == [want] * 3
    assert want.startswith("refused:") == refused
    assert "class" not in want and "globals" not in want and "function" not in want
    assert template._template.environment._verdicts  # the memo was used
