"""`prefixgate lint FILE`: the gateway's continuity analysis, offline, for CI.

FILE holds one OpenAI request body (JSON) or consecutive ones (JSONL, or a JSON array), as one
tenant would send them. Each request is fingerprinted with the same tokenizer and template the
proxy uses, matched against the earlier ones and diagnosed (app/prefix/diagnose.py). A single
request has nothing to compare with, so it is checked statically: a value that is almost surely
per-request (a clock time, a uuid, a request id...) placed before static content is reported.

Each body is read as the API it is written for (`--api`, default `auto`: Responses' `input`,
completions' `prompt`, Messages' top-level `system` or Anthropic-only content blocks, else chat),
checked as the proxy checks it (a body the proxy would answer 400 is reported with the same
message, not analysed) and rendered as the engine named by `--engine` renders it (default vLLM).

Exit status: 2 on bad input (a file that is no JSON, JSONL or array of objects, a body the proxy
would refuse, or one whose prompt the engine could not render: token ids that are no 32-bit ids, a
template that raises), else 1 when a problem was found (any break but `new_session` or
`compaction`), else 0.
`--json` prints one object per request: {"index", "continuity", "cause", "spans", "span_kinds",
"fix", "secondary"}, and "error" for a body that was not analysed: `spans` are the changed values
themselves; `secondary` lists the further causes after the first one, in prompt order, as
{"cause", "spans", "span_kinds"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.dialects import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Dialect
from app.dialects.base import strips_billing_header
from app.dialects.validation import check_common
from app.errors import ProxyError
from app.prefix.convert_messages import requires_system_first
from app.prefix.convert_responses import ResponseHistory
from app.prefix.diagnose import NOT_A_PROBLEM, Diagnosis, fix_for
from app.prefix.dynamic import NOW_CUE, VOLATILE_KINDS, Span, get_detector
from app.prefix.fingerprint import Fingerprinter
from app.prefix.sketch import RequestSketch, build_sketch
from app.prefix.template import TemplateError
from app.prefix.tokens import SegmentTokenizer
from app.prefix.tracker import TenantTracker
from app.state.memory import MemoryStore

VOLATILE = set(VOLATILE_KINDS)  # kept for importers of the old names (app/hygiene/findings.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a JSON request body, or JSONL / a JSON array of consecutive bodies")
    parser.add_argument("--json", action="store_true", help="one JSON object per request analysed")
    parser.add_argument("--tokenizer", help="Hugging Face tokenizer directory (default: built-in)")
    parser.add_argument("--block-size", type=int, default=16, help="engine block size (default 16)")
    parser.add_argument("--api", choices=("auto", *APIS), default="auto",
                        help="the API the bodies are written for (default: told by each body's members)")
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                        help="render as this engine does (billing header, tool dump; default vllm)")
    parser.add_argument("--dynamic-pattern", action="append", default=[], metavar="REGEX",
                        help="extra dynamic-value regex (repeatable)")
    parser.add_argument("--html", metavar="REPORT", help="also write the /ui break view as one offline HTML file")


def load_requests(path: str) -> list[dict[str, Any]]:
    raw = Path(path).read_text(encoding="utf-8") if path != "-" else sys.stdin.read()
    stripped = raw.strip()
    if not stripped:
        return []
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError:
        data = []
        for number, line in enumerate(stripped.splitlines(), 1):
            if line.strip():
                try:
                    data.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {number} is no JSON ({exc})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise ValueError("expected a JSON object, a JSON array of objects, or JSONL")
    return [d.get("body", d) if isinstance(d.get("body"), dict) else d for d in data]


APIS: dict[str, Dialect] = {"chat": CHAT, "completions": COMPLETIONS, "messages": MESSAGES, "responses": RESPONSES}
ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "document"})


def api_of(body: dict[str, Any]) -> Dialect:
    """The API a body is written for, as far as its members tell: Responses' `input`, completions'
    `prompt`, Messages' top-level `system` or a content block only Anthropic's API has, else chat."""
    if "input" in body and "messages" not in body:
        return RESPONSES
    if "prompt" in body and "messages" not in body:
        return COMPLETIONS
    messages = body.get("messages")
    contents = [m.get("content") for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
    if "system" in body or any(_anthropic_only(block) for c in contents if isinstance(c, list) for block in c):
        return MESSAGES
    return CHAT


def _anthropic_only(block: Any) -> bool:
    kind = block.get("type") if isinstance(block, dict) else None
    return isinstance(kind, str) and kind in ANTHROPIC_BLOCKS


@dataclass
class OfflineEngine:
    """The engine facts a body is rendered with offline (`--engine`): what the prefix stage learns
    from the replicas when serving (app/pipeline/prefix_stage.py). No stored responses: a Responses
    body that names a previous one is rendered without its history."""

    kind: Literal["vllm", "sglang"] = "vllm"
    template: Any = None  # the tokenizer's chat template (system-first ordering)
    response_history: ResponseHistory = field(default_factory=ResponseHistory)

    def engine_strips_billing(self) -> bool:
        return strips_billing_header(self.kind)

    def system_first(self) -> bool:
        return requires_system_first(self.template)

    def engine_tool_dump(self) -> Literal["vllm", "sglang"]:
        return self.kind


def refusal(dialect: Dialect, body: dict[str, Any]) -> str | None:
    """Why the proxy would answer `body` 400 on this API (its message), else None. A missing
    `model` is no concern of the analysis."""
    try:
        check_common(body if "model" in body else {**body, "model": "-"}, dialect.validate)
    except ProxyError as exc:
        return exc.message
    return None


def static_findings(sketch: RequestSketch, material: int, extra: tuple[str, ...] = ()) -> list[Span]:
    """Volatile values before at least `material` chars of static content (single request)."""
    limit = sketch.tail_start
    out: list[Span] = []
    for span in get_detector(extra).find(sketch.text, 0, limit):
        if limit - span.end < material:
            continue
        line_start = sketch.text.rfind("\n", 0, span.start) + 1
        line = sketch.text[line_start:span.start]
        if span.kind in VOLATILE or NOW_CUE.search(line) or span.kind in ("email", "user"):
            out.append(span)
    return out


async def analyse(bodies: list[dict[str, Any]], fingerprinter: Fingerprinter, block_size: int,
                  extra: tuple[str, ...] = (), store: MemoryStore | None = None, api: str = "auto",
                  engine: OfflineEngine | None = None) -> list[dict[str, Any]]:
    tracker = TenantTracker(store or MemoryStore(), show_text=True, extra_patterns=extra)
    if engine is None:
        engine = OfflineEngine(template=getattr(fingerprinter.tokenizer, "template", None))
    results: list[dict[str, Any]] = []
    material = max(64, 6 * block_size)
    for index, body in enumerate(bodies):
        dialect = api_of(body) if api == "auto" else APIS[api]
        refused = refusal(dialect, body)
        if refused is not None:
            results.append(_unanalysed(index, f"the proxy would refuse it ({dialect.name}): {refused}", True))
            continue
        inp = dialect.prompt_input(body, engine)
        if inp is None:
            results.append(_unanalysed(index, "no messages or prompt", False))
            continue
        try:
            fp = fingerprinter.complete_sync(fingerprinter.prepare(inp, block_size))
        except (TemplateError, ValueError, TypeError, OverflowError) as exc:  # the engine refuses it too
            why = f"the engine could not render it ({dialect.name}): {type(exc).__name__}: {exc}"
            results.append(_unanalysed(index, why, True))
            continue
        sketch = build_sketch(inp, fp.text or "")
        obs = await tracker.observe("lint", fp.block_hashes, sketch, block_size)
        cause = obs.diagnosis.cause if obs.diagnosis else None
        spans = obs.diagnosis.spans if obs.diagnosis else []
        fix = fix_for(obs.diagnosis, sketch.text) if obs.diagnosis else None
        secondary = obs.diagnosis.secondary if obs.diagnosis else []
        result: dict[str, Any] = {"index": index, "continuity": obs.continuity if index else None,
                                  "cause": cause, "spans": [s.text for s in spans],
                                  "span_kinds": [s.kind for s in spans], "fix": fix,
                                  "secondary": [{"cause": f.cause, "spans": [s.text for s in f.spans],
                                                 "span_kinds": [s.kind for s in f.spans]} for f in secondary]}
        if cause is not None:
            result.update(block_index=obs.matched_blocks, token_offset=obs.matched_blocks * block_size)
        if len(bodies) == 1:
            found = static_findings(sketch, material, extra)
            if found:
                diag = Diagnosis("dynamic_head", found[0].start, found)
                result.update(cause="dynamic_head", spans=[s.text for s in found],
                              span_kinds=[s.kind for s in found], fix=fix_for(diag, sketch.text), static=True)
        result["tokens"] = fp.num_tokens
        results.append(result)
    return results


def _unanalysed(index: int, error: str, refused: bool) -> dict[str, Any]:
    """The result of a body that was not analysed; `refused`: bad input (exit 2)."""
    return {"index": index, "continuity": None, "cause": None, "spans": [], "fix": None, "error": error,
            "refused": refused}


def _human(r: dict[str, Any]) -> str:
    if r.get("error"):  # not analysed: no tokens or continuity to report
        return f"request {r['index']}: {r['error']}"
    cont = "–" if r["continuity"] is None else f"{r['continuity']:.2f}"
    head = f"request {r['index']}: {r.get('tokens') or 0} tokens, continuity {cont}"
    if not r["cause"]:
        return f"{head}: ok"
    where = " (suspected, single request)" if r.get("static") else \
        f" at block {r.get('block_index')} (token {r.get('token_offset')})"
    spans = f" values: {', '.join(repr(s) for s in r['spans'])}" if r["spans"] else ""
    more = "".join(f"\n    also: {f['cause']}" + (f" values: {', '.join(repr(s) for s in f['spans'])}" if f["spans"] else "")
                   for f in r.get("secondary") or [])
    return f"{head}: {r['cause']}{where}{spans}\n    fix: {r['fix']}{more}"


def run(args: argparse.Namespace) -> int:
    try:
        bodies = load_requests(args.file)
    except (OSError, ValueError) as exc:
        print(f"prefixgate lint: {exc}", file=sys.stderr)
        return 2
    tokenizer = SegmentTokenizer.load(args.tokenizer, workers=1)
    fingerprinter = Fingerprinter(tokenizer)
    extra = tuple(args.dynamic_pattern)
    store = MemoryStore(history_len=max(1, len(bodies)))
    engine = OfflineEngine(args.engine, getattr(tokenizer, "template", None))
    try:
        results = asyncio.run(analyse(bodies, fingerprinter, args.block_size, extra, store, args.api, engine))
    finally:
        fingerprinter.close()
    if args.html:
        from app.ui.report import write_lint_report

        asyncio.run(write_lint_report(args.html, args.file, results, store, fingerprinter.mode))
    problems = [r for r in results if r["cause"] and r["cause"] not in NOT_A_PROBLEM]
    for r in results:
        if args.json:
            keys = ("index", "continuity", "cause", "spans", "span_kinds", "fix", "secondary")
            print(json.dumps({k: r.get(k) for k in keys} | ({"error": r["error"]} if r.get("error") else {}),
                             ensure_ascii=False))
        else:
            print(_human(r))
    refused = sum(1 for r in results if r.get("refused"))
    if not args.json:
        print(f"{len(results)} request(s), {len(problems)} problem(s)" + (f", {refused} refused" if refused else ""))
    return 2 if refused else 1 if problems else 0
