"""The API dialect is an object, not a string: outside app/dialects/, no code compares a route name.

What a request's API changes is asked of its `Dialect` (app/dialects/base.py: `continues_answers`,
`chat_choices`, `body_session_keys`, `strip_billing`, ...), so a new API is one new object, not a
hunt for `route == "..."` branches. The source is read with ast (nothing is imported but the
registry, for the names), like tests/test_import_graph.py.

Not counted: app/sim/ (the simulated engine, a separate program whose handlers are the engine's
routes, not the gateway's dialects) and comparisons with a `kind` (a `PromptKind` says how a prompt
is rendered — through the chat template, as sent, as ids — which several dialects share).
"""

from __future__ import annotations

import ast
import pathlib

from app.dialects import DIALECTS, PASSTHROUGH

APP = pathlib.Path(__file__).resolve().parent.parent / "app"
EXEMPT = (APP / "dialects", APP / "sim")
ROUTE_NAMES = frozenset(d.name for d in DIALECTS) | {PASSTHROUGH.name}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_route(node: ast.expr) -> bool:
    """A variable that holds a route name (`route`, `ctx.route`, `PROMPT_CACHE_KEY_ROUTES`, ...)."""
    name = (_name(node) or "").lower()
    return name in ("route", "routes") or name.endswith(("_route", "_routes"))


def _route_literals(node: ast.expr) -> bool:
    """A route-name string, or a tuple/list/set literal holding one."""
    if isinstance(node, ast.Constant):
        return node.value in ROUTE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_route_literals(e) for e in node.elts)
    return False


def route_comparisons(source: str, filename: str) -> list[int]:
    """Line numbers of the comparisons in `source` that branch on a route name."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands[:-1], node.comparators, strict=True):
            if isinstance(op, (ast.In, ast.NotIn)):  # `"messages" in body` asks for a key: not counted
                by_literal = _route_literals(right) and _name(left) != "kind"
            else:
                by_literal = (_route_literals(left) and _name(right) != "kind") or \
                             (_route_literals(right) and _name(left) != "kind")
            if by_literal or _is_route(left) or _is_route(right):
                lines.append(node.lineno)
                break
    return lines


def test_the_scan_sees_each_form_of_route_comparison() -> None:
    found = route_comparisons(
        'if route == "chat": pass\n'
        "if ctx.route in PROMPT_CACHE_KEY_ROUTES: pass\n"
        'if label != "messages": pass\n'
        'if dialect.name in ("chat", "completions"): pass\n'
        'if inp.kind == "chat": pass\n'  # a PromptKind, not an API
        'if engine == "sglang": pass\n'
        'if "messages" in body: pass\n', "<sample>")
    assert found == [1, 2, 3, 4]


def test_no_route_name_comparison_outside_the_dialects() -> None:
    found = [f"{path.relative_to(APP.parent)}:{line}"
             for path in sorted(APP.rglob("*.py")) if not any(path.is_relative_to(e) for e in EXEMPT)
             for line in route_comparisons(path.read_text(), str(path))]
    assert found == [], "ask the request's Dialect (app/dialects/base.py) instead of comparing route names: " \
                        + ", ".join(found)
