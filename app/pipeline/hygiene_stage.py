"""The hygiene stage: step 1 of the pipeline (app/pipeline/request.py), before the fingerprint.

The adapter between the request and the pure hygiene cores (app/hygiene/findings.py, rewrite.py,
salt.py). Per parsed request (chat, completions, responses, messages); what is scanned and how a
rewrite is applied is the request's dialect's (`Dialect.hygiene_scan`, `Dialect.rewrite`,
app/dialects/), which calls back into `scan_chat` here on the chat body the engine renders:
1. cache isolation (`tenants.cache_salt`): the tenant's salt becomes `ctx.salt`, which the
   fingerprint chain starts from and which app/pipeline/body.py splices into the forwarded bytes
   (the parsed body is not touched for it); a client's own `cache_salt` is replaced or refused.
   With isolation off a client salt passes through and still seeds the fingerprint.
2. findings (app/hygiene/findings.py): Claude Code's billing header (chat and messages), bounded
   scan of the system/developer heads and tool order (chat, and Responses / Messages bodies as
   the chat messages the engine renders from them), inline system messages the engine merges
   into the head (messages), kept in `ctx.hygiene.findings` (the tracing stage lists their kinds
   on the span).
3. the tenant's policy (`tenants.default` / `tenants.overrides`):
   - observe: `prefixgate_hygiene_findings_total` only;
   - warn: + response header `x-prefixgate-hygiene` listing the findings;
   - rewrite: the enabled rewrites (app/hygiene/rewrite.py; on Messages the billing header,
     then rewrite_messages.py; on Responses rewrite_responses.py), each counted in
     `prefixgate_rewrites_total{kind}` and listed in `x-prefixgate-rewrites`; findings no rewrite
     fixed are still listed in `x-prefixgate-hygiene`;
   - reject: a finding means 400, OpenAI-shaped, saying what is wrong and how to fix it, counted in
     `prefixgate_rejections_total{reason}`.
The rewritten body goes into the stage's note (`ctx.hygiene.body`, which `ctx.body` then reads and
which makes the forwarded body re-serialised) only when a rewrite changed it. Headers and metrics never carry prompt text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.hygiene.findings import (
    BILLING_HEADER,
    DYNAMIC_HEAD,
    INLINE_SYSTEM,
    TOOL_ORDER,
    Finding,
    LineClassifier,
    ToolOrderMemo,
    ToolsSignature,
    dynamic_findings,
    dynamic_lines,
    tool_findings,
    tools_signature,
)
from app.hygiene.rewrite import (
    CANONICAL_JSON,
    MOVE_DYNAMIC,
    SORT_TOOLS,
    STRIP_BILLING,
    RewriteOptions,
    RewriteResult,
)
from app.hygiene.salt import TenantSalts, decide_salt, load_secret, valid_salt
from app.proxy.context import ProxyError, RequestContext

if TYPE_CHECKING:
    from app.config import Settings
    from app.telemetry.metrics import Metrics

HYGIENE_HEADER = "x-prefixgate-hygiene"
REWRITES_HEADER = "x-prefixgate-rewrites"
CLIENT_SALT = "client_salt"  # rewrite kind (replaced) and rejection reason (refused)
INVALID_SALT = "invalid_salt"


def fix_message(finding: Finding) -> str:
    """What is wrong and how to fix it, for a 400 (no prompt text)."""
    if finding.detail == BILLING_HEADER:
        return (f"{finding.where} is Claude Code's x-anthropic-billing-header, whose cch= value changes on "
                "every request, so an engine that keeps it (SGLang, older vLLM) reuses none of the prompt "
                "after it. Fix: drop that block before sending, or ask for "
                "the `rewrite` policy.")
    if finding.kind == DYNAMIC_HEAD and finding.line is not None:
        ln = finding.line
        return (f"{finding.where} holds a per-request value ({finding.detail}) before "
                f"{ln.static_after} characters of reusable prompt, so the engine's prefix cache misses "
                "from there on, on every request. Fix: move that line below the static content "
                "(e.g. append it to the last user message), or ask for the `rewrite` policy.")
    if finding.kind == INLINE_SYSTEM:
        return (f"{finding.where} is a system message inside the conversation; this model's chat template "
                "requires system-first ordering, so the engine merges it into the leading system prompt and "
                "each new or changed one changes the prompt's head: the tools and the whole conversation are "
                "prefilled again. Fix: put such reminders in the user message text, or serve a chat template "
                "that accepts system messages after the first turn.")
    if finding.kind == TOOL_ORDER:
        what = "are not sorted" if finding.detail == "unsorted" else \
            f"arrived in another {finding.detail} than in an earlier request with the same tools"
        return (f"tools {what}, so the prompt differs from the tools on and the prefix cache misses. "
                "Fix: send tools sorted by function name with a fixed JSON key order.")
    return f"{finding.kind} at {finding.where}"


def _fixed(finding: Finding, kinds: tuple[str, ...], opts: RewriteOptions) -> bool:
    if finding.detail == BILLING_HEADER:
        return STRIP_BILLING in kinds
    if finding.kind == DYNAMIC_HEAD:
        return MOVE_DYNAMIC in kinds
    if finding.kind == TOOL_ORDER:
        if finding.detail == "key order":
            return opts.canonical_json
        return opts.sort_tools and (finding.detail == "order" or opts.canonical_json)
    return False


class HygieneStage:
    """Cache isolation, findings and the tenant's hygiene policy, before the fingerprint."""

    def __init__(self, settings: Settings, metrics: Metrics, salts: TenantSalts | None) -> None:
        self.tenants = settings.tenants
        self.metrics = metrics
        self.salts = salts
        self.client_salt_policy = settings.tenants.cache_salt.client_salt
        hygiene = settings.hygiene
        self.flag_unsorted = hygiene.flag_unsorted_tools
        r = hygiene.rewrites
        self.strip_billing = r.strip_billing_header
        self.options = RewriteOptions(r.move_dynamic, r.sort_tools, r.canonical_json, r.move_target,
                                      r.max_moved_lines)
        self.classifier = LineClassifier(hygiene.dynamic_patterns)
        self.tool_memo = ToolOrderMemo()
        # whether the chat template needs system-first ordering (the engine then merges a Messages
        # body's inline system messages into the head): the prefix stage's probe, set by
        # app/server.py; without one, no merge is assumed
        self.system_first: Callable[[], bool] = lambda: False

    # ------------------------------------------------------------------ hot path
    async def before_route(self, ctx: RequestContext) -> None:
        if not ctx.dialect.parses:
            return
        tenant = self.metrics.tenant_label(ctx.tenant)
        self._isolate(ctx, tenant)  # every parsed API: the engine reads the top-level `cache_salt`
        scanned = ctx.dialect.hygiene_scan(ctx.tenant, ctx.body, self)
        if scanned is None:
            return  # completions: salt only (a raw prompt has no system/developer messages)
        findings, lines = scanned
        ctx.hygiene.findings = findings
        for kind in sorted({f.kind for f in findings}):
            self.metrics.hygiene_findings.labels(ctx.route, tenant, kind).inc()
        policy = self.tenants.policy_for(ctx.tenant)
        if policy == "observe" or (not findings and policy != "rewrite"):
            return
        if policy == "warn":
            ctx.hygiene.headers[HYGIENE_HEADER] = _header(findings)
        elif policy == "reject":
            self._reject(ctx.route, findings, tenant)
        elif policy == "rewrite":
            self._rewrite(ctx, tenant, findings, lines)

    # ------------------------------------------------------------------ parts
    def _isolate(self, ctx: RequestContext, tenant: str) -> None:
        client = ctx.body.get("cache_salt")
        decision = decide_salt(client, self.salts(ctx.tenant) if self.salts else None,
                               self.client_salt_policy)
        if decision.action == "reject":
            self.metrics.rejections.labels(ctx.route, tenant, CLIENT_SALT).inc()
            raise ProxyError(400, "cache_salt is set by the gateway (per-tenant cache isolation); "
                                  "remove `cache_salt` from the request.",
                             param="cache_salt", code="cache_salt_not_allowed")
        if decision.action == "client" and not valid_salt(client):
            return  # the engine will refuse it with its own message; do not seed the chain with it
        ctx.hygiene.salt = decision.salt  # app/pipeline/body.py puts it into the forwarded bytes
        if decision.action == "replace":
            self.metrics.rewrites.labels(ctx.route, tenant, CLIENT_SALT).inc()
            _add(ctx.hygiene.headers, REWRITES_HEADER, CLIENT_SALT)

    def scan_chat(self, tenant: str, body: dict[str, Any], skip_billing_line: bool = False,
                   places: dict[int, str] | None = None) -> tuple[list[Finding], list[Any], ToolsSignature | None]:
        """Dynamic lines and tool order of a chat body (`places`: names of its message indexes)."""
        tools = body.get("tools")
        sig = tools_signature(tools) if isinstance(tools, list) and tools else None
        lines = dynamic_lines(body, self.classifier, sig.chars if sig else 0)
        if skip_billing_line:  # its line is the billing header's, never a line to move
            lines = [ln for ln in lines if not (ln.message == 0 and ln.line_no == 1)]
        findings = dynamic_findings(lines, places)
        if sig is not None:
            findings += tool_findings(tenant, sig, self.tool_memo, self.flag_unsorted)
        return findings, lines, sig

    def _reject(self, route: str, findings: list[Finding], tenant: str) -> None:
        first = findings[0]
        for reason in sorted({f.kind for f in findings}):
            self.metrics.rejections.labels(route, tenant, reason).inc()
        message = "prefix-cache hygiene: " + " ".join(fix_message(f) for f in findings)
        place = first.where.split(" line ")[0]
        param = "tools" if first.kind == TOOL_ORDER else first.where if first.kind == INLINE_SYSTEM else \
            (place if place == "system" else f"{place}.content") if first.line else None
        raise ProxyError(400, message, param=param, code=first.kind,
                         headers={HYGIENE_HEADER: _header(findings)})

    def _rewrite(self, ctx: RequestContext, tenant: str, findings: list[Finding], lines: list[Any]) -> None:
        body, stripped = ctx.body, False
        if self.strip_billing and any(f.detail == BILLING_HEADER for f in findings):
            changed = ctx.dialect.strip_billing(body)  # where its body carries the header
            if changed is not None:
                body, stripped = changed, True
        result = ctx.dialect.rewrite(body, lines, self.options)
        if stripped:
            result = RewriteResult(result.body, (STRIP_BILLING, *result.kinds), result.moved_lines)
        if result.changed:
            ctx.hygiene.body = result.body
            for kind in result.kinds:
                self.metrics.rewrites.labels(ctx.route, tenant, kind).inc()
                label = f"{kind}({result.moved_lines})" if kind == MOVE_DYNAMIC else kind
                _add(ctx.hygiene.headers, REWRITES_HEADER, label)
        left = [f for f in findings if not _fixed(f, result.kinds, self.options)]
        if left:
            ctx.hygiene.headers[HYGIENE_HEADER] = _header(left)


def _header(findings: list[Finding]) -> str:
    return ", ".join(f.label() for f in findings)


def _add(headers: dict[str, str], name: str, item: str) -> None:
    headers[name] = f"{headers[name]}, {item}" if headers.get(name) else item


def build_hygiene_stage(settings: Settings, metrics: Metrics) -> HygieneStage:
    """The hygiene + isolation stage. Raises ValueError when isolation is enabled without a
    usable secret."""
    salts = None
    if settings.tenants.cache_salt.enabled:
        salts = TenantSalts(load_secret(settings.tenants.cache_salt.secret_env))
    return HygieneStage(settings, metrics, salts)


__all__ = ["CANONICAL_JSON", "HYGIENE_HEADER", "MOVE_DYNAMIC", "REWRITES_HEADER", "SORT_TOOLS",
           "HygieneStage", "build_hygiene_stage", "fix_message"]
